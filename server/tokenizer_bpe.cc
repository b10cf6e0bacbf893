#include "server/tokenizer_bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "server/utf8.h"

namespace ring::text {
namespace {

struct Alphabet {
  std::string chars[256];
  // Code points 0..323 cover every stand-in character (printable bytes stand for
  // themselves, the other 68 bytes for U+0100..U+0143).
  int16_t bytes[324];
};

const Alphabet& TheAlphabet() {
  static const Alphabet* alphabet = [] {
    auto* a = new Alphabet;
    std::fill(std::begin(a->bytes), std::end(a->bytes), int16_t{-1});
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = printable ? b : next++;
      AppendUtf8(static_cast<char32_t>(cp), &a->chars[b]);
      a->bytes[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return *alphabet;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t b) { return TheAlphabet().chars[b]; }

int ByteLevelByte(char32_t cp) { return cp < 324 ? TheAlphabet().bytes[cp] : -1; }

std::string ByteLevelDecodeToken(absl::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  if (!IsValidUtf8(token)) return std::string(token);
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = ByteLevelByte(NextCodePoint(token, &pos));
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(BpeOptions o) {
  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  int32_t max_id = -1;
  m->vocab_.reserve(o.vocab.size());
  for (auto& [token, id] : o.vocab) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab: token \"", token, "\" has negative id ", id));
    }
    max_id = std::max(max_id, id);
    m->vocab_[token] = id;
  }
  m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m->has_id_.resize(static_cast<size_t>(max_id + 1), false);
  for (auto& [token, id] : o.vocab) {
    m->id_to_token_[id] = token;
    m->has_id_[id] = true;
  }

  m->merges_.reserve(o.merges.size());
  for (size_t rank = 0; rank < o.merges.size(); ++rank) {
    const auto& [a, b] = o.merges[rank];
    auto ia = m->vocab_.find(a);
    auto ib = m->vocab_.find(b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.merges[", rank, "]: \"",
                       ia == m->vocab_.end() ? a : b, "\" is not in model.vocab"));
    }
    auto ic = m->vocab_.find(a + b);
    if (ic == m->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.merges[", rank, "]: the merged token \"", a + b, "\" is not in model.vocab"));
    }
    // A repeated pair keeps the later rank, as HF's map collection does.
    m->merges_[PairKey(ia->second, ib->second)] =
        Merge{static_cast<int32_t>(rank), ic->second};
  }

  if (o.unk_token.has_value()) {
    auto it = m->vocab_.find(*o.unk_token);
    if (it == m->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.unk_token \"", *o.unk_token, "\" is not in model.vocab"));
    }
    m->unk_id_ = it->second;
  }
  m->fuse_unk_ = o.fuse_unk;
  m->ignore_merges_ = o.ignore_merges;

  for (int b = 0; b < 256; ++b) {
    const std::string& ch = ByteLevelChar(static_cast<uint8_t>(b));
    ByteSymbol& s = m->byte_symbols_[b];
    if (auto it = m->vocab_.find(ch); it != m->vocab_.end()) {
      s.kind = ByteSymbol::kToken;
      s.ids = {it->second};
      continue;
    }
    if (o.byte_fallback) {
      // HF falls back on the UTF-8 bytes of the character, i.e. of the stand-in.
      std::vector<int32_t> ids;
      for (unsigned char u : ch) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", u);
        auto it = m->vocab_.find(name);
        if (it == m->vocab_.end()) break;
        ids.push_back(it->second);
      }
      if (ids.size() == ch.size()) {
        s.kind = ByteSymbol::kFallback;
        s.ids = std::move(ids);
        continue;
      }
    }
    s.kind = ByteSymbol::kUnknown;
  }

  if (m->ignore_merges_) {
    for (const auto& [token, id] : m->vocab_) {
      std::string raw = ByteLevelDecodeToken(token);
      // Only tokens made of alphabet characters can equal a piece's mapping.
      bool all_alphabet = IsValidUtf8(token);
      for (size_t pos = 0; all_alphabet && pos < token.size();) {
        all_alphabet = ByteLevelByte(NextCodePoint(token, &pos)) >= 0;
      }
      if (all_alphabet) m->raw_vocab_.emplace(std::move(raw), id);
    }
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::TokenText(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::MergeWord(absl::string_view piece, std::vector<int32_t>* symbols) const {
  symbols->clear();
  // HF models/bpe/model.rs merge_word, one character (= one byte) at a time. Unknown
  // characters become unk (consecutive ones fused into one when fuse_unk) or vanish when
  // there is no unk_token. As in HF, byte-fallback tokens are appended without first
  // flushing a pending unk.
  bool pending_unk = false;
  for (unsigned char b : piece) {
    const ByteSymbol& s = byte_symbols_[b];
    if (s.kind == ByteSymbol::kToken) {
      if (pending_unk) symbols->push_back(*unk_id_);
      pending_unk = false;
      symbols->push_back(s.ids[0]);
    } else if (s.kind == ByteSymbol::kFallback) {
      symbols->insert(symbols->end(), s.ids.begin(), s.ids.end());
    } else if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) symbols->push_back(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) symbols->push_back(*unk_id_);
  if (symbols->size() <= 64) {
    MergeShort(symbols);
  } else {
    MergeLong(symbols);
  }
}

void BpeModel::MergeShort(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& s = *symbols;
  if (s.size() < 2) return;
  // merges[i] is the merge of pair (s[i], s[i+1]) (rank INT_MAX: none). Each round merges
  // the lowest rank, leftmost on ties: the order HF's priority queue pops them in.
  thread_local std::vector<Merge> pairs;
  pairs.resize(s.size() - 1);
  auto lookup = [this](int32_t a, int32_t b) {
    const Merge* m = FindMerge(a, b);
    return m != nullptr ? *m : Merge{INT_MAX, -1};
  };
  for (size_t i = 0; i + 1 < s.size(); ++i) pairs[i] = lookup(s[i], s[i + 1]);
  while (!pairs.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < pairs.size(); ++i) {
      if (pairs[i].rank < pairs[best].rank) best = i;
    }
    if (pairs[best].rank == INT_MAX) break;
    s[best] = pairs[best].id;
    s.erase(s.begin() + static_cast<ptrdiff_t>(best) + 1);
    pairs.erase(pairs.begin() + static_cast<ptrdiff_t>(best));
    if (best > 0) pairs[best - 1] = lookup(s[best - 1], s[best]);
    if (best < pairs.size()) pairs[best] = lookup(s[best], s[best + 1]);
  }
}

void BpeModel::MergeLong(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& s = *symbols;
  const int32_t n = static_cast<int32_t>(s.size());
  if (n < 2) return;
  // HF models/bpe/word.rs merge_all: a min-queue of (rank, position of the left symbol),
  // symbols in a linked list; entries whose pair has changed since they were queued are
  // skipped when popped.
  struct Entry {
    int32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> gone(n, false);
  std::vector<Entry> heap;
  heap.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n) {
      if (const Merge* m = FindMerge(s[i], s[i + 1])) heap.push_back({m->rank, i, m->id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<Entry>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Entry>());
    const Entry top = heap.back();
    heap.pop_back();
    if (gone[top.pos] || next[top.pos] == -1) continue;
    const int32_t right = next[top.pos];
    const Merge* current = FindMerge(s[top.pos], s[right]);
    if (current == nullptr || current->id != top.id) continue;  // stale entry
    s[top.pos] = top.id;
    gone[right] = true;
    next[top.pos] = next[right];
    if (next[right] != -1) prev[next[right]] = top.pos;
    if (prev[top.pos] != -1) {
      const int32_t p = prev[top.pos];
      if (const Merge* m = FindMerge(s[p], s[top.pos])) {
        heap.push_back({m->rank, p, m->id});
        std::push_heap(heap.begin(), heap.end(), std::greater<Entry>());
      }
    }
    if (next[top.pos] != -1) {
      if (const Merge* m = FindMerge(s[top.pos], s[next[top.pos]])) {
        heap.push_back({m->rank, top.pos, m->id});
        std::push_heap(heap.begin(), heap.end(), std::greater<Entry>());
      }
    }
  }
  int32_t out = 0;
  for (int32_t i = 0; i != -1; i = next[i]) s[out++] = s[i];
  s.resize(out);
}

void BpeModel::Tokenize(absl::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = raw_vocab_.find(piece); it != raw_vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    const ByteSymbol& s = byte_symbols_[static_cast<unsigned char>(piece[0])];
    if (s.kind == ByteSymbol::kToken) {
      ids->push_back(s.ids[0]);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  MergeWord(piece, &symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    // Bounded memory: start over when full (the working set refills it quickly).
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(piece, symbols);
  }
}

}  // namespace ring::text
