#include "server/tokenizer_regex.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ring::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

std::vector<std::string> Matches(absl::string_view pattern, absl::string_view text) {
  auto re = Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status();
  Ranges r;
  EXPECT_TRUE((*re)->FindAll(text, &r).ok());
  std::vector<std::string> out;
  for (auto [s, e] : r) out.emplace_back(text.substr(s, e - s));
  return out;
}

constexpr absl::string_view kGlm =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(RegexTest, TranslatesOnigurumaEscapes) {
  constexpr absl::string_view kSpace =
      R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  EXPECT_EQ(*TranslateOnigPattern(R"(\s+(?!\S))"),
            absl::StrCat("[", kSpace, "]+(?![^", kSpace, "])"));
  EXPECT_EQ(*TranslateOnigPattern(R"(\h\u00e9[]a])"), R"([0-9a-fA-F]\x{00e9}[\]a])");
  // Categories get the code points Unicode 15/16 added to them.
  const std::string letters = *TranslateOnigPattern(R"(\p{L})");
  EXPECT_THAT(letters, HasSubstr(R"(\x{10D4A}-\x{10D65})"));
  EXPECT_EQ(letters.front(), '[');
  EXPECT_THAT(*TranslateOnigPattern(R"([^\s\p{N}])"), HasSubstr(R"(\p{N}\x{)"));
  EXPECT_EQ(*TranslateOnigPattern(R"(\p{Lt}\p{Han})"), R"(\p{Lt}\p{Han})");  // no delta
  EXPECT_THAT(*TranslateOnigPattern(R"(\P{L})"), HasSubstr(R"([^\p{L}\x{)"));
}

TEST(RegexTest, RejectsWhatItCannotTranslate) {
  for (absl::string_view p : {R"(\bword\b)", R"(\w+)", R"([\S])", R"([[:alpha:]])",
                              R"([a-z&&[^aeiou]])", R"([a[b]])", R"([\P{L}])", R"([\p{Cn}])"}) {
    auto t = TranslateOnigPattern(p);
    EXPECT_FALSE(t.ok()) << p;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << p;
  }
  EXPECT_THAT(std::string(Regex::Compile("(unclosed").status().message()), HasSubstr("(unclosed"));
}

TEST(RegexTest, UnicodePropertiesFollowOniguruma) {
  // U+10D4A (Garay, Unicode 16) is a letter for Oniguruma; U+11F50 (Kawi digit, Unicode
  // 15) a number; U+180E (Mongolian vowel separator) no longer a space.
  EXPECT_THAT(Matches(R"(\p{L}+)", "x\xF0\x90\xB5\x8Ay"), ElementsAre("x\xF0\x90\xB5\x8Ay"));
  EXPECT_THAT(Matches(R"(\p{N})", "1\xF0\x91\xBD\x90"), ElementsAre("1", "\xF0\x91\xBD\x90"));
  EXPECT_THAT(Matches(R"(\s)", "a\xE1\xA0\x8E" "b\xC2\x85"), ElementsAre("\xC2\x85"));
  // U+1171E moved from Mn to Mc in Unicode 15: excluded from \p{Mn} by a lookahead.
  EXPECT_THAT(Matches(R"(\p{Mn})", "\xF0\x91\x9C\x9E\xCC\x81"), ElementsAre("\xCC\x81"));
}

TEST(RegexTest, GlmPatternSplitsLikeHf) {
  // Expected splits from HF tokenizers' Split(Regex(GLM), "isolated").
  EXPECT_THAT(Matches(kGlm, "Hello, world! 1234567"),
              ElementsAre("Hello", ",", " world", "!", " ", "123", "456", "7"));
  EXPECT_THAT(Matches(kGlm, "a  \t\n b"), ElementsAre("a", "  \t\n", " b"));
  // U+0085 is whitespace for Oniguruma (not for plain PCRE2 UCP).
  EXPECT_THAT(Matches(kGlm, "a\xC2\x85\xC2\x85" "b"), ElementsAre("a", "\xC2\x85", "\xC2\x85" "b"));
  // (?i) folds the long s: 'ſ is a contraction.
  EXPECT_THAT(Matches(kGlm, "x'\xC5\xBF 'S"), ElementsAre("x", "'\xC5\xBF", " '", "S"));
  // \x1c-\x1f are not White_Space.
  EXPECT_THAT(Matches(kGlm, "\x1c\x1d\x1e\x1fx"), ElementsAre("\x1c\x1d\x1e\x1f", "x"));
}

TEST(RegexTest, EmptyMatchesFollowOnigurumaIteration) {
  // Oniguruma's find_iter skips an empty match right where the previous match ended.
  auto re = Regex::Compile("x*");
  ASSERT_TRUE(re.ok());
  Ranges r;
  ASSERT_TRUE((*re)->FindAll("axxb", &r).ok());
  EXPECT_EQ(r, (Ranges{{0, 0}, {1, 3}, {4, 4}}));
}

TEST(RegexTest, LiteralAndLongInputs) {
  auto lit = Regex::Literal("a.b");
  ASSERT_TRUE(lit.ok());
  Ranges r;
  ASSERT_TRUE((*lit)->FindAll("a.bxaxb a.b", &r).ok());
  EXPECT_EQ(r, (Ranges{{0, 3}, {8, 11}}));
  EXPECT_FALSE(Regex::Literal("").ok());
  // Long runs must not exhaust the JIT stack (backtracking of \s+(?!\S)).
  std::string spaces(200000, ' ');
  spaces += "x";
  EXPECT_THAT(Matches(kGlm, spaces), ElementsAre(std::string(199999, ' '), " x"));
}

}  // namespace
}  // namespace ring::text
