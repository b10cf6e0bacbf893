// File: server/jinja_parser.cc
//
// Lexer and recursive-descent parser for the jinja2 subset chat templates use. It follows
// jinja2's own grammar (jinja2/lexer.py, jinja2/parser.py) rule for rule, including its
// surprises, because templates are written against it:
//   - `is` tests and `|` filters bind tighter than any operator: `a + b is string` tests b;
//   - `**` is left-associative and binds looser than unary minus: -2 ** 2 == 4;
//   - comparisons chain (1 < x < 3); `not` binds looser than comparisons;
//   - the environment transformers uses: trim_blocks (drop the newline after a block or
//     comment tag) and lstrip_blocks (drop spaces/tabs before a block or comment tag that
//     starts its line), plus `-`/`+` whitespace control, and one trailing newline of the
//     template removed (keep_trailing_newline=False).
// Errors name line:column and the construct.
#include <algorithm>
#include <functional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/jinja_ast.h"
#include "server/jinja_builtins.h"
#include "utf8proc.h"

namespace ring::jinja {
namespace {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof,
};

struct Token {
  Tok type;
  std::string value;  // text, name, operator, or decoded string literal
  Value literal;      // numbers and strings
  size_t offset = 0;
};

bool IsPySpaceAt(absl::string_view s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *len = 1;
    return PyIsSpace(c);
  }
  utf8proc_int32_t cp;
  utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                        static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0) {
    *len = 1;
    return false;
  }
  *len = static_cast<size_t>(n);
  return PyIsSpace(static_cast<char32_t>(cp));
}

// Python str.rstrip() / lstrip() (Unicode whitespace).
std::string PyRStrip(absl::string_view s) {
  std::vector<char32_t> cps = DecodeUtf8(s);
  while (!cps.empty() && PyIsSpace(cps.back())) cps.pop_back();
  return EncodeUtf8(cps);
}

size_t SkipPySpace(absl::string_view s, size_t i) {
  size_t len;
  while (i < s.size() && IsPySpaceAt(s, i, &len)) i += len;
  return i;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  SourcePos PosOf(size_t offset) const {
    size_t line =
        std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - line_starts_.begin();
    size_t start = line_starts_[line - 1];
    SourcePos p;
    p.line = static_cast<int>(line);
    p.column =
        static_cast<int>(CodePointCount(absl::string_view(src_).substr(start, offset - start)) + 1);
    return p;
  }

  absl::Status Error(size_t offset, absl::string_view msg) const {
    SourcePos p = PosOf(offset);
    return absl::InvalidArgumentError(absl::StrCat("line ", p.line, ":", p.column, ": ", msg));
  }

  absl::StatusOr<std::vector<Token>> Run() {
    std::vector<Token> out;
    size_t pos = 0;
    const size_t n = src_.size();
    while (pos < n) {
      size_t start = src_.find('{', pos);
      while (start != std::string::npos && start + 1 < n && src_[start + 1] != '{' &&
             src_[start + 1] != '%' && src_[start + 1] != '#') {
        start = src_.find('{', start + 1);
      }
      if (start == std::string::npos || start + 1 >= n) {
        EmitText(src_.substr(pos), pos, &out);
        break;
      }
      char kind = src_[start + 1];
      char mod = start + 2 < n ? src_[start + 2] : '\0';
      if (mod != '-' && mod != '+') mod = '\0';
      std::string text = src_.substr(pos, start - pos);
      if (mod == '-') {
        text = PyRStrip(text);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: spaces/tabs between the line start and a block/comment tag go.
        size_t l = text.rfind('\n');
        l = (l == std::string::npos) ? 0 : l + 1;
        bool line_starting = pos == 0 || src_[pos - 1] == '\n';
        if ((l > 0 || line_starting) && text.find_first_not_of(" \t", l) == std::string::npos) {
          text.resize(l);
        }
      }
      EmitText(text, pos, &out);
      size_t inner = start + 2 + (mod ? 1 : 0);
      absl::StatusOr<size_t> next;
      if (kind == '#') {
        next = LexComment(start, inner);
      } else if (kind == '%' && IsRawBegin(inner)) {
        next = LexRaw(start, inner, &out);
      } else {
        next = LexTag(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, start, inner, &out);
      }
      if (!next.ok()) return next.status();
      pos = *next;
    }
    Token eof{Tok::kEof, "", Value(), n};
    out.push_back(eof);
    return out;
  }

 private:
  void EmitText(std::string text, size_t offset, std::vector<Token>* out) {
    if (text.empty()) return;
    Token t{Tok::kText, std::move(text), Value(), offset};
    out->push_back(std::move(t));
  }

  // After a block/comment close: `-` eats all following whitespace, `+` nothing, and a
  // plain close eats one newline (trim_blocks).
  size_t AfterBlockClose(size_t after, char mod) {
    if (mod == '-') return SkipPySpace(src_, after);
    if (mod == '+') return after;
    if (after < src_.size() && src_[after] == '\n') return after + 1;
    return after;
  }

  absl::StatusOr<size_t> LexComment(size_t start, size_t inner) {
    size_t end = src_.find("#}", inner);
    if (end == std::string::npos) return Error(start, "missing end of comment tag");
    char mod = '\0';
    if (end > inner && (src_[end - 1] == '-' || src_[end - 1] == '+')) mod = src_[end - 1];
    return AfterBlockClose(end + 2, mod);
  }

  // {% raw %} ... {% endraw %}: the body is text, untouched.
  bool IsRawBegin(size_t inner) const {
    size_t i = SkipPySpace(src_, inner);
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    if (i < src_.size() && (absl::ascii_isalnum(src_[i]) || src_[i] == '_')) return false;
    i = SkipPySpace(src_, i);
    if (i < src_.size() && src_[i] == '-') ++i;
    return src_.compare(i, 2, "%}") == 0;
  }

  absl::StatusOr<size_t> LexRaw(size_t start, size_t inner, std::vector<Token>* out) {
    size_t i = SkipPySpace(src_, inner) + 3;
    i = SkipPySpace(src_, i);
    char open_mod = '\0';
    if (src_[i] == '-') {
      open_mod = '-';
      ++i;
    }
    i += 2;
    if (open_mod == '-') i = SkipPySpace(src_, i);
    // Find {%[-+]? endraw [-+]?%}
    size_t search = i;
    while (true) {
      size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) return Error(start, "missing end of raw directive");
      size_t j = tag + 2;
      char mod = '\0';
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) mod = src_[j++];
      j = SkipPySpace(src_, j);
      if (src_.compare(j, 6, "endraw") == 0) {
        j = SkipPySpace(src_, j + 6);
        char close_mod = '\0';
        if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) close_mod = src_[j++];
        if (src_.compare(j, 2, "%}") == 0) {
          std::string body = src_.substr(i, tag - i);
          if (mod == '-') body = PyRStrip(body);
          EmitText(body, i, out);
          return AfterBlockClose(j + 2, close_mod);
        }
      }
      search = tag + 2;
    }
  }

  absl::StatusOr<size_t> LexTag(Tok begin, size_t start, size_t inner, std::vector<Token>* out) {
    out->push_back(Token{begin, "", Value(), start});
    const bool is_var = begin == Tok::kVarBegin;
    size_t i = inner;
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      i = SkipPySpace(src_, i);
      if (i >= n)
        return Error(start, is_var ? "unexpected end of template, expected '}}'"
                                   : "unexpected end of template, expected '%}'");
      // Tag end (only when brackets are balanced, as jinja2's lexer does).
      if (balance.empty()) {
        if (is_var) {
          if (src_.compare(i, 3, "-}}") == 0) {
            out->push_back(Token{Tok::kVarEnd, "", Value(), i});
            return SkipPySpace(src_, i + 3);
          }
          if (src_.compare(i, 2, "}}") == 0) {
            out->push_back(Token{Tok::kVarEnd, "", Value(), i});
            return i + 2;
          }
        } else {
          if ((src_[i] == '-' || src_[i] == '+') && src_.compare(i + 1, 2, "%}") == 0) {
            out->push_back(Token{Tok::kBlockEnd, "", Value(), i});
            return AfterBlockClose(i + 3, src_[i]);
          }
          if (src_.compare(i, 2, "%}") == 0) {
            out->push_back(Token{Tok::kBlockEnd, "", Value(), i});
            return AfterBlockClose(i + 2, '\0');
          }
        }
      }
      char c = src_[i];
      // Numbers. jinja2 refuses a float right after '.', so `x.0.y` is item 0 then y.
      if (absl::ascii_isdigit(c)) {
        absl::StatusOr<size_t> next = LexNumber(i, out);
        if (!next.ok()) return next.status();
        i = *next;
        continue;
      }
      if (absl::ascii_isalpha(c) || c == '_' || static_cast<unsigned char>(c) >= 0x80) {
        size_t j = i;
        while (j < n && (absl::ascii_isalnum(src_[j]) || src_[j] == '_' ||
                         static_cast<unsigned char>(src_[j]) >= 0x80)) {
          ++j;
        }
        out->push_back(Token{Tok::kName, src_.substr(i, j - i), Value(), i});
        i = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        absl::StatusOr<size_t> next = LexString(i, out);
        if (!next.ok()) return next.status();
        i = *next;
        continue;
      }
      static const char* kOps[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/",
                                   "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                   ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      bool matched = false;
      for (const char* op : kOps) {
        size_t len = std::char_traits<char>::length(op);
        if (src_.compare(i, len, op) == 0) {
          std::string o(op);
          if (o == "(" || o == "[" || o == "{") {
            balance.push_back(o[0]);
          } else if (o == ")" || o == "]" || o == "}") {
            char want = o == ")" ? '(' : (o == "]" ? '[' : '{');
            if (balance.empty() || balance.back() != want) {
              return Error(i, absl::StrCat("unexpected '", o, "'"));
            }
            balance.pop_back();
          }
          out->push_back(Token{Tok::kOp, o, Value(), i});
          i += len;
          matched = true;
          break;
        }
      }
      if (!matched) {
        return Error(i, absl::StrCat("unexpected char '", std::string(1, c), "'"));
      }
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t i, std::vector<Token>* out) {
    const size_t n = src_.size();
    auto digits = [&](size_t j) {  // (\d+_)*\d+
      size_t k = j;
      while (k < n &&
             (absl::ascii_isdigit(src_[k]) ||
              (src_[k] == '_' && k + 1 < n && absl::ascii_isdigit(src_[k + 1]) && k > j))) {
        ++k;
      }
      return k;
    };
    auto strip = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    bool after_dot = i > 0 && src_[i - 1] == '.';
    size_t int_end = digits(i);
    if (!after_dot) {
      size_t j = int_end;
      bool is_float = false;
      if (j + 1 < n && src_[j] == '.' && absl::ascii_isdigit(src_[j + 1])) {
        j = digits(j + 1);
        is_float = true;
      }
      if (j < n && (src_[j] == 'e' || src_[j] == 'E')) {
        size_t k = j + 1;
        if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
        if (k < n && absl::ascii_isdigit(src_[k])) {
          j = digits(k);
          is_float = true;
        }
      }
      if (is_float) {
        std::string text = strip(src_.substr(i, j - i));
        out->push_back(
            Token{Tok::kFloat, text, Value::Float(std::strtod(text.c_str(), nullptr)), i});
        return j;
      }
    }
    // Integers: 0x / 0o / 0b prefixes, or decimal without leading zeros (except "0").
    if (src_[i] == '0' && i + 1 < n &&
        (src_[i + 1] == 'x' || src_[i + 1] == 'X' || src_[i + 1] == 'o' || src_[i + 1] == 'O' ||
         src_[i + 1] == 'b' || src_[i + 1] == 'B')) {
      int base = (src_[i + 1] == 'x' || src_[i + 1] == 'X')   ? 16
                 : (src_[i + 1] == 'o' || src_[i + 1] == 'O') ? 8
                                                              : 2;
      size_t j = i + 2;
      while (j < n && (absl::ascii_isxdigit(src_[j]) || src_[j] == '_')) ++j;
      std::string text = strip(src_.substr(i + 2, j - i - 2));
      errno = 0;
      int64_t v = std::strtoll(text.c_str(), nullptr, base);
      if (errno != 0 || text.empty()) return Error(i, "invalid integer literal");
      out->push_back(Token{Tok::kInt, src_.substr(i, j - i), Value::Int(v), i});
      return j;
    }
    size_t j = src_[i] == '0' ? i + 1 : int_end;
    if (src_[i] == '0') {
      while (j < n && (src_[j] == '0' || (src_[j] == '_' && j + 1 < n && src_[j + 1] == '0'))) ++j;
    }
    std::string text = strip(src_.substr(i, j - i));
    errno = 0;
    int64_t v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno != 0) return Error(i, "integer literal out of range");
    out->push_back(Token{Tok::kInt, text, Value::Int(v), i});
    return j;
  }

  // Python string literal with the escapes jinja2 decodes ("unicode-escape").
  absl::StatusOr<size_t> LexString(size_t i, std::vector<Token>* out) {
    const char quote = src_[i];
    std::string value;
    size_t j = i + 1;
    const size_t n = src_.size();
    auto hex = [&](size_t at, int count, char32_t* cp) {
      if (at + count > n) return false;
      char32_t v = 0;
      for (int k = 0; k < count; ++k) {
        char h = src_[at + k];
        if (!absl::ascii_isxdigit(h)) return false;
        v = v * 16 + (absl::ascii_isdigit(h) ? h - '0' : (absl::ascii_tolower(h) - 'a' + 10));
      }
      *cp = v;
      return true;
    };
    while (true) {
      if (j >= n) return Error(i, "unterminated string literal");
      char c = src_[j];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++j;
        continue;
      }
      if (j + 1 >= n) return Error(i, "unterminated string literal");
      char e = src_[j + 1];
      j += 2;
      char32_t cp;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
          if (!hex(j, 2, &cp)) return Error(j - 2, "invalid \\x escape in string literal");
          AppendUtf8(cp, &value);
          j += 2;
          break;
        case 'u':
          if (!hex(j, 4, &cp)) return Error(j - 2, "invalid \\u escape in string literal");
          AppendUtf8(cp, &value);
          j += 4;
          break;
        case 'U':
          if (!hex(j, 8, &cp) || cp > 0x10FFFF) {
            return Error(j - 2, "invalid \\U escape in string literal");
          }
          AppendUtf8(cp, &value);
          j += 8;
          break;
        case 'N':
          return Error(j - 2, "unsupported \\N{...} escape in string literal");
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && j < n && src_[j] >= '0' && src_[j] <= '7'; ++k, ++j) {
              v = v * 8 + static_cast<char32_t>(src_[j] - '0');
            }
            AppendUtf8(v, &value);
          } else {  // unknown escapes stay as written
            value += '\\';
            value += e;
          }
      }
    }
    out->push_back(Token{Tok::kString, value, Value::String(value), i});
    return j + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
};

// --- parser --------------------------------------------------------------------------------

// Nesting bound for expressions and blocks (jinja2 is bounded by Python's recursion limit).
constexpr int kMaxNesting = 200;

struct DepthGuard {
  explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~DepthGuard() { --*depth_; }
  int* depth_;
};

class Parser {
 public:
  Parser(const Lexer& lexer, std::vector<Token> tokens) : lexer_(lexer), toks_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseTemplate() {
    std::string end;
    return ParseBody({}, &end);
  }

 private:
  // --- token helpers ---
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const { return Cur().type == Tok::kOp && Cur().value == op; }
  bool IsName(absl::string_view name) const {
    return Cur().type == Tok::kName && Cur().value == name;
  }
  SourcePos Pos() const { return lexer_.PosOf(Cur().offset); }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case Tok::kText:
        return "template text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kEof:
        return "end of template";
      case Tok::kString:
        return "string";
      case Tok::kInt:
      case Tok::kFloat:
        return "number '" + t.value + "'";
      default:
        return "'" + t.value + "'";
    }
  }
  absl::Status ErrorAt(const Token& t, absl::string_view msg) const {
    return lexer_.Error(t.offset, msg);
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return ErrorAt(Cur(), absl::StrCat("expected ", expected, ", got ", Describe(Cur())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!IsOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != Tok::kName) return Unexpected("a name");
    std::string v = Cur().value;
    Next();
    return v;
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != Tok::kBlockEnd) return Unexpected("end of statement block");
    Next();
    return absl::OkStatus();
  }

  ExprPtr NewExpr(ExprKind kind, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  StmtPtr NewStmt(StmtKind kind, SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = pos;
    return s;
  }

  // --- statements ---

  // Parses until a block tag whose first name is in `ends` (consumed; the caller parses
  // the rest of that tag). `ends` empty: until the end of the template.
  absl::StatusOr<Body> ParseBody(const std::set<std::string>& ends, std::string* found) {
    Body body;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case Tok::kText: {
          StmtPtr s = NewStmt(StmtKind::kText, Pos());
          s->text = t.value;
          body.push_back(std::move(s));
          Next();
          break;
        }
        case Tok::kVarBegin: {
          SourcePos pos = Pos();
          Next();
          absl::StatusOr<ExprPtr> e = ParseTuple(true, false, {}, false);
          if (!e.ok()) return e.status();
          if (Cur().type != Tok::kVarEnd) return Unexpected("'}}'");
          Next();
          StmtPtr s = NewStmt(StmtKind::kOutput, pos);
          s->expr = std::move(*e);
          body.push_back(std::move(s));
          break;
        }
        case Tok::kBlockBegin: {
          Next();
          if (Cur().type != Tok::kName) return Unexpected("a statement name");
          const std::string tag = Cur().value;
          if (ends.count(tag)) {
            *found = tag;
            Next();
            return body;
          }
          absl::StatusOr<StmtPtr> s = ParseStatement();
          if (!s.ok()) return s.status();
          if (*s) body.push_back(std::move(*s));
          break;
        }
        case Tok::kEof: {
          if (!ends.empty()) {
            std::string want;
            for (const std::string& e : ends) {
              if (e.rfind("end", 0) == 0) want = e;
            }
            if (want.empty()) want = *ends.begin();
            return ErrorAt(t, absl::StrCat("unexpected end of template, expected '", want, "'"));
          }
          return body;
        }
        default:
          return ErrorAt(t, absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return ErrorAt(Cur(), "blocks nested too deeply");
    const Token& t = Cur();
    const std::string tag = t.value;
    if (tag == "if") return ParseIf();
    if (tag == "for") return ParseFor();
    if (tag == "set") return ParseSet();
    if (tag == "macro") return ParseMacro();
    if (tag == "call") return ParseCallBlock();
    if (tag == "filter") return ParseFilterBlock();
    if (tag == "with") return ParseWith();
    if (tag == "generation") {
      SourcePos pos = Pos();
      Next();
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      StmtPtr st = NewStmt(StmtKind::kGeneration, pos);
      std::string end;
      absl::StatusOr<Body> body = ParseBody({"endgeneration"}, &end);
      if (!body.ok()) return body.status();
      st->body = std::move(*body);
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      return st;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) {
        return ErrorAt(t, absl::StrCat("'", tag, "' outside of a loop"));
      }
      StmtPtr st = NewStmt(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, Pos());
      Next();
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      return st;
    }
    static const std::set<std::string> kKnownEnds = {
        "endif",   "endfor",        "endset", "endmacro", "endcall", "endfilter",
        "endwith", "endgeneration", "elif",   "else",     "endraw",  "endblock"};
    if (kKnownEnds.count(tag)) return ErrorAt(t, absl::StrCat("unexpected '", tag, "'"));
    return ErrorAt(t, absl::StrCat("unsupported tag '", tag, "'"));
  }

  absl::StatusOr<StmtPtr> ParseIf() {
    StmtPtr st = NewStmt(StmtKind::kIf, Pos());
    Next();  // if / elif
    while (true) {
      absl::StatusOr<ExprPtr> cond = ParseTuple(false, false, {}, false);
      if (!cond.ok()) return cond.status();
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      absl::StatusOr<Body> body = ParseBody({"elif", "else", "endif"}, &end);
      if (!body.ok()) return body.status();
      st->conds.push_back(std::move(*cond));
      st->bodies.push_back(std::move(*body));
      if (end == "elif") continue;
      if (end == "else") {
        if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
        absl::StatusOr<Body> else_body = ParseBody({"endif"}, &end);
        if (!else_body.ok()) return else_body.status();
        st->else_body = std::move(*else_body);
      }
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      return st;
    }
  }

  // Names for `for x` / `for k, v` / `set a, b` / `(a, b)`.
  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    std::vector<std::string> names;
    bool paren = IsOp("(");
    if (paren) Next();
    while (true) {
      if (Cur().type != Tok::kName) return Unexpected("a variable name");
      if (IsOp("(")) return ErrorAt(Cur(), "nested tuple unpacking is not supported");
      names.push_back(Cur().value);
      Next();
      if (!IsOp(",")) break;
      Next();
      if (paren && IsOp(")")) break;
      if (!paren && (IsName("in") || IsOp("="))) break;
    }
    if (paren) {
      if (absl::Status s = ExpectOp(")"); !s.ok()) return s;
    }
    for (const std::string& n : names) {
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" ||
          n == "None" || n == "in" || n == "not" || n == "and" || n == "or" || n == "is" ||
          n == "if" || n == "else") {
        return ErrorAt(Cur(), absl::StrCat("cannot assign to '", n, "'"));
      }
    }
    return names;
  }

  absl::StatusOr<StmtPtr> ParseFor() {
    StmtPtr st = NewStmt(StmtKind::kFor, Pos());
    Next();
    absl::StatusOr<std::vector<std::string>> targets = ParseTargets();
    if (!targets.ok()) return targets.status();
    st->targets = std::move(*targets);
    if (!IsName("in")) return Unexpected("'in'");
    Next();
    absl::StatusOr<ExprPtr> iter = ParseTuple(false, false, {"recursive", "if"}, false);
    if (!iter.ok()) return iter.status();
    st->expr = std::move(*iter);
    if (IsName("if")) {
      Next();
      absl::StatusOr<ExprPtr> cond = ParseExpression(true);
      if (!cond.ok()) return cond.status();
      st->cond = std::move(*cond);
    }
    if (IsName("recursive")) return ErrorAt(Cur(), "unsupported construct 'recursive' loop");
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    ++loop_depth_;
    std::string end;
    absl::StatusOr<Body> body = ParseBody({"else", "endfor"}, &end);
    --loop_depth_;
    if (!body.ok()) return body.status();
    st->body = std::move(*body);
    if (end == "else") {
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      absl::StatusOr<Body> else_body = ParseBody({"endfor"}, &end);
      if (!else_body.ok()) return else_body.status();
      st->else_body = std::move(*else_body);
    }
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    return st;
  }

  absl::StatusOr<StmtPtr> ParseSet() {
    SourcePos pos = Pos();
    Next();
    StmtPtr st = NewStmt(StmtKind::kSet, pos);
    if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().value == ".") {
      st->targets.push_back(Cur().value);
      Next();
      Next();
      absl::StatusOr<std::string> attr = ExpectName();
      if (!attr.ok()) return attr.status();
      st->ns_attr = *attr;
    } else {
      absl::StatusOr<std::vector<std::string>> targets = ParseTargets();
      if (!targets.ok()) return targets.status();
      st->targets = std::move(*targets);
    }
    if (IsOp("=")) {
      Next();
      absl::StatusOr<ExprPtr> value = ParseTuple(true, false, {}, false);
      if (!value.ok()) return value.status();
      st->expr = std::move(*value);
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      return st;
    }
    // Block set: {% set x %}...{% endset %}, optionally {% set x | filter %}.
    if (!st->ns_attr.empty() || st->targets.size() != 1) {
      return ErrorAt(Cur(), "block set needs a single variable name");
    }
    st->kind = StmtKind::kSetBlock;
    while (IsOp("|")) {
      Next();
      absl::StatusOr<ExprPtr> f = ParseFilter(nullptr);
      if (!f.ok()) return f.status();
      st->filters.push_back(std::move(*f));
    }
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    std::string end;
    absl::StatusOr<Body> body = ParseBody({"endset"}, &end);
    if (!body.ok()) return body.status();
    st->body = std::move(*body);
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    return st;
  }

  absl::Status ParseSignature(Stmt* st) {
    if (absl::Status s = ExpectOp("("); !s.ok()) return s;
    while (!IsOp(")")) {
      if (!st->params.empty()) {
        if (absl::Status s = ExpectOp(","); !s.ok()) return s;
        if (IsOp(")")) break;
      }
      absl::StatusOr<std::string> name = ExpectName();
      if (!name.ok()) return name.status();
      st->params.push_back(*name);
      if (IsOp("=")) {
        Next();
        absl::StatusOr<ExprPtr> d = ParseExpression(true);
        if (!d.ok()) return d.status();
        st->defaults.push_back(std::move(*d));
      } else {
        if (!st->defaults.empty() && st->defaults.back()) {
          return ErrorAt(Cur(), "non-default argument follows default argument");
        }
        st->defaults.push_back(nullptr);
      }
    }
    return ExpectOp(")");
  }

  absl::StatusOr<StmtPtr> ParseMacro() {
    StmtPtr st = NewStmt(StmtKind::kMacro, Pos());
    Next();
    absl::StatusOr<std::string> name = ExpectName();
    if (!name.ok()) return name.status();
    st->name = *name;
    if (absl::Status s = ParseSignature(st.get()); !s.ok()) return s;
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    absl::Status body = ParseCallableBody(st.get(), "endmacro");
    if (!body.ok()) return body;
    return st;
  }

  // Macro and call-block bodies: break/continue do not cross them, and whether the body
  // mentions caller/varargs/kwargs decides which extra arguments a call may pass.
  absl::Status ParseCallableBody(Stmt* st, const std::string& end_tag) {
    int saved_depth = loop_depth_;
    loop_depth_ = 0;
    callable_uses_.push_back({});
    std::string end;
    absl::StatusOr<Body> body = ParseBody({end_tag}, &end);
    std::set<std::string> uses = callable_uses_.back();
    callable_uses_.pop_back();
    loop_depth_ = saved_depth;
    if (!body.ok()) return body.status();
    st->body = std::move(*body);
    st->uses_caller = uses.count("caller") > 0;
    st->uses_varargs = uses.count("varargs") > 0;
    st->uses_kwargs = uses.count("kwargs") > 0;
    return ExpectBlockEnd();
  }

  absl::StatusOr<StmtPtr> ParseCallBlock() {
    StmtPtr st = NewStmt(StmtKind::kCallBlock, Pos());
    Next();
    if (IsOp("(")) {
      if (absl::Status s = ParseSignature(st.get()); !s.ok()) return s;
    }
    absl::StatusOr<ExprPtr> call = ParseExpression(true);
    if (!call.ok()) return call.status();
    if ((*call)->kind != ExprKind::kCall) {
      return ErrorAt(Cur(), "expected a call expression in 'call' block");
    }
    st->expr = std::move(*call);
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    absl::Status body = ParseCallableBody(st.get(), "endcall");
    if (!body.ok()) return body;
    return st;
  }

  absl::StatusOr<StmtPtr> ParseFilterBlock() {
    StmtPtr st = NewStmt(StmtKind::kFilterBlock, Pos());
    Next();
    while (true) {
      absl::StatusOr<ExprPtr> f = ParseFilter(nullptr);
      if (!f.ok()) return f.status();
      st->filters.push_back(std::move(*f));
      if (!IsOp("|")) break;
      Next();
    }
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    std::string end;
    absl::StatusOr<Body> body = ParseBody({"endfilter"}, &end);
    if (!body.ok()) return body.status();
    st->body = std::move(*body);
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    return st;
  }

  absl::StatusOr<StmtPtr> ParseWith() {
    StmtPtr st = NewStmt(StmtKind::kWith, Pos());
    Next();
    while (Cur().type != Tok::kBlockEnd) {
      if (!st->targets.empty()) {
        if (absl::Status s = ExpectOp(","); !s.ok()) return s;
      }
      absl::StatusOr<std::string> name = ExpectName();
      if (!name.ok()) return name.status();
      if (absl::Status s = ExpectOp("="); !s.ok()) return s;
      absl::StatusOr<ExprPtr> v = ParseExpression(true);
      if (!v.ok()) return v.status();
      st->targets.push_back(*name);
      st->values.push_back(std::move(*v));
    }
    Next();
    std::string end;
    absl::StatusOr<Body> body = ParseBody({"endwith"}, &end);
    if (!body.ok()) return body.status();
    st->body = std::move(*body);
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    return st;
  }

  // --- expressions (jinja2/parser.py, same names) ---

  bool IsTupleEnd(const std::set<std::string>& extra_end) const {
    if (Cur().type == Tok::kVarEnd || Cur().type == Tok::kBlockEnd || IsOp(")")) return true;
    return Cur().type == Tok::kName && extra_end.count(Cur().value) > 0;
  }

  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool simplified,
                                     const std::set<std::string>& extra_end,
                                     bool explicit_parentheses) {
    SourcePos pos = Pos();
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) {
        if (absl::Status s = ExpectOp(","); !s.ok()) return s;
      }
      if (IsTupleEnd(extra_end)) break;
      absl::StatusOr<ExprPtr> e = simplified ? ParsePrimary() : ParseExpression(with_condexpr);
      if (!e.ok()) return e.status();
      args.push_back(std::move(*e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) return Unexpected("an expression");
    }
    ExprPtr t = NewExpr(ExprKind::kTuple, pos);
    t->args = std::move(args);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    // Recursive descent: bound the nesting so a hostile template cannot exhaust the stack.
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return ErrorAt(Cur(), "expression nested too deeply");
    if (with_condexpr) return ParseCondExpr();
    return ParseOr();
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    absl::StatusOr<ExprPtr> expr1 = ParseOr();
    if (!expr1.ok()) return expr1;
    ExprPtr node = std::move(*expr1);
    while (IsName("if")) {
      SourcePos pos = Pos();
      Next();
      absl::StatusOr<ExprPtr> cond = ParseOr();
      if (!cond.ok()) return cond;
      ExprPtr other;
      if (IsName("else")) {
        Next();
        absl::StatusOr<ExprPtr> e = ParseCondExpr();
        if (!e.ok()) return e;
        other = std::move(*e);
      }
      ExprPtr c = NewExpr(ExprKind::kCondExpr, pos);
      c->args.push_back(std::move(node));
      c->args.push_back(std::move(*cond));
      c->args.push_back(std::move(other));
      node = std::move(c);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseBinaryLeft(const std::function<absl::StatusOr<ExprPtr>()>& operand,
                                          const std::function<bool()>& at_op) {
    absl::StatusOr<ExprPtr> left = operand();
    if (!left.ok()) return left;
    ExprPtr node = std::move(*left);
    while (at_op()) {
      SourcePos pos = Pos();
      std::string op = Cur().value;
      Next();
      absl::StatusOr<ExprPtr> right = operand();
      if (!right.ok()) return right;
      ExprPtr b = NewExpr(ExprKind::kBinary, pos);
      b->name = op;
      b->args.push_back(std::move(node));
      b->args.push_back(std::move(*right));
      node = std::move(b);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    return ParseBinaryLeft([this] { return ParseAnd(); }, [this] { return IsName("or"); });
  }
  absl::StatusOr<ExprPtr> ParseAnd() {
    return ParseBinaryLeft([this] { return ParseNot(); }, [this] { return IsName("and"); });
  }
  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      SourcePos pos = Pos();
      Next();
      absl::StatusOr<ExprPtr> operand = ParseNot();
      if (!operand.ok()) return operand;
      ExprPtr n = NewExpr(ExprKind::kUnary, pos);
      n->name = "not";
      n->args.push_back(std::move(*operand));
      return n;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    SourcePos pos = Pos();
    absl::StatusOr<ExprPtr> first = ParseMath1();
    if (!first.ok()) return first;
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == Tok::kOp &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == Tok::kName && Peek().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      absl::StatusOr<ExprPtr> rhs = ParseMath1();
      if (!rhs.ok()) return rhs;
      if (!cmp) {
        cmp = NewExpr(ExprKind::kCompare, pos);
        cmp->args.push_back(std::move(*first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(*rhs));
    }
    if (!cmp) return std::move(*first);
    return cmp;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseBinaryLeft([this] { return ParseConcat(); },
                           [this] { return IsOp("+") || IsOp("-"); });
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    SourcePos pos = Pos();
    absl::StatusOr<ExprPtr> first = ParseMath2();
    if (!first.ok()) return first;
    if (!IsOp("~")) return first;
    ExprPtr c = NewExpr(ExprKind::kConcat, pos);
    c->args.push_back(std::move(*first));
    while (IsOp("~")) {
      Next();
      absl::StatusOr<ExprPtr> next = ParseMath2();
      if (!next.ok()) return next;
      c->args.push_back(std::move(*next));
    }
    return c;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryLeft([this] { return ParsePow(); },
                           [this] { return IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"); });
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseBinaryLeft([this] { return ParseUnary(true); }, [this] { return IsOp("**"); });
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return ErrorAt(Cur(), "expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      SourcePos pos = Pos();
      std::string op = Cur().value;
      Next();
      absl::StatusOr<ExprPtr> operand = ParseUnary(false);
      if (!operand.ok()) return operand;
      node = NewExpr(ExprKind::kUnary, pos);
      node->name = op;
      node->args.push_back(std::move(*operand));
    } else {
      absl::StatusOr<ExprPtr> p = ParsePrimary();
      if (!p.ok()) return p;
      node = std::move(*p);
    }
    absl::StatusOr<ExprPtr> post = ParsePostfix(std::move(node));
    if (!post.ok()) return post;
    node = std::move(*post);
    if (with_filter) return ParseFilterExpr(std::move(node));
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    SourcePos pos = Pos();
    switch (t.type) {
      case Tok::kName: {
        ExprPtr e;
        if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
          e = NewExpr(ExprKind::kLiteral, pos);
          e->literal = Value::Bool(t.value == "true" || t.value == "True");
        } else if (t.value == "none" || t.value == "None") {
          e = NewExpr(ExprKind::kLiteral, pos);
          e->literal = Value::None();
        } else {
          e = NewExpr(ExprKind::kName, pos);
          e->name = t.value;
          if (!callable_uses_.empty()) callable_uses_.back().insert(t.value);
        }
        Next();
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (Cur().type == Tok::kString) {  // adjacent literals concatenate
          s += Cur().value;
          Next();
        }
        ExprPtr e = NewExpr(ExprKind::kLiteral, pos);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        ExprPtr e = NewExpr(ExprKind::kLiteral, pos);
        e->literal = t.literal;
        Next();
        return e;
      }
      case Tok::kOp:
        if (t.value == "(") {
          Next();
          absl::StatusOr<ExprPtr> e = ParseTuple(true, false, {}, true);
          if (!e.ok()) return e;
          if (absl::Status s = ExpectOp(")"); !s.ok()) return s;
          return e;
        }
        if (t.value == "[") {
          Next();
          ExprPtr list = NewExpr(ExprKind::kList, pos);
          while (!IsOp("]")) {
            if (!list->args.empty()) {
              if (absl::Status s = ExpectOp(","); !s.ok()) return s;
              if (IsOp("]")) break;
            }
            absl::StatusOr<ExprPtr> item = ParseExpression(true);
            if (!item.ok()) return item;
            list->args.push_back(std::move(*item));
          }
          Next();
          return list;
        }
        if (t.value == "{") {
          Next();
          ExprPtr dict = NewExpr(ExprKind::kDict, pos);
          while (!IsOp("}")) {
            if (!dict->args.empty()) {
              if (absl::Status s = ExpectOp(","); !s.ok()) return s;
              if (IsOp("}")) break;
            }
            absl::StatusOr<ExprPtr> key = ParseExpression(true);
            if (!key.ok()) return key;
            if (absl::Status s = ExpectOp(":"); !s.ok()) return s;
            absl::StatusOr<ExprPtr> value = ParseExpression(true);
            if (!value.ok()) return value;
            dict->args.push_back(std::move(*key));
            dict->args.push_back(std::move(*value));
          }
          Next();
          return dict;
        }
        break;
      default:
        break;
    }
    return ErrorAt(t, absl::StrCat("unexpected ", Describe(t)));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        absl::StatusOr<ExprPtr> sub = ParseSubscript(std::move(node));
        if (!sub.ok()) return sub;
        node = std::move(*sub);
      } else if (IsOp("(")) {
        absl::StatusOr<ExprPtr> call = ParseCall(std::move(node));
        if (!call.ok()) return call;
        node = std::move(*call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        absl::StatusOr<ExprPtr> f = ParseFilter(std::move(node));
        if (!f.ok()) return f;
        node = std::move(*f);
      } else if (IsName("is")) {
        absl::StatusOr<ExprPtr> t = ParseTest(std::move(node));
        if (!t.ok()) return t;
        node = std::move(*t);
      } else if (IsOp("(")) {
        absl::StatusOr<ExprPtr> call = ParseCall(std::move(node));
        if (!call.ok()) return call;
        node = std::move(*call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    SourcePos pos = Pos();
    if (IsOp(".")) {
      Next();
      const Token& attr = Cur();
      if (attr.type == Tok::kName) {
        ExprPtr g = NewExpr(ExprKind::kGetattr, pos);
        g->name = attr.value;
        g->args.push_back(std::move(node));
        Next();
        return g;
      }
      if (attr.type != Tok::kInt) return Unexpected("a name or number");
      ExprPtr key = NewExpr(ExprKind::kLiteral, Pos());
      key->literal = attr.literal;
      Next();
      ExprPtr g = NewExpr(ExprKind::kGetitem, pos);
      g->args.push_back(std::move(node));
      g->args.push_back(std::move(key));
      return g;
    }
    Next();  // [
    std::vector<ExprPtr> subs;
    while (!IsOp("]")) {
      if (!subs.empty()) {
        if (absl::Status s = ExpectOp(","); !s.ok()) return s;
      }
      absl::StatusOr<ExprPtr> sub = ParseSubscribed();
      if (!sub.ok()) return sub;
      subs.push_back(std::move(*sub));
    }
    Next();
    if (subs.empty()) return ErrorAt(Cur(), "expected a subscript");
    ExprPtr key;
    if (subs.size() == 1) {
      key = std::move(subs[0]);
    } else {
      key = NewExpr(ExprKind::kTuple, pos);
      key->args = std::move(subs);
    }
    ExprPtr g = NewExpr(ExprKind::kGetitem, pos);
    g->args.push_back(std::move(node));
    g->args.push_back(std::move(key));
    return g;
  }

  absl::StatusOr<ExprPtr> ParseSubscribed() {
    SourcePos pos = Pos();
    std::vector<ExprPtr> parts;
    if (IsOp(":")) {
      Next();
      parts.push_back(nullptr);
    } else {
      absl::StatusOr<ExprPtr> e = ParseExpression(true);
      if (!e.ok()) return e;
      if (!IsOp(":")) return e;
      Next();
      parts.push_back(std::move(*e));
    }
    if (IsOp(":")) {
      parts.push_back(nullptr);
    } else if (!IsOp("]") && !IsOp(",")) {
      absl::StatusOr<ExprPtr> e = ParseExpression(true);
      if (!e.ok()) return e;
      parts.push_back(std::move(*e));
    } else {
      parts.push_back(nullptr);
    }
    if (IsOp(":")) {
      Next();
      if (!IsOp("]") && !IsOp(",")) {
        absl::StatusOr<ExprPtr> e = ParseExpression(true);
        if (!e.ok()) return e;
        parts.push_back(std::move(*e));
      } else {
        parts.push_back(nullptr);
      }
    } else {
      parts.push_back(nullptr);
    }
    ExprPtr s = NewExpr(ExprKind::kSlice, pos);
    s->args = std::move(parts);
    return s;
  }

  absl::Status ParseCallArgs(Expr* target) {
    if (absl::Status s = ExpectOp("("); !s.ok()) return s;
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        if (absl::Status s = ExpectOp(","); !s.ok()) return s;
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) {
        return ErrorAt(Cur(), "unsupported construct '*args' / '**kwargs' in a call");
      }
      if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        absl::StatusOr<ExprPtr> value = ParseExpression(true);
        if (!value.ok()) return value.status();
        target->kwargs.emplace_back(key, std::move(*value));
      } else {
        if (!target->kwargs.empty()) {
          return ErrorAt(Cur(), "positional argument follows keyword argument");
        }
        absl::StatusOr<ExprPtr> value = ParseExpression(true);
        if (!value.ok()) return value.status();
        target->args.push_back(std::move(*value));
      }
      require_comma = true;
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr c = NewExpr(ExprKind::kCall, Pos());
    c->args.push_back(std::move(callee));
    if (absl::Status s = ParseCallArgs(c.get()); !s.ok()) return s;
    return c;
  }

  // After '|': name[.name](args)? — operand null for filter blocks.
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr operand) {
    const Token& name_tok = Cur();
    absl::StatusOr<std::string> name = ExpectName();
    if (!name.ok()) return name.status();
    std::string full = *name;
    while (IsOp(".")) {
      Next();
      absl::StatusOr<std::string> more = ExpectName();
      if (!more.ok()) return more.status();
      full += "." + *more;
    }
    if (!IsKnownFilter(full)) {
      return ErrorAt(name_tok, absl::StrCat("unsupported filter '", full, "'"));
    }
    ExprPtr f = NewExpr(ExprKind::kFilter, lexer_.PosOf(name_tok.offset));
    f->name = full;
    f->args.push_back(std::move(operand));
    if (IsOp("(")) {
      if (absl::Status s = ParseCallArgs(f.get()); !s.ok()) return s;
    }
    return f;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr operand) {
    Next();  // is
    bool negated = false;
    if (IsName("not")) {
      negated = true;
      Next();
    }
    const Token& name_tok = Cur();
    absl::StatusOr<std::string> name = ExpectName();
    if (!name.ok()) return name.status();
    std::string full = *name;
    while (IsOp(".")) {
      Next();
      absl::StatusOr<std::string> more = ExpectName();
      if (!more.ok()) return more.status();
      full += "." + *more;
    }
    if (!IsKnownTest(full)) {
      return ErrorAt(name_tok, absl::StrCat("unsupported test '", full, "'"));
    }
    ExprPtr t = NewExpr(ExprKind::kTest, lexer_.PosOf(name_tok.offset));
    t->name = full;
    t->negated = negated;
    t->args.push_back(std::move(operand));
    if (IsOp("(")) {
      if (absl::Status s = ParseCallArgs(t.get()); !s.ok()) return s;
    } else if ((Cur().type == Tok::kName || Cur().type == Tok::kString || Cur().type == Tok::kInt ||
                Cur().type == Tok::kFloat || IsOp("(") || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      // One argument without parentheses: `x is divisibleby 3`, `x is sameas false`.
      if (IsName("is")) return ErrorAt(Cur(), "cannot chain multiple tests with 'is'");
      absl::StatusOr<ExprPtr> arg = ParsePrimary();
      if (!arg.ok()) return arg;
      absl::StatusOr<ExprPtr> post = ParsePostfix(std::move(*arg));
      if (!post.ok()) return post;
      t->args.push_back(std::move(*post));
    }
    return t;
  }

  const Lexer& lexer_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::set<std::string>> callable_uses_;
};

// Recursive literal parser over the lexer's tokens (ParsePythonLiteral).
class LiteralParser {
 public:
  explicit LiteralParser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  absl::StatusOr<Value> ParseAll() {
    absl::StatusOr<Value> v = ParseValue();
    if (!v.ok()) return v;
    if (toks_[pos_].type != Tok::kVarEnd) return Fail();
    return v;
  }

 private:
  absl::Status Fail() const { return absl::InvalidArgumentError("not a Python literal"); }
  bool IsOp(absl::string_view op) const {
    return toks_[pos_].type == Tok::kOp && toks_[pos_].value == op;
  }

  absl::StatusOr<Value> ParseValue() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Fail();
    const Token& t = toks_[pos_];
    if (t.type == Tok::kString) {
      std::string s;
      while (toks_[pos_].type == Tok::kString) s += toks_[pos_++].value;
      return Value::String(std::move(s));
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      ++pos_;
      return t.literal;
    }
    if (IsOp("-") || IsOp("+")) {
      bool neg = IsOp("-");
      ++pos_;
      const Token& n = toks_[pos_];
      if (n.type != Tok::kInt && n.type != Tok::kFloat) return Fail();
      ++pos_;
      if (!neg) return n.literal;
      if (n.type == Tok::kFloat) return Value::Float(-n.literal.number_value());
      return Value::Int(-n.literal.int_value());
    }
    if (t.type == Tok::kName) {  // only Python's capitalized constants
      ++pos_;
      if (t.value == "True") return Value::Bool(true);
      if (t.value == "False") return Value::Bool(false);
      if (t.value == "None") return Value::None();
      return Fail();
    }
    if (IsOp("[") || IsOp("(")) {
      const bool tuple = IsOp("(");
      const char* close = tuple ? ")" : "]";
      ++pos_;
      List items;
      bool saw_comma = false;
      while (!IsOp(close)) {
        absl::StatusOr<Value> v = ParseValue();
        if (!v.ok()) return v;
        items.push_back(std::move(*v));
        if (IsOp(",")) {
          saw_comma = true;
          ++pos_;
        } else if (!IsOp(close)) {
          return Fail();
        }
      }
      ++pos_;
      if (tuple && items.size() == 1 && !saw_comma) return items[0];  // parenthesized
      return Value::MakeList(std::move(items), tuple);
    }
    if (IsOp("{")) {
      ++pos_;
      Dict d;
      while (!IsOp("}")) {
        absl::StatusOr<Value> k = ParseValue();
        if (!k.ok()) return k;
        if (k->is_list() && !k->is_tuple()) return Fail();
        if (k->is_dict()) return Fail();
        if (!IsOp(":")) return Fail();
        ++pos_;
        absl::StatusOr<Value> v = ParseValue();
        if (!v.ok()) return v;
        d.Set(std::move(*k), std::move(*v));
        if (IsOp(",")) {
          ++pos_;
        } else if (!IsOp("}")) {
          return Fail();
        }
      }
      ++pos_;
      return Value::MakeDict(std::move(d));
    }
    return Fail();
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Value> ParsePythonLiteral(absl::string_view text) {
  Lexer lexer("{{ " + std::string(text) + " }}");
  absl::StatusOr<std::vector<Token>> tokens = lexer.Run();
  if (!tokens.ok()) return tokens.status();
  // Exactly one {{ ... }} tag and nothing around it.
  if (tokens->size() < 3 || (*tokens)[0].type != Tok::kVarBegin ||
      (*tokens)[tokens->size() - 2].type != Tok::kVarEnd) {
    return absl::InvalidArgumentError("not a Python literal");
  }
  for (size_t k = 1; k + 2 < tokens->size(); ++k) {
    if ((*tokens)[k].type == Tok::kVarEnd || (*tokens)[k].type == Tok::kVarBegin) {
      return absl::InvalidArgumentError("not a Python literal");
    }
  }
  std::vector<Token> inner(tokens->begin() + 1, tokens->end());
  return LiteralParser(std::move(inner)).ParseAll();
}

absl::StatusOr<Body> ParseTemplateSource(absl::string_view source) {
  if (source.size() > (1u << 26)) {
    return absl::InvalidArgumentError("template larger than 64 MiB");
  }
  // Validate UTF-8 up front so every later step can rely on it.
  {
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(source.data());
    utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(source.size());
    size_t offset = 0;
    while (left > 0) {
      utf8proc_int32_t cp;
      utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
      if (n <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("template is not valid UTF-8 (byte offset ", offset, ")"));
      }
      p += n;
      left -= n;
      offset += static_cast<size_t>(n);
    }
  }
  // jinja2 normalizes \r\n and \r to \n and drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(std::move(src));
  absl::StatusOr<std::vector<Token>> tokens = lexer.Run();
  if (!tokens.ok()) return tokens.status();
  Parser parser(lexer, std::move(*tokens));
  return parser.ParseTemplate();
}

}  // namespace ring::jinja
