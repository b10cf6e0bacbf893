#include "server/utf8.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "utf8proc.h"

namespace ring::text {
namespace {

// Length of the sequence a lead byte starts and the allowed range of its second byte
// (Unicode Table 3-7, "well-formed UTF-8 byte sequences"); len 0 for bytes that can never
// start a sequence.
struct LeadInfo {
  uint8_t len;
  uint8_t lo;
  uint8_t hi;
};

constexpr LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlongs
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // <= U+10FFFF
  return {0, 0, 0};
}

bool IsCont(uint8_t b) { return (b & 0xC0) == 0x80; }

// Length of the valid prefix of the sequence starting at s[i] (1..len when complete or
// truncated-but-valid), and whether it is complete.
size_t ValidPrefix(absl::string_view s, size_t i, bool* complete) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const LeadInfo lead = Lead(p[i]);
  *complete = false;
  if (lead.len == 0) return 0;
  if (lead.len == 1) {
    *complete = true;
    return 1;
  }
  size_t n = 1;
  if (i + n >= s.size()) return n;
  if (p[i + n] < lead.lo || p[i + n] > lead.hi) return n;
  ++n;
  while (n < lead.len) {
    if (i + n >= s.size()) return n;
    if (!IsCont(p[i + n])) return n;
    ++n;
  }
  *complete = true;
  return n;
}

// The code points NFC may change or combine with a neighbour, as a bitset.
class NfcTable {
 public:
  NfcTable() : bits_((0x110000 + 63) / 64, 0) {
    // A code point is "unsafe" when it is a non-starter, can be the second element of a
    // canonical composition (it sits after the first position of some canonical
    // decomposition: combining marks, Hangul V/T jamo, a few ccc=0 vowel signs), or is
    // not its own NFC (singletons, exclusions). Text made only of safe code points is its
    // own NFC: nothing reorders (all are starters), every character's decomposition
    // recomposes to itself, and no character can combine with its neighbour.
    std::vector<bool> second(0x110000, false);
    std::vector<char32_t> decomposable;
    utf8proc_int32_t buf[32];
    for (char32_t cp = 0; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const utf8proc_property_t* prop = utf8proc_get_property(static_cast<int32_t>(cp));
      if (prop->combining_class != 0) Mark(cp);
      if (prop->decomp_seqindex == UINT16_MAX && !(cp >= 0xAC00 && cp <= 0xD7A3)) continue;
      int boundclass = UTF8PROC_BOUNDCLASS_START;
      const utf8proc_ssize_t n = utf8proc_decompose_char(
          static_cast<int32_t>(cp), buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
      if (n == 1 && buf[0] == static_cast<int32_t>(cp)) continue;  // compatibility only
      if (n <= 0 || n > 32) {
        Mark(cp);
        continue;
      }
      for (utf8proc_ssize_t k = 1; k < n; ++k) second[buf[k]] = true;
      decomposable.push_back(cp);
    }
    for (char32_t cp = 0; cp < 0x110000; ++cp) {
      if (second[cp]) Mark(cp);
    }
    for (char32_t cp : decomposable) {
      if (Unsafe(cp)) continue;
      int boundclass = UTF8PROC_BOUNDCLASS_START;
      utf8proc_decompose_char(static_cast<int32_t>(cp), buf, 32, UTF8PROC_DECOMPOSE,
                              &boundclass);
      const utf8proc_int32_t first = buf[0];
      if (second[first] || utf8proc_get_property(first)->combining_class != 0) {
        Mark(cp);
        continue;
      }
      // Its own NFC? (Composition exclusions and singletons are not.)
      std::string one;
      AppendUtf8(cp, &one);
      utf8proc_uint8_t* out = nullptr;
      const utf8proc_ssize_t len = utf8proc_map(
          reinterpret_cast<const utf8proc_uint8_t*>(one.data()),
          static_cast<utf8proc_ssize_t>(one.size()), &out,
          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (len < 0 || absl::string_view(reinterpret_cast<char*>(out), len) != one) Mark(cp);
      std::free(out);
    }
  }

  bool Unsafe(char32_t cp) const { return (bits_[cp >> 6] >> (cp & 63)) & 1; }

 private:
  void Mark(char32_t cp) { bits_[cp >> 6] |= uint64_t{1} << (cp & 63); }
  std::vector<uint64_t> bits_;
};

const NfcTable& NfcUnsafeTable() {
  static const NfcTable* table = new NfcTable();
  return *table;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs dominate; test 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    bool complete = false;
    const size_t len = ValidPrefix(s, i, &complete);
    if (!complete) return false;
    i += len;
  }
  return true;
}

void AppendUtf8Lossy(absl::string_view bytes, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  out->reserve(out->size() + bytes.size());
  size_t i = 0;
  size_t run = 0;  // start of the current run of valid bytes, appended in one go
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    bool complete = false;
    const size_t len = ValidPrefix(bytes, i, &complete);
    if (complete) {
      i += len;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    out->append(kReplacement, 3);
    i += len == 0 ? 1 : len;  // a maximal subpart is replaced as one unit
    run = i;
  }
  out->append(bytes.data() + run, bytes.size() - run);
}

size_t Utf8StreamCut(absl::string_view bytes) {
  const size_t n = bytes.size();
  // A character in progress started at most 3 bytes before the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (IsCont(b)) continue;
    bool complete = false;
    const size_t len = ValidPrefix(bytes, i, &complete);
    // Held back only when every byte up to the end is a valid prefix of one character.
    if (!complete && len == back) return i;
    return n;
  }
  return n;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + *pos;
  if (p[0] < 0x80) {
    *pos += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *pos += 2;
    return (char32_t{p[0] & 0x1Fu} << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *pos += 3;
    return (char32_t{p[0] & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3F);
  }
  *pos += 4;
  return (char32_t{p[0] & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3F);
}

bool IsNfcInvariant(absl::string_view s) {
  // Below U+0300 (lead bytes < 0xCC; continuation bytes are < 0xC0) nothing is unsafe, so
  // only code points from a lead byte >= 0xCC are looked up.
  size_t i = 0;
  while (i < s.size() && static_cast<uint8_t>(s[i]) < 0xCC) ++i;
  if (i == s.size()) return true;
  const NfcTable& table = NfcUnsafeTable();
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0xCC) {
      ++i;
      continue;
    }
    if (table.Unsafe(NextCodePoint(s, &i))) return false;
  }
  return true;
}

std::string NfcNormalize(absl::string_view s) {
  if (IsNfcInvariant(s)) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    // Only out-of-memory or an over-long input can get here (the input is valid UTF-8).
    std::fprintf(stderr, "NfcNormalize: utf8proc_map failed: %s\n", utf8proc_errmsg(len));
    std::abort();
  }
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(len));
  std::free(out);
  return result;
}

}  // namespace ring::text
