#!/usr/bin/env python3
"""End-to-end test of ring-server's OpenAI API with the official `openai` client.

Starts two ring-worker processes and ring-server on loopback (CPU backend) over a tiny
synthetic GLM-5.2-style checkpoint, then checks: models, chat and completions (plain and
streaming, usage), greedy output against `ringctl logits` (the reference step loop) and the
prompt against Python jinja2 + HF tokenizers, seeds, stop strings, logprobs, tools,
every error status (400, 401, 404, 413, 429, context length), cancellation by closing a
stream, a worker killed mid-stream (error event, then the ring re-forms once it is back),
and graceful shutdown. Every wait has a deadline; the whole test is bounded by CTest.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import jinja2
import jinja2.sandbox
import openai
from tokenizers import Tokenizer

import ringproc
from ringproc import start, wait_ready

KEY = "sk-ringserve-test-key"
check = ringproc.check


def raw(port, method, path, body=b"", headers=None, timeout=10):
    h = {"Authorization": f"Bearer {KEY}"}
    h.update(headers or {})
    return ringproc.raw(port, method, path, body=body, headers=h, timeout=timeout)


def metric(port, name):
    return ringproc.metric(port, name, key=KEY)


def main():
    a, root, model_dir = ringproc.setup_tiny_ring_test()
    procs = []
    try:
        workers = []
        for i in range(2):
            p, addr = ringproc.start_worker(a, root, os.path.join(a.work, f"worker{i}.log"))
            procs.append(p)
            workers.append(addr)
        admin = ringproc.free_address()
        cfg = os.path.join(a.work, "ring.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "{admin}"
api_keys = ["{KEY}"]
max_concurrent_requests = 2
max_body_bytes = 65536
read_timeout_s = 2
shutdown_grace_s = 20
[model]
name = "tiny-glm"
path = "tiny-glm"
local_dir = "{model_dir}"
act_dtype = "f32"
prefill_chunk = 16
[ring]
workers = {json.dumps(workers)}
step_timeout_s = 5
""")
        server, url = start([a.server, "--config", cfg], os.path.join(a.work, "server.log"),
                            r"listening on (http://\S+)")
        procs.append(server)
        port = int(url.rsplit(":", 1)[1])
        check(wait_ready(port), "/ready turns 200 once the ring is formed")
        a.admin = admin
        run_tests(a, port, model_dir, workers, procs, server)
    finally:
        ringproc.kill_all(procs)
    return ringproc.report("openai API")


def run_tests(a, port, model_dir, workers, procs, server):
    base = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=60)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    gen_cfg = json.load(open(os.path.join(model_dir, "generation_config.json")))
    eos = set(gen_cfg["eos_token_id"] if isinstance(gen_cfg["eos_token_id"], list) else [gen_cfg["eos_token_id"]])

    # Public endpoints.
    st, _, body = raw(port, "GET", "/health", headers={"Authorization": ""})
    check(st == 200, "/health is public")
    models = client.models.list()
    check([m.id for m in models.data] == ["tiny-glm"], "models.list names the served model")

    # Greedy completion from token ids == the reference step loop (ringctl logits).
    prompt_ids = [11, 22, 33, 44, 55, 66, 77, 88, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108]
    n = 12
    ref = subprocess.run([a.ringctl, "logits", "--model", model_dir, "--tokens", ",".join(map(str, prompt_ids)),
                          "--decode", str(n), "--act", "f32", "--prefill-chunk", "16"],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r"decode tokens:([\d ]+)", ref.stderr)
    ref_ids = [int(x) for x in m.group(1).split()] if m else []
    expect_ids = []
    for t in ref_ids:
        if t in eos:
            break
        expect_ids.append(t)
    expect_text = tok.decode(expect_ids, skip_special_tokens=True)
    c = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0, logprobs=2)
    check(c.choices[0].text == expect_text,
          f"greedy completion equals ringctl logits through the reference loop ({expect_text!r})")
    check(c.usage.prompt_tokens == len(prompt_ids) and c.usage.completion_tokens == len(expect_ids),
          f"usage counts prompt and completion tokens ({c.usage})")
    check(c.choices[0].finish_reason == ("length" if len(expect_ids) == n else "stop"), "finish_reason")
    lp = c.choices[0].logprobs
    check(lp is not None and len(lp.token_logprobs) == len(expect_ids) and
          all(1 <= len(d) <= 2 for d in lp.top_logprobs) and
          all(abs(x - max(d.values())) < 1e-5 for x, d in zip(lp.token_logprobs, lp.top_logprobs)),
          "completion logprobs: greedy token has the top logprob")
    stream = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0,
                                       stream=True)
    check("".join(ch.choices[0].text for ch in stream if ch.choices) == expect_text,
          "streamed completion text equals the non-streamed one")

    # Chat: the prompt is the checkpoint's template rendered as transformers would.
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say something about rings, 123 and 漢字."}]
    tmpl_src = open(os.path.join(model_dir, "chat_template.jinja")).read()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(jinja2.exceptions.TemplateError(msg))
    rendered = env.from_string(tmpl_src).render(messages=messages, add_generation_prompt=True, tools=None)
    want_prompt_tokens = len(tok.encode(rendered, add_special_tokens=False).ids)
    r1 = client.chat.completions.create(model="tiny-glm", messages=messages, max_tokens=10, temperature=0.8,
                                        seed=7)
    check(r1.usage.prompt_tokens == want_prompt_tokens,
          f"chat prompt tokens match jinja2 + HF tokenizers ({r1.usage.prompt_tokens} vs {want_prompt_tokens})")
    check(r1.choices[0].message.role == "assistant" and r1.choices[0].finish_reason in ("stop", "length"),
          "chat completion shape")
    r2 = client.chat.completions.create(model="tiny-glm", messages=messages, max_tokens=10, temperature=0.8,
                                        seed=7)
    same = (r1.choices[0].message.content, getattr(r1.choices[0].message, "reasoning_content", None)) == \
           (r2.choices[0].message.content, getattr(r2.choices[0].message, "reasoning_content", None))
    check(same, "same seed, same output")
    outs = set()
    for seed in range(8, 12):
        r = client.chat.completions.create(model="tiny-glm", messages=messages, max_tokens=10, temperature=1.0,
                                           seed=seed)
        outs.add((r.choices[0].message.content, getattr(r.choices[0].message, "reasoning_content", None),
                  r.usage.completion_tokens))
    check(len(outs) > 1, "different seeds give different outputs")

    # Streaming chat with usage; concatenation equals the non-streamed answer.
    chunks = list(client.chat.completions.create(model="tiny-glm", messages=messages, max_tokens=10,
                                                 temperature=0.8, seed=7, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
    reason = "".join((getattr(ch.choices[0].delta, "reasoning_content", None) or "") for ch in chunks if ch.choices)
    check(text == (r1.choices[0].message.content or "") and
          reason == (getattr(r1.choices[0].message, "reasoning_content", None) or ""),
          "streamed chat equals the non-streamed answer")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r1.usage.completion_tokens
          and not chunks[-1].choices, "include_usage: a final usage chunk")
    fins = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(fins == [r1.choices[0].finish_reason], "exactly one finish_reason in the stream")

    # Stop strings: cut the greedy text at a substring.
    full = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0).choices[0].text
    if len(full) >= 6:
        stop = full[3:6]
        cut = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0,
                                        stop=[stop])
        check(cut.choices[0].text == full[:full.find(stop)] and cut.choices[0].finish_reason == "stop",
              f"stop string {stop!r} cuts the output")
    else:
        check(False, f"greedy output long enough for a stop-string test ({full!r})")

    # Chat logprobs.
    r = client.chat.completions.create(model="tiny-glm", messages=messages, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else []
    check(len(content) == r.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in content) and
          all(abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5 for e in content),
          "chat logprobs: one entry per token, greedy token on top")

    # Tools are rendered into the prompt.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    rt = client.chat.completions.create(model="tiny-glm", messages=messages, max_tokens=3, tools=tools)
    check(rt.usage.prompt_tokens > r1.usage.prompt_tokens, "tools are rendered into the prompt")

    # Errors.
    bad = openai.OpenAI(base_url=base, api_key="sk-wrong-key-000", max_retries=0)
    try:
        bad.models.list()
        check(False, "wrong key -> 401")
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and e.body and e.body.get("code") == "invalid_api_key", "wrong key -> 401")
    try:
        client.chat.completions.create(model="nope", messages=messages)
        check(False, "unknown model -> 404")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "unknown model -> 404")
    try:
        client.chat.completions.create(model="tiny-glm", messages=messages, temperature="hot")
        check(False, "wrong type -> 400")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "temperature", "wrong type -> 400 naming the parameter")
    try:
        client.chat.completions.create(model="tiny-glm", messages=messages, n=2)
        check(False, "n=2 -> 400")
    except openai.BadRequestError:
        check(True, "n=2 -> 400")
    try:
        client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=10**6)
        check(False, "context length -> 400")
    except openai.BadRequestError as e:
        check(e.body.get("code") == "context_length_exceeded", "prompt + max_tokens over the context -> 400")
    st, _, body = raw(port, "POST", "/v1/chat/completions", body=b'{"model": "tiny-glm", "messages": [')
    check(st == 400 and b"malformed JSON" in body, "malformed JSON -> 400")
    st, _, _ = raw(port, "POST", "/v1/chat/completions", body=b"x" * 70000)
    check(st == 413, "body over max_body_bytes -> 413")
    st, _, _ = raw(port, "GET", "/v1/nothing")
    check(st == 404, "unknown route -> 404")

    # Over the concurrency limit: 429 with Retry-After.
    results = []

    def long_stream():
        try:
            s = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=1500, temperature=1.0,
                                          seed=1, stream=True, extra_body={"ignore_eos": True})
            for _ in s:
                pass
            results.append("ok")
        except openai.RateLimitError as e:
            results.append(("429", e.response.headers.get("retry-after")))
        except Exception as e:  # noqa: BLE001
            results.append(repr(e))
    ts = [threading.Thread(target=long_stream) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    n429 = [r for r in results if isinstance(r, tuple)]
    check(len(n429) >= 1 and all(r[1] == "1" for r in n429) and results.count("ok") >= 2,
          f"more than max_concurrent_requests -> 429 with Retry-After ({results})")

    # Cancellation: close a stream early; the generation stops and its caches are freed.
    before = metric(port, "ring_requests_cancelled_total") or 0
    s = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=3000, temperature=1.0,
                                  seed=2, stream=True, extra_body={"ignore_eos": True})
    got = 0
    for _ in s:
        got += 1
        if got == 3:
            break
    s.close()
    deadline = time.time() + 10
    while time.time() < deadline and (metric(port, "ring_requests_cancelled_total") or 0) <= before:
        time.sleep(0.05)
    check((metric(port, "ring_requests_cancelled_total") or 0) > before, "closing a stream cancels it")
    deadline = time.time() + 10
    while time.time() < deadline and metric(port, "ring_sequences_live") != 0:
        time.sleep(0.05)
    check(metric(port, "ring_sequences_live") == 0 and metric(port, "ring_requests_in_flight") == 0,
          "no sequence left behind")

    # Failover: a worker killed (SIGKILL) or stalled (SIGSTOP) mid-stream. The request is
    # replayed on a ring re-formed from the survivors (prompt + tokens already sent), so the
    # client's stream is exactly the uninterrupted one: no token lost or repeated.
    def stream_text(seed, fault=None):
        s = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=400, temperature=1.0,
                                      seed=seed, stream=True, extra_body={"ignore_eos": True})
        out, k = [], 0
        for ch in s:
            if ch.choices:
                out.append(ch.choices[0].text)
            k += 1
            if k == 5 and fault:
                fault()
        return "".join(out)

    want = stream_text(31)

    # ringctl status / drain / undrain against the admin service.
    def status():
        r = subprocess.run([a.ringctl, "status", "--server", a.admin, "--api-key", KEY, "--json"],
                           capture_output=True, text=True, timeout=30)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {"error": r.stderr}
    r = subprocess.run([a.ringctl, "plan", "--workers", ",".join(workers), "--model", "tiny-glm", "--json"],
                       capture_output=True, text=True, timeout=60)
    try:
        plan = json.loads(r.stdout)
    except ValueError:
        plan = {}
    check(r.returncode == 0 and sum(plan.get("split", [])) == 4 and len(plan.get("stages", [])) == 2 and
          plan.get("pipelined_tokens_per_s", 0) > 0, f"ringctl plan: a split of the 4 layers over 2 workers ({plan})")
    r = subprocess.run([a.ringctl, "plan", "--workers", ",".join(workers), "--model", "tiny-glm",
                        "--context", str(1 << 40)], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "no split" in r.stderr, f"ringctl plan refuses an infeasible KV budget ({r.stderr.strip()})")
    st = status()
    check(st.get("state") == "ready" and [w["state"] for w in st.get("workers", [])] == ["serving", "serving"],
          f"ringctl status: ready, both workers serving ({st.get('state')}, {st.get('error', '')})")
    r = subprocess.run([a.ringctl, "status", "--server", a.admin, "--api-key", "sk-wrong-key-000"],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "key" in r.stderr, "ringctl status with a wrong key is refused")
    got = stream_text(31, lambda: subprocess.run([a.ringctl, "drain", workers[0], "--server", a.admin,
                                                  "--api-key", KEY], capture_output=True, timeout=30))
    check(got == want, "drain mid-stream: the request moves to the new ring, stream identical")
    deadline = time.time() + 30
    while time.time() < deadline:
        st = status()
        states = {w["address"]: w["state"] for w in st.get("workers", [])}
        if states.get(workers[0]) == "drained" and states.get(workers[1]) == "serving":
            break
        time.sleep(0.2)
    check(states.get(workers[0]) == "drained" and states.get(workers[1]) == "serving",
          f"ringctl status shows the drained worker ({states})")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0)
    check(r.choices[0].text == expect_text, "drained ring gives the same greedy output")
    subprocess.run([a.ringctl, "undrain", workers[0], "--server", a.admin, "--api-key", KEY],
                   capture_output=True, timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        st = status()
        if [w["state"] for w in st.get("workers", [])] == ["serving", "serving"]:
            break
        time.sleep(0.2)
    check([w["state"] for w in st.get("workers", [])] == ["serving", "serving"], "undrain: both serve again")
    # join / leave a third worker.
    p3, addr3 = ringproc.start_worker(a, os.path.dirname(model_dir), os.path.join(a.work, "worker3.log"))
    procs.append(p3)
    r = subprocess.run([a.ringctl, "join", addr3, "--server", a.admin, "--api-key", KEY],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, f"ringctl join {addr3} ({r.stderr.strip()})")
    deadline = time.time() + 30
    while time.time() < deadline:
        st = status()
        if [w["state"] for w in st.get("workers", [])] == ["serving"] * 3:
            break
        time.sleep(0.2)
    check([w["stageIndex"] for w in st.get("workers", [])] == [0, 1, 2], f"joined worker becomes stage 2 ({st})")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0)
    check(r.choices[0].text == expect_text, "3-stage ring after join gives the same greedy output")
    r = subprocess.run([a.ringctl, "leave", addr3, "--server", a.admin, "--api-key", KEY],
                       capture_output=True, text=True, timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        st = status()
        if [w["state"] for w in st.get("workers", [])] == ["serving"] * 2:
            break
        time.sleep(0.2)
    check(r.returncode == 0 and [w["address"] for w in st.get("workers", [])] == workers,
          "ringctl leave: back to the two configured workers")
    r = subprocess.run([a.ringctl, "drain", "127.0.0.1:1", "--server", a.admin, "--api-key", KEY],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "not in the ring" in r.stderr, "drain of an unknown worker is refused")

    replays0 = metric(port, "ring_requests_replayed_total") or 0
    t0 = time.time()
    try:
        got = stream_text(31, lambda: (procs[1].send_signal(signal.SIGKILL), procs[1].wait(10)))
    except openai.APIError as e:
        got = f"error: {e}"
    check(got == want, f"SIGKILLed worker mid-stream: replayed, stream identical ({time.time() - t0:.1f}s)")
    check((metric(port, "ring_requests_replayed_total") or 0) > replays0, "the replay is counted")
    st, _, body = raw(port, "GET", "/ready")
    check(st == 200 and b"degraded" in body and workers[1].encode() in body,
          f"/ready reports the degraded ring ({body[:160]!r})")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0)
    check(r.choices[0].text == expect_text, "degraded ring (1 worker) gives the same greedy output")
    # The worker comes back on its address: the full ring re-forms by itself.
    p, _ = start([a.worker, "--listen", workers[1], "--model-root", os.path.dirname(model_dir)],
                 os.path.join(a.work, "worker1b.log"), r"listening on (\S+)")
    procs[1] = p
    deadline = time.time() + 30
    while time.time() < deadline and metric(port, "ring_workers_missing") != 0:
        time.sleep(0.2)
    check(metric(port, "ring_workers_missing") == 0, "restarted worker rejoins the ring")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=n, temperature=0)
    check(r.choices[0].text == expect_text, "same greedy output after the rejoin")
    # Stalled worker: its step deadline (5 s) fires, the request replays without it.
    t0 = time.time()
    try:
        got = stream_text(31, lambda: procs[1].send_signal(signal.SIGSTOP))
    except openai.APIError as e:
        got = f"error: {e}"
    took = time.time() - t0
    procs[1].send_signal(signal.SIGCONT)
    check(got == want and took < 30, f"SIGSTOPped worker mid-stream: replayed after the deadline ({took:.1f}s)")
    deadline = time.time() + 30
    while time.time() < deadline and metric(port, "ring_workers_missing") != 0:
        time.sleep(0.2)
    check(metric(port, "ring_workers_missing") == 0, "continued worker rejoins the ring")

    # Metrics: well-formed for Prometheus (promtool), and a real Prometheus server scraping
    # this ring answers a PromQL query about tokens this test generated.
    _, _, scraped = raw(port, "GET", "/metrics")
    check(b'ring_stage_activation_rms{stage="1"}' in scraped and b'ring_stage_activation_absmax{stage="0"}' in scraped,
          "per-stage activation fingerprints are exported")
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "metrics"], input=scraped, capture_output=True, timeout=30)
        check(r.returncode == 0, f"promtool check metrics on scraped output {r.stdout[-300:]!r}{r.stderr[-300:]!r}")
    if shutil.which("prometheus"):
        psock = socket.socket()
        psock.bind(("127.0.0.1", 0))
        pport = psock.getsockname()[1]
        psock.close()
        pdir = os.path.join(a.work, "prometheus")
        os.makedirs(pdir, exist_ok=True)
        with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
            f.write(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ringserve\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        prom = subprocess.Popen(["prometheus", f"--config.file={pdir}/prometheus.yml",
                                 f"--storage.tsdb.path={pdir}/data", f"--web.listen-address=127.0.0.1:{pport}"],
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(pdir, "log"), "w"))
        value = None
        try:
            deadline = time.time() + 60
            while time.time() < deadline and value is None:
                time.sleep(0.5)
                try:
                    st, _, body = ringproc.raw(pport, "GET",
                                               "/api/v1/query?query=sum(ring_generated_tokens_total)", timeout=2)
                    res = json.loads(body).get("data", {}).get("result", [])
                    if st == 200 and res and float(res[0]["value"][1]) > 0:
                        value = float(res[0]["value"][1])
                except (OSError, ValueError):
                    pass
        finally:
            prom.kill()
            prom.wait(10)
        check(value is not None and value >= c.usage.completion_tokens,
              f"Prometheus scraped the ring: sum(ring_generated_tokens_total) = {value}")

    # No ring within the failover timeout: the stream ends with an error event naming the
    # stage (a second server over one worker, failover_timeout_s = 2).
    pw, waddr = ringproc.start_worker(a, os.path.dirname(model_dir), os.path.join(a.work, "lone_worker.log"))
    procs.append(pw)
    cfg2 = os.path.join(a.work, "ring2.toml")
    with open(cfg2, "w") as f:
        f.write(f'[server]\nlisten = "127.0.0.1:0"\nadmin_listen = "off"\napi_keys = ["{KEY}"]\n'
                f'[model]\nname = "tiny-glm"\npath = "tiny-glm"\nlocal_dir = "{model_dir}"\n'
                f'[ring]\nworkers = ["{waddr}"]\nstep_timeout_s = 5\nfailover_timeout_s = 2\n')
    s2, url2 = start([a.server, "--config", cfg2], os.path.join(a.work, "server2.log"), r"listening on (http://\S+)")
    procs.append(s2)
    port2 = int(url2.rsplit(":", 1)[1])
    check(wait_ready(port2), "second server ready")
    c2 = openai.OpenAI(base_url=f"http://127.0.0.1:{port2}/v1", api_key=KEY, max_retries=0, timeout=60)
    err, k = None, 0
    t0 = time.time()
    try:
        for _ in c2.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True}):
            k += 1
            if k == 3:
                pw.kill()
                pw.wait(10)
    except openai.APIError as e:
        err = str(e)
    check(err is not None and "stage 0" in err and time.time() - t0 < 30,
          f"no ring within failover_timeout_s: the stream ends with an error event naming the stage ({err})")
    st, _, body = raw(port2, "GET", "/ready")
    check(st == 503 and b"not ready" in body, f"/ready is 503 without a ring ({body[:100]!r})")
    s2.send_signal(signal.SIGTERM)

    # Graceful shutdown: an in-flight stream finishes, then the process exits 0.
    s = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=200, temperature=1.0,
                                  seed=4, stream=True)
    finish, chunks, broken = None, 0, None
    try:
        for ch in s:
            if chunks == 0:
                server.send_signal(signal.SIGTERM)
            chunks += 1
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
    except openai.APIError as e:  # a cut stream: say how far it got and what the server said
        broken = f"{type(e).__name__} after {chunks} chunks: {e}"
        with open(os.path.join(a.work, "server.log"), errors="replace") as f:
            broken += " | server log tail: " + " / ".join(f.read().splitlines()[-6:])
    check(finish in ("length", "stop") and broken is None,
          f"SIGTERM lets an in-flight stream finish ({chunks} chunks{', ' + broken if broken else ''})")
    try:
        rc = server.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"server exits 0 after draining (rc={rc})")


if __name__ == "__main__":
    sys.exit(main())
