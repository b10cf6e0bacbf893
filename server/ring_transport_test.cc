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

}  // namespace
}  // namespace ring
