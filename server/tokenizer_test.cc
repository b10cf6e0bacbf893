#include "server/tokenizer.h"

#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/temp_dir_for_test.h"
#include "nlohmann/json.hpp"
#include "server/tokenizer_bpe.h"

namespace ring::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// Handwritten tokenizer.json files. Expected ids were checked against HF `tokenizers`
// 0.23 on the same files.

Json ByteLevelStep() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
          {"use_regex", false}};
}

Json SplitStep(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"},
          {"invert", false}};
}

Json AddedToken(const std::string& content, int id, bool special, Json extra = {}) {
  Json t = {{"id", id},         {"content", content}, {"single_word", false},
            {"lstrip", false},  {"rstrip", false},    {"normalized", false},
            {"special", special}};
  for (auto& [k, v] : extra.items()) t[k] = v;
  return t;
}

struct Spec {
  std::vector<std::string> vocab;  // id = position
  std::vector<std::pair<std::string, std::string>> merges;
  Json added = Json::array();
  Json normalizer = nullptr;
  Json pre_tokenizer = ByteLevelStep();
  Json model_extra = Json::object();  // unk_token, fuse_unk, byte_fallback, ...
};

Json ToJson(const Spec& s) {
  Json vocab = Json::object();
  for (size_t i = 0; i < s.vocab.size(); ++i) vocab[s.vocab[i]] = i;
  Json merges = Json::array();
  for (const auto& [a, b] : s.merges) merges.push_back({a, b});
  Json model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                {"merges", merges}};
  for (auto& [k, v] : s.model_extra.items()) model[k] = v;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", s.added},
          {"normalizer", s.normalizer},
          {"pre_tokenizer", s.pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", model}};
}

std::unique_ptr<Tokenizer> Load(const Spec& s) {
  auto tok = Tokenizer::FromJson(ToJson(s).dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

Ids Enc(const Tokenizer& t, absl::string_view text, bool allow_special = true) {
  auto ids = t.Encode(text, allow_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : Ids{};
}

// All 256 byte tokens with id == byte value, so ids spell out the bytes.
std::vector<std::string> AllBytes() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(ByteLevelChar(static_cast<uint8_t>(b)));
  return v;
}

Ids Bytes(absl::string_view s) {
  Ids ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(TokenizerTest, MergesApplyInRankOrder) {
  Spec s;
  s.vocab = {"a", "b", "c", "ab", "bc"};
  s.merges = {{"b", "c"}, {"a", "b"}};
  EXPECT_EQ(Enc(*Load(s), "abc"), (Ids{0, 4}));
  s.merges = {{"a", "b"}, {"b", "c"}};
  EXPECT_EQ(Enc(*Load(s), "abc"), (Ids{3, 2}));
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  Spec s;
  s.vocab = {"a", "aa", "aaaa"};
  s.merges = {{"a", "a"}, {"aa", "aa"}};
  auto tok = Load(s);
  EXPECT_EQ(Enc(*tok, "aaa"), (Ids{1, 0}));
  EXPECT_EQ(Enc(*tok, "aaaaa"), (Ids{2, 0}));
  // A long word takes the priority-queue path: same rule.
  Ids want(250, 2);
  want.push_back(1);
  EXPECT_EQ(Enc(*tok, std::string(1002, 'a')), want);
}

TEST(TokenizerTest, PreTokenizerBoundsTheMerges) {
  // GLM's regex keeps digits in runs of up to 3, Qwen's splits them singly: the same
  // merges give different ids.
  Spec s;
  s.vocab = AllBytes();
  s.vocab.insert(s.vocab.end(), {"12", "123", "45"});
  s.merges = {{"1", "2"}, {"12", "3"}, {"4", "5"}};
  const std::string glm =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  std::string qwen = glm;
  qwen.replace(qwen.find("\\p{N}{1,3}"), 10, "\\p{N}");
  s.pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", Json::array({SplitStep(glm), ByteLevelStep()})}};
  EXPECT_EQ(Enc(*Load(s), "12345"), (Ids{257, 258}));
  s.pre_tokenizer["pretokenizers"][0] = SplitStep(qwen);
  EXPECT_EQ(Enc(*Load(s), "12345"), Bytes("12345"));
}

class AddedTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Spec s;
    s.vocab = AllBytes();
    s.added = {AddedToken("<|im_start|>", 256, true), AddedToken("<|im_end|>", 257, true),
               AddedToken("<think>", 258, false), AddedToken("<|im", 259, false)};
    tok_ = Load(s);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(AddedTokensTest, AreSplitOutOfTheText) {
  EXPECT_EQ(Enc(*tok_, "x<|im_start|>y<think>z<|im_end|>"),
            (Ids{'x', 256, 'y', 258, 'z', 257}));
  // Leftmost-longest: "<|im_start|>" wins over its prefix "<|im".
  EXPECT_EQ(Enc(*tok_, "<|im_x"), (Ids{259, '_', 'x'}));
  // Near misses are text.
  Ids near = Bytes("_start|");
  near.insert(near.begin(), 259);
  EXPECT_EQ(Enc(*tok_, "<|im_start|"), near);
}

TEST_F(AddedTokensTest, AllowSpecialFalseKeepsOnlyNonSpecialTokens) {
  // HF encode_special_tokens=True: the special token is text, and the search resumes after
  // it, so "<|im" inside it is not matched either.
  Ids want = Bytes("x<|im_start|>y");
  want.insert(want.end(), {258, 'z'});
  EXPECT_EQ(Enc(*tok_, "x<|im_start|>y<think>z", /*allow_special=*/false), want);
}

TEST_F(AddedTokensTest, DecodeAndLookups) {
  const Ids ids = {'x', 256, 'y', 258, 'z', 257};
  EXPECT_EQ(tok_->Decode(ids), "x<|im_start|>y<think>z<|im_end|>");
  EXPECT_EQ(tok_->Decode(ids, /*skip_special_tokens=*/true), "xy<think>z");
  EXPECT_EQ(tok_->Decode({-1, 100000, 'h'}), "h");  // ids that are no token are skipped
  EXPECT_TRUE(tok_->IsSpecial(256));
  EXPECT_FALSE(tok_->IsSpecial(258));
  EXPECT_FALSE(tok_->IsSpecial('a'));
  EXPECT_EQ(tok_->TokenId("<think>"), 258);
  EXPECT_EQ(tok_->TokenId("\xC4\xA0"), ' ');
  EXPECT_EQ(tok_->TokenId("nope"), std::nullopt);
  EXPECT_EQ(tok_->TokenText(' '), "\xC4\xA0");
  EXPECT_EQ(tok_->TokenText(257), "<|im_end|>");
  EXPECT_EQ(tok_->TokenText(999), std::nullopt);
  EXPECT_EQ(tok_->vocab_size(), 260);
}

TEST(TokenizerTest, AddedTokenIdsAreAssignedAsHfDoes) {
  // HF ignores the file's id for a token that is not in the vocab: it takes the next free
  // id after the vocab (and warns).
  Spec s;
  s.vocab = AllBytes();
  s.added = {AddedToken("<x>", 1000, true), AddedToken("a", 5, false)};
  auto tok = Load(s);
  EXPECT_EQ(tok->TokenId("<x>"), 256);
  EXPECT_EQ(tok->TokenId("a"), 'a');  // already in the vocab: the vocab id
  EXPECT_EQ(tok->vocab_size(), 257);
}

TEST(TokenizerTest, LstripRstripSingleWord) {
  Spec s;
  s.vocab = AllBytes();
  s.added = {AddedToken("<mask>", 256, true, {{"lstrip", true}, {"rstrip", true}}),
             AddedToken("ab", 257, false, {{"single_word", true}})};
  auto tok = Load(s);
  EXPECT_EQ(Enc(*tok, "a  <mask>  b"), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(Enc(*tok, " <mask><mask> "), (Ids{256, 256}));
  EXPECT_EQ(Enc(*tok, "ab xab ab."), (Ids{257, ' ', 'x', 'a', 'b', ' ', 257, '.'}));
  EXPECT_EQ(Enc(*tok, "ab_ ab"), (Ids{'a', 'b', '_', ' ', 257}));
}

TEST(TokenizerTest, UnknownBytesBecomeUnkOrFallBackToBytes) {
  // 'é' is C3 A9: byte C3 stands for U+00C3, whose UTF-8 (C3 83) has <0x..> tokens (byte
  // fallback); byte A9 has neither and becomes <unk>.
  Spec s;
  s.vocab = {"a", "b", "<unk>", "<0xC3>", "<0x83>"};
  s.model_extra = {{"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true}};
  auto tok = Load(s);
  EXPECT_EQ(Enc(*tok, "a\xC3\xA9" "b"), (Ids{0, 3, 4, 2, 1}));
  EXPECT_EQ(Enc(*tok, "a\xC2\xA9" "b"), (Ids{0, 2, 1}));  // "©": two unknown bytes, fused
  // HF quirk kept: fallback tokens do not flush a pending unk, which then fuses with the
  // next unknown byte.
  EXPECT_EQ(Enc(*tok, "\xC2\xA9\xC3\xA9"), (Ids{3, 4, 2}));
  s.model_extra["fuse_unk"] = false;
  tok = Load(s);
  EXPECT_EQ(Enc(*tok, "a\xC2\xA9" "b"), (Ids{0, 2, 2, 1}));
  EXPECT_EQ(Enc(*tok, "\xC2\xA9\xC3\xA9"), (Ids{2, 3, 4, 2, 2}));
  // Without unk_token (and no fallback), unknown bytes vanish.
  s.model_extra = Json::object();
  EXPECT_EQ(Enc(*Load(s), "a\xC2\xA9" "b"), (Ids{0, 1}));
}

TEST(TokenizerTest, NfcNormalizerComposesBeforeTheModel) {
  Spec s;
  s.vocab = AllBytes();
  s.vocab.push_back("\xC3\x83\xC2\xA9");  // stand-ins of C3 A9 ("é") merged
  s.merges = {{"\xC3\x83", "\xC2\xA9"}};
  EXPECT_EQ(Enc(*Load(s), "e\xCC\x81"), (Ids{'e', 0xCC, 0x81}));  // no normalizer
  s.normalizer = {{"type", "NFC"}};
  auto tok = Load(s);
  EXPECT_EQ(Enc(*tok, "e\xCC\x81"), Ids{256});
  EXPECT_EQ(Enc(*tok, "\xC3\xA9"), Ids{256});
  s.normalizer = {{"type", "Sequence"}, {"normalizers", Json::array({{{"type", "NFC"}}})}};
  EXPECT_EQ(Enc(*Load(s), "e\xCC\x81"), Ids{256});
}

TEST(TokenizerTest, InvalidUtf8IsRejected) {
  Spec s;
  s.vocab = AllBytes();
  auto ids = Load(s)->Encode("ab\xC3");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  Spec s;
  s.vocab = AllBytes();
  s.vocab.insert(s.vocab.end(), {"th", "the", "\xC4\xA0the"});
  s.merges = {{"t", "h"}, {"th", "e"}, {"\xC4\xA0", "the"}};
  s.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = Load(s);
  std::vector<std::string> texts;
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string t;
    for (int w = 0; w < 30; ++w) t += (rng() % 3 ? "the " : "then ") + std::to_string(rng() % 50);
    texts.push_back(t);
  }
  std::vector<Ids> want;
  for (const auto& t : texts) want.push_back(Enc(*tok, t));
  EXPECT_EQ(want[0][0], 258);  // add_prefix_space: the first word is " the"
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = tok->Encode(texts[(i + k * 7) % texts.size()]);
          if (!ids.ok() || *ids != want[(i + k * 7) % texts.size()]) ++bad[k];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(bad, ElementsAre(0, 0, 0, 0));
}

TEST(StreamDecoderTest, NeverSplitsACharacter) {
  Spec s;
  s.vocab = AllBytes();
  s.added = {AddedToken("<|end|>", 256, true)};
  auto tok = Load(s);
  // 👍🏽 = F0 9F 91 8D | F0 9F 8F BD, one byte token each.
  const Ids ids = Enc(*tok, "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD");
  ASSERT_EQ(ids.size(), 8u);
  StreamDecoder stream(tok.get(), /*skip_special_tokens=*/false);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(stream.Push(id));
  EXPECT_THAT(out, ElementsAre("", "", "", "\xF0\x9F\x91\x8D", "", "", "", "\xF0\x9F\x8F\xBD"));
  EXPECT_EQ(stream.Finish(), "");

  // An invalid run is emitted as U+FFFD once it can no longer become a character; an
  // unfinished one at the end becomes U+FFFD at Finish().
  EXPECT_EQ(stream.Push(0xF0), "");
  EXPECT_EQ(stream.Push(0x9F), "");
  EXPECT_EQ(stream.Push('a'), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(stream.Push(0xE2), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");

  StreamDecoder skipping(tok.get(), /*skip_special_tokens=*/true);
  EXPECT_EQ(skipping.Push('h'), "h");
  EXPECT_EQ(skipping.Push(256), "");
  StreamDecoder keeping(tok.get(), /*skip_special_tokens=*/false);
  EXPECT_EQ(keeping.Push(256), "<|end|>");
}

TEST(StreamDecoderTest, ConcatenationEqualsDecode) {
  Spec s;
  s.vocab = AllBytes();
  s.vocab.push_back("\xC3\xA4\xC2\xBD");  // stand-ins of E4 BD (2/3 of a CJK character)
  s.added = {AddedToken("<|end|>", 257, true), AddedToken("<t>", 258, false)};
  auto tok = Load(s);
  std::mt19937 rng(9);
  for (int iter = 0; iter < 5000; ++iter) {
    Ids ids(rng() % 12);
    for (int32_t& id : ids) {
      const int r = rng() % 10;
      id = r < 6 ? static_cast<int32_t>(0x80 + rng() % 0x80) : r < 8 ? 'a' : 256 + rng() % 4;
    }
    for (bool skip : {false, true}) {
      StreamDecoder stream(tok.get(), skip);
      std::string got;
      for (int32_t id : ids) got += stream.Push(id);
      got += stream.Finish();
      ASSERT_EQ(got, tok->Decode(ids, skip)) << "iteration " << iter;
    }
  }
}

struct BadFile {
  const char* what;
  std::function<void(Json&)> edit;
  absl::StatusCode code;
  const char* message;  // must appear in the error
};

TEST(TokenizerTest, MalformedOrUnsupportedFilesFailAtLoadNamingTheCulprit) {
  Spec s;
  s.vocab = {"a", "b", "ab"};
  s.merges = {{"a", "b"}};
  const std::vector<BadFile> cases = {
      {"vocab not an object", [](Json& j) { j["model"]["vocab"] = Json::array(); },
       absl::StatusCode::kInvalidArgument, "model.vocab"},
      {"bad merge", [](Json& j) { j["model"]["merges"] = {"ab"}; },
       absl::StatusCode::kInvalidArgument, "model.merges[0]"},
      {"merge of unknown token", [](Json& j) { j["model"]["merges"] = {"a c"}; },
       absl::StatusCode::kInvalidArgument, "\"c\" is not in model.vocab"},
      {"added token without content",
       [](Json& j) { j["added_tokens"] = {{{"id", 3}, {"content", "x"}}, {{"id", 4}}}; },
       absl::StatusCode::kInvalidArgument, "added_tokens[1].content"},
      {"added token flag not a bool",
       [](Json& j) { j["added_tokens"] = {{{"content", "x"}, {"special", "yes"}}}; },
       absl::StatusCode::kInvalidArgument, "added_tokens[0].special"},
      {"bad split behavior",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {SplitStep("a"), ByteLevelStep()}}};
         j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
       },
       absl::StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers[0].behavior"},
      {"unknown version", [](Json& j) { j["version"] = "2.0"; },
       absl::StatusCode::kInvalidArgument, "version"},
      {"Lowercase normalizer", [](Json& j) { j["normalizer"] = {{"type", "Lowercase"}}; },
       absl::StatusCode::kUnimplemented, "normalizer Lowercase"},
      {"NFKC inside a Sequence",
       [](Json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}};
       },
       absl::StatusCode::kUnimplemented, "normalizer.normalizers[1]: normalizer NFKC"},
      {"Metaspace pre-tokenizer",
       [](Json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
       absl::StatusCode::kUnimplemented, "pre-tokenizer Metaspace"},
      {"no ByteLevel", [](Json& j) { j["pre_tokenizer"] = SplitStep("a"); },
       absl::StatusCode::kUnimplemented, "does not end in ByteLevel"},
      {"untranslatable regex",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {SplitStep("\\bx"), ByteLevelStep()}}};
       },
       absl::StatusCode::kUnimplemented, "word boundary"},
      {"WordPiece model", [](Json& j) { j["model"]["type"] = "WordPiece"; },
       absl::StatusCode::kUnimplemented, "model WordPiece"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; },
       absl::StatusCode::kUnimplemented, "model.dropout"},
      {"subword prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       absl::StatusCode::kUnimplemented, "continuing_subword_prefix"},
      {"Metaspace decoder", [](Json& j) { j["decoder"] = {{"type", "Metaspace"}}; },
       absl::StatusCode::kUnimplemented, "decoder Metaspace"},
      {"null decoder", [](Json& j) { j["decoder"] = nullptr; },
       absl::StatusCode::kUnimplemented, "decoder"},
      {"unknown post-processor", [](Json& j) { j["post_processor"] = {{"type", "Magic"}}; },
       absl::StatusCode::kUnimplemented, "post-processor Magic"},
  };
  for (const BadFile& c : cases) {
    Json j = ToJson(s);
    c.edit(j);
    auto tok = Tokenizer::FromJson(j.dump());
    ASSERT_FALSE(tok.ok()) << c.what;
    EXPECT_EQ(tok.status().code(), c.code) << c.what << ": " << tok.status();
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(c.message)) << c.what;
  }
  auto syntax = Tokenizer::FromJson("{\"model\": ");
  EXPECT_EQ(syntax.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(syntax.status().message()), HasSubstr("invalid JSON"));
}

class ModelDirTest : public TempDirTest {
 protected:
  void Write(const std::string& name, const Json& j) {
    std::ofstream(dir_ / name) << j.dump(2);
  }
  Json TokenizerJson() {
    Spec s;
    s.vocab = AllBytes();
    s.added = {AddedToken("<|endoftext|>", 256, true), AddedToken("<|im_end|>", 257, true)};
    return ToJson(s);
  }
  Json Entry(const std::string& content, bool special) {
    return {{"content", content}, {"lstrip", false}, {"normalized", false},
            {"rstrip", false},    {"single_word", false}, {"special", special}};
  }
};

TEST_F(ModelDirTest, ReadsTokenizerConfig) {
  Write("tokenizer.json", TokenizerJson());
  Write("tokenizer_config.json",
        {{"added_tokens_decoder",
          {{"256", Entry("<|endoftext|>", true)}, {"258", Entry("<tool_call>", false)}}},
         {"bos_token", nullptr},
         {"eos_token", {{"__type", "AddedToken"}, {"content", "<|im_end|>"}}}});
  auto tok = Tokenizer::FromModelDir(dir_.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->eos_id(), 257);
  EXPECT_EQ((*tok)->bos_id(), std::nullopt);
  EXPECT_EQ((*tok)->TokenId("<tool_call>"), 258);  // added from the config
  EXPECT_EQ(Enc(**tok, "a<tool_call>"), (Ids{'a', 258}));
}

TEST_F(ModelDirTest, WorksWithoutConfig) {
  Write("tokenizer.json", TokenizerJson());
  auto tok = Tokenizer::FromModelDir(dir_.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->eos_id(), std::nullopt);
}

TEST_F(ModelDirTest, RejectsConfigsThatDisagree) {
  Write("tokenizer.json", TokenizerJson());
  Write("tokenizer_config.json", {{"eos_token", "<|eot|>"}});
  auto tok = Tokenizer::FromModelDir(dir_.string());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("eos_token \"<|eot|>\""));
  Write("tokenizer_config.json", {{"added_tokens_decoder", {{"300", Entry("<x>", true)}}}});
  tok = Tokenizer::FromModelDir(dir_.string());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("has id 300"));
  EXPECT_EQ(Tokenizer::FromModelDir((dir_ / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ring::text
