// File: server/utf8.h
//
// UTF-8 helpers for the text layer (tokenizer, templates, streaming): validation, the
// lossy decoding Rust's String::from_utf8_lossy does (which HF `tokenizers` uses when it
// detokenizes), the "where may a stream be cut" question, and Unicode NFC through
// utf8proc with a fast path for text that NFC leaves unchanged.
//
//   if (!IsValidUtf8(text)) return absl::InvalidArgumentError("not UTF-8");
//   std::string shown;
//   AppendUtf8Lossy(bytes, &shown);             // invalid runs -> U+FFFD
//   size_t cut = Utf8StreamCut(pending);        // bytes [0, cut) can be shown now
#ifndef RINGSERVE_SERVER_UTF8_H_
#define RINGSERVE_SERVER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ring::text {

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points beyond
// U+10FFFF; NUL bytes are fine).
bool IsValidUtf8(absl::string_view s);

// Appends `bytes` to `out`, replacing every maximal invalid subsequence by one U+FFFD
// (Unicode's "substitution of maximal subparts", which is what Rust's from_utf8_lossy and
// Python's errors="replace" do): an invalid lead byte is one subpart; a valid lead byte
// followed by a valid but truncated continuation is one subpart.
void AppendUtf8Lossy(absl::string_view bytes, std::string* out);

// For a byte stream that will continue: the largest n such that AppendUtf8Lossy of
// bytes[0, n) followed by AppendUtf8Lossy of (bytes[n, end) + anything later) equals
// AppendUtf8Lossy of the whole. It is bytes.size() unless the stream ends inside a
// multi-byte character that may still be completed (at most 3 bytes are held back).
size_t Utf8StreamCut(absl::string_view bytes);

// Appends the UTF-8 encoding of code point `cp` (must be a scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// Decodes the code point at s[*pos] (s must be valid UTF-8) and advances *pos.
char32_t NextCodePoint(absl::string_view s, size_t* pos);

// Unicode NFC of valid UTF-8 text (utf8proc: UTF8PROC_STABLE | UTF8PROC_COMPOSE). Text
// made only of characters that can neither change nor combine under NFC (all of ASCII,
// most CJK, emoji...) is returned unchanged without calling utf8proc.
std::string NfcNormalize(absl::string_view s);

// True when NFC certainly leaves `s` unchanged (the fast-path test of NfcNormalize).
bool IsNfcInvariant(absl::string_view s);

}  // namespace ring::text

#endif  // RINGSERVE_SERVER_UTF8_H_
