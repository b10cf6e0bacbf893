// File: server/tokenizer.h
//
// The HF `tokenizers` byte-level BPE tokenizer (tokenizer.json), in C++, giving the same
// ids and the same text as the Python library for GLM- and Qwen-style files (and any other
// file made of the components below). Parity is checked on 10,000 strings per tokenizer
// file, for 7 files, by tests/tokenizer_parity.py.
//
//   RING_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromModelDir(dir));
//   RING_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(prompt));
//   StreamDecoder stream(tok.get(), /*skip_special_tokens=*/true);
//   for (int32_t id : generated) send(stream.Push(id));
//   send(stream.Finish());
//
// Pipeline (as HF's TokenizerImpl::encode): added tokens are split out of the raw text
// first (those with normalized=false on the raw text, then those with normalized=true on
// each normalized piece; leftmost-longest, honouring lstrip/rstrip/single_word), the
// rest is normalized, pre-tokenized, and each piece goes through the BPE model.
//
// Supported components (anything else fails at load with an error naming it; a file is
// never accepted and then tokenized differently):
//   normalizer      null, NFC, Sequence of those
//   pre_tokenizer   ByteLevel (add_prefix_space, use_regex: the GPT-2 regex), Split
//                   (Regex or String pattern, every behavior, invert), Sequence of Splits
//                   ending in one ByteLevel. Regexes are Oniguruma patterns run with PCRE2
//                   (UTF + UCP); \s, \w, \h are translated to Oniguruma's meaning.
//   model           BPE: vocab, merges ("a b" strings or [a, b] pairs), ignore_merges,
//                   byte_fallback, unk_token, fuse_unk; no dropout, no subword affixes.
//   post_processor  null, ByteLevel, TemplateProcessing, BertProcessing,
//                   RobertaProcessing, Sequence. Encode() is HF encode(text,
//                   add_special_tokens=False): the server adds BOS/template tokens itself
//                   through the chat template, so post-processors never change ids here.
//   decoder         ByteLevel, or a Sequence holding one ByteLevel.
//   truncation, padding: ignored (the server enforces its own length limits and never
//                   truncates a prompt silently).
//
// Thread safety: a Tokenizer is immutable after load (the BPE word cache is internally
// synchronized); all const methods may be called concurrently. A StreamDecoder belongs to
// one stream and is not thread-safe.
#ifndef RINGSERVE_SERVER_TOKENIZER_H_
#define RINGSERVE_SERVER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ring::text {

class TokenizerImpl;

class Tokenizer {
 public:
  // Parses a tokenizer.json. InvalidArgument names the offending field for malformed
  // files; Unimplemented names the component for valid files this class cannot run.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view tokenizer_json);

  // tokenizer.json of a model dir, plus tokenizer_config.json when present:
  // added_tokens_decoder entries missing from tokenizer.json are added (as transformers
  // does; an id that would differ from the one the config states is an error), and
  // bos_token / eos_token give bos_id() / eos_id() (a name that is not a token is an error).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDir(const std::string& dir);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text` (HF encode(text, add_special_tokens=False)). InvalidArgument on
  // invalid UTF-8 input. allow_special: added tokens in the text are matched (HF default
  // behaviour of encode()); false treats special added tokens as plain text (HF's
  // encode_special_tokens=True) while non-special added tokens are still matched.
  // ResourceExhausted only if a regex exceeds PCRE2's match limits.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool allow_special = true) const;

  // Like HF decode(ids, skip_special_tokens): invalid UTF-8 byte runs become U+FFFD as HF
  // does (one per maximal invalid subsequence). Ids that are no token are skipped, as HF
  // skips them. skip_special_tokens drops the added tokens marked special only.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // max id + 1, over the BPE vocab and the added tokens
  // Id of a token string (raw token text, e.g. "Ġthe" or "<|im_end|>"): added tokens
  // first, then the BPE vocab, as HF's token_to_id.
  std::optional<int32_t> TokenId(absl::string_view token) const;
  std::optional<std::string> TokenText(int32_t id) const;  // raw token string
  bool IsSpecial(int32_t id) const;  // added token with special=true
  // From tokenizer_config.json (FromModelDir only); nullopt when absent or null.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // The bytes one token contributes to Decode() before UTF-8 repair (empty for unknown
  // ids), and whether Decode(..., skip_special_tokens=true) drops it. For StreamDecoder.
  absl::string_view TokenBytes(int32_t id) const;
  bool SkippedWhenSkippingSpecial(int32_t id) const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Incremental detokenizer for streaming: never emits half a UTF-8 character;
// concatenation of all Push()es + Finish() == Decode(all ids, skip_special_tokens).
// Holds back at most 3 bytes (an unfinished character); an invalid byte run is emitted as
// U+FFFD as soon as it can no longer become a character. `tokenizer` must outlive it.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens);
  // The text that `id` completes (possibly empty).
  std::string Push(int32_t id);
  // The rest (an unfinished character at the end of the stream becomes U+FFFD). The
  // decoder is then empty and may be reused for a new stream.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // bytes of an unfinished character
};

}  // namespace ring::text

#endif  // RINGSERVE_SERVER_TOKENIZER_H_
