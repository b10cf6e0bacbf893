#include "server/stop_matcher.h"

#include <random>

#include "gtest/gtest.h"

namespace ring {
namespace {

// Feeds `text` in pieces and returns what was emitted and whether it stopped.
std::pair<std::string, bool> Feed(const std::vector<std::string>& stops,
                                 const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.Push(p);
    out += r.text;
    if (r.stopped) return {out, true};
  }
  out += m.Flush();
  return {out, false};
}

TEST(StopMatcherTest, NoStopsPassesEverything) {
  EXPECT_EQ(Feed({}, {"a", "b"}), std::make_pair(std::string("ab"), false));
}

TEST(StopMatcherTest, StopAcrossPieces) {
  EXPECT_EQ(Feed({"END"}, {"Hello E", "N", "D tail"}), std::make_pair(std::string("Hello "), true));
}

TEST(StopMatcherTest, PartialPrefixIsReleasedAtFlush) {
  EXPECT_EQ(Feed({"END"}, {"Hello EN"}), std::make_pair(std::string("Hello EN"), false));
}

TEST(StopMatcherTest, HoldsBackOnlyPossiblePrefix) {
  StopMatcher m({"END"});
  auto r = m.Push("abcE");
  EXPECT_EQ(r.text, "abc");
  r = m.Push("x");
  EXPECT_EQ(r.text, "Ex");
  EXPECT_FALSE(r.stopped);
}

TEST(StopMatcherTest, EarliestOfSeveralStops) {
  EXPECT_EQ(Feed({"cd", "b"}, {"abcd"}), std::make_pair(std::string("a"), true));
}

// Any split of the text into pieces gives the same result as one piece.
TEST(StopMatcherTest, SplitInvariance) {
  const std::string text = "the quick <|end|> brown fox\n\njumps";
  const std::vector<std::string> stops = {"<|end|>", "\n\n", "zzz"};
  const auto whole = Feed(stops, {text});
  EXPECT_EQ(whole, std::make_pair(std::string("the quick "), true));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> pieces;
    size_t i = 0;
    while (i < text.size()) {
      size_t n = 1 + rng() % 5;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    EXPECT_EQ(Feed(stops, pieces), whole);
  }
}

}  // namespace
}  // namespace ring
