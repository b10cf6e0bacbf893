#!/usr/bin/env python3
"""Operations end to end: the commands of docs/operations.md against a local ring.

Starts two ring-worker processes the way docs/operations.md brings a ring up (shared ring
token made with the documented command, --auth-token-file, --metrics-listen) and
ring-server on loopback (CPU backend, API key from $RINGSERVE_API_KEY) over a tiny
synthetic GLM-5.2-style checkpoint, then checks: each worker's /metrics passes `promtool
check metrics` and its counters move after a request (tokens, frames, bytes, step
histograms, KV cache used / budget / free, activation fingerprints, epoch), the documented
`curl ... | grep` of a worker's metrics, the coordinator's ring_worker_up gauge and the
closed ring's step metrics (ring_closed_step_seconds, ring_stage_compute_seconds,
ring_closed_transport_seconds; the star topology's per-hop metrics are in
closed_ring_test.py), `ringctl plan` with the
documented flags, `ringctl describe`, `ringctl status` (table, --json, exit codes, KV
used/budget), `ringctl apply` (dry run, a split, a bad split, --config ring.toml) and
`ringctl rebalance` while a stream runs (the stream is identical to an undisturbed one),
and the bash/zsh completion scripts generated from the CLI (syntax and real completion in
each shell). A second ring checks the admission gate and a worker's KV cache budget
(--kv-cache-bytes: a request that does not fit gets a 429 naming the worker, the worker
keeps serving). A third ring checks a worker that joins by itself (`ring-worker --join`):
it registers with the ring token, serves in the ring, and on SIGTERM leaves it while a
stream is in flight, which replays without an error. Every wait has a deadline; no check
depends on how fast the machine is.
"""
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import time

import openai

import ringproc
from ringproc import start, wait_ready

KEY = "sk-ringserve-ops-key"
check = ringproc.check


def scrape(addr):
    """Text of http://addr/metrics ("" when it does not answer)."""
    host, port = addr.rsplit(":", 1)
    try:
        st, _, body = ringproc.raw(int(port), "GET", "/metrics", timeout=5)
    except OSError:
        return ""
    return body.decode() if st == 200 else ""


def samples(text, name):
    """{labels string: value} of every sample of metric `name` in a Prometheus text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def total(text, name, **labels):
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples(text, name).items() if all(w in k for w in want))


def promtool_ok(text, what):
    if not shutil.which("promtool"):
        print(f"skip promtool check of {what}: promtool not installed")
        return
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    check(r.returncode == 0, f"promtool check metrics on {what} {r.stdout[-300:]!r}{r.stderr[-300:]!r}")


def main():
    a, root, model_dir = ringproc.setup_tiny_ring_test()
    procs = []
    # docs/operations.md "Install": the shared ring token, made with the documented command.
    token = os.path.join(a.work, "ring.token")
    r = subprocess.run(["bash", "-c", f"head -c 32 /dev/urandom | base64 > {token} && chmod 600 {token}"],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and os.stat(token).st_mode & 0o777 == 0o600 and len(open(token).read().strip()) == 44,
          f"the documented token command makes a 0600 token file ({r.stderr.strip()})")
    try:
        workers, metrics = [], []
        # --metrics-listen in its documented forms HOST:PORT and :PORT.
        for i, mlisten in enumerate(["127.0.0.1:0", ":0"]):
            p, line = start([a.worker, "--listen", "127.0.0.1:0", "--model-root", root, "--auth-token-file", token,
                             "--metrics-listen", mlisten],
                            os.path.join(a.work, f"worker{i}.log"), r"listening on (.*)")
            procs.append(p)
            m = re.match(r"(\S+) \(metrics http://(\S+)/metrics\)", line)
            check(m is not None, f"ring-worker prints its metrics address ({line!r})")
            if m is None:
                return 1
            workers.append(m.group(1))
            metrics.append(m.group(2))
        admin = ringproc.free_address()
        cfg = os.path.join(a.work, "ring.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "{admin}"
api_key_env = "RINGSERVE_API_KEY"
max_concurrent_requests = 2
[model]
name = "tiny-glm"
path = "tiny-glm"
local_dir = "{model_dir}"
act_dtype = "f32"
[ring]
workers = {json.dumps(workers)}
split = [3, 1]
step_timeout_s = 10
auth_token_file = "{token}"
""")
        # As documented: RINGSERVE_API_KEY=... ring-server --config ring.toml
        server, url = start([a.server, "--config", cfg], os.path.join(a.work, "server.log"),
                            r"listening on (http://\S+)", env=dict(os.environ, RINGSERVE_API_KEY=KEY))
        procs.append(server)
        port = int(url.rsplit(":", 1)[1])
        check(wait_ready(port), "/ready turns 200 once the ring is formed")
        log = open(os.path.join(a.work, "server.log")).read()
        check(f"ring-server: ring formed: [stage 0 ({workers[0]}) layers 0..3) [stage 1 ({workers[1]}) layers 3..4)"
              in log, "the server log lists the stages as documented")
        run_tests(a, port, admin, workers, metrics, model_dir, root, procs, token)
        server.kill()
        admission_test(a, root, model_dir, procs)
        not_ready_test(a, model_dir, procs)
        join_test(a, root, model_dir, procs, token)
    finally:
        ringproc.kill_all(procs)
    return ringproc.report("operations")


def run_tests(a, port, admin, workers, metrics, model_dir, root, procs, token):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    prompt_ids = [11, 22, 33, 44, 55, 66, 77, 88, 99, 100]

    def ctl(*args, timeout=120):
        return subprocess.run([a.ringctl, *args, "--server", admin, "--api-key", KEY],
                              capture_output=True, text=True, timeout=timeout)

    def status():
        r = ctl("status", "--json", timeout=30)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {"error": r.stderr}

    def layers():
        # proto3 JSON writes int64 as strings.
        return [(int(w.get("layerBegin", 0)), int(w.get("layerEnd", 0))) for w in status().get("workers", [])]

    def stream(seed, during=None):
        s = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=200, temperature=1.0,
                                      seed=seed, stream=True, extra_body={"ignore_eos": True})
        out, k, result = [], 0, {}
        for ch in s:
            if ch.choices:
                out.append(ch.choices[0].text)
            k += 1
            if k == 5 and during:
                result["during"] = during()
        return "".join(out), result.get("during")

    # --- Worker metrics: well-formed, and moved by a request. ---
    before = [scrape(m) for m in metrics]
    check(all(before), f"both workers serve /metrics ({metrics})")
    for i, text in enumerate(before):
        promtool_ok(text, f"worker {i} /metrics")
    check('ring_worker_stage_layers{model="tiny-glm",stage="0"} 3' in before[0] and
          'ring_worker_stage_layers{model="tiny-glm",stage="1"} 1' in before[1],
          "ring_worker_stage_layers: the configured split 3,1")
    check(all(total(t, "ring_worker_epoch") >= 1 for t in before), "ring_worker_epoch is set once a stage is loaded")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    greedy = r.choices[0].text
    after = [scrape(m) for m in metrics]
    for i in range(2):
        b, t = before[i], after[i]
        check(total(t, "ring_worker_tokens_total", phase="prefill") - total(b, "ring_worker_tokens_total", phase="prefill")
              >= len(prompt_ids), f"worker {i}: prefill tokens counted")
        check(total(t, "ring_worker_tokens_total", phase="decode") - total(b, "ring_worker_tokens_total", phase="decode")
              >= 7, f"worker {i}: decode tokens counted")
        check(total(t, "ring_worker_step_seconds_count", phase="decode") >
              total(b, "ring_worker_step_seconds_count", phase="decode"), f"worker {i}: decode step histogram moved")
        check(total(t, "ring_worker_frames_total", direction="received") >=
              total(b, "ring_worker_frames_total", direction="received") + 8,
              f"worker {i}: frames received from the previous stage counted")
        check(total(t, "ring_worker_frame_bytes_total", direction="sent") >
              total(b, "ring_worker_frame_bytes_total", direction="sent"), f"worker {i}: bytes sent counted")
        check(total(t, "ring_worker_activation_rms", stage=str(i)) > 0 and
              total(t, "ring_worker_activation_absmax", stage=str(i)) > 0, f"worker {i}: activation fingerprint exported")
        check(total(t, "ring_worker_memory_free_bytes") > 0, f"worker {i}: free memory exported")
        check(total(t, "ring_worker_kv_cache_budget_bytes") > 0,
              f"worker {i}: KV cache budget derived at stage load and exported")
        promtool_ok(t, f"worker {i} /metrics after a request")
    # The finished request released its sequence: KV back to zero on every worker.
    deadline = time.time() + 30
    while time.time() < deadline and any(total(scrape(m), "ring_worker_sequences_live") != 0 for m in metrics):
        time.sleep(0.2)
    check(all(total(scrape(m), "ring_worker_sequences_live") == 0 and total(scrape(m), "ring_worker_kv_cache_bytes") == 0
              for m in metrics), "KV cache and live sequences back to 0 after Release")
    idle = [scrape(m) for m in metrics]
    check(all(total(t, "ring_worker_kv_cache_free_bytes") == total(t, "ring_worker_kv_cache_budget_bytes") > 0
              for t in idle), "ring_worker_kv_cache_free_bytes is the whole budget when no sequence is live")
    # docs/operations.md "Metrics": look at one worker by hand.
    r = subprocess.run(["bash", "-c", f"curl -s http://{metrics[0]}/metrics | "
                        "grep -E '^ring_worker_(kv_cache_bytes|tokens_total|epoch)\\b'"],
                       capture_output=True, text=True, timeout=30)
    names = {re.match(r"^(\w+)", line).group(1) for line in r.stdout.splitlines()}
    check(r.returncode == 0 and names == {"ring_worker_kv_cache_bytes", "ring_worker_tokens_total", "ring_worker_epoch"},
          f"the documented curl | grep of a worker's metrics ({names}, {r.stderr.strip()})")
    # KV in use while a stream holds its sequence.
    seen = {}

    def kv_during():
        texts = [scrape(m) for m in metrics]
        seen["kv"] = [total(t, "ring_worker_kv_cache_bytes") for t in texts]
        seen["kv_free"] = [total(t, "ring_worker_kv_cache_free_bytes") < total(t, "ring_worker_kv_cache_budget_bytes")
                           for t in texts]
        seen["status"] = status()
        r = ctl("status", timeout=30)
        seen["table"], seen["table_rc"] = r.stdout, r.returncode
    stream(5, kv_during)
    check(all(v > 0 for v in seen.get("kv", [0])), f"ring_worker_kv_cache_bytes > 0 while a sequence is live ({seen.get('kv')})")
    check(seen.get("kv_free") == [True, True], "ring_worker_kv_cache_free_bytes below the budget while a sequence is live")
    ws = seen.get("status", {}).get("workers", [])
    check(len(ws) == 2 and all(w.get("tokensPerSecond", 0) > 0 for w in ws),
          f"ringctl status: tokens/s per worker while a stream runs ({[w.get('tokensPerSecond') for w in ws]})")
    check([w.get("metricsAddress") for w in ws] == metrics, "ringctl status: each worker's metrics address")
    check("TOK/S" in seen.get("table", ""), "ringctl status table has a TOK/S column")
    check(seen.get("table_rc") == 0 and seen.get("table", "").startswith("ring ready"),
          "ringctl status exits 0 when the ring is ready")
    check(all(int(w.get("cacheBytes", 0)) > 0 and int(w.get("kvCacheBudgetBytes", 0)) > int(w.get("cacheBytes", 0))
              for w in ws), f"ringctl status --json: KV used and budget per worker "
          f"({[(w.get('cacheBytes'), w.get('kvCacheBudgetBytes')) for w in ws]})")
    rows = [line for line in seen.get("table", "").splitlines() if line.startswith(tuple(workers))]
    check("KV USED/BUDGET" in seen.get("table", "") and len(rows) == 2 and
          all(re.search(r" \d+(\.\d+)? [KMGT]?i?B/\d+(\.\d+)? [KMGT]?i?B ", row) for row in rows),
          f"ringctl status table shows KV used/budget per worker ({rows})")
    arch = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(os.uname().machine, os.uname().machine)
    check(all(w.get("arch") == arch for w in ws) and "DEVICE" in seen.get("table", "") and
          all(f"cpu {arch}" in row for row in rows) and "MEM USED/FREE" in seen.get("table", ""),
          f"ringctl status: device and arch per worker, memory used/free ({[w.get('arch') for w in ws]}, {rows})")

    # --- ringctl plan and describe with the documented flags (the workers want the token). ---
    r = subprocess.run([a.ringctl, "plan", "--workers", ",".join(workers), "--model", "tiny-glm", "--context", "8192",
                        "--sequences", "8", "--auth-token-file", token], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and all(w in r.stdout for w in workers),
          f"ringctl plan --context --sequences --auth-token-file ({r.stdout.strip()[-200:]} {r.stderr.strip()[-200:]})")
    r = subprocess.run([a.ringctl, "plan", "--workers", ",".join(workers), "--model", "tiny-glm"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "token" in r.stderr, f"ringctl plan without the ring token is refused ({r.stderr.strip()[-200:]})")
    r = subprocess.run([a.ringctl, "describe", "--worker", workers[1], "--auth-token-file", token],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and "layers [3, 4)" in r.stdout and re.search(r"kv cache +\S+ \S*B used of \S+ \S*B budget \(\S+ \S*B free\)", r.stdout)
          and "health     ok" in r.stdout, f"ringctl describe --worker --auth-token-file ({r.stdout.strip()} {r.stderr.strip()})")

    # --- Coordinator: ring_worker_up and the formation / failover metrics. ---
    deadline = time.time() + 30
    up = {}
    while time.time() < deadline:
        text = ringproc.raw(port, "GET", "/metrics", key=KEY)[2].decode()
        up = samples(text, "ring_worker_up")
        if len(up) == 2 and all(v == 1 for v in up.values()):
            break
        time.sleep(0.3)
    check(sorted(up) == sorted(f'{{worker="{w}"}}' for w in workers) and all(v == 1 for v in up.values()),
          f"ring_worker_up{{worker}} is 1 for both workers ({up})")
    check(total(text, "ring_formation_seconds_count") >= 1 and "ring_failover_timeouts_total 0" in text,
          "ring_formation_seconds and ring_failover_timeouts_total exported")
    # The closed ring (the default topology): stage 0 reports every step's time round the
    # ring, each stage's own part of it comes back with the token, the rest is the hops.
    steps = total(text, "ring_closed_step_seconds_count")
    check(steps >= 8, f"ring_closed_step_seconds counts the steps round the ring ({steps})")
    check(all(total(text, "ring_stage_compute_seconds_count", stage=str(i)) == steps for i in range(2)),
          "ring_stage_compute_seconds{stage}: every stage's time on every step came round the ring")
    check(0 < total(text, "ring_closed_transport_seconds_sum") <= total(text, "ring_closed_step_seconds_sum"),
          "ring_closed_transport_seconds: the hops' part of the steps, never more than the steps")
    check(total(text, "ring_stage_activation_rms", stage="1") > 0,
          "per-stage activation fingerprints come round the closed ring to the coordinator")
    promtool_ok(text, "ring-server /metrics")

    # --- ringctl apply. ---
    r = ctl("apply", "--split", "1,3", "--dry-run", "--json")
    try:
        plan = json.loads(r.stdout)
    except ValueError:
        plan = {}
    check(r.returncode == 0 and plan.get("changed") is True and [int(x) for x in plan.get("split", [])] == [1, 3],
          f"ringctl apply --dry-run: the layout checks out, would change ({r.stderr.strip()})")
    check(layers() == [(0, 3), (3, 4)], "apply --dry-run moved nothing")
    epochs0 = total(scrape(metrics[0]), "ring_worker_epoch_changes_total")
    r = ctl("apply", "--split", "1,3")
    check(r.returncode == 0 and "ring ready" in r.stdout, f"ringctl apply --split 1,3 ({r.stdout.strip()[-200:]} {r.stderr.strip()})")
    check(layers() == [(0, 1), (1, 4)], f"after apply the ring holds layers 0..1 and 1..4 ({layers()})")
    m0 = scrape(metrics[0])
    check('ring_worker_stage_layers{model="tiny-glm",stage="0"} 1' in m0 and
          total(m0, "ring_worker_epoch_changes_total") > epochs0, "worker 0 metrics: 1 layer, epoch changed")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(r.choices[0].text == greedy, "greedy output unchanged on the applied split")
    r = ctl("apply", "--split", "1,3")
    check(r.returncode == 0 and "nothing moved" in r.stdout, "apply of the current layout moves nothing")
    r = ctl("apply", "--split", "2,3")
    check(r.returncode == 1 and "does not sum to 4" in r.stderr, f"apply of a split with the wrong layer count is refused ({r.stderr.strip()})")
    r = ctl("apply", "--split", "1,1,2")
    check(r.returncode == 1 and layers() == [(0, 1), (1, 4)], f"apply of a split for 3 workers on 2 is refused ({r.stderr.strip()})")
    r = ctl("apply", "--workers", f"{workers[0]},127.0.0.1:1", "--split", "2,2")
    check(r.returncode == 1 and "127.0.0.1:1" in r.stderr and layers() == [(0, 1), (1, 4)],
          f"apply naming a worker that does not answer is refused, ring untouched ({r.stderr.strip()[-160:]})")
    r = ctl("apply", "--workers", f"{workers[1]},{workers[0]}", "--split", "2,2")
    order = [w.get("address") for w in status().get("workers", [])]
    check(r.returncode == 0 and order == [workers[1], workers[0]] and layers() == [(0, 2), (2, 4)],
          f"ringctl apply --workers: the ring in the new order ({order}, {r.stderr.strip()})")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(r.choices[0].text == greedy, "greedy output unchanged in the new worker order")
    cfg2 = os.path.join(a.work, "ring-2-2.toml")
    with open(cfg2, "w") as f:
        f.write(f'[server]\nlisten = "127.0.0.1:0"\n[model]\nname = "tiny-glm"\npath = "tiny-glm"\n'
                f'[ring]\nworkers = {json.dumps(workers)}\nsplit = [2, 2]\n')
    r = ctl("apply", "--config", cfg2)
    check(r.returncode == 0 and layers() == [(0, 2), (2, 4)], f"ringctl apply --config ring.toml: split 2,2 ({r.stderr.strip()})")

    # --- ringctl rebalance: mid-stream, nothing fails and the stream is the undisturbed one. ---
    r = ctl("rebalance", "--dry-run", "--json")
    try:
        plan = json.loads(r.stdout)
    except ValueError:
        plan = {}
    check(r.returncode == 0 and sum(int(x) for x in plan.get("split", [])) == 4 and plan.get("plan"),
          f"ringctl rebalance --dry-run prints a plan of the 4 layers ({r.stderr.strip()})")
    check(ctl("apply", "--split", "1,3").returncode == 0, "back to split 1,3 before the rebalance")
    want, _ = stream(77)
    got, reb = stream(77, lambda: ctl("rebalance", "--json"))
    try:
        moved = json.loads(reb.stdout) if reb is not None else {}
    except ValueError:
        moved = {}
    check(reb is not None and reb.returncode == 0, f"ringctl rebalance mid-stream ({reb.stderr.strip() if reb else ''})")
    check(got == want, f"rebalance mid-stream: the stream is identical to an undisturbed one (moved: {moved.get('changed')})")
    split = [int(x) for x in moved.get("split", [])]
    begins = [sum(split[:i]) for i in range(len(split))]
    check(layers() == [(b, b + n) for b, n in zip(begins, split)], f"the ring holds the rebalanced split {split} ({layers()})")

    # --- A worker's last error: another client (ringctl logits) reloads worker 0 behind the
    # coordinator's back, so the ring's next step there fails on the epoch; the request
    # replays on a re-formed ring and `ringctl status` shows what failed on that worker.
    r = subprocess.run([a.ringctl, "logits", "--workers", workers[0], "--model", "tiny-glm", "--tokens", "1,2,3",
                        "--auth-token-file", token, "--out", os.path.join(a.work, "logits.npy")],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"ringctl logits on worker 0 alone ({r.stderr.strip()[-200:]})")
    r = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(r.choices[0].text == greedy, "the request whose stage was reloaded replays: same greedy output")
    w0 = [w for w in status().get("workers", []) if w.get("address") == workers[0]]
    err = w0[0].get("lastError", "") if w0 else ""
    check("epoch" in err and int(w0[0].get("lastErrorUnixSeconds", 0)) > 0,
          f"ringctl status --json: worker 0's last error names the epoch mismatch ({err!r})")
    table = ctl("status", timeout=30).stdout
    check("last error" in table and "epoch" in table, "ringctl status table shows the last error under the worker")

    # --- Shell completion, generated from the CLI. ---
    r = subprocess.run([a.ringctl, "completion", "bash"], capture_output=True, text=True, timeout=30)
    script = os.path.join(a.work, "ringctl.bash")
    with open(script, "w") as f:
        f.write(r.stdout)

    def complete(*words):
        probe = (f'source {script}; COMP_WORDS=({" ".join(repr(w) for w in words)}); '
                 f'COMP_CWORD={len(words) - 1}; _ringctl; echo "${{COMPREPLY[*]}}"')
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30).stdout.split()
    check(r.returncode == 0 and "complete -o default -F _ringctl ringctl" in r.stdout, "ringctl completion bash")
    b = subprocess.run(["bash", "-n", script], capture_output=True, text=True, timeout=30)
    check(b.returncode == 0, f"bash -n parses the completion script ({b.stderr[-200:]})")
    b = subprocess.run(["bash", "-c", f"source {script} && complete -p ringctl"], capture_output=True, text=True,
                       timeout=30)
    check(b.returncode == 0 and b.stdout.strip() == "complete -o default -F _ringctl ringctl",
          f"bash: sourcing the script registers the completion ({b.stdout.strip()!r} {b.stderr[-200:]})")
    check(complete("ringctl", "reb") == ["rebalance"], f"bash completes a subcommand ({complete('ringctl', 'reb')})")
    subs = complete("ringctl", "")
    check({"apply", "rebalance", "status", "drain", "completion", "logits", "plan"} <= set(subs),
          f"bash completion lists every subcommand ({subs})")
    check(complete("ringctl", "apply", "--sp") == ["--split"], "bash completes a subcommand's option")
    check("--dry-run" in complete("ringctl", "rebalance", "--"), "bash completes rebalance's options")
    check(script in complete("ringctl", "apply", "--config", os.path.join(a.work, "ringctl.b")),
          "bash completes a file after an option that takes a value")
    r = subprocess.run([a.ringctl, "completion", "zsh"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and r.stdout.startswith("#compdef ringctl") and "'rebalance:" in r.stdout and
          "'--split[" in r.stdout, "ringctl completion zsh")
    zscript = os.path.join(a.work, "_ringctl")
    with open(zscript, "w") as f:
        f.write(r.stdout)
    # deploy/install_deps.sh installs zsh: its absence is a failure here, not a skip.
    check(shutil.which("zsh") is not None, "zsh is installed (deploy/install_deps.sh)")
    if shutil.which("zsh"):
        z = subprocess.run(["zsh", "-n", zscript], capture_output=True, text=True, timeout=30)
        check(z.returncode == 0, f"zsh -n parses the completion script ({z.stderr[-200:]})")
        z = subprocess.run(["zsh", "-fc", f"autoload -U compinit && compinit -u -D && source {zscript} && "
                            "print -r -- $_comps[ringctl]"], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, HOME=a.work))
        check(z.returncode == 0 and z.stdout.strip() == "_ringctl",
              f"zsh: sourcing the script registers _ringctl for ringctl ({z.stdout.strip()!r} {z.stderr[-200:]})")
        got = zsh_complete(zscript, a.work, ["ringctl reb"])
        check(got == ["ringctl rebalance"], f"zsh completes a subcommand ({got})")
        got = zsh_complete(zscript, a.work, ["ringctl apply --sp", "ringctl rebalance --dry"])
        check(got == ["ringctl apply --split", "ringctl rebalance --dry-run"],
              f"zsh completes a subcommand's options ({got})")
    r = subprocess.run([a.ringctl, "completion", "fish"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2, "ringctl completion fish is a usage error")


def zsh_complete(script, home, lines, timeout=60):
    """What an interactive zsh (in a pseudo-terminal, compinit + the completion script)
    makes of each of `lines` after a TAB: the command line as zle holds it, read back by
    moving to its start and turning it into a `print`. None for a line that got no answer
    before the deadline."""
    pid, fd = pty.fork()
    if pid == 0:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TERM": "dumb", "PS1": "> "}
        os.execvpe("zsh", ["zsh", "-f", "-i"], env)
    out = bytearray()
    deadline = time.time() + timeout

    def wait_for(pattern, since):
        while time.time() < deadline:
            m = re.search(pattern, out[since:].decode(errors="replace"))
            if m:
                return m
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    out.extend(os.read(fd, 4096))
                except OSError:
                    return None
        return None

    got = []
    try:
        # $((6*7)): the marker appears only once the line ran, not in its echo.
        os.write(fd, f"autoload -U compinit && compinit -u -D && source {script} && print READY-$((6*7))\n".encode())
        if wait_for(r"READY-42", 0) is None:
            return [None] * len(lines)
        for i, line in enumerate(lines):
            mark = len(out)
            os.write(fd, (line + "\t").encode())
            # The completion has happened once zle echoed past the typed text.
            wait_for(re.escape(line.split()[-1]) + r"\S", mark)
            # Ctrl-A, then make the line a print of itself, and run it.
            os.write(fd, f"\x01print -r -- LINE{i}: \n".encode())
            m = wait_for(rf"\nLINE{i}: ([^\r\n]*)", mark)
            got.append(m.group(1).strip() if m else None)
        return got
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


def stop(proc, timeout):
    """SIGTERM (systemctl stop) and the exit code, None when it did not exit in `timeout` s."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def write_ring_config(path, admin, model_dir, workers, server="", model="", ring=""):
    """A ring.toml for ring-server on loopback over the tiny model, API key KEY; `server`,
    `model` and `ring` are extra lines of those sections."""
    with open(path, "w") as f:
        f.write(f'[server]\nlisten = "127.0.0.1:0"\nadmin_listen = "{admin}"\napi_keys = ["{KEY}"]\n{server}\n'
                f'[model]\nname = "tiny-glm"\npath = "tiny-glm"\nlocal_dir = "{model_dir}"\n{model}\n'
                f'[ring]\nworkers = {json.dumps(workers)}\n{ring}\n')


KV_BUDGET = 32768  # ring-worker --kv-cache-bytes 32KiB: a few dozen tokens of the tiny model


def admission_test(a, root, model_dir, procs):
    """Admission gate through ring-server: of three workers, the one whose kernel is wrong
    (test fault switch) fails its verify, is left out, and `ringctl status` says why. The
    second worker runs with a small KV cache budget: a request too long for it is refused
    with a 429 naming it, and the ring keeps serving."""
    workers = []
    for i, fault in enumerate([None, None, "scale:layers.3.self_attn.o_proj"]):
        env = dict(os.environ, RING_TEST_FAULT=fault) if fault else None
        extra = ("--kv-cache-bytes", "32KiB") if i == 1 else ()
        p, addr = ringproc.start_worker(a, root, os.path.join(a.work, f"adm-worker{i}.log"), env=env, extra=extra)
        procs.append(p)
        workers.append(addr)
    admin = ringproc.free_address()
    cfg = os.path.join(a.work, "ring-admission.toml")
    write_ring_config(cfg, admin, model_dir, workers, ring='plan = "even"\nstep_timeout_s = 10\nadmission_prompt_len = 6')
    server, url = start([a.server, "--config", cfg], os.path.join(a.work, "server-admission.log"),
                        r"listening on (http://\S+)")
    procs.append(server)
    port = int(url.rsplit(":", 1)[1])
    check(wait_ready(port), "admission: the ring forms without the worker that failed its verify")
    r = subprocess.run([a.ringctl, "status", "--server", admin, "--api-key", KEY, "--json"],
                       capture_output=True, text=True, timeout=60)
    try:
        st = json.loads(r.stdout)
    except ValueError:
        st = {"error": r.stderr}
    by_addr = {w.get("address"): w for w in st.get("workers", [])}
    bad = by_addr.get(workers[2], {})
    check(bad.get("state") == "degraded" and "admission verify failed" in bad.get("degradedReason", "")
          and "o_proj" in bad.get("degradedReason", ""),
          f"admission: ringctl status shows the refused worker degraded with the bisection ({bad})")
    good = [by_addr.get(w, {}).get("state") for w in workers[:2]]
    check(good == ["serving", "serving"], f"admission: the two good workers serve ({good})")
    r = subprocess.run([a.ringctl, "status", "--server", admin, "--api-key", KEY],
                       capture_output=True, text=True, timeout=60)
    check("DEGRADED: " in r.stdout, f"admission: the status table prints DEGRADED ({r.stdout[-400:]})")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    c = client.completions.create(model="tiny-glm", prompt="hello", max_tokens=4, temperature=0)
    check(len(c.choices) == 1 and c.usage.completion_tokens >= 1, "admission: the degraded ring serves")

    # --- KV cache budget (ring-worker --kv-cache-bytes 32KiB on the second worker). ---
    check(int(by_addr.get(workers[1], {}).get("kvCacheBudgetBytes", 0)) == KV_BUDGET,
          f"ringctl status --json: the --kv-cache-bytes budget ({by_addr.get(workers[1], {}).get('kvCacheBudgetBytes')})")
    try:
        client.completions.create(model="tiny-glm", prompt=list(range(1, 201)), max_tokens=2, temperature=0)
        check(False, "a request too long for a worker's KV budget is refused")
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        msg = body.get("message", "")
        check(e.status_code == 429 and body.get("code") == "kv_cache_exhausted",
              f"KV budget exceeded -> 429 kv_cache_exhausted ({e.status_code}, {body})")
        check(workers[1] in msg and f"budget of {KV_BUDGET} bytes" in msg and re.search(r"needs \d+ bytes", msg),
              f"the error names the worker, the bytes needed and the budget ({msg})")
    c = client.completions.create(model="tiny-glm", prompt=[1, 2, 3], max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(c.usage.completion_tokens == 3, "after the refusal the worker serves a request that fits its budget")
    r = subprocess.run([a.ringctl, "status", "--server", admin, "--api-key", KEY, "--json"],
                       capture_output=True, text=True, timeout=60)
    try:
        w1 = {w.get("address"): w for w in json.loads(r.stdout).get("workers", [])}.get(workers[1], {})
    except ValueError:
        w1 = {}
    check(w1.get("state") == "serving" and "KV cache budget exceeded" in w1.get("lastError", ""),
          f"the refusing worker still serves; its last error is the budget ({w1.get('state')}, {w1.get('lastError')})")
    rc = stop(server, 30)
    check(rc == 0, f"ring-server exits 0 on SIGTERM (systemctl stop) (rc={rc})")


def not_ready_test(a, model_dir, procs):
    """`ringctl status` exits 3 while the ring is not ready (its only worker never answers)."""
    admin = ringproc.free_address()
    cfg = os.path.join(a.work, "ring-not-ready.toml")
    write_ring_config(cfg, admin, model_dir, ["127.0.0.1:1"])
    server, _ = start([a.server, "--config", cfg], os.path.join(a.work, "server-not-ready.log"),
                      r"listening on (http://\S+)")
    procs.append(server)
    deadline = time.time() + 30
    r = None
    while time.time() < deadline:
        r = subprocess.run([a.ringctl, "status", "--server", admin, "--api-key", KEY],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 1:  # 1: the admin service does not answer yet
            break
        time.sleep(0.2)
    check(r is not None and r.returncode == 3 and r.stdout.startswith("ring forming"),
          f"ringctl status exits 3 while the ring is not ready ({r.returncode if r else None}, "
          f"{r.stdout[:120] if r else ''})")
    server.kill()


def join_test(a, root, model_dir, procs, token):
    """docs/operations.md "Add a machine": `ring-worker --join ADMIN` registers itself with the
    coordinator (authenticated by the ring token), becomes a stage, and on SIGTERM leaves the
    ring; a stream in flight at that moment replays on the re-formed ring, unchanged."""
    p0, w0 = ringproc.start_worker(a, root, os.path.join(a.work, "join-worker0.log"),
                                   extra=("--auth-token-file", token))
    procs.append(p0)
    admin = ringproc.free_address()
    cfg = os.path.join(a.work, "ring-join.toml")
    write_ring_config(cfg, admin, model_dir, [w0], server="max_concurrent_requests = 2", model='act_dtype = "f32"',
                      ring=f'step_timeout_s = 10\nauth_token_file = "{token}"')
    slog = os.path.join(a.work, "server-join.log")
    server, url = start([a.server, "--config", cfg], slog, r"listening on (http://\S+)")
    procs.append(server)
    port = int(url.rsplit(":", 1)[1])
    check(wait_ready(port), "join: the one-worker ring forms")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    prompt_ids = [11, 22, 33, 44, 55, 66, 77, 88, 99, 100]

    def greedy():
        return client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text

    def stream(during=None):
        s = client.completions.create(model="tiny-glm", prompt=prompt_ids, max_tokens=600, temperature=1.0,
                                      seed=7, stream=True, extra_body={"ignore_eos": True})
        out = []
        for k, ch in enumerate(s):
            if ch.choices:
                out.append(ch.choices[0].text)
            if k == 5 and during:
                during()
        return "".join(out)

    def ring_workers():
        r = subprocess.run([a.ringctl, "status", "--server", admin, "--api-key", KEY, "--json"],
                           capture_output=True, text=True, timeout=30)
        try:
            return {w["address"]: w for w in json.loads(r.stdout).get("workers", [])}
        except ValueError:
            return {}

    def describe(addr):
        r = subprocess.run([a.ringctl, "describe", "--worker", addr, "--auth-token-file", token, "--json"],
                           capture_output=True, text=True, timeout=30)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {}

    want_greedy, want_stream = greedy(), stream()

    # A worker that binds every interface cannot tell the coordinator where to dial it.
    r = subprocess.run([a.worker, "--listen", "0.0.0.0:0", "--model-root", root, "--auth-token-file", token,
                        "--join", admin], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and "--advertise" in r.stderr,
          f"join: --listen 0.0.0.0 without --advertise is refused at start ({r.returncode}, {r.stderr.strip()})")

    # A coordinator that does not answer: the worker serves anyway and reports why.
    pd, wd = ringproc.start_worker(a, root, os.path.join(a.work, "join-worker-nocoord.log"),
                                   extra=("--auth-token-file", token, "--join", "127.0.0.1:1"))
    procs.append(pd)
    deadline = time.time() + 60
    d = {}
    while time.time() < deadline and not d.get("registration", {}).get("last_error"):
        d = describe(wd)
        time.sleep(0.2)
    reg = d.get("registration", {})
    check(reg.get("coordinator") == "127.0.0.1:1" and reg.get("advertise") == wd and bool(reg.get("last_error")) and
          int(reg.get("last_success_unix_seconds", 0)) == 0,
          f"join: a worker whose coordinator is down serves Describe and reports the failed Join ({reg})")
    rc = stop(pd, 60)
    check(rc == 0, f"join: SIGTERM with the coordinator down still exits 0 (rc={rc})")

    # The worker joins by itself, authenticated by the ring token.
    p1, w1 = ringproc.start_worker(a, root, os.path.join(a.work, "join-worker1.log"),
                                   extra=("--auth-token-file", token, "--join", admin))
    procs.append(p1)
    deadline = time.time() + 60
    ws = {}
    while time.time() < deadline:
        ws = ring_workers()
        if ws.get(w1, {}).get("state") == "serving" and ws.get(w0, {}).get("state") == "serving":
            break
        time.sleep(0.2)
    check(ws.get(w1, {}).get("state") == "serving" and ws.get(w1, {}).get("stageIndex") == 1,
          f"join: ringctl status shows the joined worker serving as stage 1 ({ws.get(w1)})")
    check(f"worker {w1} joined by itself (ring-worker --join)" in open(slog).read(),
          "join: the server log says the worker joined by itself")
    reg = describe(w1).get("registration", {})
    check(reg.get("coordinator") == admin and reg.get("advertise") == w1 and int(reg.get("last_success_unix_seconds", 0)) > 0
          and not reg.get("last_error"), f"join: ringctl describe shows the registration ({reg})")
    r = subprocess.run([a.ringctl, "describe", "--worker", w1, "--auth-token-file", token],
                       capture_output=True, text=True, timeout=30)
    check(f"joins      {admin} as {w1}: registered" in r.stdout, f"join: the describe table ({r.stdout[-300:]})")
    check(greedy() == want_greedy, "join: the two-stage ring gives the same greedy output")

    # SIGTERM mid-stream: the worker leaves, the stream replays on the one-worker ring.
    replays0 = metric_value(port, "ring_requests_replayed_total")
    failed0 = metric_value(port, "ring_requests_failed_total")
    try:
        got = stream(lambda: p1.send_signal(signal.SIGTERM))
    except openai.APIError as e:
        got = f"error: {e}"
    check(got == want_stream, "join: SIGTERM of the joined worker mid-stream: no error, stream identical")
    try:
        rc = p1.wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"join: the worker exits 0 after leaving (rc={rc})")
    check(metric_value(port, "ring_requests_failed_total") == failed0,
          "join: no request failed while the worker left")
    # The stream was in flight when the ring re-formed without the worker (its stage moved).
    check(metric_value(port, "ring_requests_replayed_total") > replays0, "join: the stream in flight was replayed")
    deadline = time.time() + 60
    while time.time() < deadline:
        ws = ring_workers()
        if list(ws) == [w0] and ws[w0].get("state") == "serving":
            break
        time.sleep(0.2)
    check(list(ws) == [w0], f"join: after SIGTERM ringctl status no longer lists the worker ({list(ws)})")
    check(f"worker {w1} left by itself" in open(slog).read(), "join: the server log says the worker left by itself")
    check(f"ring-worker: left the ring of coordinator {admin}" in open(os.path.join(a.work, "join-worker1.log")).read(),
          "join: the worker logs its Leave")
    check(greedy() == want_greedy, "join: the ring serves again on its own worker")
    server.kill()


def metric_value(port, name):
    return ringproc.metric(port, name, key=KEY) or 0


if __name__ == "__main__":
    raise SystemExit(main())
