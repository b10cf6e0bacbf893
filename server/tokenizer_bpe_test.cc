#include "server/tokenizer_bpe.h"

#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ring::text {
namespace {

using ::testing::HasSubstr;

TEST(ByteLevelTest, AlphabetIsGpt2s) {
  EXPECT_EQ(ByteLevelChar(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(ByteLevelChar('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(ByteLevelChar('a'), "a");
  EXPECT_EQ(ByteLevelChar(0xE9), "\xC3\xA9");  // printable Latin-1 stands for itself
  EXPECT_EQ(ByteLevelChar(0xAD), "\xC5\x83");  // soft hyphen is not printable: U+0143
  std::set<std::string> distinct;
  for (int b = 0; b < 256; ++b) {
    distinct.insert(ByteLevelChar(static_cast<uint8_t>(b)));
    EXPECT_EQ(ByteLevelDecodeToken(ByteLevelChar(static_cast<uint8_t>(b))),
              std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(distinct.size(), 256u);
  // A token with a character outside the alphabet decodes to its own bytes, as HF's does.
  EXPECT_EQ(ByteLevelDecodeToken("\xC4\xA0x"), " x");
  EXPECT_EQ(ByteLevelDecodeToken("a b"), "a b");
  EXPECT_EQ(ByteLevelDecodeToken("<|im_end|>"), "<|im_end|>");
}

TEST(BpeModelTest, RejectsMergesOutsideTheVocab) {
  BpeOptions o;
  o.vocab = {{"a", 0}, {"b", 1}};
  o.merges = {{"a", "b"}};
  auto m = BpeModel::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("merges[0]"));
  o.merges = {{"a", "c"}};
  EXPECT_THAT(std::string(BpeModel::Create(o).status().message()), HasSubstr("\"c\""));
  o.merges.clear();
  o.unk_token = "<unk>";
  EXPECT_THAT(std::string(BpeModel::Create(o).status().message()), HasSubstr("unk_token"));
}

// A random merge table over a 4-letter alphabet: the scan used for short words and the
// priority queue used for long ones (and by HF) must give the same merges.
TEST(BpeModelTest, ShortAndLongMergeAgree) {
  std::mt19937 rng(5);
  BpeOptions o;
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  for (size_t i = 0; i < tokens.size(); ++i) o.vocab.emplace_back(tokens[i], i);
  std::set<std::string> known(tokens.begin(), tokens.end());
  while (o.merges.size() < 300) {
    const std::string& x = tokens[rng() % tokens.size()];
    const std::string& y = tokens[rng() % std::min<size_t>(tokens.size(), 12)];
    if (x.size() + y.size() > 12) continue;
    o.merges.emplace_back(x, y);
    if (known.insert(x + y).second) {
      o.vocab.emplace_back(x + y, static_cast<int32_t>(tokens.size()));
      tokens.push_back(x + y);
    }
  }
  auto model = BpeModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<int32_t> word(2 + rng() % 60);
    for (int32_t& s : word) s = static_cast<int32_t>(rng() % 4);
    std::vector<int32_t> a = word, b = word;
    (*model)->MergeShort(&a);
    (*model)->MergeLong(&b);
    ASSERT_EQ(a, b) << "iteration " << iter;
  }
}

TEST(BpeModelTest, TokenizeUsesByteSymbolsAndCache) {
  BpeOptions o;
  // Vocab of the byte-level characters for 'a', 'b' and ' ' (Ġ) plus merges.
  o.vocab = {{"a", 0}, {"b", 1}, {"\xC4\xA0", 2}, {"ab", 3}, {"\xC4\xA0" "ab", 4}};
  o.merges = {{"a", "b"}, {"\xC4\xA0", "ab"}};
  auto model = BpeModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  for (int pass = 0; pass < 2; ++pass) {  // the second pass is served from the cache
    std::vector<int32_t> ids;
    (*model)->Tokenize(" ab", &ids);
    (*model)->Tokenize("ba", &ids);
    (*model)->Tokenize("zz", &ids);  // no unk_token: unknown bytes vanish, as in HF
    EXPECT_EQ(ids, (std::vector<int32_t>{4, 1, 0}));
  }
}

}  // namespace
}  // namespace ring::text
