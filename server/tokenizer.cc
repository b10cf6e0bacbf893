// The tokenizer.json pipeline (server/tokenizer.h). References to HF are to the Rust
// `tokenizers` crate (tokenizer/added_vocabulary.rs, normalizer.rs, pre_tokenizers/,
// models/bpe/, decoders/byte_level.rs), whose behaviour is mirrored here, quirks included;
// tests/tokenizer_parity.py holds us to it.
#include "server/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "nlohmann/json.hpp"
#include "server/tokenizer_bpe.h"
#include "server/tokenizer_regex.h"
#include "server/utf8.h"
#include "utf8proc.h"

namespace ring::text {
namespace {

using Json = nlohmann::json;

// The GPT-2 pre-tokenizer regex (ByteLevel with use_regex=true).
constexpr absl::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- JSON field access with messages that name the field -----------------------------

absl::Status FieldError(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", path, ": ", what));
}

absl::Status Unsupported(absl::string_view path, absl::string_view what,
                         absl::string_view supported) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", path, ": ", what,
                                               " is not supported (supported: ", supported,
                                               ")"));
}

const Json* Find(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// A bool field; `def` when absent or null.
absl::StatusOr<bool> GetBool(const Json& obj, const char* key, bool def,
                             absl::string_view path) {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return def;
  if (!v->is_boolean()) return FieldError(absl::StrCat(path, ".", key), "expected a boolean");
  return v->get<bool>();
}

// A string field; nullopt when absent or null.
absl::StatusOr<std::optional<std::string>> GetOptString(const Json& obj, const char* key,
                                                        absl::string_view path) {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) return FieldError(absl::StrCat(path, ".", key), "expected a string");
  return std::optional<std::string>(v->get<std::string>());
}

// The "type" of a component object.
absl::StatusOr<std::string> GetType(const Json& obj, absl::string_view path) {
  if (!obj.is_object()) return FieldError(path, "expected an object");
  const Json* t = Find(obj, "type");
  if (t == nullptr || !t->is_string()) return FieldError(path, "missing \"type\"");
  return t->get<std::string>();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view file) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": invalid JSON: ", e.what()));
  }
}

// ---- Unicode classes of the Rust `regex` crate, used by added-token options -----------

// \s of Rust's regex crate (Unicode White_Space).
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// \w of Rust's regex crate: Alphabetic | Mark | Decimal_Number | Connector_Punctuation |
// Join_Control. Alphabetic is approximated by the letters, Nl and the circled/squared
// Latin letters (the Other_Alphabetic code points outside the marks).
bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// The last / first code point of a non-empty valid UTF-8 string.
char32_t LastCodePoint(absl::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return NextCodePoint(s, &i);
}
char32_t FirstCodePoint(absl::string_view s) {
  size_t i = 0;
  return NextCodePoint(s, &i);
}

// ---- Added tokens ----------------------------------------------------------------------

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;

  bool operator==(const AddedToken&) const = default;
};

// An added token object of tokenizer.json's added_tokens (or of tokenizer_config.json's
// added_tokens_decoder: `file` names which, for messages).
absl::StatusOr<AddedToken> ParseAddedToken(const Json& j, absl::string_view file,
                                           absl::string_view path) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", path, ": expected an object"));
  }
  AddedToken t;
  const Json* content = Find(j, "content");
  if (content == nullptr || !content->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", path, ".content: expected a string"));
  }
  t.content = content->get<std::string>();
  // "special" first: the default of "normalized" depends on it.
  const std::pair<const char*, bool*> fields[] = {{"special", &t.special},
                                                  {"single_word", &t.single_word},
                                                  {"lstrip", &t.lstrip},
                                                  {"rstrip", &t.rstrip},
                                                  {"normalized", &t.normalized}};
  for (auto [key, field] : fields) {
    const Json* v = Find(j, key);
    if (v == nullptr || v->is_null()) {
      // HF/transformers default: special tokens are not normalized, the others are.
      *field = std::string_view(key) == "normalized" ? !t.special : false;
    } else if (v->is_boolean()) {
      *field = v->get<bool>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", path, ".", key, ": expected a boolean"));
    }
  }
  return t;
}

// Leftmost-longest multi-pattern search over bytes (HF uses aho-corasick with
// MatchKind::LeftmostLongest): a byte trie plus a first-byte filter, which is cheap for
// added tokens (a few hundred patterns sharing a handful of first bytes such as '<').
class TokenMatcher {
 public:
  void Add(absl::string_view pattern, int32_t id) {
    if (pattern.empty()) return;
    if (terminal_.empty()) terminal_.push_back(-1);
    int32_t node = 0;
    for (unsigned char b : pattern) {
      auto [it, inserted] =
          edges_.try_emplace(Edge(node, b), static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = id;  // identical patterns: the first wins
    first_[static_cast<unsigned char>(pattern[0])] = true;
  }
  bool empty() const { return terminal_.empty(); }

  // The leftmost-longest match starting at or after `pos`.
  bool Find(absl::string_view s, size_t pos, size_t* start, size_t* end, int32_t* id) const {
    if (empty()) return false;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = pos; i < s.size(); ++i) {
      if (!first_[p[i]]) continue;
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        auto it = edges_.find(Edge(node, p[j]));
        if (it == edges_.end()) break;
        node = it->second;
        if (terminal_[node] >= 0) {
          best = terminal_[node];
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        *start = i;
        *end = best_end;
        *id = best;
        return true;
      }
    }
    return false;
  }

 private:
  static uint64_t Edge(int32_t node, unsigned char b) {
    return (static_cast<uint64_t>(node) << 8) | b;
  }
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;  // per node: pattern id ending there, or -1
  bool first_[256] = {};
};

// ---- Pre-tokenizer ---------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext,
                           kContiguous };

struct PreTokStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  std::unique_ptr<Regex> regex;  // kSplit: the pattern; kByteLevel: GPT-2 regex or null
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
};

// HF NormalizedString::split over Pattern::find_matches: cuts `piece` by the matches of
// `re` and appends the non-empty parts `behavior` keeps.
absl::Status SplitPiece(absl::string_view piece, const Regex& re, SplitBehavior behavior,
                        bool invert, std::vector<absl::string_view>* out) {
  thread_local std::vector<std::pair<uint32_t, uint32_t>> matches;
  thread_local std::vector<std::pair<std::pair<uint32_t, uint32_t>, bool>> parts;
  matches.clear();
  parts.clear();
  RING_RETURN_IF_ERROR(re.FindAll(piece, &matches));
  // Pattern::find_matches: the whole piece as (range, is_match) parts.
  uint32_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (prev != s) parts.push_back({{prev, s}, invert});
    parts.push_back({{s, e}, !invert});
    prev = e;
  }
  if (prev != piece.size()) parts.push_back({{prev, static_cast<uint32_t>(piece.size())}, invert});

  auto emit = [&](uint32_t s, uint32_t e) {
    if (e > s) out->push_back(piece.substr(s, e - s));
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [r, m] : parts) emit(r.first, r.second);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [r, m] : parts) {
        if (!m) emit(r.first, r.second);
      }
      break;
    case SplitBehavior::kContiguous:
    case SplitBehavior::kMergedWithPrevious: {
      // Contiguous: consecutive parts with the same flag fuse. MergedWithPrevious: a match
      // that follows a non-match joins it.
      std::vector<std::pair<uint32_t, uint32_t>> acc;
      bool previous_match = false;
      for (const auto& [r, m] : parts) {
        const bool fuse = behavior == SplitBehavior::kContiguous ? m == previous_match
                                                                  : m && !previous_match;
        if (fuse && !acc.empty()) {
          acc.back().second = r.second;
        } else {
          acc.push_back(r);
        }
        previous_match = m;
      }
      for (const auto& [s, e] : acc) emit(s, e);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // A match joins the non-match that follows it (HF folds from the end).
      std::vector<std::pair<uint32_t, uint32_t>> acc;
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        const auto& [r, m] = *it;
        if (m && !previous_match && !acc.empty()) {
          acc.back().first = r.first;
        } else {
          acc.push_back(r);
        }
        previous_match = m;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->first, it->second);
      break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---- TokenizerImpl -----------------------------------------------------------------------

class TokenizerImpl {
 public:
  absl::Status Load(const Json& root);
  absl::Status ApplyConfig(const Json& cfg);
  void Finalize();  // matchers and decode tables, after all added tokens are in

  absl::Status Encode(absl::string_view text, bool allow_special,
                      std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenId(absl::string_view token) const {
    if (auto it = added_id_by_content_.find(token); it != added_id_by_content_.end()) {
      return it->second;
    }
    return bpe_->TokenId(token);
  }
  // HF id_to_token: an added token's content, normalized when the token is matched in
  // normalized form (HF caches that form and decodes it), else the vocab entry.
  const std::string* TokenText(int32_t id) const {
    if (auto it = added_text_by_id_.find(id); it != added_text_by_id_.end()) return &it->second;
    return bpe_->TokenText(id);
  }

  int64_t vocab_size_ = 0;
  std::optional<int32_t> bos_;
  std::optional<int32_t> eos_;
  absl::flat_hash_map<int32_t, AddedToken> added_by_id_;
  absl::flat_hash_map<int32_t, std::string> added_text_by_id_;  // see TokenText()
  // Per id < vocab_size_: the bytes the ByteLevel decoder gives, and the skip flag.
  std::string decode_blob_;
  std::vector<uint32_t> decode_offset_;  // vocab_size_ + 1 entries
  std::vector<bool> skip_special_;

 private:
  absl::Status LoadNormalizer(const Json* j);
  absl::Status LoadNormalizerPart(const Json& j, absl::string_view path);
  absl::Status LoadPreTokenizer(const Json* j);
  absl::Status LoadPreTokenizerPart(const Json& j, absl::string_view path);
  absl::Status LoadModel(const Json* j);
  absl::Status CheckPostProcessor(const Json& j, absl::string_view path);
  absl::Status CheckDecoder(const Json* j);
  // HF AddedVocabulary::add_tokens for one token; returns its id.
  int32_t AddToken(const AddedToken& token);

  // HF AddedVocabulary::find_matches: calls emit(part, id) for the consecutive parts of
  // `s`, id -1 for text between added tokens.
  template <typename Emit>
  void SplitAdded(absl::string_view s, const TokenMatcher& matcher, bool allow_special,
                  Emit&& emit) const;
  absl::Status PreTokenizeAndTokenize(absl::string_view segment,
                                      std::vector<int32_t>* ids) const;

  bool nfc_ = false;
  std::vector<PreTokStep> steps_;
  std::unique_ptr<BpeModel> bpe_;

  absl::flat_hash_map<std::string, int32_t> added_id_by_content_;
  int64_t max_added_id_ = -1;
  absl::flat_hash_set<std::string> special_contents_;
  // HF's special_tokens and added_tokens lists, in insertion order (the match patterns).
  std::vector<AddedToken> special_list_;
  std::vector<AddedToken> plain_list_;
  TokenMatcher raw_matcher_;         // normalized=false: matched on the raw text
  TokenMatcher normalized_matcher_;  // normalized=true: matched on normalized pieces
};

absl::Status TokenizerImpl::Load(const Json& root) {
  if (!root.is_object()) return FieldError("(root)", "expected an object");
  if (const Json* v = Find(root, "version"); v != nullptr && !v->is_null()) {
    if (!v->is_string() || v->get<std::string>() != "1.0") {
      return FieldError("version", absl::StrCat("unknown tokenizer version ", v->dump()));
    }
  }
  RING_RETURN_IF_ERROR(LoadNormalizer(Find(root, "normalizer")));
  RING_RETURN_IF_ERROR(LoadPreTokenizer(Find(root, "pre_tokenizer")));
  RING_RETURN_IF_ERROR(LoadModel(Find(root, "model")));
  if (const Json* pp = Find(root, "post_processor"); pp != nullptr && !pp->is_null()) {
    RING_RETURN_IF_ERROR(CheckPostProcessor(*pp, "post_processor"));
  }
  RING_RETURN_IF_ERROR(CheckDecoder(Find(root, "decoder")));

  if (const Json* added = Find(root, "added_tokens"); added != nullptr && !added->is_null()) {
    if (!added->is_array()) return FieldError("added_tokens", "expected an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const std::string path = absl::StrCat("added_tokens[", i, "]");
      RING_ASSIGN_OR_RETURN(AddedToken t, ParseAddedToken((*added)[i], "tokenizer.json", path));
      // The file's "id" is not used: HF assigns ids itself (the vocab id of a token that
      // is already in the vocab, else the next free id) and only warns on a mismatch.
      AddToken(t);
    }
  }
  return absl::OkStatus();
}

absl::Status TokenizerImpl::LoadNormalizer(const Json* j) {
  if (j == nullptr || j->is_null()) return absl::OkStatus();
  return LoadNormalizerPart(*j, "normalizer");
}

absl::Status TokenizerImpl::LoadNormalizerPart(const Json& j, absl::string_view path) {
  RING_ASSIGN_OR_RETURN(std::string type, GetType(j, path));
  if (type == "NFC") {
    // NFC is idempotent, so NFC twice in a Sequence is NFC once.
    nfc_ = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    const Json* list = Find(j, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return FieldError(absl::StrCat(path, ".normalizers"), "expected an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RING_RETURN_IF_ERROR(
          LoadNormalizerPart((*list)[i], absl::StrCat(path, ".normalizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  return Unsupported(path, absl::StrCat("normalizer ", type), "null, NFC, Sequence");
}

absl::Status TokenizerImpl::LoadPreTokenizer(const Json* j) {
  if (j == nullptr || j->is_null()) {
    return Unsupported("pre_tokenizer", "null (no ByteLevel step)",
                       "byte-level BPE: ByteLevel, or Split steps ending in ByteLevel");
  }
  RING_RETURN_IF_ERROR(LoadPreTokenizerPart(*j, "pre_tokenizer"));
  if (steps_.empty() || steps_.back().kind != PreTokStep::kByteLevel) {
    return Unsupported("pre_tokenizer", "a pre-tokenizer that does not end in ByteLevel",
                       "byte-level BPE: ByteLevel, or Split steps ending in ByteLevel");
  }
  // ByteLevel without prefix space and regex only maps bytes to characters, which the BPE
  // model does implicitly; drop the step.
  if (!steps_.back().add_prefix_space && steps_.back().regex == nullptr) steps_.pop_back();
  return absl::OkStatus();
}

absl::Status TokenizerImpl::LoadPreTokenizerPart(const Json& j, absl::string_view path) {
  RING_ASSIGN_OR_RETURN(std::string type, GetType(j, path));
  if (!steps_.empty() && steps_.back().kind == PreTokStep::kByteLevel) {
    return Unsupported(path, absl::StrCat("pre-tokenizer ", type, " after ByteLevel"),
                       "ByteLevel as the last step");
  }
  if (type == "Sequence") {
    const Json* list = Find(j, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return FieldError(absl::StrCat(path, ".pretokenizers"), "expected an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RING_RETURN_IF_ERROR(
          LoadPreTokenizerPart((*list)[i], absl::StrCat(path, ".pretokenizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    PreTokStep step;
    step.kind = PreTokStep::kByteLevel;
    // HF defaults: add_prefix_space=true, use_regex=true.
    RING_ASSIGN_OR_RETURN(step.add_prefix_space, GetBool(j, "add_prefix_space", true, path));
    RING_ASSIGN_OR_RETURN(bool use_regex, GetBool(j, "use_regex", true, path));
    if (use_regex) {
      RING_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Regex));
    }
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Split") {
    PreTokStep step;
    step.kind = PreTokStep::kSplit;
    const Json* pattern = Find(j, "pattern");
    const std::string ppath = absl::StrCat(path, ".pattern");
    if (pattern == nullptr || !pattern->is_object()) {
      return FieldError(ppath, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    if (const Json* re = Find(*pattern, "Regex"); re != nullptr && re->is_string()) {
      auto compiled = Regex::Compile(re->get<std::string>());
      if (!compiled.ok()) {
        return absl::Status(compiled.status().code(),
                            absl::StrCat("tokenizer.json: ", ppath, ": ",
                                         compiled.status().message()));
      }
      step.regex = *std::move(compiled);
    } else if (const Json* str = Find(*pattern, "String"); str != nullptr && str->is_string()) {
      auto compiled = Regex::Literal(str->get<std::string>());
      if (!compiled.ok()) return FieldError(ppath, compiled.status().message());
      step.regex = *std::move(compiled);
    } else {
      return FieldError(ppath, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const Json* behavior = Find(j, "behavior");
    if (behavior == nullptr || !behavior->is_string()) {
      return FieldError(absl::StrCat(path, ".behavior"), "expected a string");
    }
    const std::string b = behavior->get<std::string>();
    if (b == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (b == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (b == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (b == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return FieldError(absl::StrCat(path, ".behavior"), absl::StrCat("unknown \"", b, "\""));
    }
    RING_ASSIGN_OR_RETURN(step.invert, GetBool(j, "invert", false, path));
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  return Unsupported(path, absl::StrCat("pre-tokenizer ", type),
                     "ByteLevel, Split, Sequence");
}

absl::Status TokenizerImpl::LoadModel(const Json* j) {
  if (j == nullptr || !j->is_object()) return FieldError("model", "expected an object");
  std::string type = "BPE";  // files from old versions have no "type"
  if (const Json* t = Find(*j, "type"); t != nullptr) {
    if (!t->is_string()) return FieldError("model.type", "expected a string");
    type = t->get<std::string>();
  }
  if (type != "BPE") return Unsupported("model", absl::StrCat("model ", type), "BPE");

  if (const Json* d = Find(*j, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number()) return FieldError("model.dropout", "expected a number or null");
    if (d->get<double>() != 0.0) {
      return Unsupported("model.dropout", "BPE dropout (random merges)", "null or 0");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    RING_ASSIGN_OR_RETURN(std::optional<std::string> affix, GetOptString(*j, key, "model"));
    if (affix.has_value() && !affix->empty()) {
      return Unsupported(absl::StrCat("model.", key), "a subword affix", "null or \"\"");
    }
  }

  BpeOptions o;
  RING_ASSIGN_OR_RETURN(o.unk_token, GetOptString(*j, "unk_token", "model"));
  RING_ASSIGN_OR_RETURN(o.fuse_unk, GetBool(*j, "fuse_unk", false, "model"));
  RING_ASSIGN_OR_RETURN(o.byte_fallback, GetBool(*j, "byte_fallback", false, "model"));
  RING_ASSIGN_OR_RETURN(o.ignore_merges, GetBool(*j, "ignore_merges", false, "model"));

  const Json* vocab = Find(*j, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return FieldError("model.vocab", "expected an object {token: id}");
  }
  o.vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return FieldError(absl::StrCat("model.vocab[\"", it.key(), "\"]"), "expected an integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX - 1) {
      return FieldError(absl::StrCat("model.vocab[\"", it.key(), "\"]"),
                        absl::StrCat("id ", id, " out of range"));
    }
    o.vocab.emplace_back(it.key(), static_cast<int32_t>(id));
  }

  const Json* merges = Find(*j, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return FieldError("model.merges", "expected an array");
  }
  o.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    if (m.is_string()) {
      // "a b": exactly one space (byte-level tokens never contain a space).
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return FieldError(absl::StrCat("model.merges[", i, "]"),
                          absl::StrCat("\"", s, "\" is not two tokens separated by a space"));
      }
      o.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      o.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return FieldError(absl::StrCat("model.merges[", i, "]"),
                        "expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  auto bpe = BpeModel::Create(std::move(o));
  if (!bpe.ok()) {
    return absl::Status(bpe.status().code(),
                        absl::StrCat("tokenizer.json: ", bpe.status().message()));
  }
  bpe_ = *std::move(bpe);
  return absl::OkStatus();
}

absl::Status TokenizerImpl::CheckPostProcessor(const Json& j, absl::string_view path) {
  RING_ASSIGN_OR_RETURN(std::string type, GetType(j, path));
  // None of these changes the ids of encode(text, add_special_tokens=False) (see header).
  if (type == "ByteLevel" || type == "TemplateProcessing" || type == "BertProcessing" ||
      type == "RobertaProcessing") {
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    const Json* list = Find(j, "processors");
    if (list == nullptr || !list->is_array()) {
      return FieldError(absl::StrCat(path, ".processors"), "expected an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RING_RETURN_IF_ERROR(
          CheckPostProcessor((*list)[i], absl::StrCat(path, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  return Unsupported(path, absl::StrCat("post-processor ", type),
                     "ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, "
                     "Sequence");
}

absl::Status TokenizerImpl::CheckDecoder(const Json* j) {
  constexpr absl::string_view kSupported = "ByteLevel, Sequence[ByteLevel]";
  if (j == nullptr || j->is_null()) {
    return Unsupported("decoder", "null (tokens joined by spaces)", kSupported);
  }
  RING_ASSIGN_OR_RETURN(std::string type, GetType(*j, "decoder"));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    const Json* list = Find(*j, "decoders");
    if (list == nullptr || !list->is_array()) {
      return FieldError("decoder.decoders", "expected an array");
    }
    if (list->size() == 1) {
      RING_ASSIGN_OR_RETURN(std::string inner, GetType((*list)[0], "decoder.decoders[0]"));
      if (inner == "ByteLevel") return absl::OkStatus();
      return Unsupported("decoder.decoders[0]", absl::StrCat("decoder ", inner), kSupported);
    }
    return Unsupported("decoder", absl::StrCat("a Sequence of ", list->size(), " decoders"),
                       kSupported);
  }
  return Unsupported("decoder", absl::StrCat("decoder ", type), kSupported);
}

int32_t TokenizerImpl::AddToken(const AddedToken& token) {
  if (token.content.empty()) return -1;
  if (token.special && special_contents_.insert(token.content).second) {
    special_list_.push_back(token);
  }
  if (auto it = added_id_by_content_.find(token.content); it != added_id_by_content_.end()) {
    if (added_by_id_.at(it->second) == token) return it->second;  // same options: no-op
  }
  int32_t id;
  if (std::optional<int32_t> known = TokenId(token.content)) {
    id = *known;
  } else if (max_added_id_ < 0) {
    id = static_cast<int32_t>(bpe_->size());
  } else {
    // After the largest added id when that is at or past the BPE vocab size, else the BPE
    // vocab size (HF AddedVocabulary::add_tokens).
    const int64_t model_size = bpe_->size();
    id = static_cast<int32_t>(max_added_id_ >= model_size || model_size == 0 ? max_added_id_ + 1
                                                                             : model_size);
  }
  added_id_by_content_[token.content] = id;
  added_by_id_[id] = token;
  max_added_id_ = std::max<int64_t>(max_added_id_, id);
  if (!special_contents_.contains(token.content)) plain_list_.push_back(token);
  return id;
}

absl::Status TokenizerImpl::ApplyConfig(const Json& cfg) {
  if (!cfg.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json: expected an object");
  }
  if (const Json* dec = Find(cfg, "added_tokens_decoder"); dec != nullptr && !dec->is_null()) {
    if (!dec->is_object()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: added_tokens_decoder: expected an object");
    }
    std::vector<std::pair<int64_t, AddedToken>> entries;
    for (auto it = dec->begin(); it != dec->end(); ++it) {
      const std::string path = absl::StrCat("added_tokens_decoder[\"", it.key(), "\"]");
      int64_t id = -1;
      if (!absl::SimpleAtoi(it.key(), &id) || id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: ", path, ": key is not an id"));
      }
      RING_ASSIGN_OR_RETURN(AddedToken token,
                            ParseAddedToken(it.value(), "tokenizer_config.json", path));
      entries.emplace_back(id, std::move(token));
    }
    // transformers adds the entries tokenizer.json lacks, in id order.
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [want, token] : entries) {
      auto it = added_by_id_.find(static_cast<int32_t>(want));
      if (it != added_by_id_.end() && it->second == token) continue;
      const int32_t got = AddToken(token);
      if (got != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer_config.json: added_tokens_decoder: \"", token.content, "\" has id ",
            want, " but tokenizer.json gives it id ", got));
      }
    }
  }
  auto special_token_id = [&](const char* key,
                              std::optional<int32_t>* slot) -> absl::Status {
    const Json* v = Find(cfg, key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    std::string name;
    if (v->is_string()) {
      name = v->get<std::string>();
    } else if (const Json* c = Find(*v, "content"); c != nullptr && c->is_string()) {
      name = c->get<std::string>();  // {"__type": "AddedToken", "content": ...}
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config.json: ", key, ": expected a string or null"));
    }
    *slot = TokenId(name);
    if (!slot->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", key, " \"",
                                                     name, "\" is not a token of tokenizer.json"));
    }
    return absl::OkStatus();
  };
  RING_RETURN_IF_ERROR(special_token_id("bos_token", &bos_));
  RING_RETURN_IF_ERROR(special_token_id("eos_token", &eos_));
  return absl::OkStatus();
}

void TokenizerImpl::Finalize() {
  raw_matcher_ = TokenMatcher();
  normalized_matcher_ = TokenMatcher();
  // HF refresh_added_tokens: special tokens first, then the others; normalized ones are
  // matched in their normalized form.
  for (const std::vector<AddedToken>* list : {&special_list_, &plain_list_}) {
    for (const AddedToken& t : *list) {
      const int32_t id = added_id_by_content_.at(t.content);
      if (t.normalized) {
        normalized_matcher_.Add(nfc_ ? NfcNormalize(t.content) : t.content, id);
      } else {
        raw_matcher_.Add(t.content, id);
      }
    }
  }

  added_text_by_id_.clear();
  for (const auto& [id, t] : added_by_id_) {
    added_text_by_id_[id] = t.normalized && nfc_ ? NfcNormalize(t.content) : t.content;
  }

  vocab_size_ = bpe_->id_limit();
  for (const auto& [id, unused] : added_by_id_) {
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  decode_blob_.clear();
  decode_offset_.assign(static_cast<size_t>(vocab_size_) + 1, 0);
  skip_special_.assign(static_cast<size_t>(vocab_size_), false);
  for (int32_t id = 0; id < vocab_size_; ++id) {
    decode_offset_[id] = static_cast<uint32_t>(decode_blob_.size());
    if (const std::string* text = TokenText(id)) {
      decode_blob_ += ByteLevelDecodeToken(*text);
      // HF decode skips by token string: any id whose string is a special token's content
      // (so a normalized special token whose NFC differs is not skipped, as in HF).
      skip_special_[id] = special_contents_.contains(*text);
    }
  }
  decode_offset_[vocab_size_] = static_cast<uint32_t>(decode_blob_.size());
}

template <typename Emit>
void TokenizerImpl::SplitAdded(absl::string_view s, const TokenMatcher& matcher,
                               bool allow_special, Emit&& emit) const {
  if (matcher.empty()) {
    emit(s, -1);
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  size_t start, stop;
  int32_t id;
  while (matcher.Find(s, pos, &start, &stop, &id)) {
    pos = stop;  // the search resumes after the raw match, whatever is done with it
    const AddedToken& token = added_by_id_.at(id);
    if (!allow_special && token.special) continue;
    if (token.single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastCodePoint(s.substr(0, start)));
      const bool stop_space = stop == s.size() || !IsWordChar(FirstCodePoint(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t k = new_start - 1;
        while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
        size_t tmp = k;
        if (!IsWhiteSpace(NextCodePoint(s, &tmp))) break;
        new_start = k;
      }
      // Spaces already taken by the previous match stay with it.
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < s.size()) {
        size_t tmp = stop;
        if (!IsWhiteSpace(NextCodePoint(s, &tmp))) break;
        stop = tmp;
      }
    }
    if (start_offset < start) emit(s.substr(start_offset, start - start_offset), -1);
    emit(s.substr(start, stop - start), id);
    start_offset = stop;
  }
  if (start_offset < s.size()) emit(s.substr(start_offset), -1);
}

absl::Status TokenizerImpl::PreTokenizeAndTokenize(absl::string_view segment,
                                                   std::vector<int32_t>* ids) const {
  thread_local std::vector<absl::string_view> cur;
  thread_local std::vector<absl::string_view> next;
  std::vector<std::string> prefixed;  // owns " " + piece for add_prefix_space
  cur.clear();
  cur.push_back(segment);
  for (const PreTokStep& step : steps_) {
    next.clear();
    if (step.kind == PreTokStep::kSplit) {
      for (absl::string_view piece : cur) {
        RING_RETURN_IF_ERROR(SplitPiece(piece, *step.regex, step.behavior, step.invert, &next));
      }
    } else {
      if (step.add_prefix_space) {
        size_t need = 0;
        for (absl::string_view piece : cur) need += piece[0] != ' ';
        prefixed.reserve(need);  // no reallocation below: views into it stay valid
      }
      for (absl::string_view piece : cur) {
        if (step.add_prefix_space && piece[0] != ' ') {
          prefixed.push_back(absl::StrCat(" ", piece));
          piece = prefixed.back();
        }
        if (step.regex != nullptr) {
          RING_RETURN_IF_ERROR(
              SplitPiece(piece, *step.regex, SplitBehavior::kIsolated, false, &next));
        } else {
          next.push_back(piece);
        }
      }
    }
    std::swap(cur, next);
  }
  for (absl::string_view piece : cur) bpe_->Tokenize(piece, ids);
  return absl::OkStatus();
}

absl::Status TokenizerImpl::Encode(absl::string_view text, bool allow_special,
                                   std::vector<int32_t>* ids) const {
  absl::Status status;
  // 1. Added tokens with normalized=false, on the raw text.
  SplitAdded(text, raw_matcher_, allow_special, [&](absl::string_view part, int32_t id) {
    if (id >= 0) {
      ids->push_back(id);
      return;
    }
    if (part.empty() || !status.ok()) return;
    // 2. Normalize what lies between them; then added tokens with normalized=true.
    std::string normalized;
    absl::string_view norm = part;
    if (nfc_) {
      normalized = NfcNormalize(part);
      norm = normalized;
    }
    SplitAdded(norm, normalized_matcher_, allow_special,
               [&](absl::string_view sub, int32_t sub_id) {
                 if (sub_id >= 0) {
                   ids->push_back(sub_id);
                 } else if (!sub.empty() && status.ok()) {
                   // 3. Pre-tokenize and run the model.
                   status = PreTokenizeAndTokenize(sub, ids);
                 }
               });
  });
  return status;
}

// ---- Tokenizer ----------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view tokenizer_json) {
  RING_ASSIGN_OR_RETURN(Json root, ParseJson(tokenizer_json, "tokenizer.json"));
  auto impl = std::make_unique<TokenizerImpl>();
  RING_RETURN_IF_ERROR(impl->Load(root));
  impl->Finalize();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const std::string& dir) {
  RING_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/tokenizer.json"));
  RING_ASSIGN_OR_RETURN(Json root, ParseJson(text, dir + "/tokenizer.json"));
  text.clear();
  auto impl = std::make_unique<TokenizerImpl>();
  if (absl::Status s = impl->Load(root); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(dir, "/", s.message()));
  }
  root = Json();
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    RING_ASSIGN_OR_RETURN(std::string cfg_text, ReadFile(config_path));
    RING_ASSIGN_OR_RETURN(Json cfg, ParseJson(cfg_text, config_path));
    if (absl::Status s = impl->ApplyConfig(cfg); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(dir, "/", s.message()));
    }
  }
  impl->Finalize();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool allow_special) const {
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError("Tokenizer::Encode: the text is not valid UTF-8");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  RING_RETURN_IF_ERROR(impl_->Encode(text, allow_special, &ids));
  return ids;
}

absl::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size_) return {};
  const uint32_t begin = impl_->decode_offset_[id];
  return absl::string_view(impl_->decode_blob_).substr(begin,
                                                       impl_->decode_offset_[id + 1] - begin);
}

bool Tokenizer::SkippedWhenSkippingSpecial(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size_ && impl_->skip_special_[id];
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special_tokens && SkippedWhenSkippingSpecial(id)) continue;
    const absl::string_view b = TokenBytes(id);
    bytes.append(b.data(), b.size());
  }
  std::string out;
  AppendUtf8Lossy(bytes, &out);
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size_; }

std::optional<int32_t> Tokenizer::TokenId(absl::string_view token) const {
  return impl_->TokenId(token);
}

std::optional<std::string> Tokenizer::TokenText(int32_t id) const {
  const std::string* text = impl_->TokenText(id);
  if (text == nullptr) return std::nullopt;
  return *text;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = impl_->added_by_id_.find(id);
  return it != impl_->added_by_id_.end() && it->second.special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_; }

// ---- StreamDecoder ------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_->SkippedWhenSkippingSpecial(id)) return {};
  const absl::string_view bytes = tokenizer_->TokenBytes(id);
  pending_.append(bytes.data(), bytes.size());
  const size_t cut = Utf8StreamCut(pending_);
  std::string out;
  AppendUtf8Lossy(absl::string_view(pending_).substr(0, cut), &out);
  pending_.erase(0, cut);
  return out;
}

std::string StreamDecoder::Finish() {
  std::string out;
  AppendUtf8Lossy(pending_, &out);
  pending_.clear();
  return out;
}

}  // namespace ring::text
