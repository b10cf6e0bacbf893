// File: server/jinja_builtins.h
//
// The filters, tests, globals and methods (str.split, dict.items, ...) of the jinja
// engine, with jinja2's semantics as transformers configures them: `tojson` is
// transformers' json.dumps override (ensure_ascii=False, no HTML escaping), globals add
// raise_exception and strftime_now, and list/dict mutators (append, pop, update, ...) are
// refused as ImmutableSandboxedEnvironment refuses them.
//
// Internal to the jinja engine; the public API is server/jinja.h.
#ifndef RINGSERVE_SERVER_JINJA_BUILTINS_H_
#define RINGSERVE_SERVER_JINJA_BUILTINS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/jinja_value.h"

namespace ring::jinja {

// Whether the parser accepts `x | name` / `x is name`. Names jinja2 has but we do not
// implement are rejected at parse time ("unsupported filter 'xmlattr'") instead of
// rendering something different.
bool IsKnownFilter(absl::string_view name);
bool IsKnownTest(absl::string_view name);

absl::StatusOr<Value> ApplyFilter(Interpreter& interp, absl::string_view name, const Value& operand,
                                  CallArgs& args);
absl::StatusOr<bool> ApplyTest(Interpreter& interp, absl::string_view name, const Value& operand,
                               CallArgs& args);

// A global function (range, namespace, dict, raise_exception, strftime_now), or an
// undefined value when `name` is not one.
Value LookupGlobal(absl::string_view name);

// `obj.name` and `obj[key]` as jinja2's sandboxed environment resolves them: attribute
// first for `.` (methods of str/dict/list), item first for `[]`, and an undefined value
// carrying jinja2's message when neither exists.
Value GetAttr(const Value& obj, absl::string_view name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] (any may be None) on str / list / tuple.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step);

// Python iteration: list/tuple elements, dict keys, str code points; undefined is empty.
absl::StatusOr<List> Iterate(const Value& v);

// The error an operation on an undefined value raises (jinja2's UndefinedError).
absl::Status UndefinedError(const Value& v);

}  // namespace ring::jinja

#endif  // RINGSERVE_SERVER_JINJA_BUILTINS_H_
