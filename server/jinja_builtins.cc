// File: server/jinja_builtins.cc
//
// Filters, tests, globals, attribute/item lookup and the str/dict/list methods templates
// call, each mirroring its jinja2 / CPython counterpart (cited by name in comments where the
// behaviour is surprising).
#include "server/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/jinja_interpreter.h"
#include "utf8proc.h"

namespace ring::jinja {
namespace {

absl::Status TypeError(absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("TypeError: ", msg));
}
absl::Status ValueError(absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("ValueError: ", msg));
}

// jinja2's object_type_repr: "dict object", "None".
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return PyTypeName(v) + " object";
}

Value NoAttribute(const Value& obj, absl::string_view name) {
  return Value::Undefined(
      absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute '", name, "'"));
}

Value Unsafe(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat("SecurityError: access to attribute '", name, "' of '",
                                       PyTypeName(obj), "' object is unsafe."));
}

// --- argument binding ---------------------------------------------------------------------

// Binds CallArgs to named parameters like a Python signature (positional, then keyword).
class Args {
 public:
  Args(absl::string_view fn, CallArgs& call, std::vector<std::string> params)
      : fn_(fn),
        call_(call),
        params_(std::move(params)),
        values_(params_.size()),
        given_(params_.size(), false) {}

  absl::Status Bind() {
    if (call_.args.size() > params_.size()) {
      return TypeError(absl::StrCat(fn_, "() takes at most ", params_.size(), " argument(s) (",
                                    call_.args.size(), " given)"));
    }
    for (size_t k = 0; k < call_.args.size(); ++k) {
      values_[k] = call_.args[k];
      given_[k] = true;
    }
    for (auto& [key, v] : call_.kwargs) {
      auto it = std::find(params_.begin(), params_.end(), key);
      if (it == params_.end()) {
        return TypeError(absl::StrCat(fn_, "() got an unexpected keyword argument '", key, "'"));
      }
      size_t idx = static_cast<size_t>(it - params_.begin());
      if (given_[idx]) {
        return TypeError(absl::StrCat(fn_, "() got multiple values for argument '", key, "'"));
      }
      values_[idx] = v;
      given_[idx] = true;
    }
    return absl::OkStatus();
  }
  bool Has(size_t k) const { return given_[k]; }
  const Value& Get(size_t k) const { return values_[k]; }
  Value Or(size_t k, Value dflt) const { return given_[k] ? values_[k] : std::move(dflt); }
  absl::StatusOr<int64_t> Int(size_t k, int64_t dflt) const {
    if (!given_[k] || values_[k].is_none()) return dflt;
    if (!values_[k].is_integral()) {
      return TypeError(absl::StrCat(fn_, "(): '", params_[k], "' must be an integer, not ",
                                    PyTypeName(values_[k])));
    }
    return values_[k].int_value();
  }
  absl::StatusOr<std::string> Str(size_t k, std::string dflt) const {
    if (!given_[k]) return dflt;
    if (!values_[k].is_string()) {
      return TypeError(
          absl::StrCat(fn_, "(): '", params_[k], "' must be str, not ", PyTypeName(values_[k])));
    }
    return values_[k].str();
  }
  bool Bool(size_t k, bool dflt) const { return given_[k] ? values_[k].Truthy() : dflt; }

 private:
  std::string fn_;
  CallArgs& call_;
  std::vector<std::string> params_;
  std::vector<Value> values_;
  std::vector<bool> given_;
};

#define BIND(var, fn, call, ...)     \
  Args var(fn, call, {__VA_ARGS__}); \
  if (absl::Status s_ = var.Bind(); !s_.ok()) return s_

// --- strings ------------------------------------------------------------------------------

// Python's str(x) inside filters (jinja2 soft_str): undefined becomes "".
std::string SoftStr(const Value& v) { return PyStr(v); }

char32_t ToUpper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<int32_t>(c)));
}
char32_t ToLower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<int32_t>(c)));
}
char32_t ToTitle(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<int32_t>(c)));
}
bool IsCased(char32_t c) {
  auto cat = utf8proc_category(static_cast<int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool IsLowerCp(char32_t c) {
  return utf8proc_category(static_cast<int32_t>(c)) == UTF8PROC_CATEGORY_LL;
}
bool IsUpperCp(char32_t c) {
  auto cat = utf8proc_category(static_cast<int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT;
}

std::string MapChars(const std::string& s, char32_t (*fn)(char32_t)) {
  std::vector<char32_t> cps = DecodeUtf8(s);
  for (char32_t& c : cps) c = fn(c);
  return EncodeUtf8(cps);
}

std::string PyUpper(const std::string& s) { return MapChars(s, ToUpper); }
std::string PyLower(const std::string& s) { return MapChars(s, ToLower); }

std::string PyCapitalize(const std::string& s) {
  std::vector<char32_t> cps = DecodeUtf8(s);
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? ToTitle(cps[k]) : ToLower(cps[k]);
  return EncodeUtf8(cps);
}

std::string PyTitle(const std::string& s) {  // str.title()
  std::vector<char32_t> cps = DecodeUtf8(s);
  bool prev_cased = false;
  for (char32_t& c : cps) {
    bool cased = IsCased(c);
    c = prev_cased ? ToLower(c) : ToTitle(c);
    prev_cased = cased;
  }
  return EncodeUtf8(cps);
}

// str.strip / lstrip / rstrip with Python's default (whitespace) or a char set.
std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<char32_t> set;
  bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = DecodeUtf8(chars.str());
  auto strip = [&](char32_t c) {
    return whitespace ? PyIsSpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
}

absl::StatusOr<List> PySplit(const std::string& s, const Value& sep, int64_t maxsplit,
                             bool from_right) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {
    std::vector<char32_t> cps = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;  // [b, e) in cps
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && PyIsSpace(cps[k])) ++k;
      if (k == cps.size()) break;
      size_t b = k;
      while (k < cps.size() && !PyIsSpace(cps[k])) ++k;
      words.emplace_back(b, k);
    }
    auto text = [&](size_t b, size_t e) {
      return EncodeUtf8(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
    };
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) out.push_back(Value::String(text(b, e)));
      return out;
    }
    if (!from_right) {
      for (int64_t w = 0; w < maxsplit; ++w)
        out.push_back(Value::String(text(words[w].first, words[w].second)));
      // The remainder loses its leading whitespace run but keeps the rest, as CPython's.
      out.push_back(Value::String(text(words[maxsplit].first, cps.size())));
    } else {
      size_t first = words.size() - static_cast<size_t>(maxsplit);
      out.push_back(Value::String(text(0, words[first - 1].second)));
      for (size_t w = first; w < words.size(); ++w) {
        out.push_back(Value::String(text(words[w].first, words[w].second)));
      }
    }
    return out;
  }
  if (!sep.is_string()) {
    return TypeError(absl::StrCat("must be str or None, not ", PyTypeName(sep)));
  }
  const std::string& d = sep.str();
  if (d.empty()) return ValueError("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t pos = 0;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      size_t f = s.find(d, pos);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(pos, f - pos));
      pos = f + d.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) break;
      if (end < d.size()) break;
      size_t f = s.rfind(d, end - d.size());
      if (f == std::string::npos) break;
      rev.push_back(s.substr(f + d.size(), end - f - d.size()));
      end = f;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return out;
}

std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every code point (and at both ends)
    std::vector<char32_t> cps = DecodeUtf8(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cps.size()) AppendUtf8(cps[k], &out);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// Code-point index <-> byte offset for find/count with start/end.
size_t ByteOffsetOfCp(const std::string& s, int64_t cp_index) {
  size_t n = 0;
  for (size_t b = 0; b < s.size(); ++b) {
    if ((static_cast<unsigned char>(s[b]) & 0xC0) != 0x80) {
      if (static_cast<int64_t>(n) == cp_index) return b;
      ++n;
    }
  }
  return s.size();
}

// Python's start/end clamping for str methods (negative counts from the end).
std::pair<size_t, size_t> SubRange(const std::string& s, const Args& a, size_t start_idx) {
  int64_t len = static_cast<int64_t>(CodePointCount(s));
  auto norm = [&](size_t k, int64_t dflt) {
    int64_t v = dflt;
    if (a.Has(k) && a.Get(k).is_integral()) v = a.Get(k).int_value();
    if (v < 0) v += len;
    return std::clamp<int64_t>(v, 0, len);
  };
  int64_t b = norm(start_idx, 0), e = norm(start_idx + 1, len);
  if (e < b) e = b;
  return {ByteOffsetOfCp(s, b), ByteOffsetOfCp(s, e)};
}

// printf-style `str % args` for the `format` filter: %s %r %d %i %f %%.
absl::StatusOr<std::string> PercentFormat(const std::string& fmt, const List& args,
                                          const Dict* named) {
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) return ValueError("incomplete format");
    std::string key;
    if (fmt[k] == '(') {
      size_t close = fmt.find(')', k);
      if (close == std::string::npos) return ValueError("incomplete format key");
      key = fmt.substr(k + 1, close - k - 1);
      k = close + 1;
    }
    std::string spec;
    while (k < fmt.size() && std::string("0123456789.-+ #").find(fmt[k]) != std::string::npos) {
      spec += fmt[k++];
    }
    if (k >= fmt.size()) return ValueError("incomplete format");
    char conv = fmt[k];
    if (conv == '%') {
      out += '%';
      continue;
    }
    Value arg;
    if (!key.empty()) {
      const Value* v = named ? named->Find(key) : nullptr;
      if (!v) return absl::InvalidArgumentError(absl::StrCat("KeyError: '", key, "'"));
      arg = *v;
    } else {
      if (next >= args.size()) return TypeError("not enough arguments for format string");
      arg = args[next++];
    }
    if (!spec.empty() && conv != 'f' && conv != 'd' && conv != 'i') {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported format spec '%", spec, std::string(1, conv), "'"));
    }
    switch (conv) {
      case 's':
        out += PyStr(arg);
        break;
      case 'r':
        out += PyRepr(arg);
        break;
      case 'd':
      case 'i': {
        if (!arg.is_number()) return TypeError("%d format: a real number is required");
        int64_t v = arg.is_float() ? static_cast<int64_t>(arg.number_value()) : arg.int_value();
        if (spec.empty()) {
          out += absl::StrCat(v);
        } else {
          char buf[64];
          std::snprintf(buf, sizeof(buf), ("%" + spec + "lld").c_str(), static_cast<long long>(v));
          out += buf;
        }
        break;
      }
      case 'f': {
        if (!arg.is_number()) return TypeError("must be real number");
        char buf[512];
        std::snprintf(buf, sizeof(buf), ("%" + (spec.empty() ? std::string() : spec) + "f").c_str(),
                      arg.number_value());
        out += buf;
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
    }
  }
  if (named == nullptr && next < args.size()) {
    return TypeError("not all arguments converted during string formatting");
  }
  return out;
}

// str.format with {} / {0} / {name} and !r / !s; format specs are not supported.
absl::StatusOr<std::string> BraceFormat(const std::string& fmt, const CallArgs& call) {
  std::string out;
  size_t auto_index = 0;
  bool automatic = false, manual = false;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') {
        out += '}';
        ++k;
        continue;
      }
      return ValueError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t close = fmt.find('}', k);
    if (close == std::string::npos) return ValueError("expected '}' before end of string");
    std::string field = fmt.substr(k + 1, close - k - 1);
    k = close;
    char conversion = 0;
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) return ValueError("invalid conversion in format string");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos || field.find('.') != std::string::npos ||
        field.find('[') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported str.format field '{", field, "}'"));
    }
    Value arg;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      if (field.empty() ? manual : automatic) {
        return ValueError(field.empty() ? "cannot switch from manual field specification to "
                                          "automatic field numbering"
                                        : "cannot switch from automatic field numbering to "
                                          "manual field specification");
      }
      (field.empty() ? automatic : manual) = true;
      size_t idx = field.empty() ? auto_index++ : std::stoul(field);
      if (idx >= call.args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("IndexError: Replacement index ", idx,
                                                       " out of range for positional "
                                                       "args tuple"));
      }
      arg = call.args[idx];
    } else {
      bool found = false;
      for (const auto& [key, v] : call.kwargs) {
        if (key == field) {
          arg = v;
          found = true;
        }
      }
      if (!found) return absl::InvalidArgumentError(absl::StrCat("KeyError: '", field, "'"));
    }
    if (conversion == 'r') {
      out += PyRepr(arg);
    } else if (conversion == 's' || conversion == 0) {
      out += PyStr(arg);
    } else {
      return ValueError("unknown conversion specifier");
    }
  }
  return out;
}

// --- methods -------------------------------------------------------------------------------

absl::StatusOr<Value> StrMethod(const std::string& name, const Value& self, CallArgs& call) {
  const std::string& s = self.str();
  auto fn = "str." + name;
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "swapcase" || name == "casefold") {
    BIND(a, fn, call);
    if (name == "upper") return Value::String(PyUpper(s));
    if (name == "lower" || name == "casefold") return Value::String(PyLower(s));
    if (name == "title") return Value::String(PyTitle(s));
    if (name == "capitalize") return Value::String(PyCapitalize(s));
    std::vector<char32_t> cps = DecodeUtf8(s);
    for (char32_t& c : cps) c = IsUpperCp(c) ? ToLower(c) : (IsLowerCp(c) ? ToUpper(c) : c);
    return Value::String(EncodeUtf8(cps));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BIND(a, fn, call, "chars");
    Value chars = a.Or(0, Value::None());
    if (!chars.is_none() && !chars.is_string()) {
      return TypeError(absl::StrCat(name, " arg must be None or str"));
    }
    return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    BIND(a, fn, call, "sep", "maxsplit");
    absl::StatusOr<int64_t> maxsplit = a.Int(1, -1);
    if (!maxsplit.ok()) return maxsplit.status();
    absl::StatusOr<List> parts = PySplit(s, a.Or(0, Value::None()), *maxsplit, name == "rsplit");
    if (!parts.ok()) return parts.status();
    return Value::MakeList(std::move(*parts));
  }
  if (name == "splitlines") {
    BIND(a, fn, call, "keepends");
    bool keep = a.Bool(0, false);
    List out;
    std::vector<char32_t> cps = DecodeUtf8(s);
    std::vector<char32_t> line;
    for (size_t k = 0; k < cps.size(); ++k) {
      char32_t c = cps[k];
      bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                 c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
      if (!brk) {
        line.push_back(c);
        continue;
      }
      if (keep) line.push_back(c);
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') {
        if (keep) line.push_back('\n');
        ++k;
      }
      out.push_back(Value::String(EncodeUtf8(line)));
      line.clear();
    }
    if (!line.empty()) out.push_back(Value::String(EncodeUtf8(line)));
    return Value::MakeList(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    BIND(a, fn, call, "prefix", "start", "end");
    if (!a.Has(0)) return TypeError(absl::StrCat(fn, "() takes at least 1 argument (0 given)"));
    auto [b, e] = SubRange(s, a, 1);
    absl::string_view sub = absl::string_view(s).substr(b, e - b);
    std::vector<Value> options;
    const Value& p = a.Get(0);
    if (p.is_string()) {
      options.push_back(p);
    } else if (p.is_tuple()) {
      options = p.list();
    } else {
      return TypeError(
          absl::StrCat(name, " first arg must be str or a tuple of str, not ", PyTypeName(p)));
    }
    for (const Value& o : options) {
      if (!o.is_string()) return TypeError("tuple for startswith must only contain str");
      bool hit =
          name == "startswith" ? absl::StartsWith(sub, o.str()) : absl::EndsWith(sub, o.str());
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    BIND(a, fn, call, "sub", "start", "end");
    absl::StatusOr<std::string> sub = a.Str(0, "");
    if (!sub.ok()) return sub.status();
    if (!a.Has(0)) return TypeError(absl::StrCat(fn, "() takes at least 1 argument (0 given)"));
    auto [b, e] = SubRange(s, a, 1);
    std::string hay = s.substr(b, e - b);
    if (name == "count") {
      if (sub->empty()) return Value::Int(static_cast<int64_t>(CodePointCount(hay) + 1));
      int64_t n = 0;
      for (size_t pos = hay.find(*sub); pos != std::string::npos;
           pos = hay.find(*sub, pos + sub->size())) {
        ++n;
      }
      return Value::Int(n);
    }
    size_t pos = (name == "find" || name == "index") ? hay.find(*sub) : hay.rfind(*sub);
    if (pos == std::string::npos) {
      if (name == "index" || name == "rindex") return ValueError("substring not found");
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(CodePointCount(s.substr(0, b + pos))));
  }
  if (name == "replace") {
    BIND(a, fn, call, "old", "new", "count");
    absl::StatusOr<std::string> from = a.Str(0, "");
    absl::StatusOr<std::string> to = a.Str(1, "");
    absl::StatusOr<int64_t> count = a.Int(2, -1);
    if (!from.ok()) return from.status();
    if (!to.ok()) return to.status();
    if (!count.ok()) return count.status();
    if (!a.Has(0) || !a.Has(1)) return TypeError("replace expected at least 2 arguments");
    return Value::String(PyReplace(s, *from, *to, *count));
  }
  if (name == "join") {
    BIND(a, fn, call, "iterable");
    absl::StatusOr<List> items = Iterate(a.Or(0, Value::MakeList({})));
    if (!items.ok()) return items.status();
    std::string out;
    for (size_t k = 0; k < items->size(); ++k) {
      const Value& v = (*items)[k];
      if (!v.is_string()) {
        return TypeError(absl::StrCat("sequence item ", k, ": expected str instance, ",
                                      PyTypeName(v), " found"));
      }
      if (k) out += s;
      out += v.str();
    }
    return Value::String(std::move(out));
  }
  if (name == "format") {
    absl::StatusOr<std::string> r = BraceFormat(s, call);
    if (!r.ok()) return r.status();
    return Value::String(std::move(*r));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    BIND(a, fn, call, "fix");
    absl::StatusOr<std::string> fix = a.Str(0, "");
    if (!fix.ok()) return fix.status();
    if (name == "removeprefix") {
      return Value::String(absl::StartsWith(s, *fix) ? s.substr(fix->size()) : s);
    }
    return Value::String(absl::EndsWith(s, *fix) ? s.substr(0, s.size() - fix->size()) : s);
  }
  if (name == "partition" || name == "rpartition") {
    BIND(a, fn, call, "sep");
    absl::StatusOr<std::string> sep = a.Str(0, "");
    if (!sep.ok()) return sep.status();
    if (sep->empty()) return ValueError("empty separator");
    size_t pos = name == "partition" ? s.find(*sep) : s.rfind(*sep);
    if (pos == std::string::npos) {
      if (name == "partition") {
        return Value::MakeList({Value::String(s), Value::String(""), Value::String("")}, true);
      }
      return Value::MakeList({Value::String(""), Value::String(""), Value::String(s)}, true);
    }
    return Value::MakeList({Value::String(s.substr(0, pos)), Value::String(*sep),
                            Value::String(s.substr(pos + sep->size()))},
                           true);
  }
  if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
    BIND(a, fn, call, "width", "fillchar");
    absl::StatusOr<int64_t> width = a.Int(0, 0);
    if (!width.ok()) return width.status();
    absl::StatusOr<std::string> fill = a.Str(1, " ");
    if (!fill.ok()) return fill.status();
    std::vector<char32_t> cps = DecodeUtf8(s);
    std::vector<char32_t> f = DecodeUtf8(*fill);
    if (f.size() != 1) return TypeError("The fill character must be exactly one character long");
    int64_t pad = *width - static_cast<int64_t>(cps.size());
    if (pad <= 0) return self;
    std::vector<char32_t> out;
    if (name == "zfill") {
      size_t sign = (!cps.empty() && (cps[0] == '+' || cps[0] == '-')) ? 1 : 0;
      out.assign(cps.begin(), cps.begin() + sign);
      out.insert(out.end(), static_cast<size_t>(pad), U'0');
      out.insert(out.end(), cps.begin() + sign, cps.end());
    } else {
      int64_t left = name == "ljust" ? 0 : (name == "rjust" ? pad : pad / 2 + (pad & *width & 1));
      out.insert(out.end(), static_cast<size_t>(left), f[0]);
      out.insert(out.end(), cps.begin(), cps.end());
      out.insert(out.end(), static_cast<size_t>(pad - left), f[0]);
    }
    return Value::String(EncodeUtf8(out));
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric" || name == "isalpha" ||
      name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper") {
    BIND(a, fn, call);
    std::vector<char32_t> cps = DecodeUtf8(s);
    if (cps.empty()) return Value::Bool(false);
    if (name == "islower" || name == "isupper") {
      bool any_cased = false;
      for (char32_t c : cps) {
        if (name == "islower" ? IsUpperCp(c) : IsLowerCp(c)) return Value::Bool(false);
        any_cased |= IsCased(c);
      }
      return Value::Bool(any_cased);
    }
    for (char32_t c : cps) {
      auto cat = utf8proc_category(static_cast<int32_t>(c));
      bool digit = cat == UTF8PROC_CATEGORY_ND;
      bool numeric = digit || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
      bool alpha = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
                   cat == UTF8PROC_CATEGORY_LT || cat == UTF8PROC_CATEGORY_LM ||
                   cat == UTF8PROC_CATEGORY_LO;
      bool ok = name == "isspace"     ? PyIsSpace(c)
                : name == "isalpha"   ? alpha
                : name == "isalnum"   ? (alpha || numeric)
                : name == "isnumeric" ? numeric
                                      : digit;
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  return NoAttribute(self, name);
}

const std::set<std::string>& StrMethodNames() {
  static const auto* names = new std::set<std::string>{
      "upper",      "lower",      "title",     "capitalize", "swapcase",     "casefold",
      "strip",      "lstrip",     "rstrip",    "split",      "rsplit",       "splitlines",
      "startswith", "endswith",   "find",      "rfind",      "index",        "rindex",
      "count",      "replace",    "join",      "format",     "removeprefix", "removesuffix",
      "partition",  "rpartition", "zfill",     "center",     "ljust",        "rjust",
      "isdigit",    "isdecimal",  "isnumeric", "isalpha",    "isalnum",      "isspace",
      "islower",    "isupper"};
  return *names;
}

absl::StatusOr<Value> DictMethod(const std::string& name, const Value& self, CallArgs& call) {
  const Dict& d = self.dict();
  auto fn = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    BIND(a, fn, call);
    List out;
    for (const auto& [k, v] : d.items()) {
      if (name == "items") {
        out.push_back(Value::MakeList({k, v}, true));
      } else {
        out.push_back(name == "keys" ? k : v);
      }
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "get") {
    BIND(a, fn, call, "key", "default");
    if (!a.Has(0)) return TypeError("get expected at least 1 argument, got 0");
    if (const Value* v = d.Find(a.Get(0))) return *v;
    return a.Or(1, Value::None());
  }
  if (name == "copy") {
    BIND(a, fn, call);
    return self;
  }
  return NoAttribute(self, name);
}

absl::StatusOr<Value> ListMethod(const std::string& name, const Value& self, CallArgs& call) {
  const List& l = self.list();
  if (name == "count") {
    BIND(a, PyTypeName(self) + ".count", call, "value");
    int64_t n = 0;
    for (const Value& v : l) n += PyEquals(v, a.Or(0, Value()));
    return Value::Int(n);
  }
  if (name == "index") {
    BIND(a, PyTypeName(self) + ".index", call, "value");
    for (size_t k = 0; k < l.size(); ++k) {
      if (PyEquals(l[k], a.Or(0, Value()))) return Value::Int(static_cast<int64_t>(k));
    }
    return ValueError("value is not in list");
  }
  if (name == "copy") return self;
  return NoAttribute(self, name);
}

// --- loop ----------------------------------------------------------------------------------

Value LoopAttr(const Value& loop_value, absl::string_view name) {
  LoopState& l = loop_value.loop();
  const int64_t n = static_cast<int64_t>(l.items->size());
  const int64_t i = l.index0;
  if (name == "index0") return Value::Int(i);
  if (name == "index") return Value::Int(i + 1);
  if (name == "revindex") return Value::Int(n - i);
  if (name == "revindex0") return Value::Int(n - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == n - 1);
  if (name == "length") return Value::Int(n);
  if (name == "depth") return Value::Int(1);
  if (name == "depth0") return Value::Int(0);
  if (name == "previtem") {
    if (i == 0) return Value::Undefined("there is no previous item");
    return (*l.items)[static_cast<size_t>(i - 1)];
  }
  if (name == "nextitem") {
    if (i + 1 >= n) return Value::Undefined("there is no next item");
    return (*l.items)[static_cast<size_t>(i + 1)];
  }
  if (name == "cycle") {
    return Value::MakeCallable(
        "loop.cycle", [loop_value](Interpreter&, CallArgs& call) -> absl::StatusOr<Value> {
          if (call.args.empty()) return TypeError("no items for cycling given");
          return call.args[static_cast<size_t>(loop_value.loop().index0) % call.args.size()];
        });
  }
  if (name == "changed") {
    return Value::MakeCallable(
        "loop.changed", [loop_value](Interpreter&, CallArgs& call) -> absl::StatusOr<Value> {
          LoopState& st = loop_value.loop();
          bool same = st.has_changed && st.last_changed.size() == call.args.size();
          for (size_t k = 0; same && k < call.args.size(); ++k) {
            same = PyEquals(st.last_changed[k], call.args[k]);
          }
          st.last_changed = call.args;
          st.has_changed = true;
          return Value::Bool(!same);
        });
  }
  return NoAttribute(loop_value, name);
}

// --- attribute paths for map/selectattr/sort (jinja2 make_attrgetter) ---------------------

absl::StatusOr<Value> AttrPath(const Value& item, const Value& attribute) {
  if (attribute.is_integral()) return GetItem(item, attribute);
  std::string path = PyStr(attribute);
  Value cur = item;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    Value key = Value::String(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      key = Value::Int(std::stoll(part));
    }
    if (cur.is_undefined()) return UndefinedError(cur);
    absl::StatusOr<Value> next = GetItem(cur, key);
    if (!next.ok()) return next.status();
    cur = std::move(*next);
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

// Sort key comparison for sort/dictsort/unique/min/max: strings compare lowercased unless
// case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PyLower(v.str()));
  return v;
}

absl::Status StableSort(std::vector<std::pair<Value, Value>>* keyed, bool reverse) {
  absl::Status err;
  std::stable_sort(keyed->begin(), keyed->end(), [&](const auto& x, const auto& y) {
    if (!err.ok()) return false;
    absl::StatusOr<bool> lt =
        reverse ? PyCompare("<", y.first, x.first) : PyCompare("<", x.first, y.first);
    if (!lt.ok()) {
      err = lt.status();
      return false;
    }
    return *lt;
  });
  return err;
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(Interpreter& interp, const Value& seq, CallArgs& call,
                                     bool select, bool by_attr) {
  absl::StatusOr<List> items = Iterate(seq);
  if (!items.ok()) return items.status();
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (call.args.empty()) return TypeError("missing attribute argument");
    attribute = call.args[next++];
  }
  std::string test;
  CallArgs test_args;
  if (next < call.args.size()) {
    if (!call.args[next].is_string()) return TypeError("test name must be a string");
    test = call.args[next++].str();
    if (!IsKnownTest(test)) {
      return absl::InvalidArgumentError(absl::StrCat("unsupported test '", test, "'"));
    }
    test_args.args.assign(call.args.begin() + static_cast<long>(next), call.args.end());
    test_args.kwargs = call.kwargs;
  }
  List out;
  for (const Value& item : *items) {
    Value subject = item;
    if (by_attr) {
      absl::StatusOr<Value> v = AttrPath(item, attribute);
      if (!v.ok()) return v.status();
      subject = *v;
    }
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      CallArgs a = test_args;
      absl::StatusOr<bool> r = ApplyTest(interp, test, subject, a);
      if (!r.ok()) return r.status();
      pass = *r;
    }
    if (pass == select) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

// --- filters -------------------------------------------------------------------------------

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      return Value::Int(static_cast<int64_t>(CodePointCount(v.str())));
    case Kind::kList:
      return Value::Int(static_cast<int64_t>(v.list().size()));
    case Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.dict().size()));
    case Kind::kNamespace:
      return TypeError("object of type 'Namespace' has no len()");
    case Kind::kUndefined:
      return Value::Int(0);
    default:
      return TypeError(absl::StrCat("object of type '", PyTypeName(v), "' has no len()"));
  }
}

absl::StatusOr<Value> ToJsonFilter(const Value& v, CallArgs& call) {
  // transformers' override: tojson(x, ensure_ascii=False, indent=None, separators=None,
  // sort_keys=False) = json.dumps(...). No HTML escaping, unlike jinja2's own filter.
  BIND(a, "tojson", call, "ensure_ascii", "indent", "separators", "sort_keys");
  JsonDumpOptions o;
  o.ensure_ascii = a.Bool(0, false);
  o.sort_keys = a.Bool(3, false);
  Value indent = a.Or(1, Value::None());
  if (indent.is_string()) {
    o.indent_is_string = true;
    o.indent_str = indent.str();
  } else if (indent.is_integral()) {
    o.indent = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(indent.int_value(), 64)));
  } else if (!indent.is_none()) {
    return TypeError(absl::StrCat("indent must be int, str or None, not ", PyTypeName(indent)));
  }
  Value seps = a.Or(2, Value::None());
  if (seps.is_list() && seps.list().size() == 2 && seps.list()[0].is_string() &&
      seps.list()[1].is_string()) {
    o.item_separator = seps.list()[0].str();
    o.key_separator = seps.list()[1].str();
  } else if (!seps.is_none()) {
    return TypeError("separators must be a pair of strings");
  } else if (o.indent >= 0 || o.indent_is_string) {
    o.item_separator = ",";
  }
  absl::StatusOr<std::string> s = PyJsonDumps(v, o);
  if (!s.ok()) return s.status();
  return Value::String(std::move(*s));
}

absl::StatusOr<Value> IntFilter(const Value& v, CallArgs& call) {
  BIND(a, "int", call, "default", "base");
  Value dflt = a.Or(0, Value::Int(0));
  absl::StatusOr<int64_t> base = a.Int(1, 10);
  if (!base.ok()) return base.status();
  if (v.is_integral()) return Value::Int(v.int_value());
  if (v.is_float()) {
    double d = v.number_value();
    if (!std::isfinite(d)) return dflt;
    return Value::Int(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_string()) {
    std::string s = PyStrip(v.str(), Value::None(), true, true);
    std::string digits;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '_' && k > 0 && k + 1 < s.size() && std::isxdigit(s[k - 1]) &&
          std::isxdigit(s[k + 1])) {
        continue;
      }
      digits += s[k];
    }
    if (!digits.empty()) {
      errno = 0;
      char* end = nullptr;
      long long r = std::strtoll(digits.c_str(), &end, static_cast<int>(*base));
      if (errno == 0 && end && *end == '\0' && digits.find_first_of(" \t") == std::string::npos) {
        return Value::Int(r);
      }
      // "42.23" | int == 42: jinja2 retries through float().
      char* fend = nullptr;
      double d = std::strtod(digits.c_str(), &fend);
      if (fend && *fend == '\0' && std::isfinite(d)) {
        return Value::Int(static_cast<int64_t>(std::trunc(d)));
      }
    }
  }
  return dflt;
}

absl::StatusOr<Value> FloatFilter(const Value& v, CallArgs& call) {
  BIND(a, "float", call, "default");
  Value dflt = a.Or(0, Value::Float(0.0));
  if (v.is_number()) return Value::Float(v.number_value());
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_string()) {
    std::string s = PyStrip(v.str(), Value::None(), true, true);
    std::string lower = PyLower(s);
    if (lower == "inf" || lower == "+inf" || lower == "infinity" || lower == "+infinity") {
      return Value::Float(HUGE_VAL);
    }
    if (lower == "-inf" || lower == "-infinity") return Value::Float(-HUGE_VAL);
    if (lower == "nan" || lower == "+nan" || lower == "-nan") return Value::Float(NAN);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0' && lower.find("x") == std::string::npos) {
      return Value::Float(d);
    }
  }
  return dflt;
}

absl::StatusOr<Value> JoinFilter(const Value& v, CallArgs& call) {
  BIND(a, "join", call, "d", "attribute");
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::string sep = a.Has(0) ? PyStr(a.Get(0)) : "";
  std::string out;
  for (size_t k = 0; k < items->size(); ++k) {
    Value item = (*items)[k];
    if (a.Has(1) && !a.Get(1).is_none()) {
      absl::StatusOr<Value> x = AttrPath(item, a.Get(1));
      if (!x.ok()) return x.status();
      item = *x;
    }
    if (k) out += sep;
    out += PyStr(item);
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> MapFilter(Interpreter& interp, const Value& v, CallArgs& call) {
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return items.status();
  List out;
  Value attribute, dflt;
  bool has_default = false;
  std::string filter;
  CallArgs filter_args;
  if (call.args.empty()) {
    for (const auto& [k, val] : call.kwargs) {
      if (k == "attribute") {
        attribute = val;
      } else if (k == "default") {
        dflt = val;
        has_default = true;
      } else {
        return TypeError(absl::StrCat("map() got an unexpected keyword argument '", k, "'"));
      }
    }
    if (attribute.is_undefined()) return TypeError("map() needs an attribute or a filter name");
  } else {
    if (!call.args[0].is_string()) return TypeError("map() filter name must be a string");
    filter = call.args[0].str();
    if (!IsKnownFilter(filter)) {
      return absl::InvalidArgumentError(absl::StrCat("unsupported filter '", filter, "'"));
    }
    filter_args.args.assign(call.args.begin() + 1, call.args.end());
    filter_args.kwargs = call.kwargs;
  }
  for (const Value& item : *items) {
    if (filter.empty()) {
      absl::StatusOr<Value> x = AttrPath(item, attribute);
      if (!x.ok()) return x.status();
      out.push_back(x->is_undefined() && has_default ? dflt : *x);
    } else {
      CallArgs a = filter_args;
      absl::StatusOr<Value> x = ApplyFilter(interp, filter, item, a);
      if (!x.ok()) return x.status();
      out.push_back(std::move(*x));
    }
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> SortFilter(const Value& v, CallArgs& call) {
  BIND(a, "sort", call, "reverse", "case_sensitive", "attribute");
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : *items) {
    Value key = item;
    if (a.Has(2) && !a.Get(2).is_none()) {
      absl::StatusOr<Value> x = AttrPath(item, a.Get(2));
      if (!x.ok()) return x.status();
      key = *x;
    }
    keyed.emplace_back(SortKey(key, a.Bool(1, false)), item);
  }
  absl::Status st = StableSort(&keyed, a.Bool(0, false));
  if (!st.ok()) return st;
  List out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> DictSortFilter(const Value& v, CallArgs& call) {
  BIND(a, "dictsort", call, "case_sensitive", "by", "reverse");
  if (!v.is_dict())
    return absl::InvalidArgumentError("FilterArgumentError: dictsort needs a mapping");
  absl::StatusOr<std::string> by = a.Str(1, "key");
  if (!by.ok()) return by.status();
  if (*by != "key" && *by != "value") {
    return absl::InvalidArgumentError(
        "FilterArgumentError: You can only sort by either 'key' or 'value'");
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [k, val] : v.dict().items()) {
    keyed.emplace_back(SortKey(*by == "key" ? k : val, a.Bool(0, false)),
                       Value::MakeList({k, val}, true));
  }
  absl::Status st = StableSort(&keyed, a.Bool(2, false));
  if (!st.ok()) return st;
  List out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> UniqueFilter(const Value& v, CallArgs& call) {
  BIND(a, "unique", call, "case_sensitive", "attribute");
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return items.status();
  List out, seen;
  for (const Value& item : *items) {
    Value key = item;
    if (a.Has(1) && !a.Get(1).is_none()) {
      absl::StatusOr<Value> x = AttrPath(item, a.Get(1));
      if (!x.ok()) return x.status();
      key = *x;
    }
    key = SortKey(key, a.Bool(0, false));
    if (!PyHashable(key)) return absl::InvalidArgumentError(UnhashableMessage(key));
    bool dup = false;
    for (const Value& s : seen) dup |= PyEquals(s, key);
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> MinMaxFilter(const Value& v, CallArgs& call, bool is_max) {
  BIND(a, is_max ? "max" : "min", call, "case_sensitive", "attribute");
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  Value best, best_key;
  for (const Value& item : *items) {
    Value key = item;
    if (a.Has(1) && !a.Get(1).is_none()) {
      absl::StatusOr<Value> x = AttrPath(item, a.Get(1));
      if (!x.ok()) return x.status();
      key = *x;
    }
    key = SortKey(key, a.Bool(0, false));
    if (best.is_undefined()) {
      best = item;
      best_key = key;
      continue;
    }
    absl::StatusOr<bool> better = PyCompare(is_max ? ">" : "<", key, best_key);
    if (!better.ok()) return better.status();
    if (*better) {
      best = item;
      best_key = key;
    }
  }
  return best;
}

absl::StatusOr<Value> SumFilter(const Value& v, CallArgs& call) {
  BIND(a, "sum", call, "attribute", "start");
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return items.status();
  Value total = a.Or(1, Value::Int(0));
  for (const Value& item : *items) {
    Value x = item;
    if (a.Has(0) && !a.Get(0).is_none()) {
      absl::StatusOr<Value> y = AttrPath(item, a.Get(0));
      if (!y.ok()) return y.status();
      x = *y;
    }
    if (!x.is_number() || !total.is_number()) {
      return TypeError(absl::StrCat("unsupported operand type(s) for +: '", PyTypeName(total),
                                    "' and '", PyTypeName(x), "'"));
    }
    if (x.is_integral() && total.is_integral()) {
      total = Value::Int(total.int_value() + x.int_value());
    } else {
      total = Value::Float(total.number_value() + x.number_value());
    }
  }
  return total;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

absl::StatusOr<Value> IndentFilter(const Value& v, CallArgs& call) {
  BIND(a, "indent", call, "width", "first", "blank");
  std::string indention;
  Value width = a.Or(0, Value::Int(4));
  if (width.is_string()) {
    indention = width.str();
  } else if (width.is_integral()) {
    indention = std::string(static_cast<size_t>(std::max<int64_t>(0, width.int_value())), ' ');
  } else {
    return TypeError("indent width must be int or str");
  }
  std::string s = PyStr(v) + "\n";
  CallArgs split_args;
  absl::StatusOr<Value> lines_v = StrMethod("splitlines", Value::String(s), split_args);
  if (!lines_v.ok()) return lines_v;
  List lines = lines_v->list();
  std::string rv;
  if (a.Bool(2, false)) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + indention;
      rv += lines[k].str();
    }
  } else {
    rv = lines.empty() ? "" : lines[0].str();
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += "\n";
      if (!lines[k].str().empty()) rv += indention;
      rv += lines[k].str();
    }
  }
  if (a.Bool(1, false)) rv = indention + rv;
  return Value::String(std::move(rv));
}

absl::StatusOr<Value> RoundFilter(const Value& v, CallArgs& call) {
  BIND(a, "round", call, "precision", "method");
  absl::StatusOr<int64_t> precision = a.Int(0, 0);
  absl::StatusOr<std::string> method = a.Str(1, "common");
  if (!precision.ok()) return precision.status();
  if (!method.ok()) return method.status();
  if (!v.is_number())
    return TypeError(absl::StrCat("type ", PyTypeName(v), " doesn't define __round__"));
  double scale = std::pow(10.0, static_cast<double>(*precision));
  double x = v.number_value() * scale;
  double r;
  if (*method == "common") {
    if (v.is_integral()) return Value::Int(v.int_value());
    if (*precision >= 0 && *precision <= 300 && std::isfinite(v.number_value())) {
      // Python rounds the exact binary value half-to-even (round(2.675, 2) == 2.67);
      // glibc's printf does the same.
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(*precision), v.number_value());
      return Value::Float(std::strtod(buf, nullptr));
    }
    r = std::nearbyint(x);
  } else if (*method == "floor") {
    r = std::floor(x);
  } else if (*method == "ceil") {
    r = std::ceil(x);
  } else {
    return absl::InvalidArgumentError("FilterArgumentError: method must be common, ceil or floor");
  }
  return Value::Float(r / scale);
}

absl::StatusOr<Value> TitleFilter(const Value& v) {
  // jinja2 do_title: capitalize each chunk split at [-\s({\[<]+, not str.title().
  std::vector<char32_t> cps = DecodeUtf8(PyStr(v));
  std::vector<char32_t> out;
  bool at_start = true;
  for (char32_t c : cps) {
    bool boundary = PyIsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (boundary) {
      out.push_back(c);
      at_start = true;
    } else {
      out.push_back(at_start ? ToUpper(c) : ToLower(c));
      at_start = false;
    }
  }
  return Value::String(EncodeUtf8(out));
}

const std::set<std::string>& FilterNames() {
  static const auto* names = new std::set<std::string>{
      "abs",     "attr",     "batch",  "capitalize", "center",     "count",      "d",
      "default", "dictsort", "e",      "escape",     "first",      "float",      "format",
      "indent",  "int",      "items",  "join",       "last",       "length",     "list",
      "lower",   "map",      "max",    "min",        "reject",     "rejectattr", "replace",
      "reverse", "round",    "safe",   "select",     "selectattr", "sort",       "string",
      "sum",     "title",    "tojson", "trim",       "unique",     "upper",      "wordcount"};
  return *names;
}

const std::set<std::string>& TestNames() {
  static const auto* names = new std::set<std::string>{
      "defined",     "undefined", "none",     "boolean", "false",    "true",     "integer",
      "float",       "number",    "string",   "mapping", "iterable", "sequence", "callable",
      "sameas",      "escaped",   "in",       "eq",      "equalto",  "==",       "ne",
      "!=",          "lt",        "lessthan", "<",       "le",       "<=",       "gt",
      "greaterthan", ">",         "ge",       ">=",      "odd",      "even",     "divisibleby",
      "lower",       "upper",     "filter",   "test"};
  return *names;
}

}  // namespace

// --- public entry points --------------------------------------------------------------------

bool IsKnownFilter(absl::string_view name) { return FilterNames().count(std::string(name)) > 0; }
bool IsKnownTest(absl::string_view name) { return TestNames().count(std::string(name)) > 0; }

absl::Status UndefinedError(const Value& v) {
  const std::string& hint = v.undefined_hint();
  return absl::InvalidArgumentError(
      hint.empty() ? "UndefinedError: value is undefined"
                   : (absl::StartsWith(hint, "SecurityError") ? hint : "UndefinedError: " + hint));
}

absl::StatusOr<List> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
      return v.list();
    case Kind::kDict: {
      List keys;
      for (const auto& [k, val] : v.dict().items()) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (char32_t cp : DecodeUtf8(v.str())) {
        std::string s;
        AppendUtf8(cp, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    case Kind::kUndefined:
      return List();
    default:
      return TypeError(absl::StrCat("'", PyTypeName(v), "' object is not iterable"));
  }
}

Value GetAttr(const Value& obj, absl::string_view name) {
  std::string n(name);
  switch (obj.kind()) {
    case Kind::kDict: {
      static const std::set<std::string> kSafe = {"items", "keys", "values", "get", "copy"};
      static const std::set<std::string> kMutators = {"pop",    "popitem", "setdefault",
                                                      "update", "clear",   "fromkeys"};
      if (kSafe.count(n)) {
        return Value::MakeCallable("dict." + n, [obj, n](Interpreter&, CallArgs& call) {
          return DictMethod(n, obj, call);
        });
      }
      if (kMutators.count(n)) return Unsafe(obj, name);
      if (const Value* v = obj.dict().Find(name)) return *v;
      return NoAttribute(obj, name);
    }
    case Kind::kList: {
      if (n == "count" || n == "index" || (n == "copy" && !obj.is_tuple())) {
        return Value::MakeCallable(
            PyTypeName(obj) + "." + n,
            [obj, n](Interpreter&, CallArgs& call) { return ListMethod(n, obj, call); });
      }
      static const std::set<std::string> kMutators = {"append", "extend",  "insert", "pop",
                                                      "remove", "reverse", "sort",   "clear"};
      if (!obj.is_tuple() && kMutators.count(n)) return Unsafe(obj, name);
      return NoAttribute(obj, name);
    }
    case Kind::kString:
      if (StrMethodNames().count(n)) {
        return Value::MakeCallable(
            "str." + n, [obj, n](Interpreter&, CallArgs& call) { return StrMethod(n, obj, call); });
      }
      return NoAttribute(obj, name);
    case Kind::kNamespace:
      if (const Value* v = obj.ns().attrs.Find(name)) return *v;
      return NoAttribute(obj, name);
    case Kind::kLoop:
      return LoopAttr(obj, name);
    default:
      return NoAttribute(obj, name);
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kDict:
      if (const Value* v = obj.dict().Find(key)) return *v;
      break;
    case Kind::kList:
      if (key.is_integral()) {
        int64_t n = static_cast<int64_t>(obj.list().size());
        int64_t i = key.int_value();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.list()[static_cast<size_t>(i)];
        return Value::Undefined(
            absl::StrCat("'", ObjectTypeRepr(obj), "' has no element ", key.int_value()));
      }
      break;
    case Kind::kString:
      if (key.is_integral()) {
        std::vector<char32_t> cps = DecodeUtf8(obj.str());
        int64_t n = static_cast<int64_t>(cps.size());
        int64_t i = key.int_value();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          std::string s;
          AppendUtf8(cps[static_cast<size_t>(i)], &s);
          return Value::String(std::move(s));
        }
        return Value::Undefined(
            absl::StrCat("'", ObjectTypeRepr(obj), "' has no element ", key.int_value()));
      }
      break;
    default:
      break;
  }
  // jinja2's getitem falls back to getattr for string keys (d['items'] is the method).
  if (key.is_string()) {
    if (obj.is_dict() && !obj.dict().Find(key.str())) {
      static const std::set<std::string> kMethods = {"items",  "keys",  "values",  "get",
                                                     "copy",   "pop",   "popitem", "setdefault",
                                                     "update", "clear", "fromkeys"};
      if (!kMethods.count(key.str())) return NoAttribute(obj, key.str());
    }
    return GetAttr(obj, key.str());
  }
  if (key.is_integral() || key.is_float() || key.is_none()) {
    return Value::Undefined(
        absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute ", PyRepr(key)));
  }
  return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(obj), "' has no element ", PyRepr(key)));
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step) {
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !v->is_integral()) {
      return TypeError("slice indices must be integers or None");
    }
  }
  int64_t st = step.is_none() ? 1 : step.int_value();
  if (st == 0) return ValueError("slice step cannot be zero");
  std::vector<char32_t> cps;
  int64_t len;
  if (obj.is_string()) {
    cps = DecodeUtf8(obj.str());
    len = static_cast<int64_t>(cps.size());
  } else if (obj.is_list()) {
    len = static_cast<int64_t>(obj.list().size());
  } else {
    return TypeError(absl::StrCat("'", PyTypeName(obj), "' object is not subscriptable"));
  }
  // CPython PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t x = v.int_value();
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  int64_t b = adjust(start, st < 0 ? len - 1 : 0);
  int64_t e = adjust(stop, st < 0 ? -1 : len);
  std::vector<int64_t> idx;
  if (st > 0) {
    for (int64_t i = b; i < e; i += st) idx.push_back(i);
  } else {
    for (int64_t i = b; i > e; i += st) idx.push_back(i);
  }
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) AppendUtf8(cps[static_cast<size_t>(i)], &out);
    return Value::String(std::move(out));
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.list()[static_cast<size_t>(i)]);
  return Value::MakeList(std::move(out), obj.is_tuple());
}

absl::StatusOr<Value> ApplyFilter(Interpreter& interp, absl::string_view name_view, const Value& v,
                                  CallArgs& call) {
  const std::string name(name_view);
  if (name == "default" || name == "d") {
    BIND(a, name, call, "default_value", "boolean");
    bool use_default = v.is_undefined() || (a.Bool(1, false) && !v.Truthy());
    return use_default ? a.Or(0, Value::String("")) : v;
  }
  if (name == "tojson") return ToJsonFilter(v, call);
  if (name == "length" || name == "count") {
    BIND(a, name, call);
    return Length(v);
  }
  if (name == "string") {
    BIND(a, name, call);
    return Value::String(SoftStr(v));
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    BIND(a, name, call);
    std::string s = SoftStr(v);
    return Value::String(name == "upper" ? PyUpper(s)
                                         : (name == "lower" ? PyLower(s) : PyCapitalize(s)));
  }
  if (name == "title") {
    BIND(a, name, call);
    return TitleFilter(v);
  }
  if (name == "trim") {
    BIND(a, name, call, "chars");
    Value chars = a.Or(0, Value::None());
    if (!chars.is_none() && !chars.is_string()) return TypeError("trim chars must be a string");
    return Value::String(PyStrip(SoftStr(v), chars, true, true));
  }
  if (name == "replace") {
    BIND(a, name, call, "old", "new", "count");
    absl::StatusOr<int64_t> count = a.Int(2, -1);
    if (!count.ok()) return count.status();
    if (!a.Has(0) || !a.Has(1)) return TypeError("replace() needs old and new");
    return Value::String(PyReplace(SoftStr(v), PyStr(a.Get(0)), PyStr(a.Get(1)), *count));
  }
  if (name == "first" || name == "last") {
    BIND(a, name, call);
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) {
      return Value::Undefined(name == "first" ? "No first item, sequence was empty."
                                              : "No last item, sequence was empty.");
    }
    return name == "first" ? items->front() : items->back();
  }
  if (name == "join") return JoinFilter(v, call);
  if (name == "list") {
    BIND(a, name, call);
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    return Value::MakeList(std::move(*items));
  }
  if (name == "items") {
    BIND(a, name, call);
    if (v.is_undefined()) return Value::MakeList({});
    if (!v.is_dict()) return TypeError("Can only get item pairs from a mapping.");
    CallArgs none;
    return DictMethod("items", v, none);
  }
  if (name == "int") return IntFilter(v, call);
  if (name == "float") return FloatFilter(v, call);
  if (name == "abs") {
    BIND(a, name, call);
    if (v.is_float()) return Value::Float(std::fabs(v.number_value()));
    if (v.is_integral()) {
      if (v.int_value() == INT64_MIN) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(std::llabs(v.int_value()));
    }
    return TypeError(absl::StrCat("bad operand type for abs(): '", PyTypeName(v), "'"));
  }
  if (name == "map") return MapFilter(interp, v, call);
  if (name == "select" || name == "reject")
    return SelectOrReject(interp, v, call, name == "select", false);
  if (name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(interp, v, call, name == "selectattr", true);
  }
  if (name == "unique") return UniqueFilter(v, call);
  if (name == "sort") return SortFilter(v, call);
  if (name == "dictsort") return DictSortFilter(v, call);
  if (name == "reverse") {
    BIND(a, name, call);
    if (v.is_string()) return GetSlice(v, Value::None(), Value::None(), Value::Int(-1));
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value::MakeList(std::move(*items));
  }
  if (name == "min" || name == "max") return MinMaxFilter(v, call, name == "max");
  if (name == "sum") return SumFilter(v, call);
  if (name == "round") return RoundFilter(v, call);
  if (name == "indent") return IndentFilter(v, call);
  if (name == "center") {
    BIND(a, name, call, "width");
    CallArgs c;
    c.args.push_back(a.Or(0, Value::Int(80)));
    return StrMethod("center", Value::String(SoftStr(v)), c);
  }
  if (name == "wordcount") {  // jinja2: len(re.findall(r"\w+", s))
    BIND(a, name, call);
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : DecodeUtf8(SoftStr(v))) {
      auto cat = utf8proc_category(static_cast<int32_t>(c));
      bool w = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
               (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::Int(words);
  }
  if (name == "attr") {
    BIND(a, name, call, "name");
    if (!a.Has(0)) return TypeError("attr() needs a name");
    if (v.is_undefined()) return UndefinedError(v);
    return GetAttr(v, PyStr(a.Get(0)));
  }
  if (name == "batch") {
    BIND(a, name, call, "linecount", "fill_with");
    absl::StatusOr<int64_t> n = a.Int(0, 1);
    if (!n.ok()) return n.status();
    if (*n <= 0) return ValueError("batch size must be positive");
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    List out, cur;
    for (const Value& item : *items) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == *n) {
        out.push_back(Value::MakeList(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (a.Has(1) && !a.Get(1).is_none()) {
        while (static_cast<int64_t>(cur.size()) < *n) cur.push_back(a.Get(1));
      }
      out.push_back(Value::MakeList(std::move(cur)));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "format") {
    std::string fmt = SoftStr(v);
    absl::StatusOr<std::string> r;
    if (!call.kwargs.empty()) {
      if (!call.args.empty()) {
        return absl::InvalidArgumentError(
            "FilterArgumentError: can't handle positional and keyword arguments at the same time");
      }
      Dict named;
      for (auto& [k, val] : call.kwargs) named.Set(Value::String(k), val);
      r = PercentFormat(fmt, {}, &named);
    } else {
      r = PercentFormat(fmt, call.args, nullptr);
    }
    if (!r.ok()) return r.status();
    return Value::String(std::move(*r));
  }
  if (name == "e" || name == "escape") {
    BIND(a, name, call);
    return Value::String(HtmlEscape(SoftStr(v)));
  }
  if (name == "safe") {
    BIND(a, name, call);
    return Value::String(SoftStr(v));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(Interpreter& interp, absl::string_view name_view, const Value& v,
                               CallArgs& call) {
  const std::string name(name_view);
  auto one_arg = [&]() -> absl::StatusOr<Value> {
    if (call.args.size() != 1 || !call.kwargs.empty()) {
      return TypeError(absl::StrCat("test '", name, "' takes exactly one argument"));
    }
    return call.args[0];
  };
  static const std::set<std::string> kNoArgs = {
      "defined", "undefined", "none",   "boolean", "false",    "true",     "integer",
      "float",   "number",    "string", "mapping", "iterable", "sequence", "callable",
      "escaped", "lower",     "upper",  "odd",     "even"};
  if (kNoArgs.count(name) && (!call.args.empty() || !call.kwargs.empty())) {
    return TypeError(absl::StrCat("test_", name, "() takes 1 positional argument but ",
                                  1 + call.args.size() + call.kwargs.size(), " were given"));
  }
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") {
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  }
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    CallArgs none;
    absl::StatusOr<Value> r =
        StrMethod(name == "lower" ? "islower" : "isupper", Value::String(PyStr(v)), none);
    if (!r.ok()) return r.status();
    return r->Truthy();
  }
  if (name == "filter" || name == "test") {
    absl::StatusOr<Value> arg = one_arg();
    (void)arg;
    return v.is_string() && (name == "filter" ? IsKnownFilter(v.str()) : IsKnownTest(v.str()));
  }
  if (name == "odd" || name == "even") {
    if (v.is_undefined()) return UndefinedError(v);
    if (!v.is_integral()) return TypeError("odd/even test needs an integer");
    int64_t r = v.int_value() % 2;
    return name == "odd" ? r != 0 : r == 0;
  }
  absl::StatusOr<Value> other = one_arg();
  if (!other.ok()) return other.status();
  if (name == "sameas") {
    if (v.kind() != other->kind()) return false;
    if (v.is_none()) return true;
    if (v.is_bool() || v.is_int()) return PyEquals(v, *other);
    if (v.is_namespace() || v.is_callable() || v.is_loop()) return PyEquals(v, *other);
    return false;
  }
  if (name == "in") {
    switch (other->kind()) {
      case Kind::kString:
        if (!v.is_string()) return TypeError("'in <string>' requires string as left operand");
        return absl::StrContains(other->str(), v.str());
      case Kind::kList:
        for (const Value& x : other->list()) {
          if (PyEquals(x, v)) return true;
        }
        return false;
      case Kind::kDict:
        return other->dict().Find(v) != nullptr;
      case Kind::kUndefined:
        return false;
      default:
        return TypeError(
            absl::StrCat("argument of type '", PyTypeName(*other), "' is not iterable"));
    }
  }
  if (name == "eq" || name == "equalto" || name == "==") return PyEquals(v, *other);
  if (name == "ne" || name == "!=") return !PyEquals(v, *other);
  if (name == "lt" || name == "lessthan" || name == "<") return PyCompare("<", v, *other);
  if (name == "le" || name == "<=") return PyCompare("<=", v, *other);
  if (name == "gt" || name == "greaterthan" || name == ">") return PyCompare(">", v, *other);
  if (name == "ge" || name == ">=") return PyCompare(">=", v, *other);
  if (name == "divisibleby") {
    if (!v.is_number() || !other->is_number()) return TypeError("divisibleby needs numbers");
    if (other->number_value() == 0)
      return absl::InvalidArgumentError("ZeroDivisionError: modulo by zero");
    if (v.is_integral() && other->is_integral()) return v.int_value() % other->int_value() == 0;
    return std::fmod(v.number_value(), other->number_value()) == 0;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported test '", name, "'"));
}

Value LookupGlobal(absl::string_view name) {
  if (name == "range") {
    return Value::MakeCallable("range", [](Interpreter&, CallArgs& call) -> absl::StatusOr<Value> {
      if (!call.kwargs.empty()) return TypeError("range() takes no keyword arguments");
      if (call.args.empty() || call.args.size() > 3) {
        return TypeError("range expected 1 to 3 arguments");
      }
      for (const Value& a : call.args) {
        if (!a.is_integral()) {
          return TypeError(
              absl::StrCat("'", PyTypeName(a), "' object cannot be interpreted as an integer"));
        }
      }
      int64_t start = 0, stop, step = 1;
      if (call.args.size() == 1) {
        stop = call.args[0].int_value();
      } else {
        start = call.args[0].int_value();
        stop = call.args[1].int_value();
        if (call.args.size() == 3) step = call.args[2].int_value();
      }
      if (step == 0) return ValueError("range() arg 3 must not be zero");
      // jinja2's sandbox refuses ranges over MAX_RANGE (100000) items.
      int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                               : (start > stop ? (start - stop - step - 1) / -step : 0);
      if (count > 100000) {
        return absl::InvalidArgumentError(
            "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE "
            "(100000).");
      }
      List out;
      for (int64_t k = 0, x = start; k < count; ++k, x += step) out.push_back(Value::Int(x));
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool is_ns = name == "namespace";
    return Value::MakeCallable(
        std::string(name), [is_ns](Interpreter&, CallArgs& call) -> absl::StatusOr<Value> {
          Dict attrs;
          if (call.args.size() > 1) return TypeError("expected at most 1 positional argument");
          if (call.args.size() == 1) {
            const Value& init = call.args[0];
            if (init.is_dict()) {
              attrs = init.dict();
            } else {
              absl::StatusOr<List> pairs = Iterate(init);
              if (!pairs.ok()) return pairs.status();
              for (const Value& p : *pairs) {
                if (!p.is_list() || p.list().size() != 2) {
                  return ValueError("dictionary update sequence element has wrong length");
                }
                attrs.Set(p.list()[0], p.list()[1]);
              }
            }
          }
          for (auto& [k, v] : call.kwargs) attrs.Set(Value::String(k), v);
          if (!is_ns) return Value::MakeDict(std::move(attrs));
          for (const auto& [k, v] : attrs.items()) {
            if (k.is_string() && absl::StartsWith(k.str(), "_")) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "SecurityError: chat templates cannot store underscore-prefixed attributes on a "
                  "namespace, but got ",
                  PyRepr(k)));
            }
          }
          auto ns = std::make_shared<Namespace>();
          ns->attrs = std::move(attrs);
          return Value::MakeNamespace(std::move(ns));
        });
  }
  if (name == "raise_exception") {
    return Value::MakeCallable("raise_exception",
                               [](Interpreter& interp, CallArgs& call) -> absl::StatusOr<Value> {
                                 std::string msg = call.args.empty() ? "" : PyStr(call.args[0]);
                                 interp.set_raised();
                                 return absl::InvalidArgumentError(msg);
                               });
  }
  if (name == "strftime_now") {
    return Value::MakeCallable(
        "strftime_now", [](Interpreter&, CallArgs& call) -> absl::StatusOr<Value> {
          if (call.args.size() != 1 || !call.args[0].is_string()) {
            return TypeError("strftime_now(format) takes one string");
          }
          std::time_t now = std::time(nullptr);
          std::tm local;
          localtime_r(&now, &local);
          char buf[512];
          size_t n = std::strftime(buf, sizeof(buf), call.args[0].str().c_str(), &local);
          return Value::String(std::string(buf, n));
        });
  }
  if (name == "lipsum" || name == "cycler" || name == "joiner") {
    std::string n(name);
    return Value::MakeCallable(n, [n](Interpreter&, CallArgs&) -> absl::StatusOr<Value> {
      return absl::InvalidArgumentError(absl::StrCat("unsupported global '", n, "'"));
    });
  }
  return Value();
}

}  // namespace ring::jinja
