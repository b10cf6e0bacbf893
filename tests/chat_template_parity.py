#!/usr/bin/env python3
"""Chat-template parity: our Jinja engine (ringctl chat-template) against HF transformers.

Every template under tests/data/chat_templates/ is rendered over a suite of conversations
(system prompts, multi-turn, tools, tool calls and results, reasoning_content, thinking
on/off, add_generation_prompt true/false, content as a parts list, unicode) twice:
  - by transformers' own apply_chat_template rendering path (render_jinja_template on
    _normalize_chat_messages output, with the tokenizer's special tokens), or, when
    transformers cannot be imported, by jinja2 configured exactly as transformers does;
  - by `ringctl chat-template`.
The rendered strings must be identical, and a case that raises in Python must fail in ours.

    .venv/bin/python tests/chat_template_parity.py --ringctl build/server/ringctl \
        --templates tests/data/chat_templates [-v]

Exit 0 on full parity, 1 on any mismatch, 77 (CTest skip) without jinja2.
"""

import argparse
import copy
import json
import os
import subprocess
import sys

try:
    import jinja2  # noqa: F401
except ImportError:
    print("SKIP: jinja2 is not installed")
    sys.exit(77)

# Special tokens per template file (what the model's tokenizer_config.json provides).
DS_BOS = "<｜begin▁of▁sentence｜>"
DS_EOS = "<｜end▁of▁sentence｜>"
SPECIAL_TOKENS = {
    "deepseek-v3.1.jinja": {"bos_token": DS_BOS, "eos_token": DS_EOS},
    "deepseek-v3.2.jinja": {"bos_token": DS_BOS, "eos_token": DS_EOS},
    "deepseek-v3.jinja": {"bos_token": "<｜begin of sentence｜>", "eos_token": "<｜end of sentence｜>"},
    "qwen3.jinja": {"eos_token": "<|im_end|>"},
    "qwen3-instruct-2507.jinja": {"eos_token": "<|im_end|>"},
    "qwen3-thinking-2507.jinja": {"eos_token": "<|im_end|>"},
    "synth-qwen.jinja": {"eos_token": "<|im_end|>"},
    "glm-4.5.jinja": {"eos_token": "<|endoftext|>"},
    "glm-4.6.jinja": {"eos_token": "<|endoftext|>"},
    "glm-4.7-flash.jinja": {"eos_token": "<|endoftext|>"},
    "glm-5.3-flash.jinja": {"eos_token": "<|endoftext|>"},
    "synth-glm.jinja": {"eos_token": "<|endoftext|>"},
}


# --- the oracle -----------------------------------------------------------------------------

def make_oracle(force_replica=False):
    """Returns (render(source, messages, tools, add_generation_prompt, kwargs, special),
    render_raw(source, context), name)."""
    try:
        if force_replica:
            raise ImportError("--oracle jinja2")
        from transformers.utils import chat_template_utils as ctu  # noqa: WPS433

        def render(source, messages, tools, agp, kwargs, special):
            if not messages:
                raise ValueError("Cannot apply chat template to an empty conversation.")
            conv = ctu._normalize_chat_messages(messages)
            template_kwargs = {**special, **kwargs}
            rendered, _ = ctu.render_jinja_template(
                conversations=[conv], tools=tools, documents=None, chat_template=source,
                return_assistant_tokens_mask=False, continue_final_message=False,
                add_generation_prompt=agp, **template_kwargs)
            return rendered[0]

        def render_raw(source, context):
            return ctu._compile_jinja_template(source).render(**context)

        return render, render_raw, "transformers"
    except Exception as e:  # pragma: no cover - depends on the venv
        print(f"note: transformers unavailable ({type(e).__name__}: {e}); using a jinja2 replica")

    import datetime
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(name)

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = Namespace

    def render(source, messages, tools, agp, kwargs, special):
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        conv = []
        for m in messages:
            m = {k: v for k, v in m.items() if v is not None}
            r = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
            if r is not None:
                m = {"thinking": r, **m, "reasoning_content": r}
            conv.append(m)
        return env.from_string(source).render(messages=conv, tools=tools, documents=None,
                                              add_generation_prompt=agp, **{**special, **kwargs})

    def render_raw(source, context):
        return env.from_string(source).render(**context)

    return render, render_raw, "jinja2 replica"


# --- the conversations -----------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city. 天气预报 — \"quoted\" & <tagged>.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 北京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"site": {"type": "string"}, "recent": {"type": "boolean"}}},
                "limit": {"type": "number"},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def tool_call(cid, name, args, as_string=False):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


CONVERSATIONS = {
    "single_user": dict(messages=[{"role": "user", "content": "Hello!"}]),
    "system_user": dict(messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"}]),
    "multi_turn": dict(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"}]),
    "reasoning_history": dict(messages=[
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "Yes, 17 is prime.", "reasoning_content": "Check divisors 2,3: none.\n"},
        {"role": "user", "content": "And 21?"},
        {"role": "assistant", "content": "No: 21 = 3 × 7.", "reasoning_content": "\n21/3 = 7.\n"}]),
    "reasoning_last_user": dict(messages=[
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "Think about it."},
        {"role": "user", "content": "Sure?"}]),
    "think_in_content": dict(messages=[
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
        {"role": "user", "content": "times 2?"}]),
    "reasoning_alias": dict(messages=[
        {"role": "user", "content": "Ping"},
        {"role": "assistant", "content": "Pong", "reasoning": "The user says ping."}]),
    "tools_only": dict(messages=[
        {"role": "system", "content": "You can use tools."},
        {"role": "user", "content": "Weather in Paris?"}], tools=TOOLS),
    "tool_round_trip": dict(messages=[
        {"role": "user", "content": "Weather in Paris and in 北京?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool twice.",
         "tool_calls": [tool_call("call_1", "get_weather", {"city": "Paris", "unit": "celsius", "days": 2}),
                        tool_call("call_2", "get_weather", {"city": "北京"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "晴，25°C"},
        {"role": "assistant", "content": "Paris: 21°C and clear. 北京: 25°C, sunny."},
        {"role": "user", "content": "Thanks!"}], tools=TOOLS),
    "tool_call_pending": dict(messages=[
        {"role": "user", "content": "Search for jinja docs"},
        {"role": "assistant", "content": "Let me search.",
         "tool_calls": [tool_call("call_9", "search", {"query": "jinja2 docs", "filters": {"site": "palletsprojects.com", "recent": True}, "limit": 2.5})]},
        {"role": "tool", "tool_call_id": "call_9", "name": "search", "content": "Jinja is a templating engine."}], tools=TOOLS),
    "tool_args_as_string": dict(messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("call_3", "get_weather", {"city": "Oslo"}, as_string=True)]},
        {"role": "tool", "tool_call_id": "call_3", "content": "cold"}], tools=[WEATHER_TOOL]),
    "tool_args_string_with_content": dict(messages=[
        {"role": "system", "content": "Tools allowed."},
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "",
         "tool_calls": [tool_call("call_4", "get_weather", {"city": "Rome", "days": 1}, as_string=True)]},
        {"role": "tool", "tool_call_id": "call_4", "content": "hot"},
        {"role": "assistant", "content": "It is hot in Rome."}], tools=[WEATHER_TOOL]),
    "content_parts": dict(messages=[
        {"role": "system", "content": [{"type": "text", "text": "System in parts."}]},
        {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]}]),
    "unicode": dict(messages=[
        {"role": "user", "content": "Ünïcödé ✓ — 你好，世界！ 😀 עברית \\ \"q\" 'a' <b>&amp; \t tab\nnewline"},
        {"role": "assistant", "content": "Got it: 😀 ✓"},
        {"role": "user", "content": "  spaced  \n\n"}]),
    "assistant_last": dict(messages=[
        {"role": "user", "content": "Continue the story."},
        {"role": "assistant", "content": "Once upon a time"}]),
    "developer_role": dict(messages=[
        {"role": "developer", "content": "Follow the rules."},
        {"role": "user", "content": "OK?"}]),
    "empty": dict(messages=[]),
}

KWARG_VARIANTS = {
    "default": {},
    "thinking_off": {"enable_thinking": False},
    "thinking_on": {"enable_thinking": True, "thinking": True},
    "keep_reasoning": {"clear_thinking": False, "reasoning_effort": "low"},
}


def build_cases():
    cases = []
    for cname, conv in CONVERSATIONS.items():
        for kname, kwargs in KWARG_VARIANTS.items():
            for agp in (True, False):
                if cname == "empty" and (kname != "default" or not agp):
                    continue
                cases.append({
                    "name": f"{cname}/{kname}/agp={agp}",
                    "messages": copy.deepcopy(conv["messages"]),
                    "tools": copy.deepcopy(conv.get("tools")),
                    "add_generation_prompt": agp,
                    "kwargs": dict(kwargs),
                })
    return cases




# --- engine phase: hand-written snippets and seeded random expressions -------------------------
#
# Each snippet is its own template rendered with ENGINE_CONTEXT by jinja2 in transformers'
# environment and by `ringctl chat-template --raw`; the same equality rule applies.

ENGINE_CONTEXT = {
    "d": {"a": 1, "b": [1, 2, {"c": "x"}], "items": 2, "s": "Hé llo", "n": None},
    "l": [3, 1, 2],
    "ls": ["b", "A", "a", "é"],
    "s": "Hello, World! héllo 😀",
    "n": None,
    "f": 2.5,
    "i": 7,
    "t": True,
    "msgs": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"},
             {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}],
}

ENGINE_SNIPPETS = [
    "{{ 1 + 2 * 3 - 4 / 2 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ 7 // -2 }}|{{ -7.5 % 2 }}",
    "{{ 'a' ~ 1 ~ none ~ true }}|{{ 1 ~ 2 * 3 }}|{{ [1, 2] ~ '' }}",
    "{{ not 1 is defined }}|{{ 1 if false }}|{{ 'x' if 0 else 'y' if none else 'z' }}",
    "{{ s[::-1] }}|{{ s[3:-3] }}|{{ s[100:] }}|{{ l[::-2] }}|{{ s[-1] }}|{{ s | length }}",
    "{{ d['items'] }}|{{ d.a }}|{{ d.b[2].c }}|{{ d.b.2.c }}|{{ d.zz is defined }}",
    "{{ s.split() }}|{{ s.split(',', 1) }}|{{ s.rsplit('l', 2) }}|{{ s.lower().title() }}|{{ s.count('l') }}",
    "{{ s.startswith(('x', 'He')) }}|{{ s.endswith('😀') }}|{{ s.find('W') }}|{{ s.replace('l', 'L', 2) }}",
    "{{ '  x y  '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ '\\t a'.lstrip() }}|{{ 'a\\n'.rstrip() }}",
    "{{ '{} {x} {0!r}'.format('a', x='b') }}|{{ '%s=%r' | format('k', 'v') }}|{{ ','.join(ls) }}",
    "{{ ls | sort }}|{{ ls | sort(reverse=true, case_sensitive=true) }}|{{ ls | unique | list }}|{{ ls | max }}|{{ ls | min }}",
    "{{ l | sum }}|{{ l | sort | first }}|{{ l | last }}|{{ l | reverse | list }}|{{ l | batch(2) | list }}",
    "{{ {'b': 2, 'A': 1, 'a': 3} | dictsort }}|{{ {'x': 1} | items | list }}",
    "{{ msgs | map(attribute='role') | join('/') }}|{{ msgs | selectattr('content') | list | length }}|{{ msgs | rejectattr('content', 'none') | map(attribute='role') | list }}",
    "{{ msgs | selectattr('tool_calls', 'defined') | map(attribute='tool_calls') | first | first | tojson }}",
    "{{ d | tojson }}|{{ d | tojson(indent=1) }}|{{ s | tojson(ensure_ascii=true) }}|{{ l | tojson(separators=(',', ':')) }}",
    "{{ f | round }}|{{ 2.675 | round(2) }}|{{ 3.14159 | round(2, 'floor') }}|{{ -3 | abs }}|{{ '3.9' | float }}|{{ '0x1A' | int(0, 16) }}",
    "{{ 'abc' | center(9) }}|{{ 'a b\\nc' | wordcount }}|{{ 'hi\\nthere' | indent(3, true) }}|{{ 'x' * 3 }}",
    "{{ i is odd }}{{ i is divisibleby 7 }}{{ s is string }}{{ l is sequence }}{{ d is mapping }}{{ n is none }}{{ t is boolean }}{{ f is float }}{{ i is integer }}",
    "{{ 'é' is lower }}{{ 'A' is upper }}{{ 2 is in l }}{{ 'a' is in d }}{{ l is iterable }}{{ i is number }}{{ undefined_x is undefined }}",
    "{% for k, v in d.items() if k != 'b' %}{{ loop.index }}:{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for x in l %}{{ loop.revindex0 }}{{ loop.previtem | default('-') }}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}",
    "{% for c in s if c is upper %}{{ c }}{% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %}",
    "{% set ns = namespace(n=0, acc='') %}{% for m in msgs %}{% set ns.n = ns.n + 1 %}{% set ns.acc = ns.acc ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.acc }}",
    "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}|{{ m(a=2, b=none) }}",
    "{% macro outer() %}[{{ caller('x') }}]{% endmacro %}{% call(v) outer() %}got {{ v }}{% endcall %}",
    "{%- set x -%}\n  block {{ 1 }}  \n{%- endset -%}[{{ x }}]",
    "  {% if t %}\n  yes\n  {% endif %}\n{{ 'v' }}  \n  {%- if t %} trimmed{% endif %}\n",
    "{{ range(3) | list }}{{ range(2, 9, 3) | list }}{{ range(0) | list }}{{ range(3, 0, -1) | list }}",
    "{{ [1, 2] == [1, 2] }}{{ (1, 2) == [1, 2] }}{{ {'a': 1} == {'a': 1.0} }}{{ 1 == true }}{{ none == none }}{{ 'a' < 'b' < 'c' }}",
    "{{ [[1, 2], [1, 3]] | max }}|{{ [(2, 'b'), (1, 'a')] | sort }}|{{ ['a', 'B'] | sort(case_sensitive=true) }}",
    "{{ ['x', 'y'] | map('upper') | list }}|{{ [' a', 'b '] | map('trim') | join }}|{{ [1, 2, 3] | select('gt', 1) | list }}",
    "{{ 'Mixed Case' | lower | title | replace(' ', '_') | capitalize }}",
    "{{ {'k': 'v'}.get('k') }}{{ {'k': 'v'}.get('z', 'dflt') }}{{ {'k': 'v'}.keys() | list }}{{ {'k': 'v'}.values() | list }}",
    "{{ none | default('d') }}{{ undefined_y | default('d') }}{{ '' | default('d', true) }}{{ 0 | d('zero', true) }}",
    "{{ raise_exception('custom failure ' ~ i) }}",
    "{{ undefined_z.attr }}",
    "{{ l.append(4) }}",
    "{{ 1 + 'a' }}",
    "{{ [] | first }}|{{ [] | last }}|{{ {} | length }}|{{ '' | list }}",
    "{{ 'a' in none }}",
]


def random_snippets(count, seed):
    """Seeded random expressions over ENGINE_CONTEXT (typed so most evaluate)."""
    import random
    rng = random.Random(seed)
    strs = ["s", "d.s", "'abc'", "'A b'", "'héllo'", "'x,y,,z'", "'  pad  '", "(s ~ '!')", "'😀ok'"]
    nums = ["i", "f", "l[0]", "d.a", "3", "-2", "0", "1.5", "(i // 2)", "(l | length)", "(s | length)"]
    lists = ["l", "ls", "d.b", "[1, 'a', none]", "(l | sort)", "s.split()", "(ls | unique | list)", "msgs", "[]"]
    dicts = ["d", "{'k': 1, 'j': [1]}", "msgs[1]", "{}"]
    anys = ["n", "t", "undefined_v", "d.missing", "none", "true"]

    def S(depth):
        c = rng.randrange(12 if depth < 3 else 1)
        if c == 0 or depth >= 3:
            return rng.choice(strs)
        if c == 1:
            return f"({S(depth + 1)} ~ {X(depth + 1)})"
        if c == 2:
            return f"{S(depth + 1)}.{rng.choice(['upper', 'lower', 'title', 'capitalize', 'strip'])}()"
        if c == 3:
            return f"{S(depth + 1)}.replace({rng.choice(strs)}, {rng.choice(strs)})"
        if c == 4:
            return f"({S(depth + 1)} | {rng.choice(['trim', 'upper', 'lower', 'title', 'capitalize', 'string', 'tojson', 'reverse'])})"
        if c == 5:
            return f"{S(depth + 1)}[{rng.choice(['0', '-1', '1:', ':2', '::-1', '1:-1', '::2'])}]"
        if c == 6:
            return f"({L(depth + 1)} | join({rng.choice(strs)}))"
        if c == 7:
            return f"({X(depth + 1)} | string)"
        if c == 8:
            return f"({X(depth + 1)} | tojson)"
        if c == 9:
            return f"({S(depth + 1)} if {B(depth + 1)} else {S(depth + 1)})"
        if c == 10:
            return f"({S(depth + 1)} * {rng.choice(['0', '1', '2'])})"
        return f"{S(depth + 1)}.strip({rng.choice(strs)})"

    def N(depth):
        c = rng.randrange(9 if depth < 3 else 1)
        if c == 0 or depth >= 3:
            return rng.choice(nums)
        op = rng.choice(["+", "-", "*", "/", "//", "%"])
        if c <= 3:
            return f"({N(depth + 1)} {op} {N(depth + 1)})"
        if c == 4:
            return f"({L(depth + 1)} | length)"
        if c == 5:
            return f"{S(depth + 1)}.count({rng.choice(strs)})"
        if c == 6:
            return f"({S(depth + 1)} | length)"
        if c == 7:
            return f"({N(depth + 1)} | {rng.choice(['abs', 'int', 'float', 'round'])})"
        return f"{S(depth + 1)}.find({rng.choice(strs)})"

    def L(depth):
        c = rng.randrange(8 if depth < 3 else 1)
        if c == 0 or depth >= 3:
            return rng.choice(lists)
        if c == 1:
            return f"({L(depth + 1)} + {L(depth + 1)})"
        if c == 2:
            return f"({L(depth + 1)} | {rng.choice(['reverse', 'list', 'unique', 'sort'])} | list)"
        if c == 3:
            return f"{L(depth + 1)}[{rng.choice(['1:', ':1', '::-1', '-2:'])}]"
        if c == 4:
            return f"{S(depth + 1)}.split({rng.choice(['', strs[5], repr(',')])})"
        if c == 5:
            return f"({D(depth + 1)} | dictsort)"
        if c == 6:
            return f"({L(depth + 1)} | select({rng.choice(['', repr('odd'), repr('string'), repr('defined')])}) | list)"
        return f"({D(depth + 1)}.keys() | list)"

    def D(depth):
        return rng.choice(dicts)

    def B(depth):
        c = rng.randrange(8 if depth < 3 else 1)
        if c == 0 or depth >= 3:
            return rng.choice(["t", "not t", "n is none", "(i > 3)", "d.missing is defined"])
        if c == 1:
            return f"({X(depth + 1)} is {rng.choice(['defined', 'none', 'string', 'number', 'mapping', 'iterable', 'sequence', 'integer', 'float', 'boolean'])})"
        if c == 2:
            return f"({X(depth + 1)} {rng.choice(['==', '!='])} {X(depth + 1)})"
        if c == 3:
            return f"({N(depth + 1)} {rng.choice(['<', '<=', '>', '>='])} {N(depth + 1)})"
        if c == 4:
            return f"({S(depth + 1)} in {S(depth + 1)})"
        if c == 5:
            return f"({B(depth + 1)} {rng.choice(['and', 'or'])} {X(depth + 1)})"
        if c == 6:
            return f"{S(depth + 1)}.startswith({rng.choice(strs)})"
        return f"({X(depth + 1)} not in {L(depth + 1)})"

    def X(depth):
        return rng.choice([S, N, L, D, B, lambda d: rng.choice(anys)])(depth)

    # Whitespace control: text with spaces/tabs/newlines around tags with -, + and none.
    def ws_text():
        return "".join(rng.choice([" ", "  ", "\t", "\n", "\n\n", "x", "y z", ""]) for _ in range(rng.randrange(4)))

    def tag(kind, body):
        left = rng.choice(["", "-", "+"]) if kind != "{{" else rng.choice(["", "-"])
        right = rng.choice(["", "-", "+"]) if kind != "{{" else rng.choice(["", "-"])
        close = {"{%": "%}", "{{": "}}", "{#": "#}"}[kind]
        return f"{kind}{left} {body} {right}{close}"

    def block(depth):
        parts = []
        for _ in range(rng.randrange(1, 4)):
            parts.append(ws_text())
            c = rng.randrange(6 if depth < 3 else 3)
            if c == 0:
                parts.append(tag("{{", rng.choice(["'v'", "i", "loop.index if loop is defined else 0"])))
            elif c == 1:
                parts.append(tag("{#", "note"))
            elif c == 2:
                parts.append(tag("{%", rng.choice(["set q = 1", "set q = 2"])))
            elif c == 3:
                parts += [tag("{%", "if t"), block(depth + 1), tag("{%", "else"), block(depth + 1), tag("{%", "endif")]
            elif c == 4:
                parts += [tag("{%", "for z in l"), block(depth + 1), tag("{%", "endfor")]
            else:
                parts += [tag("{%", "macro mm(a)"), block(depth + 1), tag("{%", "endmacro"), ws_text(),
                          tag("{{", "mm(1)")]
        parts.append(ws_text())
        return "".join(parts)

    shapes = ["{{ %s }}", "{{ (%s) | tojson }}", "{% if %s %}T{% else %}F{% endif %}",
              "{% for x in (%s if %s is iterable and %s is not none else []) %}[{{ x }}]{% endfor %}"]
    out = []
    for k in range(count):
        if k % 5 == 4:
            out.append(block(0))
        else:
            out.append(rng.choice(shapes).replace("%s", X(0)))
    return out



# --- comparison ------------------------------------------------------------------------------

def run_ours(ringctl, template_path, special, cases):
    cmd = [ringctl, "chat-template", "--template", template_path]
    if special.get("bos_token"):
        cmd += ["--bos", special["bos_token"]]
    if special.get("eos_token"):
        cmd += ["--eos", special["eos_token"]]
    payload = "".join(json.dumps({k: c[k] for k in ("messages", "tools", "add_generation_prompt", "kwargs")},
                                 ensure_ascii=False) + "\n" for c in cases)
    proc = subprocess.run(cmd, input=payload.encode(), capture_output=True, timeout=120)
    if proc.returncode not in (0,):
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    lines = proc.stdout.decode().splitlines()
    if len(lines) != len(cases):
        raise RuntimeError(f"expected {len(cases)} output lines, got {len(lines)}")
    return [json.loads(line) for line in lines]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def run_engine_phase(render_raw, ringctl, count, seed, verbose):
    """Returns (cases, mismatches)."""
    snippets = ENGINE_SNIPPETS + random_snippets(count, seed)
    payload = "".join(json.dumps({"template": t, "context": ENGINE_CONTEXT}, ensure_ascii=False) + "\n"
                      for t in snippets)
    proc = subprocess.run([ringctl, "chat-template", "--raw"], input=payload.encode(),
                          capture_output=True, timeout=300)
    lines = proc.stdout.decode().splitlines()
    if len(lines) != len(snippets):
        raise RuntimeError(f"--raw: expected {len(snippets)} lines, got {len(lines)}: "
                           f"{proc.stderr.decode(errors='replace')[:500]}")
    failures = []
    for src, line in zip(snippets, lines):
        got = json.loads(line)
        try:
            want = ("text", render_raw(src, copy.deepcopy(ENGINE_CONTEXT)))
        except Exception as e:
            want = ("error", f"{type(e).__name__}: {e}")
        have = ("text", got["text"]) if "text" in got else ("error", got.get("error"))
        if not (want == have or want[0] == have[0] == "error"):
            failures.append((src, want, have))
        elif verbose and want[0] == "error":
            print(f"  both raise: {src[:80]!r}: {want[1][:80]} | {have[1][:80]}")
    return len(snippets), failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--templates", required=True, help="directory of *.jinja files")
    ap.add_argument("--oracle", choices=["auto", "jinja2"], default="auto",
                    help="jinja2: use the replica of transformers' environment even when "
                         "transformers is importable")
    ap.add_argument("--fuzz", type=int, default=3000, help="random engine expressions")
    ap.add_argument("--seed", type=int, default=20260501)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    render, render_raw, oracle_name = make_oracle(args.oracle == "jinja2")
    cases = build_cases()
    names = sorted(f for f in os.listdir(args.templates) if f.endswith(".jinja"))
    if not names:
        print(f"no .jinja files in {args.templates}")
        return 1
    print(f"oracle: {oracle_name}; {len(names)} templates x {len(cases)} cases")
    total = matched = both_errors = 0
    failures = []
    for name in names:
        path = os.path.join(args.templates, name)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        special = SPECIAL_TOKENS.get(name, {})
        ours = run_ours(args.ringctl, path, special, cases)
        t_ok = t_err = 0
        for case, got in zip(cases, ours):
            total += 1
            try:
                want = ("text", render(source, copy.deepcopy(case["messages"]), copy.deepcopy(case["tools"]),
                                       case["add_generation_prompt"], case["kwargs"], special))
            except Exception as e:  # the template (or transformers) refused this input
                want = ("error", f"{type(e).__name__}: {e}")
            have = ("text", got["text"]) if "text" in got else ("error", got.get("error", "?"))
            if want[0] == have[0] == "error":
                matched += 1
                both_errors += 1
                t_err += 1
                if args.verbose:
                    print(f"  {name} {case['name']}: both raise ({want[1]} | {have[1]})")
            elif want == have:
                matched += 1
                t_ok += 1
            else:
                failures.append((name, case["name"], want, have))
        print(f"{name}: {t_ok + t_err}/{len(cases)} identical ({t_err} raise in both)")
    for name, case, want, have in failures[:20]:
        print(f"\nMISMATCH {name} {case}")
        if want[0] == have[0] == "text":
            i = first_difference(want[1], have[1])
            print(f"  first difference at char {i}:")
            print(f"  transformers: {want[1][max(0, i - 80):i + 80]!r}")
            print(f"  ours:         {have[1][max(0, i - 80):i + 80]!r}")
        else:
            print(f"  transformers: {want[0]}: {str(want[1])[:300]!r}")
            print(f"  ours:         {have[0]}: {str(have[1])[:300]!r}")
    print(f"\n{matched}/{total} chat cases identical ({both_errors} raise in both); "
          f"{len(failures)} mismatches")

    n_engine, engine_failures = run_engine_phase(render_raw, args.ringctl, args.fuzz, args.seed,
                                                   args.verbose)
    for src, want, have in engine_failures[:20]:
        print(f"\nENGINE MISMATCH {src!r}\n  jinja2: {want!r}\n  ours:   {have!r}")
    print(f"engine: {n_engine - len(engine_failures)}/{n_engine} snippets identical "
          f"({len(ENGINE_SNIPPETS)} hand-written, {args.fuzz} random, seed {args.seed})")
    return 0 if not failures and not engine_failures else 1


if __name__ == "__main__":
    sys.exit(main())
