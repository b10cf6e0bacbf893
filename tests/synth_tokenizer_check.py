#!/usr/bin/env python3
"""Checks the tokenizer and chat templates `ringctl synth` writes.

For a GLM-style (glm_moe_dsa) and a Qwen-style (qwen3) tiny checkpoint:
  - HF `tokenizers` loads tokenizer.json; encode -> decode is the identity on English,
    code, CJK, emoji, whitespace runs; every id fits the model's vocab_size;
  - special/added tokens encode as one id each and the eos ids of generation_config.json
    are the tokenizer's ids for them;
  - the pre-tokenizer splits digits in runs of 1-3 (GLM) or singly (Qwen);
  - chat_template.jinja renders with jinja2 the way transformers renders chat templates
    (sandboxed, trim_blocks, lstrip_blocks, tojson(ensure_ascii=...)): GLM
    "[gMASK]<sop><|user|>...<|assistant|><think>", thinking off, tools, tool results;
    Qwen "<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n", thinking off;
  - when transformers is importable, AutoTokenizer loads the directory and its
    apply_chat_template gives the same text.

Usage: synth_tokenizer_check.py --ringctl build/server/ringctl --work /tmp/dir
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from tokenizers import Tokenizer

SAMPLES = [
    "Hello, world!",
    "The year 2024 had 366 days; 1234567 is a number.",
    "def f(x):\n    return x ** 2  # square\n",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nnewlines\n\n\n",
    "自然语言处理很有趣。今天天气很好！",
    "東京は日本の首都です",
    "한국어 텍스트",
    "emoji: 🤖🚀👍🏽 mixed 中文 and English",
    "naïve café résumé Ελληνικά русский",
    "don't won't I'LL we've",
    "<think>reasoning</think>answer",
    "",
]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]


def synth(ringctl, arch, out):
    subprocess.run([ringctl, "synth", "--arch", arch, "--preset", "tiny", "--quant", "bf16",
                    "--out", out, "--force", "--quiet"], check=True)


def load_json(path):
    with open(path) as f:
        return json.load(f)


def check_tokenizer(d, style):
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    cfg = load_json(os.path.join(d, "config.json"))
    gen = load_json(os.path.join(d, "generation_config.json"))
    vocab = cfg["vocab_size"]
    n = tok.get_vocab_size(with_added_tokens=True)
    assert n <= vocab, f"tokenizer has {n} ids > vocab_size {vocab}"
    assert tok.get_vocab_size(with_added_tokens=False) >= 256 + 300, "too few merges"

    for s in SAMPLES:
        ids = tok.encode(s, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == s, f"round trip failed: {s!r} -> {ids} -> {back!r}"
        assert all(0 <= i < vocab for i in ids), (s, ids)
    # Merges compress: common English is well under one token per byte.
    text = "The tokenizer splits the text into pieces and each piece is mapped to an id."
    ids = tok.encode(text).ids
    assert len(ids) < len(text) / 2.5, (len(ids), len(text))

    if style == "glm":
        specials = ["[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                    "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>",
                    "</tool_call>", "<tool_response>", "</tool_response>", "<|endoftext|>"]
        stops = ["<|endoftext|>", "<|user|>", "<|observation|>"]
        digits = ["123", "45"]
        assert tok.normalizer is None
    else:
        specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
        stops = ["<|im_end|>", "<|endoftext|>"]
        digits = ["1", "2", "3", "4", "5"]
    for sp in specials:
        tid = tok.token_to_id(sp)
        assert tid is not None, sp
        assert tok.encode(f"a{sp}b", add_special_tokens=False).ids.count(tid) == 1, sp
        assert tok.encode(sp, add_special_tokens=False).ids == [tid], sp
    assert gen["eos_token_id"] == [tok.token_to_id(s) for s in stops], gen["eos_token_id"]
    pre = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("12345")]
    assert pre == digits, pre
    print(f"  {style}: {n} ids ({tok.get_vocab_size(False)} BPE), round trips ok")


def jinja_env():
    """A jinja2 environment set up the way transformers renders chat templates."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(template, messages, **kw):
    return jinja_env().from_string(template).render(messages=messages, **kw)


def check_glm_template(t):
    user = [{"role": "user", "content": "你好"}]
    out = render(t, user, add_generation_prompt=True)
    assert out == "[gMASK]<sop><|user|>你好<|assistant|><think>", repr(out)
    out = render(t, user, add_generation_prompt=True, enable_thinking=False)
    assert out == "[gMASK]<sop><|user|>你好<|assistant|></think>", repr(out)

    chat = [{"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
            {"role": "user", "content": "Bye"}]
    out = render(t, chat, add_generation_prompt=True)
    want = ("[gMASK]<sop><|system|>You are helpful.<|user|>Hi<|assistant|></think>Hello!"
            "<|user|>Bye<|assistant|><think>")
    assert out == want, repr(out)

    call = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "22C"}]
    out = render(t, call, tools=TOOLS, add_generation_prompt=True)
    assert out.startswith("[gMASK]<sop><|system|>\n# Tools\n"), repr(out[:60])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in out, out
    assert "\n</tools>" in out, out
    assert ("<|assistant|></think><tool_call>get_weather<arg_key>city</arg_key>"
            "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>"
            "</tool_call><|observation|><tool_response>sunny</tool_response>"
            "<tool_response>22C</tool_response><|assistant|><think>") in out, repr(out)
    # Reasoning of the turn after the last user message is kept.
    out = render(t, [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": "<think>hmm</think>a"}])
    assert out == "[gMASK]<sop><|user|>q<|assistant|><think>hmm</think>a", repr(out)


def check_qwen_template(t):
    user = [{"role": "user", "content": "hi"}]
    out = render(t, user, add_generation_prompt=True)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", repr(out)
    out = render(t, user, add_generation_prompt=True, enable_thinking=False)
    assert out == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                   "<think>\n\n</think>\n\n"), repr(out)
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"},
            {"role": "user", "content": "c"}]
    out = render(t, chat, add_generation_prompt=True)
    want = ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na<|im_end|>\n"
            "<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert out == want, repr(out)
    call = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny"}]
    out = render(t, call, tools=TOOLS, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\n# Tools\n"), repr(out[:40])
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n'
            '</tool_response><|im_end|>\n<|im_start|>assistant\n') in out, repr(out)


def check_transformers(d, style):
    try:
        import transformers  # noqa: F401
        from transformers import AutoTokenizer
    except Exception as e:  # pragma: no cover - optional dependency
        print(f"  transformers not importable ({e}); skipping AutoTokenizer check")
        return
    tok = AutoTokenizer.from_pretrained(d)
    with open(os.path.join(d, "chat_template.jinja")) as f:
        template = f.read()
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "你好 🤖"}]
    for thinking in (True, False):
        got = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                      enable_thinking=thinking)
        want = render(template, msgs, add_generation_prompt=True, enable_thinking=thinking)
        assert got == want, (got, want)
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    assert tok.decode(ids) == render(template, msgs, add_generation_prompt=True)
    eos = tok.eos_token
    assert eos == ("<|endoftext|>" if style == "glm" else "<|im_end|>"), eos
    print(f"  {style}: transformers AutoTokenizer renders the same template")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)

    for arch, style in (("glm_moe_dsa", "glm"), ("qwen3", "qwen")):
        d = os.path.join(args.work, arch)
        synth(args.ringctl, arch, d)
        check_tokenizer(d, style)
        with open(os.path.join(d, "chat_template.jinja")) as f:
            template = f.read()
        try:
            import jinja2  # noqa: F401
        except ImportError:
            print("  jinja2 not importable; skipping chat template checks")
            continue
        (check_glm_template if style == "glm" else check_qwen_template)(template)
        print(f"  {style}: chat template renders as expected")
        check_transformers(d, style)
    print("synth_tokenizer_check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
