#include "server/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

namespace ring::text {
namespace {

// Oniguruma's \s (Unicode White_Space) as a PCRE2 class body. PCRE2's own \s also has
// U+180E, which stopped being a space in Unicode 6.3.
constexpr absl::string_view kSpaceBody =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr absl::string_view kHexBody = "0-9a-fA-F";

// Per general category, the code points Oniguruma has in \p{X} and PCRE2 does not
// (`added`), and the reverse (`removed`), as PCRE2 class bodies.
struct CategoryDelta {
  absl::string_view name;
  absl::string_view added;
  absl::string_view removed;
};
constexpr CategoryDelta kCategoryDeltas[] = {
#include "server/tokenizer_regex_unicode.inc"
};

const CategoryDelta* FindDelta(absl::string_view name) {
  for (const CategoryDelta& d : kCategoryDeltas) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

absl::Status Untranslatable(absl::string_view pattern, absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat("regex \"", pattern, "\": ", what,
                   " is not supported (no exact PCRE2 equivalent of Oniguruma's meaning)"));
}

// \p{name} (negated: \P{name} or \p{^name}) with Oniguruma's Unicode version.
absl::Status AppendProperty(absl::string_view pattern, absl::string_view name, bool negated,
                            bool in_class, std::string* out) {
  const std::string plain = absl::StrCat(negated ? "\\P{" : "\\p{", name, "}");
  const CategoryDelta* d = FindDelta(name);
  if (d == nullptr) {
    // Scripts and other properties: PCRE2's (Unicode 14) tables as they are.
    absl::StrAppend(out, plain);
    return absl::OkStatus();
  }
  const std::string positive = absl::StrCat("\\p{", name, "}", d->added);
  if (in_class) {
    // Inside a class only a union can be written: fine for \p{X} plus additions.
    if (negated || !d->removed.empty()) {
      return Untranslatable(pattern, absl::StrCat(plain, " inside a character class"));
    }
    absl::StrAppend(out, positive);
    return absl::OkStatus();
  }
  if (!negated) {
    if (d->removed.empty()) {
      absl::StrAppend(out, "[", positive, "]");
    } else {
      absl::StrAppend(out, "(?:(?![", d->removed, "])[", positive, "])");
    }
  } else {
    if (d->removed.empty()) {
      absl::StrAppend(out, "[^", positive, "]");
    } else {
      absl::StrAppend(out, "(?:[", d->removed, "]|[^", positive, "])");
    }
  }
  return absl::OkStatus();
}

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<char*>(buf);
}

// One match data per thread, shared by every Regex: only the whole-match offsets are read,
// so one ovector pair suffices whatever the pattern's groups.
pcre2_match_data* ThreadMatchData() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder holder;
  return holder.md;
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigPattern(absl::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return absl::InvalidArgumentError(
          absl::StrCat("regex \"", p, "\": trailing backslash"));
      const char e = p[i + 1];
      i += 2;
      switch (e) {
        case 's':
          absl::StrAppend(&out, in_class ? "" : "[", kSpaceBody, in_class ? "" : "]");
          break;
        case 'S':
          if (in_class) return Untranslatable(p, "\\S inside a character class");
          absl::StrAppend(&out, "[^", kSpaceBody, "]");
          break;
        case 'd':
        case 'D':
          // Oniguruma's \d is \p{Nd}.
          RING_RETURN_IF_ERROR(AppendProperty(p, "Nd", e == 'D', in_class, &out));
          break;
        case 'h':
          absl::StrAppend(&out, in_class ? "" : "[", kHexBody, in_class ? "" : "]");
          break;
        case 'H':
          if (in_class) return Untranslatable(p, "\\H inside a character class");
          absl::StrAppend(&out, "[^", kHexBody, "]");
          break;
        case 'v':
          out += "\\x{0B}";
          break;
        case 'w':
        case 'W':
          // Oniguruma: Alphabetic | M | Nd | Pc | Join_Control, of Unicode 16.
          return Untranslatable(p, "\\w, \\W");
        case 'b':
        case 'B':
          return Untranslatable(p, "a word boundary (\\b, \\B)");
        case 'u': {
          if (i + 4 > p.size() || !IsHex(p[i]) || !IsHex(p[i + 1]) || !IsHex(p[i + 2]) ||
              !IsHex(p[i + 3])) {
            return absl::InvalidArgumentError(
                absl::StrCat("regex \"", p, "\": \\u needs 4 hex digits"));
          }
          absl::StrAppend(&out, "\\x{", p.substr(i, 4), "}");
          i += 4;
          break;
        }
        case 'p':
        case 'P': {
          if (i >= p.size() || p[i] != '{') {  // \pL: one-letter name
            if (i >= p.size()) {
              return absl::InvalidArgumentError(absl::StrCat("regex \"", p, "\": bad \\p"));
            }
            RING_RETURN_IF_ERROR(AppendProperty(p, p.substr(i, 1), e == 'P', in_class, &out));
            ++i;
            break;
          }
          const size_t close = p.find('}', i);
          if (close == absl::string_view::npos) {
            return absl::InvalidArgumentError(
                absl::StrCat("regex \"", p, "\": unterminated \\", std::string(1, e), "{"));
          }
          absl::string_view name = p.substr(i + 1, close - i - 1);
          bool negated = e == 'P';
          if (!name.empty() && name[0] == '^') {
            negated = !negated;
            name.remove_prefix(1);
          }
          RING_RETURN_IF_ERROR(AppendProperty(p, name, negated, in_class, &out));
          i = close + 1;
          break;
        }
        case 'x':
          // \x{..} is copied whole so its braces are not mistaken for a quantifier.
          out += "\\x";
          if (i < p.size() && p[i] == '{') {
            const size_t close = p.find('}', i);
            if (close == absl::string_view::npos) {
              return absl::InvalidArgumentError(
                  absl::StrCat("regex \"", p, "\": unterminated \\x{"));
            }
            out.append(p.data() + i, close + 1 - i);
            i = close + 1;
          }
          break;
        default:
          out += '\\';
          out += e;
          break;
      }
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          return Untranslatable(p, "a POSIX bracket class");
        }
        return Untranslatable(p, "a nested character class");
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        return Untranslatable(p, "character class intersection (&&)");
      }
      if (c == ']') in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += '[';
      ++i;
      // A ']' first in a class (after an optional '^') is a literal in both dialects.
      if (i < p.size() && p[i] == '^') {
        out += '^';
        ++i;
      }
      if (i < p.size() && p[i] == ']') {
        out += "\\]";
        ++i;
      }
      continue;
    }
    out += c;
    ++i;
  }
  if (in_class) {
    return absl::InvalidArgumentError(absl::StrCat("regex \"", p, "\": unterminated ["));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern) {
  absl::StatusOr<std::string> translated = TranslateOnigPattern(pattern);
  if (!translated.ok()) return translated.status();
  return CompileInternal(*translated, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, pattern);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("empty split string pattern");
  return CompileInternal(std::string(text), PCRE2_UTF | PCRE2_LITERAL, text);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileInternal(const std::string& pattern,
                                                              uint32_t options,
                                                              absl::string_view shown) {
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);  // Oniguruma: only \n ends a line
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                   pattern.size(), options, &err,
                                   &err_offset, cc);
  pcre2_compile_context_free(cc);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("regex \"", shown, "\": ",
                                                   Pcre2Message(err), " at offset ",
                                                   err_offset, " of \"", pattern, "\""));
  }
  auto re = std::unique_ptr<Regex>(new Regex());
  re->pattern_ = std::string(shown);
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(absl::string_view subject,
                            std::vector<std::pair<uint32_t, uint32_t>>* out) const {
  const auto* code = static_cast<const pcre2_code*>(code_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  pcre2_match_data* md = ThreadMatchData();
  // Created only if the 32 KiB default JIT stack is too small (deep backtracking).
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* stack = nullptr;
  absl::Status status;
  size_t start = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (start <= n) {
    int rc;
    if (jit_ && mc == nullptr) {
      rc = pcre2_jit_match(code, s, n, start, PCRE2_NO_UTF_CHECK, md, nullptr);
    } else {
      rc = pcre2_match(code, s, n, start, PCRE2_NO_UTF_CHECK, md, mc);
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && mc == nullptr) {
      mc = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(mc, nullptr, stack);
      continue;  // retry this position with the big stack
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("regex \"", pattern_, "\": ", Pcre2Message(rc)));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t ms = ov[0];
    const size_t me = ov[1];
    if (ms == me && have_last && last_match_end == start) {
      // Oniguruma's find_iter: no empty match right after the previous match; step over
      // one character and search again.
      if (start >= n) break;
      const auto lead = static_cast<uint8_t>(subject[start]);
      start += lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      continue;
    }
    out->emplace_back(static_cast<uint32_t>(ms), static_cast<uint32_t>(me));
    start = me;
    have_last = true;
    last_match_end = me;
    if (ms == me && me == n) break;
  }
  if (mc != nullptr) {
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(stack);
  }
  return status;
}

}  // namespace ring::text
