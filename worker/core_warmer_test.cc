#include "worker/core_warmer.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace ring::worker {
namespace {

// Waits (up to 10 s, so a broken warmer fails instead of hanging) for spinning() == want.
bool WaitForSpinning(const CoreWarmer& w, int want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (w.spinning() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return w.spinning() == want;
}

TEST(CoreWarmerTest, SpinsAfterTouchAndParksAfterTheLinger) {
  CoreWarmer w({.threads = 2, .linger = absl::Milliseconds(30)});
  ASSERT_EQ(w.threads(), 2);
  EXPECT_TRUE(WaitForSpinning(w, 0)) << "spinners must start parked";
  w.Touch();
  EXPECT_TRUE(WaitForSpinning(w, 2)) << "a Touch wakes every spinner";
  EXPECT_TRUE(WaitForSpinning(w, 0)) << "spinners park once the window closes";
  // Touching again re-opens the window (the parked path, not just the spinning one).
  w.Touch();
  EXPECT_TRUE(WaitForSpinning(w, 2));
}

TEST(CoreWarmerTest, RepeatedTouchesKeepItSpinning) {
  CoreWarmer w({.threads = 1, .linger = absl::Seconds(2)});
  w.Touch();
  ASSERT_TRUE(WaitForSpinning(w, 1));
  for (int i = 0; i < 10; ++i) {
    w.Touch();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(w.spinning(), 1) << "touch " << i;
  }
}

TEST(CoreWarmerTest, OffByDefaultAndStopsCleanly) {
  CoreWarmer off({});
  off.Touch();
  EXPECT_EQ(off.threads(), 0);
  EXPECT_EQ(off.spinning(), 0);
  EXPECT_GE(CoreWarmer::AllCores(), 1);
  // Destroyed while spinning: the destructor must not wait for the window to close.
  const auto t0 = std::chrono::steady_clock::now();
  {
    CoreWarmer w({.threads = 2, .linger = absl::Hours(1)});
    w.Touch();
    ASSERT_TRUE(WaitForSpinning(w, 2));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

}  // namespace
}  // namespace ring::worker
