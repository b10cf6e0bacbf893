// nccl_link_test: the NCCL link's loader, status mapping and argument checks (anywhere, no
// GPU needed), and with NCCL and two GPUs real transfers between GPU 0 and GPU 1, one
// thread per rank in this process: bit-exact round trips, full duplex, and the failure
// paths (a receive nobody feeds, a peer that never joins) ending by their deadlines.
#include "kernels/cuda/nccl_link.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_status.h"

namespace ring::cuda {
namespace {

constexpr size_t kHidden = 6144;  // GLM-5 hidden width: one bf16 row is 12 KiB
constexpr size_t kBf16Row = kHidden * 2;
// What a timed-out call may overrun its deadline by: the abort that follows the timeout
// (seen up to ~1.5 s on 2x H200) plus scheduling on a loaded machine.
constexpr absl::Duration kSlack = absl::Seconds(3);

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// ---- No GPU needed -----------------------------------------------------------------------

TEST(NcclLibraryTest, BogusEnvPathIsUnavailable) {
  ScopedEnv env(NcclLibrary::kPathEnv, "/nonexistent/ringserve/libnccl.so.2");
  EXPECT_EQ(NcclLibrary::DefaultLocation(), "/nonexistent/ringserve/libnccl.so.2");
  auto lib = NcclLibrary::Open(NcclLibrary::DefaultLocation());
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable) << lib.status();
  EXPECT_TRUE(absl::StrContains(lib.status().message(), "/nonexistent/ringserve/libnccl.so.2"))
      << lib.status();
  EXPECT_TRUE(absl::StrContains(lib.status().message(), NcclLibrary::kPathEnv)) << lib.status();
}

TEST(NcclLibraryTest, UnsetEnvSearchesTheLoaderPath) {
  ScopedEnv env(NcclLibrary::kPathEnv, std::nullopt);
  EXPECT_EQ(NcclLibrary::DefaultLocation(), NcclLibrary::kSoname);
}

TEST(NcclLibraryTest, DirectoryWithoutNcclIsUnavailable) {
  const std::string dir = testing::TempDir();
  auto lib = NcclLibrary::Open(dir);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(lib.status().message(), "libnccl.so.2")) << lib.status();
}

TEST(NcclLibraryTest, LibraryWithoutNcclSymbolsIsUnavailable) {
  auto lib = NcclLibrary::Open("libm.so.6");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(lib.status().message(), "ncclGetVersion")) << lib.status();
}

absl::Status ReturnIfNcclError(ncclResult_t r) {
  RING_NCCL_RETURN_IF_ERROR(r);
  return absl::OkStatus();
}

TEST(NcclStatusTest, MacroNamesCodeAndPlace) {
  EXPECT_TRUE(ReturnIfNcclError(ncclSuccess).ok());
  const absl::Status st = ReturnIfNcclError(ncclRemoteError);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(st.message(), "ncclRemoteError")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "kernels/cuda/nccl_link_test.cc:")) << st;
  EXPECT_EQ(NcclCodeToStatusCode(ncclInvalidArgument), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCodeToStatusCode(ncclInvalidUsage), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NcclCodeToStatusCode(ncclSystemError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclCodeToStatusCode(ncclUnhandledCudaError), absl::StatusCode::kInternal);
}

TEST(NcclLinkArgsTest, ConnectRejectsBadArgumentsBeforeLoadingNccl) {
  // Checked before NCCL is loaded, so these hold on machines without NCCL or a GPU.
  ScopedEnv env(NcclLibrary::kPathEnv, "/nonexistent/libnccl.so.2");
  const std::string id(NcclLink::kIdBytes, 'x');
  const NcclLinkOptions good{.device = 0, .rank = 0, .peer = "peer"};
  auto code = [](absl::string_view id, const NcclLinkOptions& o) {
    return NcclLink::Connect(id, o, absl::Now() + absl::Seconds(1)).status().code();
  };
  EXPECT_EQ(code("short", good), absl::StatusCode::kInvalidArgument);
  NcclLinkOptions o = good;
  o.rank = 2;
  EXPECT_EQ(code(id, o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.device = -1;
  EXPECT_EQ(code(id, o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.peer.clear();
  EXPECT_EQ(code(id, o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.poll_interval = absl::ZeroDuration();
  EXPECT_EQ(code(id, o), absl::StatusCode::kInvalidArgument);
}

// ---- Two GPUs ----------------------------------------------------------------------------

class NcclLinkGpuTest : public testing::Test {
 protected:
  void SetUp() override {
    // NVLink multicast (NVLS) must stay off on our GPU hosts; set before NCCL initializes
    // anything, without overriding an explicit setting.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    auto lib = NcclLibrary::Get();
    if (!lib.ok()) GTEST_SKIP() << "NCCL unavailable: " << lib.status();
    auto devices = DeviceCount();
    if (!devices.ok()) GTEST_SKIP() << "no CUDA: " << devices.status();
    if (*devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << *devices;
    lib_ = *lib;
  }

  static NcclLinkOptions Options(int rank) {
    NcclLinkOptions o;
    o.device = rank;
    o.rank = rank;
    o.peer = rank == 0 ? "rank 1" : "rank 0";
    o.close_timeout = absl::Seconds(2);
    return o;
  }

  // Runs fn(rank) for ranks 0 and 1 on their own threads, each with GPU `rank` current.
  static void RunRanks(const std::function<void(int)>& fn) {
    std::thread t[2];
    for (int r = 0; r < 2; ++r) {
      t[r] = std::thread([&fn, r] {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        fn(r);
      });
    }
    for (auto& th : t) th.join();
  }

  // Connects both ranks; fails the test (links stay null) if either side cannot.
  void ConnectPair(std::unique_ptr<NcclLink> links[2]) {
    auto id = NcclLink::NewId(*lib_);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->size(), NcclLink::kIdBytes);
    RunRanks([&](int r) {
      auto link = NcclLink::Connect(*id, Options(r), absl::Now() + absl::Seconds(60));
      ASSERT_TRUE(link.ok()) << "rank " << r << ": " << link.status();
      links[r] = std::move(*link);
    });
    ASSERT_TRUE(links[0] && links[1]);
  }

  // Closes both sides at once, as two stages would (finalizing quiesces with the peer),
  // and expects a clean close.
  static void ClosePair(std::unique_ptr<NcclLink> links[2]) {
    RunRanks([&](int r) {
      const absl::Status st = links[r]->Close(absl::Now() + absl::Seconds(10));
      EXPECT_TRUE(st.ok()) << "rank " << r << ": " << st;
    });
  }

  static std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(bytes);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

  const NcclLibrary* lib_ = nullptr;
};

// bf16 frames of 1..2048 rows, an fp32 row and an odd size: rank 0 sends, rank 1 echoes,
// rank 0 compares byte for byte. Device memory, then host memory through the staging.
TEST_F(NcclLinkGpuTest, RoundTripIsBitExact) {
  std::unique_ptr<NcclLink> links[2];
  ASSERT_NO_FATAL_FAILURE(ConnectPair(links));
  std::printf("NCCL %s from %s\n", lib_->VersionString().c_str(), lib_->path().c_str());
  const std::vector<size_t> sizes = {kBf16Row,      16 * kBf16Row,  256 * kBf16Row,
                                     2048 * kBf16Row, kHidden * 4, 12345};
  for (size_t bytes : sizes) {
    SCOPED_TRACE(testing::Message() << bytes << " bytes");
    const std::vector<uint8_t> sent = Pattern(bytes, static_cast<uint32_t>(bytes));
    RunRanks([&](int r) {
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      NcclLink& link = *links[r];
      if (r == 0) {
        auto src = DeviceBuffer::FromVector(sent);
        auto dst = DeviceBuffer::Allocate(bytes);
        ASSERT_TRUE(src.ok() && dst.ok());
        ASSERT_TRUE(dst->Zero().ok());
        EXPECT_TRUE(link.Send(src->data(), bytes, deadline).ok()) << link.status();
        EXPECT_TRUE(link.Recv(dst->data(), bytes, deadline).ok()) << link.status();
        auto back = dst->ToVector<uint8_t>(bytes);
        ASSERT_TRUE(back.ok());
        EXPECT_TRUE(*back == sent) << "device round trip differs";

        std::vector<uint8_t> host_back(bytes, 0);
        EXPECT_TRUE(link.SendHost(sent.data(), bytes, deadline).ok()) << link.status();
        EXPECT_TRUE(link.RecvHost(host_back.data(), bytes, deadline).ok()) << link.status();
        EXPECT_TRUE(host_back == sent) << "host-staged round trip differs";
      } else {
        auto buf = DeviceBuffer::Allocate(bytes);
        ASSERT_TRUE(buf.ok());
        EXPECT_TRUE(link.Recv(buf->data(), bytes, deadline).ok()) << link.status();
        EXPECT_TRUE(link.Send(buf->data(), bytes, deadline).ok()) << link.status();
        std::vector<uint8_t> host(bytes);
        EXPECT_TRUE(link.RecvHost(host.data(), bytes, deadline).ok()) << link.status();
        EXPECT_TRUE(link.SendHost(host.data(), bytes, deadline).ok()) << link.status();
      }
    });
  }
  ClosePair(links);
}

// Both ranks send and receive at the same time, from a sender and a receiver thread each:
// the two directions are independent communicators, so neither waits for the other.
TEST_F(NcclLinkGpuTest, FullDuplexFromTwoThreadsPerRank) {
  std::unique_ptr<NcclLink> links[2];
  ASSERT_NO_FATAL_FAILURE(ConnectPair(links));
  const size_t bytes = 2048 * kBf16Row;
  const std::vector<uint8_t> sent[2] = {Pattern(bytes, 1), Pattern(bytes, 2)};
  RunRanks([&](int r) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    std::vector<uint8_t> got(bytes);
    // Receive first on a second thread: on one shared communicator this order on both
    // sides would deadlock.
    std::thread receiver([&] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_TRUE(links[r]->RecvHost(got.data(), bytes, deadline).ok()) << links[r]->status();
    });
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(links[r]->SendHost(sent[r].data(), bytes, deadline).ok()) << links[r]->status();
    receiver.join();
    EXPECT_TRUE(got == sent[1 - r]) << "rank " << r << " received other bytes";
  });
  ClosePair(links);
}

TEST_F(NcclLinkGpuTest, TransferArgumentsAreCheckedWithoutHarmingTheLink) {
  std::unique_ptr<NcclLink> links[2];
  ASSERT_NO_FATAL_FAILURE(ConnectPair(links));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  EXPECT_EQ(links[0]->Send(nullptr, 16, deadline).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(links[0]->RecvHost(nullptr, 16, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(links[0]->Send(nullptr, 0, deadline).ok());  // nothing to move
  EXPECT_TRUE(links[0]->status().ok()) << links[0]->status();
  // Still usable afterwards.
  const std::vector<uint8_t> sent = Pattern(kBf16Row, 7);
  std::vector<uint8_t> got(kBf16Row);
  RunRanks([&](int r) {
    absl::Status st = r == 0 ? links[0]->SendHost(sent.data(), sent.size(), deadline)
                             : links[1]->RecvHost(got.data(), got.size(), deadline);
    EXPECT_TRUE(st.ok()) << st;
  });
  EXPECT_TRUE(got == sent);
  ClosePair(links);
}

// Rank 0 waits for bytes rank 1 never sends; rank 1 meanwhile waits for bytes rank 0 never
// sends. Rank 0's receive ends at its deadline with DeadlineExceeded naming the peer, the
// link is aborted and later calls fail at once; rank 1's pending receive ends too (by the
// abort's effect or, at the latest, its own deadline) instead of hanging.
TEST_F(NcclLinkGpuTest, ReceiveWithoutSendTimesOutAndAbortsTheLink) {
  std::unique_ptr<NcclLink> links[2];
  ASSERT_NO_FATAL_FAILURE(ConnectPair(links));
  const absl::Duration wait[2] = {absl::Seconds(1), absl::Seconds(3)};
  RunRanks([&](int r) {
    auto buf = DeviceBuffer::Allocate(kBf16Row);
    ASSERT_TRUE(buf.ok());
    const absl::Time start = absl::Now();
    const absl::Status st = links[r]->Recv(buf->data(), kBf16Row, start + wait[r]);
    const absl::Duration took = absl::Now() - start;
    EXPECT_FALSE(st.ok()) << "rank " << r;
    EXPECT_LE(took, wait[r] + kSlack) << "rank " << r << ": " << st;
    if (r == 0) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
      EXPECT_GE(took, wait[0]) << st;
      EXPECT_TRUE(absl::StrContains(st.message(), "peer 'rank 1'")) << st;
    }
    std::printf("rank %d: pending recv ended after %.3f s: %s\n", r,
                absl::ToDoubleSeconds(took), st.ToString().c_str());
    // Aborted: later calls in either direction return the first error without waiting.
    const absl::Time again = absl::Now();
    const absl::Status later = links[r]->Send(buf->data(), kBf16Row, again + absl::Seconds(10));
    EXPECT_FALSE(later.ok());
    EXPECT_LT(absl::Now() - again, absl::Milliseconds(100)) << later;
    EXPECT_FALSE(links[r]->status().ok());
  });
  // Closing an aborted link neither hangs nor waits for its close_timeout.
  const absl::Time start = absl::Now();
  for (auto& link : links) EXPECT_FALSE(link->Close(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST_F(NcclLinkGpuTest, PeerThatNeverJoinsTimesOut) {
  auto id = NcclLink::NewId(*lib_);
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time start = absl::Now();
  auto link = NcclLink::Connect(*id, Options(0), start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded) << link.status();
  EXPECT_TRUE(absl::StrContains(link.status().message(), "rank 1")) << link.status();
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LE(took, absl::Seconds(1) + kSlack) << link.status();
}

}  // namespace
}  // namespace ring::cuda
