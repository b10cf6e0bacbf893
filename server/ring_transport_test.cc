// The closed ring's per-hop transport choice (ChooseHopTransport): shared memory between
// any two workers on the same host, NCCL only between two CUDA workers there (not on the
// hop that carries tokens back to stage 0), and neither when the config says "grpc".
#include "gtest/gtest.h"
#include "server/ring.h"

namespace ring {
namespace {

namespace pb = ringserve::v1;

pb::DescribeResponse Worker(const std::string& backend, const std::string& host) {
  pb::DescribeResponse d;
  d.set_backend(backend);
  d.set_host_id(host);
  return d;
}

TEST(ChooseHopTransport, SameHostAndBothCudaIsNccl) {
  const HopTransportChoice c =
      ChooseHopTransport(Worker("cuda:0", "m1/h"), Worker("cuda:1", "m1/h"), RingTransport::kAuto);
  EXPECT_TRUE(c.nccl);
  EXPECT_TRUE(c.shm);
  EXPECT_EQ(c.reason, "");
}

TEST(ChooseHopTransport, TheHopBackToStageZeroIsGrpc) {
  const HopTransportChoice c = ChooseHopTransport(Worker("cuda:1", "m1/h"), Worker("cuda:0", "m1/h"),
                                                  RingTransport::kAuto, /*closing=*/true);
  EXPECT_FALSE(c.nccl);
  EXPECT_TRUE(c.shm);  // tokens are small, but the hop's wake-up is saved all the same
  EXPECT_NE(c.reason.find("tokens"), std::string::npos) << c.reason;
}

TEST(ChooseHopTransport, AnotherHostIsGrpc) {
  const HopTransportChoice c =
      ChooseHopTransport(Worker("cuda:0", "m1/a"), Worker("cuda:0", "m2/b"), RingTransport::kAuto);
  EXPECT_FALSE(c.nccl);
  EXPECT_FALSE(c.shm);
  EXPECT_NE(c.reason.find("another host"), std::string::npos) << c.reason;
}

TEST(ChooseHopTransport, ACpuWorkerIsGrpc) {
  for (const auto& [from, to] : {std::pair{"cpu", "cuda:1"}, std::pair{"cuda:0", "cpu"}, std::pair{"cpu", "cpu"}}) {
    const HopTransportChoice c = ChooseHopTransport(Worker(from, "m1/h"), Worker(to, "m1/h"), RingTransport::kAuto);
    EXPECT_FALSE(c.nccl) << from << " -> " << to;
    EXPECT_TRUE(c.shm) << from << " -> " << to;
    EXPECT_NE(c.reason.find("CUDA"), std::string::npos) << c.reason;
  }
}

TEST(ChooseHopTransport, UnknownHostIsGrpc) {
  // A worker that predates host_id (or did not answer Describe) is never assumed local.
  const HopTransportChoice c = ChooseHopTransport(Worker("cuda:0", ""), Worker("cuda:1", ""), RingTransport::kAuto);
  EXPECT_FALSE(c.nccl);
  EXPECT_FALSE(c.shm);
}

TEST(ChooseHopTransport, ConfigGrpcIsAlwaysGrpc) {
  const HopTransportChoice c =
      ChooseHopTransport(Worker("cuda:0", "m1/h"), Worker("cuda:1", "m1/h"), RingTransport::kGrpc);
  EXPECT_FALSE(c.nccl);
  EXPECT_FALSE(c.shm);
  EXPECT_NE(c.reason.find("grpc"), std::string::npos) << c.reason;
}

pb::DescribeResponse OnGpu(const std::string& host, const std::string& uuid, bool mps) {
  pb::DescribeResponse d = Worker("cuda:0", host);
  d.mutable_attestation()->set_device_name("NVIDIA H200");
  d.mutable_attestation()->set_gpu_uuid(uuid);
  d.mutable_attestation()->set_mps(mps);
  return d;
}

// Two processes on one GPU cannot be NCCL ranks of each other; their frames still go
// through shared memory.
TEST(ChooseHopTransport, OneGpuHasNoNccl) {
  const HopTransportChoice c = ChooseHopTransport(OnGpu("m1/h", "GPU-a", true), OnGpu("m1/h", "GPU-a", true),
                                                  RingTransport::kAuto);
  EXPECT_FALSE(c.nccl);
  EXPECT_TRUE(c.shm);
  EXPECT_NE(c.reason.find("one GPU (GPU-a)"), std::string::npos) << c.reason;
  EXPECT_TRUE(ChooseHopTransport(OnGpu("m1/h", "GPU-a", false), OnGpu("m1/h", "GPU-b", false),
                                 RingTransport::kAuto)
                  .nccl);
}

TEST(SharedGpuWarnings, NamesWorkersSharingAGpuWithoutMps) {
  const std::vector<std::string> names = {"w0", "w1", "w2", "w3"};
  // w0 and w2 share GPU-a on m1 (w2 without MPS); w1 is alone on GPU-b; w3 has GPU-a's UUID
  // on another host (not the same GPU).
  std::vector<pb::DescribeResponse> d = {OnGpu("m1/h", "GPU-a", true), OnGpu("m1/h", "GPU-b", false),
                                         OnGpu("m1/h", "GPU-a", false), OnGpu("m2/h", "GPU-a", false)};
  std::vector<std::string> w = SharedGpuWarnings(d, names);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("w0, w2 (no MPS) share GPU GPU-a (NVIDIA H200) on m1/h"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("nvidia-cuda-mps-control -d"), std::string::npos) << w[0];
  // All of them MPS clients: nothing to say; CPU workers (no UUID) never count.
  d[2].mutable_attestation()->set_mps(true);
  EXPECT_TRUE(SharedGpuWarnings(d, names).empty());
  EXPECT_TRUE(SharedGpuWarnings({Worker("cpu", "m1/h"), Worker("cpu", "m1/h")}, names).empty());
}

}  // namespace
}  // namespace ring
