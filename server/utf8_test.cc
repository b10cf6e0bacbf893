#include "server/utf8.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "utf8proc.h"

namespace ring::text {
namespace {

std::string Lossy(absl::string_view bytes) {
  std::string out;
  AppendUtf8Lossy(bytes, &out);
  return out;
}

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));
  EXPECT_TRUE(IsValidUtf8("héllo 中文 \xF0\x9F\x98\x80 plain ascii longer than eight bytes"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("abcdefgh\xE2\x82"));  // truncated after an ASCII block
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

// Expected values are Python's bytes.decode("utf-8", "replace"), which follows the same
// "maximal subpart" rule as Rust's String::from_utf8_lossy.
TEST(Utf8Test, LossyReplacesEachMaximalInvalidSubpartOnce) {
  const std::string r = kFffd;
  EXPECT_EQ(Lossy("\xF0\x9F\x98"), r);
  EXPECT_EQ(Lossy("\xE0\x80"), r + r);
  EXPECT_EQ(Lossy("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(Lossy("\xC0\xAF"), r + r);
  EXPECT_EQ(Lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(Lossy("a\xFF" "b"), "a" + r + "b");
  EXPECT_EQ(Lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(Lossy("\xE2\x82" "a"), r + "a");
  EXPECT_EQ(Lossy("\xF1\x80\x80\xC2"), r + r);
  EXPECT_EQ(Lossy("\x80\x80"), r + r);
  EXPECT_EQ(Lossy("\xF0\x80\x80\x80"), r + r + r + r);
}

TEST(Utf8Test, StreamCutHoldsBackOnlyAnUnfinishedCharacter) {
  EXPECT_EQ(Utf8StreamCut(""), 0u);
  EXPECT_EQ(Utf8StreamCut("abc"), 3u);
  EXPECT_EQ(Utf8StreamCut("ab\xF0"), 2u);
  EXPECT_EQ(Utf8StreamCut("ab\xF0\x9F"), 2u);
  EXPECT_EQ(Utf8StreamCut("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(Utf8StreamCut("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(Utf8StreamCut("ab\xF0\x80"), 4u);   // F0 80 can never become a character
  EXPECT_EQ(Utf8StreamCut("ab\xFF"), 3u);
  EXPECT_EQ(Utf8StreamCut("\x80\x80\x80"), 3u);
  EXPECT_EQ(Utf8StreamCut("\xE2\x82"), 0u);
}

TEST(Utf8Test, StreamCutIsConsistentWithLossyDecoding) {
  // For random byte strings cut at random points, decoding the pieces as a stream equals
  // decoding the whole.
  std::mt19937 rng(7);
  const uint8_t interesting[] = {'a', 0x80, 0x9F, 0xA0, 0xBF, 0xC2, 0xDF, 0xE0, 0xE2, 0xED,
                                 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF};
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bytes;
    const int n = rng() % 12;
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>(interesting[rng() % 16]));
    std::string pending, streamed;
    for (size_t i = 0; i < bytes.size();) {
      const size_t take = 1 + rng() % 3;
      pending += bytes.substr(i, take);
      i += take;
      const size_t cut = Utf8StreamCut(pending);
      AppendUtf8Lossy(absl::string_view(pending).substr(0, cut), &streamed);
      pending.erase(0, cut);
    }
    AppendUtf8Lossy(pending, &streamed);
    ASSERT_EQ(streamed, Lossy(bytes)) << "iteration " << iter;
  }
}

TEST(Utf8Test, Nfc) {
  EXPECT_EQ(NfcNormalize("e\xCC\x81"), "\xC3\xA9");                    // e + U+0301 -> é
  EXPECT_EQ(NfcNormalize("\xE2\x84\xAB"), "\xC3\x85");                 // Angstrom sign -> Å
  EXPECT_EQ(NfcNormalize("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // jamo -> 가
  EXPECT_EQ(NfcNormalize("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");  // excluded U+0958
  // a + U+0301 + U+0323: reordered (ccc 220 before 230), then a+U+0323 -> U+1EA1.
  EXPECT_EQ(NfcNormalize("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");
  EXPECT_EQ(NfcNormalize("plain"), "plain");
  EXPECT_TRUE(IsNfcInvariant("héllo 中文 가 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"));
  EXPECT_FALSE(IsNfcInvariant("e\xCC\x81"));
  EXPECT_FALSE(IsNfcInvariant("\xE2\x84\xAB"));
  EXPECT_FALSE(IsNfcInvariant("\xEA\xB0\x80\xE1\x86\xA8"));  // 가 + final jamo composes
}

std::string Utf8procNfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string r(reinterpret_cast<char*>(out), n < 0 ? 0 : n);
  std::free(out);
  return r;
}

TEST(Utf8Test, NfcFastPathNeverSkipsAChange) {
  // Strings the fast path calls invariant must really be NFC (checked against utf8proc
  // itself), over code points around every area with compositions.
  std::mt19937 rng(11);
  const std::pair<char32_t, char32_t> ranges[] = {
      {0x20, 0x7E},     {0xA0, 0x24F},    {0x300, 0x36F},   {0x370, 0x3FF},
      {0x900, 0x9FF},   {0xB00, 0xBFF},   {0xF00, 0xFFF},   {0x1000, 0x109F},
      {0x1100, 0x11FF}, {0x1E00, 0x1FFF}, {0x2100, 0x21FF}, {0x3040, 0x30FF},
      {0xAC00, 0xAC40}, {0xF900, 0xFAFF}, {0x1D15E, 0x1D1C0}, {0x2F800, 0x2FA1D}};
  int invariant = 0;
  for (int iter = 0; iter < 30000; ++iter) {
    std::string s;
    const int n = 1 + rng() % 4;
    for (int i = 0; i < n; ++i) {
      const auto& [lo, hi] = ranges[rng() % std::size(ranges)];
      AppendUtf8(lo + rng() % (hi - lo + 1), &s);
    }
    if (IsNfcInvariant(s)) {
      ++invariant;
      ASSERT_EQ(Utf8procNfc(s), s) << "iteration " << iter;
    }
    ASSERT_EQ(NfcNormalize(s), Utf8procNfc(s)) << "iteration " << iter;
  }
  EXPECT_GT(invariant, 1000);  // the fast path is actually taken
}

}  // namespace
}  // namespace ring::text
