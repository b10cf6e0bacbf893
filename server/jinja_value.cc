// File: server/jinja_value.cc
//
// Value plumbing and the CPython behaviours templates can observe: str/repr, json.dumps,
// ==, ordering, and code-point string helpers.
#include "server/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "utf8proc.h"

namespace ring::jinja {
namespace {

const std::string& EmptyString() {
  static const std::string* empty = new std::string();
  return *empty;
}

}  // namespace

// --- Dict --------------------------------------------------------------------------------

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items_) {
    if (PyEquals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(absl::string_view key) const {
  for (const auto& [k, v] : items_) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items_) {
    if (PyEquals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

// --- Value -------------------------------------------------------------------------------

Value Value::Undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.ptr_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
namespace {
uint16_t NestedDepth(int child_max) {
  return static_cast<uint16_t>(std::min(child_max + 1, 65535));
}
}  // namespace

Value Value::MakeList(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  int child = 0;
  for (const Value& e : items) child = std::max(child, e.depth());
  v.depth_ = NestedDepth(child);
  v.ptr_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeDict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  int child = 0;
  for (const auto& [key, value] : d.items()) child = std::max({child, key.depth(), value.depth()});
  v.depth_ = NestedDepth(child);
  v.ptr_ = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value Value::MakeNamespace(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ptr_ = std::move(ns);
  return v;
}
Value Value::MakeCallable(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.ptr_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}
Value Value::MakeLoop(std::shared_ptr<LoopState> loop) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.ptr_ = std::move(loop);
  return v;
}

double Value::number_value() const {
  switch (kind_) {
    case Kind::kFloat:
      return f_;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0;
  }
}

const std::string& Value::str() const {
  if (kind_ != Kind::kString) return EmptyString();
  return *std::get<std::shared_ptr<const std::string>>(ptr_);
}
const List& Value::list() const { return *std::get<std::shared_ptr<const List>>(ptr_); }
const std::shared_ptr<const List>& Value::list_ptr() const {
  return std::get<std::shared_ptr<const List>>(ptr_);
}
const Dict& Value::dict() const { return *std::get<std::shared_ptr<const Dict>>(ptr_); }
Namespace& Value::ns() const { return *std::get<std::shared_ptr<Namespace>>(ptr_); }
const Callable& Value::callable() const { return *std::get<std::shared_ptr<const Callable>>(ptr_); }
LoopState& Value::loop() const { return *std::get<std::shared_ptr<LoopState>>(ptr_); }
const std::string& Value::undefined_hint() const {
  if (kind_ != Kind::kUndefined) return EmptyString();
  if (auto* p = std::get_if<std::shared_ptr<const std::string>>(&ptr_)) return **p;
  return EmptyString();
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list().empty();
    case Kind::kDict:
      return !dict().empty();
    default:
      return true;
  }
}

// --- JSON input --------------------------------------------------------------------------

namespace {

template <typename Json>
Value FromJsonImpl(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      // Python ints are unbounded; beyond int64 we fall back to float (documented limit).
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::String(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJsonImpl(e));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.Set(Value::String(it.key()), FromJsonImpl(it.value()));
      }
      return Value::MakeDict(std::move(d));
    }
    default:
      return Value::None();  // binary / discarded: not produced by JSON parsing
  }
}

template <typename Json>
bool NestingExceedsImpl(const Json& root, int limit) {
  std::vector<std::pair<const Json*, int>> stack = {{&root, 0}};
  while (!stack.empty()) {
    auto [j, depth] = stack.back();
    stack.pop_back();
    if (!j->is_structured()) continue;
    if (depth + 1 > limit) return true;
    for (const auto& child : *j) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace

bool JsonNestingExceeds(const nlohmann::json& j, int limit) { return NestingExceedsImpl(j, limit); }
bool JsonNestingExceeds(const nlohmann::ordered_json& j, int limit) {
  return NestingExceedsImpl(j, limit);
}

Value FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }
Value FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }

// --- UTF-8 -------------------------------------------------------------------------------

std::vector<char32_t> DecodeUtf8(absl::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // invalid byte: keep it visible rather than dropping text
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string EncodeUtf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

size_t CodePointCount(absl::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool PyIsSpace(char32_t cp) {
  // CPython: bidirectional type WS, B or S, or category Zs.
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// --- str / repr --------------------------------------------------------------------------

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, as CPython's repr (David Gay's algorithm, mode 0).
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  int exp10 = std::stoi(sci.substr(e + 1));
  int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    int x = decpt - 1;
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    out += ebuf;
  }
  return out;
}

namespace {

bool PyIsPrintable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string StringRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : DecodeUtf8(s)) {
    char buf[16];
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7f) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp < 0x7f) {
      out += static_cast<char>(cp);
    } else if (PyIsPrintable(cp)) {
      AppendUtf8(cp, &out);
    } else if (cp <= 0xff) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp <= 0xffff) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    }
  }
  out += quote;
  return out;
}

}  // namespace

namespace {
std::string ReprAt(const Value& v, int depth);
}  // namespace

std::string PyRepr(const Value& v) { return ReprAt(v, 0); }

namespace {

std::string ReprAt(const Value& v, int depth) {
  if (depth > kMaxValueDepth && (v.is_list() || v.is_dict())) return "...";
  switch (v.kind()) {
    case Kind::kString:
      return StringRepr(v.str());
    case Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      const List& l = v.list();
      for (size_t k = 0; k < l.size(); ++k) {
        if (k) out += ", ";
        out += ReprAt(l[k], depth + 1);
      }
      if (v.is_tuple() && l.size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items()) {
        if (!first) out += ", ";
        first = false;
        out += ReprAt(k, depth + 1) + ": " + ReprAt(val, depth + 1);
      }
      return out + "}";
    }
    case Kind::kUndefined:
      return "Undefined";
    default:
      return PyStr(v);
  }
}

}  // namespace

std::string PyStr(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.bool_value() ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(v.int_value());
    case Kind::kFloat:
      return PyFloatRepr(v.number_value());
    case Kind::kString:
      return v.str();
    case Kind::kList:
    case Kind::kDict:
      return PyRepr(v);
    case Kind::kNamespace:
      return "<Namespace " + PyRepr(Value::MakeDict(v.ns().attrs)) + ">";
    case Kind::kCallable:
      return "<" + v.callable().name + ">";
    case Kind::kLoop: {
      const LoopState& l = v.loop();
      return absl::StrCat("<LoopContext ", l.index0 + 1, "/", l.items->size(), ">");
    }
  }
  return "";
}

std::string PyTypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

// --- json.dumps --------------------------------------------------------------------------

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  char buf[16];
  for (char32_t cp : DecodeUtf8(s)) {
    switch (cp) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
      if (cp > 0xffff) {  // surrogate pair, as Python writes it
        char32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (unsigned)(v >> 10),
                      0xdc00 + (unsigned)(v & 0x3ff));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      }
      *out += buf;
    } else {
      AppendUtf8(cp, out);
    }
  }
  out->push_back('"');
}

absl::Status JsonDump(const Value& v, const JsonDumpOptions& o, int level, std::string* out) {
  if (level > kMaxValueDepth) {
    return absl::InvalidArgumentError("RecursionError: value nested too deeply for json.dumps");
  }
  auto newline = [&](int lvl) {
    if (o.indent < 0 && !o.indent_is_string) return;
    out->push_back('\n');
    for (int k = 0; k < lvl; ++k) {
      if (o.indent_is_string) {
        *out += o.indent_str;
      } else {
        out->append(static_cast<size_t>(o.indent), ' ');
      }
    }
  };
  switch (v.kind()) {
    case Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      *out += absl::StrCat(v.int_value());
      return absl::OkStatus();
    case Kind::kFloat: {
      double d = v.number_value();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PyFloatRepr(d);
      }
      return absl::OkStatus();
    }
    case Kind::kString:
      JsonString(v.str(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Kind::kList: {
      const List& l = v.list();
      if (l.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t k = 0; k < l.size(); ++k) {
        if (k) *out += o.item_separator;
        newline(level + 1);
        absl::Status s = JsonDump(l[k], o, level + 1, out);
        if (!s.ok()) return s;
      }
      newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Kind::kDict: {
      const auto& items = v.dict().items();
      if (items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<Value, Value>*> order;
      for (const auto& kv : items) order.push_back(&kv);
      if (o.sort_keys) {
        for (const auto* kv : order) {
          if (!kv->first.is_string()) {
            return absl::InvalidArgumentError("TypeError: '<' not supported between keys");
          }
        }
        std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
          return a->first.str() < b->first.str();
        });
      }
      out->push_back('{');
      bool first = true;
      for (const auto* kv : order) {
        if (!first) *out += o.item_separator;
        first = false;
        newline(level + 1);
        const Value& key = kv->first;
        std::string key_str;
        switch (key.kind()) {
          case Kind::kString:
            key_str = key.str();
            break;
          case Kind::kBool:
            key_str = key.bool_value() ? "true" : "false";
            break;
          case Kind::kInt:
            key_str = absl::StrCat(key.int_value());
            break;
          case Kind::kFloat:
            key_str = PyFloatRepr(key.number_value());
            break;
          case Kind::kNone:
            key_str = "null";
            break;
          default:
            return absl::InvalidArgumentError(absl::StrCat(
                "TypeError: keys must be str, int, float, bool or None, not ", PyTypeName(key)));
        }
        JsonString(key_str, o.ensure_ascii, out);
        *out += o.key_separator;
        absl::Status s = JsonDump(kv->second, o, level + 1, out);
        if (!s.ok()) return s;
      }
      newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("TypeError: Object of type ", PyTypeName(v), " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> PyJsonDumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  absl::Status s = JsonDump(v, options, 0, &out);
  if (!s.ok()) return s;
  return out;
}

// --- comparison --------------------------------------------------------------------------

bool PyHashable(const Value& v) {
  if (v.is_dict()) return false;
  if (v.is_list()) {
    if (!v.is_tuple()) return false;
    for (const Value& e : v.list()) {
      if (!PyHashable(e)) return false;
    }
  }
  return true;
}

std::string UnhashableMessage(const Value& v) {
  const Value* bad = &v;
  while (bad->is_tuple()) {  // Python names the first unhashable element's type
    for (const Value& e : bad->list()) {
      if (!PyHashable(e)) {
        bad = &e;
        break;
      }
    }
  }
  return absl::StrCat("TypeError: unhashable type: '", PyTypeName(*bad), "'");
}

namespace {
bool EqualsAt(const Value& a, const Value& b, int depth);
}  // namespace

bool PyEquals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

namespace {

bool EqualsAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.int_value() == b.int_value();
    return a.number_value() == b.number_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List& x = a.list();
      const List& y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k) {
        if (!EqualsAt(x[k], y[k], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* other = y.Find(k);
        if (other == nullptr || !EqualsAt(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &a.ns() == &b.ns();
    case Kind::kCallable:
      return &a.callable() == &b.callable();
    case Kind::kLoop:
      return &a.loop() == &b.loop();
    default:
      return false;
  }
}

}  // namespace

namespace {

// -1, 0, 1; error when unorderable.
absl::StatusOr<int> Order(const Value& a, const Value& b, absl::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.int_value() < b.int_value() ? -1 : (a.int_value() > b.int_value() ? 1 : 0);
    }
    double x = a.number_value(), y = b.number_value();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (PyEquals(x[k], y[k])) continue;
      return Order(x[k], y[k], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    return absl::InvalidArgumentError(u.undefined_hint().empty() ? "value is undefined"
                                                                 : u.undefined_hint());
  }
  return absl::InvalidArgumentError(absl::StrCat("TypeError: '", op,
                                                 "' not supported between instances of '",
                                                 PyTypeName(a), "' and '", PyTypeName(b), "'"));
}

}  // namespace

absl::StatusOr<bool> PyCompare(absl::string_view op, const Value& a, const Value& b) {
  absl::StatusOr<int> c = Order(a, b, op);
  if (!c.ok()) return c.status();
  if (op == "<") return *c < 0;
  if (op == "<=") return *c <= 0;
  if (op == ">") return *c > 0;
  return *c >= 0;
}

}  // namespace ring::jinja
