// File: server/tokenizer_bpe.h  (internal to ring_text)
//
// The BPE model of a byte-level tokenizer.json, and the GPT-2 byte <-> character
// alphabet. Pieces arrive as raw bytes (the ByteLevel pre-tokenizer's mapping of each
// byte to one character is implicit): symbol i of a piece is the vocab entry of the
// character byte i maps to. Merging follows HF `tokenizers` (models/bpe/word.rs): the
// adjacent pair with the lowest merge rank is merged first, the leftmost on ties, until no
// pair has a rank. Results of pieces up to kMaxCachedPiece bytes are cached.
//
//   BpeOptions o;  o.vocab = ...;  o.merges = ...;
//   RING_ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> bpe, BpeModel::Create(std::move(o)));
//   bpe->Tokenize("hello", &ids);
#ifndef RINGSERVE_SERVER_TOKENIZER_BPE_H_
#define RINGSERVE_SERVER_TOKENIZER_BPE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ring::text {

// The GPT-2 byte-level alphabet: byte b <-> one character (UTF-8), e.g. ' ' <-> "Ġ".
const std::string& ByteLevelChar(uint8_t b);
// The byte a character stands for, or -1 when `cp` is not in the alphabet.
int ByteLevelByte(char32_t cp);
// The bytes the ByteLevel decoder gives for one token: each character's byte when every
// character is in the alphabet, else the token's own UTF-8 bytes (HF does the same).
std::string ByteLevelDecodeToken(absl::string_view token);

struct BpeOptions {
  std::vector<std::pair<std::string, int32_t>> vocab;        // token -> id
  std::vector<std::pair<std::string, std::string>> merges;   // in rank order
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;  // bytes without a token become "<0xAB>" tokens
  bool ignore_merges = false;  // a piece that is a whole vocab token is that token
};

class BpeModel {
 public:
  // InvalidArgument for merges naming tokens absent from the vocab (or whose
  // concatenation is absent) and for an unk_token absent from the vocab.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(BpeOptions options);

  // Appends the ids of one pre-tokenized piece (raw bytes; not empty). Thread-safe.
  void Tokenize(absl::string_view piece, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenId(absl::string_view token) const;
  // Token string of an id, or nullptr.
  const std::string* TokenText(int32_t id) const;
  // Number of vocab entries (HF's BPE get_vocab_size) and max id + 1.
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  int64_t id_limit() const { return static_cast<int64_t>(id_to_token_.size()); }

  static constexpr size_t kMaxCachedPiece = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;

  // Merges `symbols` in place (exposed for tests: the scan used for short words and the
  // priority queue used for long ones must agree).
  void MergeShort(std::vector<int32_t>* symbols) const;
  void MergeLong(std::vector<int32_t>* symbols) const;

 private:
  BpeModel() = default;

  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* FindMerge(int32_t a, int32_t b) const {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  // HF's merge_word for one piece: initial symbols (vocab, byte fallback, unk), then merges.
  void MergeWord(absl::string_view piece, std::vector<int32_t>* symbols) const;

  // What byte b starts a piece's symbol list with (see MergeWord).
  struct ByteSymbol {
    enum Kind : uint8_t { kToken, kFallback, kUnknown } kind = kUnknown;
    std::vector<int32_t> ids;  // kToken: one id; kFallback: the <0x..> ids
  };

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  ByteSymbol byte_symbols_[256];
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  // ignore_merges looks pieces up by their raw bytes: vocab tokens whose characters are
  // all in the byte alphabet, keyed by the bytes they stand for.
  absl::flat_hash_map<std::string, int32_t> raw_vocab_;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_
      ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace ring::text

#endif  // RINGSERVE_SERVER_TOKENIZER_BPE_H_
