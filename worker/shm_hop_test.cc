#include "worker/shm_hop.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ring::worker {
namespace {

std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

struct Pair {
  std::unique_ptr<ShmHop> tx, rx;
};

Pair MakePair(ShmHopOptions o) {
  o.peer = "test peer";
  absl::StatusOr<std::unique_ptr<ShmHop>> tx = ShmHop::Create(o);
  EXPECT_TRUE(tx.ok()) << tx.status();
  absl::StatusOr<std::unique_ptr<ShmHop>> rx = ShmHop::Open((*tx)->name(), o);
  EXPECT_TRUE(rx.ok()) << rx.status();
  (*tx)->Unlink();
  return {*std::move(tx), *std::move(rx)};
}

TEST(ShmHopTest, MessagesOfEverySizeArriveWholeAndInOrder) {
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Milliseconds(5)}) {
    Pair p = MakePair({.capacity = 4096, .spin = spin, .peer = {}});
    // Sizes around the ring's capacity and far above it (streamed through in pieces).
    const std::vector<size_t> sizes = {0, 1, 7, 8, 4087, 4088, 4096, 4097, 12288, 100000, 3, 65536};
    std::thread sender([&] {
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_TRUE(p.tx->Send(Pattern(sizes[i], i), absl::Now() + absl::Seconds(20)).ok());
      }
    });
    // Every other message into one reused buffer (ReceiveInto, as a worker's reader does),
    // which grows and shrinks with the sizes.
    std::string buffer;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (i % 2 == 1) {
        const absl::Status s = p.rx->ReceiveInto(&buffer, absl::Now() + absl::Seconds(20), absl::Seconds(20));
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(buffer, Pattern(sizes[i], i)) << "message " << i << " of " << sizes[i] << " bytes, reused buffer";
        continue;
      }
      absl::StatusOr<std::string> m = p.rx->Receive(absl::Now() + absl::Seconds(20), absl::Seconds(20));
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(*m, Pattern(sizes[i], i)) << "message " << i << " of " << sizes[i] << " bytes";
    }
    sender.join();
  }
}

TEST(ShmHopTest, ManyMessagesUnderContention) {
  Pair p = MakePair({.capacity = 8192, .spin = absl::Microseconds(200), .peer = {}});
  constexpr int kMessages = 2000;
  std::thread sender([&] {
    std::mt19937 rng(7);
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE(p.tx->Send(Pattern(rng() % 20000, i), absl::Now() + absl::Seconds(20)).ok());
    }
  });
  std::mt19937 rng(7);
  for (int i = 0; i < kMessages; ++i) {
    absl::StatusOr<std::string> m = p.rx->Receive(absl::Now() + absl::Seconds(20), absl::Seconds(20));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(*m, Pattern(rng() % 20000, i)) << i;
  }
  sender.join();
}

TEST(ShmHopTest, IdleReceiveTimesOutAndStaysUsable) {
  Pair p = MakePair({});
  absl::StatusOr<std::string> m = p.rx->Receive(absl::Now() + absl::Milliseconds(20), absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();
  EXPECT_TRUE(p.rx->status().ok());
  ASSERT_TRUE(p.tx->Send("after", absl::Now() + absl::Seconds(5)).ok());
  m = p.rx->Receive(absl::Now() + absl::Seconds(5), absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, "after");
}

TEST(ShmHopTest, AFullRingFailsTheSendAtItsDeadlineNamingThePeer) {
  Pair p = MakePair({.capacity = 4096, .spin = {}, .peer = {}});
  absl::Status s = p.tx->Send(std::string(10000, 'x'), absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("test peer"), std::string::npos) << s;
  // Part of it is in the ring: the hop is broken for good.
  EXPECT_FALSE(p.tx->Send("x", absl::Now() + absl::Seconds(1)).ok());
}

TEST(ShmHopTest, ClosingEitherEndEndsThePeersWaits) {
  {
    Pair p = MakePair({.spin = absl::Milliseconds(1), .peer = {}});
    std::thread closer([&] {
      absl::SleepFor(absl::Milliseconds(30));
      p.tx.reset();  // the sender goes away
    });
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> m = p.rx->Receive(absl::Now() + absl::Seconds(30), absl::Seconds(30));
    closer.join();
    EXPECT_TRUE(absl::IsFailedPrecondition(m.status())) << m.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  {
    Pair p = MakePair({});
    ASSERT_TRUE(p.tx->Send("last words", absl::Now() + absl::Seconds(5)).ok());
    p.tx.reset();
    // What was sent before the sender closed is still delivered.
    absl::StatusOr<std::string> m = p.rx->Receive(absl::Now() + absl::Seconds(5), absl::Seconds(5));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(*m, "last words");
    p.rx->Close();
    EXPECT_TRUE(absl::IsCancelled(p.rx->Receive(absl::Now() + absl::Seconds(1), absl::Seconds(1)).status()));
  }
  {
    Pair p = MakePair({});
    p.rx.reset();  // the receiver goes away
    absl::Status s = p.tx->Send("x", absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_NE(s.message().find("closed its end"), std::string::npos) << s;
  }
  {
    // Close from another thread ends this end's own wait at once.
    Pair p = MakePair({});
    std::thread closer([&] {
      absl::SleepFor(absl::Milliseconds(30));
      p.rx->Close();
    });
    absl::StatusOr<std::string> m = p.rx->Receive(absl::Now() + absl::Seconds(30), absl::Seconds(30));
    closer.join();
    EXPECT_TRUE(absl::IsCancelled(m.status())) << m.status();
  }
}

TEST(ShmHopTest, AReceiverInAnotherProcessThatDiesIsNoticed) {
  absl::StatusOr<std::unique_ptr<ShmHop>> tx = ShmHop::Create({.capacity = 4096, .peer = "child"});
  ASSERT_TRUE(tx.ok()) << tx.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Opens the hop, reads one message and echoes nothing; then dies without closing.
    auto rx = ShmHop::Open((*tx)->name(), {});
    if (!rx.ok()) _exit(2);
    auto m = (*rx)->Receive(absl::Now() + absl::Seconds(10), absl::Seconds(10));
    _exit(m.ok() && *m == "hello" ? 0 : 3);
  }
  ASSERT_TRUE((*tx)->Send("hello", absl::Now() + absl::Seconds(10)).ok());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // The child opened it (so its pid is known) and is gone; filling the ring must end with
  // "exited" well before the deadline rather than hang until it.
  const absl::Time start = absl::Now();
  absl::Status s = (*tx)->Send(std::string(8192, 'y'), absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("exited"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ShmHopTest, OpenRefusesWhatIsNotAHop) {
  EXPECT_TRUE(absl::IsInvalidArgument(ShmHop::Open("/etc/passwd", {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShmHop::Open("/ringserve-hop-x/../y", {}).status()));
  EXPECT_TRUE(absl::IsNotFound(ShmHop::Open("/ringserve-hop-does-not-exist", {}).status()));
  // A segment under a hop's name that holds something else.
  const std::string name = absl::StrCat("/ringserve-hop-test-", getpid());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 16384), 0);
  absl::Status s = ShmHop::Open(name, {}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("not a hop"), std::string::npos) << s;
  shm_unlink(name.c_str());
  close(fd);
  // A hop has one receiver.
  absl::StatusOr<std::unique_ptr<ShmHop>> tx = ShmHop::Create({});
  ASSERT_TRUE(tx.ok());
  absl::StatusOr<std::unique_ptr<ShmHop>> rx = ShmHop::Open((*tx)->name(), {});
  ASSERT_TRUE(rx.ok());
  s = ShmHop::Open((*tx)->name(), {}).status();
  EXPECT_NE(s.message().find("already opened"), std::string::npos) << s;
  // Unlinked: the name is gone, the hop still works.
  (*tx)->Unlink();
  EXPECT_TRUE(absl::IsNotFound(ShmHop::Open((*tx)->name(), {}).status()));
  ASSERT_TRUE((*tx)->Send("ok", absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(*(*rx)->Receive(absl::Now() + absl::Seconds(5), absl::Seconds(5)), "ok");
}

}  // namespace
}  // namespace ring::worker
