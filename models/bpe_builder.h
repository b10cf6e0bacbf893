// File: models/bpe_builder.h
//
// A small byte-level BPE tokenizer, built deterministically, in HF `tokenizers` format,
// plus the chat templates that go with it. `ringctl synth` writes these next to a random
// checkpoint so that the checkpoint can be served end to end (tokenize, render a chat,
// detokenize) without downloading a real tokenizer.
//
// The tokenizer has the shape of the real ones (shared spec §6):
//   - normalizer: none (GLM style) or NFC (Qwen style);
//   - pre_tokenizer: Sequence[Split(regex, Isolated), ByteLevel(no prefix space, no regex)]
//     with the GLM regex (digits in runs of 1-3) or the Qwen2 regex (single digits);
//   - model: BPE over the GPT-2 byte-to-unicode alphabet (ids 0..255 in GPT-2 order),
//     then merges learned by plain BPE training on an embedded English + code + CJK
//     sample (ties broken by the lexicographically smallest pair, so the result is the
//     same on every platform);
//   - added tokens (GLM: [gMASK], <sop>, <|user|>, ...; Qwen: <|im_start|>, <|im_end|>, ...)
//     with ids right after the BPE vocabulary;
//   - decoder: ByteLevel.
// Every byte sequence is encodable, so encode -> decode is the identity on NFC text.
//
//   TokenizerFiles t = BuildTokenizerFiles(TokenizerStyle::kGlm, 202752);
//   int64_t eos = t.TokenId("<|endoftext|>");
#ifndef RINGSERVE_MODELS_BPE_BUILDER_H_
#define RINGSERVE_MODELS_BPE_BUILDER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace ring {

enum class TokenizerStyle { kGlm, kQwen };

// The GPT-2 byte -> unicode character map (UTF-8 encoded), e.g. ' ' -> "Ġ".
const std::string& ByteToUnicode(uint8_t b);

// Splits `text` (UTF-8) the way the style's Split pre-tokenizer regex does. Unicode
// letter/number classes are approximated by the common scripts (Latin, Greek, Cyrillic,
// CJK, kana, Hangul); the splitter only feeds training statistics, the tokenizer file
// carries the real regex.
std::vector<std::string> PreTokenize(absl::string_view text, TokenizerStyle style);

struct BpeModel {
  std::vector<std::string> vocab;  // id -> token (byte-level unicode string)
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

// Plain BPE training on `text`: starts from the 256 byte tokens and greedily merges the
// most frequent adjacent pair (smallest pair on ties) until `num_merges` merges are made
// or no pair occurs twice.
BpeModel TrainByteLevelBpe(absl::string_view text, int num_merges, TokenizerStyle style);

// The embedded training sample (English prose, Python/C++/JSON, Chinese, Japanese).
absl::string_view BpeTrainingSample();

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = true;  // false for content-like tokens (<think>, <tool_call>, ...)
};

struct TokenizerFiles {
  std::string tokenizer_json;         // tokenizer.json
  std::string tokenizer_config_json;  // tokenizer_config.json
  std::string chat_template;          // chat_template.jinja
  std::vector<AddedToken> added_tokens;
  int64_t bpe_vocab_size = 0;  // ids [0, bpe_vocab_size) are BPE tokens
  int64_t vocab_size = 0;      // all ids, BPE + added; must be <= the model's vocab_size

  // Id of an added token, or -1.
  int64_t TokenId(absl::string_view content) const;
};

// Builds the tokenizer and chat template of a style. model_max_length goes into
// tokenizer_config.json. Deterministic; takes a few milliseconds.
TokenizerFiles BuildTokenizerFiles(TokenizerStyle style, int64_t model_max_length);

// The chat templates (Jinja2, as shipped in chat_template.jinja).
absl::string_view GlmChatTemplate();
absl::string_view QwenChatTemplate();

}  // namespace ring

#endif  // RINGSERVE_MODELS_BPE_BUILDER_H_
