// File: server/jinja.h
//
// A Jinja template engine for chat templates: the jinja2 subset that HF chat templates
// (GLM-4.5 ... GLM-5.x, Qwen3, DeepSeek-V3 / V3.1 / V3.2 and similar) use, rendering exactly
// what transformers' apply_chat_template renders. That means jinja2 configured as
// transformers configures it: ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, loopcontrols), its `tojson` override (json.dumps, ensure_ascii=False,
// no HTML escaping), and the globals raise_exception, strftime_now, namespace, dict, range.
//
//   absl::StatusOr<ring::jinja::Template> t = ring::jinja::Template::Parse(source);
//   if (!t.ok()) return t.status();          // "line 3:5: unsupported filter 'xmlattr'"
//   absl::StatusOr<std::string> text = t->Render({{"messages", messages}});
//
// Supported: {{ }}, {% %}, {# #} with -/+ whitespace control; if/elif/else; for (tuple
// targets, `if` filter, else, loop.*, break/continue); set (incl. namespace attributes and
// block set); macro (defaults, varargs/kwargs, caller) and call blocks; filter and with
// blocks; {% generation %}; {% raw %}; Python operators, slicing, str/dict/list methods.
// Filters: abs attr batch capitalize center count d default dictsort e escape first float
// format indent int items join last length list lower map max min reject rejectattr
// replace reverse round safe select selectattr sort string sum title tojson trim unique
// upper wordcount. Tests: defined undefined none boolean true false integer float number
// string mapping iterable sequence callable sameas escaped in eq/equalto/== ne/!= lt/< le/<=
// gt/> ge/>= odd even divisibleby lower upper filter test. Anything else (include,
// extends, block, import, recursive loops, other filters/tests) is a Parse error naming
// the construct, never silently different output.
//
// Known deviations from CPython: integers are 64-bit (overflow is an error, not a bignum);
// upper()/lower() use simple one-to-one case mapping (ß stays ß); str.format supports
// {} / {0} / {name} with !r / !s but no format specs.
//
// Thread safety: a parsed Template is immutable; Render may run concurrently.
#ifndef RINGSERVE_SERVER_JINJA_H_
#define RINGSERVE_SERVER_JINJA_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ring::jinja {

struct Stmt;

class Template {
 public:
  // Parses `source`. InvalidArgument names line:column and the construct, e.g.
  // "line 3:5: unsupported filter 'xmlattr'" or "line 1:4: unexpected end of template,
  // expected 'endif'".
  static absl::StatusOr<Template> Parse(absl::string_view source);

  // Renders with the keys of `context` (an object) as variables. Errors are
  // InvalidArgument: raise_exception(msg) yields exactly `msg`; other failures (undefined
  // attribute of an undefined value, type errors, sandbox refusals) are prefixed with the
  // template position "line L:C: ".
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;
  // Same, keeping the object key order of `context` (dicts iterate, and `tojson` prints,
  // in the order the request had them, as Python would).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

 private:
  struct Impl;
  explicit Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ring::jinja

#endif  // RINGSERVE_SERVER_JINJA_H_
