// File: server/jinja_value.h
//
// The values a Jinja template computes with, and the Python behaviour they must copy.
// Chat templates are Python (jinja2) programs, and users compare our prompts with what
// HF transformers renders, so every observable operation follows CPython, not C++:
// str() of a float is Python's shortest repr ("1.0", "1e+16"), str() of a list is its
// repr ("['a', None]"), strings are indexed and measured in code points, `//` and `%`
// floor, dicts keep insertion order, and `tojson` is `json.dumps`.
//
// Lists and dicts are immutable once built (the templates run, as in transformers, under
// jinja2's ImmutableSandboxedEnvironment), so Value copies share them. The only mutable
// objects are `namespace()` instances and loop state.
//
// Internal to the jinja engine (server/jinja*.cc); the public API is server/jinja.h.
#ifndef RINGSERVE_SERVER_JINJA_VALUE_H_
#define RINGSERVE_SERVER_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ring::jinja {

class Value;
class Interpreter;

using List = std::vector<Value>;

// An insertion-ordered dict (Python 3.7+ semantics). Lookups are linear: chat-template
// dicts are messages and JSON schemas with a handful of keys each.
class Dict {
 public:
  const Value* Find(const Value& key) const;
  const Value* Find(absl::string_view key) const;
  // Replaces the value of an existing key in place (keeping its position) or appends.
  void Set(Value key, Value value);
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<Value, Value>> items_;
};

// Arguments of a call: positional, then keyword in source order.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// Builtins, bound methods and macros. `fn` receives the interpreter so macros can render.
using NativeFn = std::function<absl::StatusOr<Value>(Interpreter&, CallArgs&)>;
struct Callable {
  std::string name;  // for error messages: "macro 'visible_text'", "str.split"
  NativeFn fn;
};

// `namespace(...)`: the one object templates may mutate (`{% set ns.x = 1 %}`).
struct Namespace {
  Dict attrs;
};

// The `loop` variable of a for loop.
struct LoopState {
  std::shared_ptr<const List> items;  // after the loop's `if` filter
  int64_t index0 = 0;
  std::vector<Value> last_changed;  // loop.changed() memory
  bool has_changed = false;
};

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,  // also tuples (is_tuple()): only their repr differs
  kDict,
  kNamespace,
  kCallable,
  kLoop,
};

class Value {
 public:
  Value() = default;  // undefined, no hint
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items, bool tuple = false);
  static Value MakeDict(Dict d);
  static Value MakeNamespace(std::shared_ptr<Namespace> ns);
  static Value MakeCallable(std::string name, NativeFn fn);
  static Value MakeLoop(std::shared_ptr<LoopState> loop);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python numbers: bool is an int subclass.
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_loop() const { return kind_ == Kind::kLoop; }

  bool bool_value() const { return b_; }
  // int (or bool as 0/1).
  int64_t int_value() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  // Any number as a double.
  double number_value() const;
  const std::string& str() const;
  const List& list() const;
  const Dict& dict() const;
  const std::shared_ptr<const List>& list_ptr() const;
  Namespace& ns() const;
  const Callable& callable() const;
  LoopState& loop() const;
  // Why an undefined value is undefined ("'x' is undefined"); empty when unknown.
  const std::string& undefined_hint() const;

  // Python truthiness.
  bool Truthy() const;

  // Nesting depth of lists/dicts (0 for scalars), saturating at 65535.
  int depth() const { return depth_; }

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  uint16_t depth_ = 0;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::variant<std::monostate, std::shared_ptr<const std::string>, std::shared_ptr<const List>,
               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
               std::shared_ptr<const Callable>, std::shared_ptr<LoopState>>
      ptr_;
};

// Values nest at most this deep where it matters (JSON inputs are checked with
// JsonNestingExceeds before conversion; repr/json.dumps/== stop descending beyond it), so
// no input can exhaust the stack.
inline constexpr int kMaxValueDepth = 256;

// Whether `j` nests objects/arrays deeper than `limit` (iterative: safe on any input).
bool JsonNestingExceeds(const nlohmann::json& j, int limit);
bool JsonNestingExceeds(const nlohmann::ordered_json& j, int limit);

// Converts parsed JSON (request messages, tools, kwargs) to template values, keeping the
// key order of `ordered_json` (jinja2 sees Python dicts in the order json.loads built).
Value FromJson(const nlohmann::json& j);
Value FromJson(const nlohmann::ordered_json& j);

// --- Python semantics ------------------------------------------------------------------

// str(v) as `{{ v }}` prints it; undefined prints as "".
std::string PyStr(const Value& v);
// repr(v).
std::string PyRepr(const Value& v);
// repr(float): shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string PyFloatRepr(double d);
// "str", "int", "dict", ... as Python's type(v).__name__; "undefined" for undefined.
std::string PyTypeName(const Value& v);

// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...), i.e.
// transformers' `tojson`. TypeError (as InvalidArgument) for values JSON cannot hold.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;         // -1: None (single line)
  std::string indent_str;  // when indent was given as a string
  bool indent_is_string = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
absl::StatusOr<std::string> PyJsonDumps(const Value& v, const JsonDumpOptions& options);

// Python's hash() succeeds: not a list or dict, and tuples only of hashable values.
bool PyHashable(const Value& v);
// The TypeError Python raises for an unhashable value.
std::string UnhashableMessage(const Value& v);

// ==, as Python compares (1 == 1.0 == True; dicts ignore order; undefined == undefined).
bool PyEquals(const Value& a, const Value& b);
// <, <=, >, >= ("<", "<=", ">", ">="). TypeError for unorderable operands.
absl::StatusOr<bool> PyCompare(absl::string_view op, const Value& a, const Value& b);

// --- UTF-8 helpers (Python strings are sequences of code points) -------------------------

std::vector<char32_t> DecodeUtf8(absl::string_view s);
std::string EncodeUtf8(const std::vector<char32_t>& cps);
void AppendUtf8(char32_t cp, std::string* out);
size_t CodePointCount(absl::string_view s);
// str.isspace() for one code point.
bool PyIsSpace(char32_t cp);

}  // namespace ring::jinja

#endif  // RINGSERVE_SERVER_JINJA_VALUE_H_
