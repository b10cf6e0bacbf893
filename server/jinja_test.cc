// Tests for the jinja engine (server/jinja.h). Expected strings are what jinja2 3.1.6 in
// transformers' environment renders (checked with tests/chat_template_parity.py's oracle).
#include "server/jinja.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/jinja_ast.h"
#include "server/jinja_value.h"

namespace ring::jinja {
namespace {

using nlohmann::json;

std::string Render(const std::string& source, const json& ctx = json::object()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(ctx);
  if (!out.ok()) return "RENDER ERROR: " + std::string(out.status().message());
  return *out;
}

std::string ParseError(const std::string& source) {
  absl::StatusOr<Template> t = Template::Parse(source);
  return t.ok() ? "parsed" : std::string(t.status().message());
}

std::string RenderError(const std::string& source, const json& ctx = json::object()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(ctx);
  if (out.ok()) return "rendered: " + *out;
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

TEST(JinjaTest, OperatorPrecedenceFollowsJinja2) {
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 10 - 2 - 3 }}"), "7|9|5");
  // jinja2's ** is left-associative and binds looser than unary minus.
  EXPECT_EQ(Render("{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}"), "64|4");
  // `~` binds tighter than + but looser than *: 1 ~ (2 * 3), ('a' ~ 1) + 2 is a TypeError.
  EXPECT_EQ(Render("{{ 1 ~ 2 * 3 }}|{{ (1 ~ 2) | int + 3 }}|{{ 2 * 3 ~ 4 }}"), "16|15|64");
  EXPECT_EQ(RenderError("{{ 'a' ~ 1 + 2 }}"),
            "line 1:12: TypeError: can only concatenate str (not \"int\") to str");
  // Tests and filters bind tighter than arithmetic: 1 + (2 is number) == 1 + True.
  EXPECT_EQ(Render("{{ 1 + 2 is number }}|{{ [1, 2] | length + 1 }}"), "2|3");
  // `not` is looser than comparisons and tests.
  EXPECT_EQ(Render("{{ not 1 == 2 }}|{{ not x is defined }}|{{ not true and false }}"),
            "True|True|False");
  EXPECT_EQ(Render("{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 == true }}"), "True|False|True");
  EXPECT_EQ(Render("{{ 0 or 'x' }}|{{ 'y' and 0 }}|{{ none or [] }}"), "x|0|[]");
  EXPECT_EQ(Render("{{ 'a' if false else 'b' if true else 'c' }}|{{ 'z' if false }}|"), "b||");
  EXPECT_EQ(Render("{{ 'a' in 'cat' }}|{{ 2 not in [1, 2] }}|{{ 'k' in {'k': 1} }}"),
            "True|False|True");
}

TEST(JinjaTest, PythonArithmetic) {
  EXPECT_EQ(Render("{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7 % -3 }}"),
            "3.5|2.0|3|-4|2|-2");
  EXPECT_EQ(Render("{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 2.5 * 2 }}"),
            "0.30000000000000004|1e+16|1000000000000000.0|1e-05|0.0001|5.0");
  EXPECT_EQ(Render("{{ 'ab' * 3 }}|{{ [1] + [2] }}|{{ true + 1 }}|{{ 2 ** -1 }}"),
            "ababab|[1, 2]|2|0.5");
  EXPECT_EQ(RenderError("{{ 'a' + 1 }}"),
            "line 1:8: TypeError: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(RenderError("{{ 1 // 0 }}"), "line 1:6: ZeroDivisionError: integer division by zero");
}

TEST(JinjaTest, PythonStrAndRepr) {
  EXPECT_EQ(Render("{{ [1, 'a', none, true, 2.0, {'k': 'v'}] }}"),
            "[1, 'a', None, True, 2.0, {'k': 'v'}]");
  EXPECT_EQ(Render("{{ (1,) }}|{{ () }}|{{ (1, 'x') }}"), "(1,)|()|(1, 'x')");
  EXPECT_EQ(Render(R"({{ ["it's", 'say "hi"', "both ' \"", "tab\t"] }})"),
            R"(["it's", 'say "hi"', 'both \' "', 'tab\t'])");
  EXPECT_EQ(Render("{{ none }}|{{ true }}|{{ undefined_thing }}|"), "None|True||");
}

TEST(JinjaTest, StringsAreCodePoints) {
  json ctx = {{"s", "héllo😀"}};
  EXPECT_EQ(Render("{{ s | length }}|{{ s[1] }}|{{ s[-1] }}|{{ s[1:3] }}|{{ s[::-1] }}", ctx),
            "6|é|😀|él|😀olléh");
  EXPECT_EQ(Render("{{ s.upper() }}|{{ 'ÉCOLE'.lower() }}", ctx), "HÉLLO😀|école");
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(
      Render("{{ 'a,b,,c'.split(',') }}|{{ '  a  b '.split() }}|{{ 'a b c'.split(None, 1) }}"),
      "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']");
  EXPECT_EQ(
      Render("{{ 'a.b.c'.rsplit('.', 1) }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n a \\n'.strip() }}|"
             "{{ '--a'.lstrip('-') }}|{{ 'a--'.rstrip('-') }}"),
      "['a.b', 'c']|hi|a|a|a");
  EXPECT_EQ(Render("{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|"
                   "{{ 'banana'.find('an') }}|{{ 'banana'.rfind('an') }}|{{ 'banana'.count('a') }}|"
                   "{{ 'x'.find('y') }}"),
            "True|True|1|3|3|-1");
  EXPECT_EQ(Render("{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|"
                   "{{ 'aXa'.replace('a', 'b') }}|{{ '{} and {}'.format(1, 'x') }}|"
                   "{{ '{0}{0}{name}'.format('a', name='b') }}|{{ '-'.join(['a', 'b']) }}"),
            "Hello World|Hello|bXb|1 and x|aab|a-b");
}

TEST(JinjaTest, AttributeAndItemLookup) {
  json ctx = {{"d", {{"a", 1}, {"items", 2}}}, {"l", {1, 2, 3}}, {"n", nullptr}};
  // `.` prefers the dict method, `[]` the key; both fall back to the other.
  EXPECT_EQ(Render("{{ d['items'] }}|{{ d.a }}|{{ d['a'] }}|{{ d.get('zz', 5) }}|"
                   "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   ctx),
            "2|1|1|5|a=1;items=2;");
  EXPECT_EQ(Render("{{ l[0] }}|{{ l.1 }}|{{ l[-1] }}|{{ l[7] is defined }}|{{ d.b is defined }}|"
                   "{{ n.x is defined }}",
                   ctx),
            "1|2|3|False|False|False");
  // Undefined prints empty, but attributes of undefined are errors (jinja2 Undefined).
  EXPECT_EQ(Render("[{{ d.b }}]", ctx), "[]");
  EXPECT_EQ(RenderError("{{ d.b.c }}", ctx),
            "line 1:7: UndefinedError: 'dict object' has no attribute 'b'");
  EXPECT_EQ(RenderError("{{ nope.x }}"), "line 1:8: UndefinedError: 'nope' is undefined");
}

TEST(JinjaTest, WhitespaceControlMatchesTransformersEnvironment) {
  // trim_blocks: newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(Render("  {% if true %}\n    x\n  {% endif %}\n  y\n"), "    x\n  y");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("a\n{{- ' b ' -}}\nc"), "a b c");
  // Variable tags are not trimmed by trim_blocks/lstrip_blocks.
  EXPECT_EQ(Render("  {{ 'v' }}\nz"), "  v\nz");
  // Comments trim like blocks.
  EXPECT_EQ(Render("a\n  {# note #}\nb"), "a\nb");
  // `+` keeps what trim_blocks / lstrip_blocks would remove.
  EXPECT_EQ(Render("  {%+ if true +%}\nx{% endif %}"), "  \nx");
  // One trailing newline of the template is dropped (keep_trailing_newline=False).
  EXPECT_EQ(Render("x\n\n"), "x\n");
  EXPECT_EQ(Render("a\r\nb"), "a\nb");
  EXPECT_EQ(Render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(JinjaTest, ForLoopVariables) {
  json ctx = {{"l", {"a", "b", "c"}}};
  EXPECT_EQ(
      Render("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
             "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
             ctx),
      "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;");
  EXPECT_EQ(
      Render("{% for x in l %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}"
             "{{ loop.cycle('o', 'e') }} {% endfor %}",
             ctx),
      "-bo ace b-o ");
  EXPECT_EQ(
      Render("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }} "
             "{% endfor %}"),
      "1/2:2 2/2:4 ");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in range(10) %}{% if x is odd %}{% continue %}{% endif %}"
                   "{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "024");
  EXPECT_EQ(
      Render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}|"
             "{% for c in 'hé' %}[{{ c }}]{% endfor %}|{% for k in {'x': 1} %}{{ k }}{% endfor %}"),
      "a1b2|[h][é]|x");
  EXPECT_EQ(Render("{% for i in [1, 2] %}{% for j in [1, 2] %}{{ loop.index }}{% endfor %}"
                   "{{ loop.index }} {% endfor %}"),
            "121 122 ");
}

TEST(JinjaTest, ScopingMatchesJinja2) {
  // A set in a loop body is per iteration and never leaks; namespaces carry state.
  EXPECT_EQ(Render("{% set x = 'top' %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}[{{ x }}]"
                   "{% endfor %}{{ x }}"),
            "[top][1][top][2]top");
  EXPECT_EQ(Render("{% for i in [1, 2] %}{% if i == 1 %}{% set y = 'a' %}{% endif %}"
                   "{{ y is defined }}{% endfor %}"),
            "TrueFalse");
  EXPECT_EQ(Render("{% set ns = namespace(total=0, seen=[]) %}{% for i in [1, 2, 3] %}"
                   "{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}"),
            "6");
  // `if` opens no scope.
  EXPECT_EQ(Render("{% if true %}{% set z = 1 %}{% endif %}{{ z }}"), "1");
  EXPECT_EQ(RenderError("{% set s = 'x' %}{% set s.attr = 1 %}"),
            "line 1:21: cannot assign attribute on non-namespace object 's'");
}

TEST(JinjaTest, Macros) {
  EXPECT_EQ(Render("{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|"
                   "{{ m(b=5, a=0) }}|{{ m() }}"),
            "1-2|1-3|0-5|-2");
  EXPECT_EQ(
      Render("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}"),
      "1(2,){'k': 3}");
  EXPECT_EQ(RenderError("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
            "line 1:42: TypeError: macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(Render("{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}"
                   "{% call wrap('b') %}inner{% endcall %}"),
            "<b>inner</b>");
  EXPECT_EQ(Render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                   "{{ f(3) }}"),
            "321");
  // Macros see their defining scope at call time.
  EXPECT_EQ(Render("{% macro m() %}{{ y }}{% endmacro %}[{{ m() }}]{% set y = 5 %}[{{ m() }}]"),
            "[][5]");
  EXPECT_EQ(Render("{% macro m() %}1{% endmacro %}{{ m() + '2' }}|{{ m() ~ 3 }}"), "12|13");
  EXPECT_EQ(RenderError("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")
                    .find("maximum recursion depth exceeded") != std::string::npos,
            true);
}

TEST(JinjaTest, SetBlockFilterBlockWith) {
  EXPECT_EQ(Render("{% set t %}a{{ 1 }}{% endset %}[{{ t }}]"), "[a1]");
  EXPECT_EQ(Render("{% set t | upper %}ab{% endset %}{{ t }}"), "AB");
  EXPECT_EQ(Render("{% filter upper %}x{{ 'y' }}{% endfilter %}"), "XY");
  EXPECT_EQ(Render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaTest, ToJsonIsTransformersJsonDumps) {
  json ctx = {{"d", {{"b", 1}, {"a", {1.5, nullptr, true, "é<&'>"}}}}};
  // transformers' tojson: json.dumps(ensure_ascii=False), no HTML escaping.
  EXPECT_EQ(Render("{{ d | tojson }}", ctx), R"({"a": [1.5, null, true, "é<&'>"], "b": 1})");
  EXPECT_EQ(Render("{{ d | tojson(ensure_ascii=true) }}", ctx),
            R"({"a": [1.5, null, true, "\u00e9<&'>"], "b": 1})");
  EXPECT_EQ(Render("{{ {'k': [1, {}], 'e': []} | tojson(indent=2) }}"),
            "{\n  \"k\": [\n    1,\n    {}\n  ],\n  \"e\": []\n}");
  EXPECT_EQ(Render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}"),
            R"({"a":2,"b":1})");
  EXPECT_EQ(Render("{{ '😀\n\"' | tojson(ensure_ascii=True) }}"), R"("\ud83d\ude00\n\"")");
  EXPECT_EQ(RenderError("{{ nothing | tojson }}"),
            "line 1:14: TypeError: Object of type Undefined is not JSON serializable");
}

TEST(JinjaTest, OrderedContextKeepsKeyOrder) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(
      R"({"tool": {"type": "function", "function": {"name": "f", "description": "d"}}})");
  absl::StatusOr<Template> t = Template::Parse("{{ tool | tojson }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render(ctx),
            R"({"type": "function", "function": {"name": "f", "description": "d"}})");
}

TEST(JinjaTest, Filters) {
  EXPECT_EQ(Render("{{ x | default('d') }}|{{ none | default('d') }}|{{ '' | default('d', true) }}|"
                   "{{ [3, 1, 2] | sort }}|{{ ['b', 'A', 'a'] | sort }}|{{ ['A', 'a', 'b'] | "
                   "unique | list }}"),
            "d|None|d|[1, 2, 3]|['A', 'a', 'b']|['A', 'b']");
  EXPECT_EQ(
      Render(
          "{{ [{'a': 2}, {'a': 1}] | map(attribute='a') | list }}|"
          "{{ [{'r': 'u'}, {'r': 's'}] | selectattr('r', 'equalto', 'u') | list }}|"
          "{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3] | reject('equalto', 2) | list }}|"
          "{{ ['1', '2'] | map('int') | sum }}"),
      "[2, 1]|[{'r': 'u'}]|[1, 3]|[1, 3]|3");
  EXPECT_EQ(
      Render("{{ {'b': 1, 'a': 2} | dictsort }}|{{ {'b': 1} | items | list }}|"
             "{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ [] | first }}|{{ 'ab' | join('-') }}"),
      "[('a', 2), ('b', 1)]|[('b', 1)]|12||a-b");
  EXPECT_EQ(Render("{{ ' x ' | trim }}|{{ 'ab' | upper }}|{{ 'hello world' | title }}|"
                   "{{ 'a-b' | replace('-', '+') }}|{{ '4.7' | int }}|{{ 'x' | int(7) }}|"
                   "{{ 3 | float }}|{{ 5 | string }}|{{ -2 | abs }}|{{ 2.5 | round }}"),
            "x|AB|Hello World|a+b|4|7|3.0|5|2|2.0");
  EXPECT_EQ(Render("{{ '%s=%d' | format('a', 3) }}|{{ 'a\\nb' | indent(2) }}|{{ [1, 2, 3] | "
                   "batch(2) | list }}"),
            "a=3|a\n  b|[[1, 2], [3]]");
}

TEST(JinjaTest, Tests) {
  json ctx = {{"d", json::object()}, {"l", json::array()}, {"s", ""}, {"n", nullptr}};
  EXPECT_EQ(Render("{{ d is mapping }}{{ l is mapping }}{{ s is string }}{{ l is iterable }}"
                   "{{ 1 is iterable }}{{ n is none }}{{ x is undefined }}{{ d is sequence }}",
                   ctx),
            "TrueFalseTrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(Render("{{ 1 is number }}{{ true is number }}{{ true is boolean }}{{ 1 is integer }}"
                   "{{ 1.0 is float }}{{ 1 is true }}{{ true is true }}{{ false is false }}"),
            "TrueTrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(Render("{{ 4 is divisibleby 2 }}{{ 'a' is in 'abc' }}{{ 2 is equalto 2 }}"
                   "{{ 1 is sameas 1 }}{{ 'A' is upper }}{{ 3 is odd }}{{ 3 is not even }}"),
            "TrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaTest, RaiseExceptionCarriesTheTemplateMessage) {
  EXPECT_EQ(RenderError(
                "{% if true %}{{ raise_exception('Only user and assistant roles!') }}{% endif %}"),
            "Only user and assistant roles!");
}

TEST(JinjaTest, SandboxRefusesMutation) {
  EXPECT_EQ(RenderError("{% set l = [1] %}{% set _ = l.append(2) %}"),
            "line 1:37: SecurityError: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(RenderError("{% set d = {} %}{{ d.update({'a': 1}) }}"),
            "line 1:28: SecurityError: access to attribute 'update' of 'dict' object is unsafe.");
  EXPECT_EQ(RenderError("{{ range(200000) | length }}"),
            "line 1:9: OverflowError: Range too big. The sandbox blocks ranges larger than "
            "MAX_RANGE (100000).");
  EXPECT_EQ(
      RenderError("{% set ns = namespace(_x=1) %}").find("SecurityError") != std::string::npos,
      true);
}

TEST(JinjaTest, ParseErrorsNameLineColumnAndConstruct) {
  EXPECT_EQ(ParseError("a\nb\n  {{ x | xmlattr }}"), "line 3:10: unsupported filter 'xmlattr'");
  EXPECT_EQ(ParseError("{% if x is frobnicated %}{% endif %}"),
            "line 1:12: unsupported test 'frobnicated'");
  EXPECT_EQ(ParseError("{% include 'other.jinja' %}"), "line 1:4: unsupported tag 'include'");
  EXPECT_EQ(ParseError("{% extends 'base' %}"), "line 1:4: unsupported tag 'extends'");
  EXPECT_EQ(ParseError("{% for x in y recursive %}{% endfor %}"),
            "line 1:15: unsupported construct 'recursive' loop");
  EXPECT_EQ(ParseError("{% if x %}\nabc"),
            "line 2:4: unexpected end of template, expected 'endif'");
  EXPECT_EQ(ParseError("{% for x in y %}{% endif %}"), "line 1:20: unexpected 'endif'");
  EXPECT_EQ(ParseError("{{ 1 + }}"), "line 1:8: unexpected '}}'");
  EXPECT_EQ(ParseError("{{ 'abc }}"), "line 1:4: unterminated string literal");
  EXPECT_EQ(ParseError("{{ x "), "line 1:1: unexpected end of template, expected '}}'");
  EXPECT_EQ(ParseError("{# open comment"), "line 1:1: missing end of comment tag");
  EXPECT_EQ(ParseError("{% break %}"), "line 1:4: 'break' outside of a loop");
  EXPECT_EQ(ParseError("{{ a ? b }}"), "line 1:6: unexpected char '?'");
  EXPECT_EQ(ParseError("{{ f(*args) }}"),
            "line 1:6: unsupported construct '*args' / '**kwargs' in a call");
  EXPECT_EQ(ParseError("{% set x = 1 %}{{ x }}"), "parsed");
  EXPECT_EQ(ParseError(std::string("\xff")), "template is not valid UTF-8 (byte offset 0)");
}

TEST(JinjaTest, DeepNestingIsAnErrorNotACrash) {
  std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_EQ(ParseError("{{ " + deep + " }}"), "line 1:104: expression nested too deeply");
  EXPECT_EQ(ParseError("{{ " + std::string(5000, '-') + "1 }}"),
            "line 1:203: expression nested too deeply");
  std::string blocks;
  for (int k = 0; k < 300; ++k) blocks += "{% if true %}";
  EXPECT_TRUE(absl::StrContains(ParseError(blocks), "nested too deeply"));
  EXPECT_FALSE(ParsePythonLiteral(std::string(100000, '[') + std::string(100000, ']')).ok());
  // Deep render contexts are refused up front; a template cannot build an unprintable value.
  json ctx = json::array();
  for (int k = 0; k < 300; ++k) ctx = json::array({ctx});
  EXPECT_EQ(RenderError("{{ x }}", {{"x", ctx}}), "render context nests deeper than 256 levels");
  EXPECT_EQ(RenderError("{% set ns = namespace(v=[]) %}{% for i in range(2000) %}"
                        "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson }}"),
            "line 1:60: value nested too deeply");
}

TEST(JinjaTest, RenderContextMustBeAnObject) {
  absl::StatusOr<Template> t = Template::Parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->Render(json::array()).ok());
}

TEST(JinjaTest, PythonLiteral) {
  absl::StatusOr<Value> v =
      ParsePythonLiteral("{'a': [1, -2.5, 'x' \"y\", None, True], 'b': (1,)}");
  ASSERT_TRUE(v.ok()) << v.status();
  JsonDumpOptions o;
  EXPECT_EQ(*PyJsonDumps(*v, o), R"({"a": [1, -2.5, "xy", null, true], "b": [1]})");
  EXPECT_FALSE(ParsePythonLiteral("true").ok());  // Python spells it True
  EXPECT_FALSE(ParsePythonLiteral("a + 1").ok());
  EXPECT_FALSE(ParsePythonLiteral("[1, 2").ok());
  EXPECT_FALSE(ParsePythonLiteral("1 }}{{ 2").ok());
}

TEST(JinjaTest, FloatReprIsShortestRoundTrip) {
  EXPECT_EQ(PyFloatRepr(0.1), "0.1");
  EXPECT_EQ(PyFloatRepr(-1.0), "-1.0");
  EXPECT_EQ(PyFloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(PyFloatRepr(1.5e300), "1.5e+300");
  EXPECT_EQ(PyFloatRepr(2.5e-7), "2.5e-07");
  EXPECT_EQ(PyFloatRepr(1e22), "1e+22");
}

}  // namespace
}  // namespace ring::jinja
