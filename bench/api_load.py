#!/usr/bin/env python3
"""Bounded load test of ring-server on loopback: N concurrent streaming clients for T seconds.

Starts ring-workers + ring-server over the tiny synthetic model (or uses --port of a server
already running), then each client loops: stream a chat completion, record time to first
token (TTFT) and the gaps between tokens (inter-token latency, ITL). Prints requests/s,
tokens/s, TTFT and ITL p50/p99, errors, and checks that no sequence is left on the ring
afterwards (ring_sequences_live == 0). Exit 1 on any error or leak.

  .venv/bin/python bench/api_load.py --build build --clients 8 --seconds 20
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import openai  # noqa: E402
import ringproc  # noqa: E402

KEY = "sk-ringserve-bench"


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/ringserve_api_load")
    ap.add_argument("--workers", type=int, default=2, help="ring-worker processes (0: stages in-process)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-concurrent", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    root = os.path.join(a.work, "models")
    model_dir = os.path.join(root, "tiny-glm")
    ringctl = os.path.join(a.build, "server", "ringctl")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        subprocess.run([ringctl, "synth", "--arch", "glm_moe_dsa", "--preset", "tiny", "--quant", "mxfp4",
                        "--seed", "1", "--out", model_dir], check=True, timeout=120)
    procs = []
    try:
        addrs = []
        for i in range(a.workers):
            p, addr = ringproc.start([os.path.join(a.build, "worker", "ring-worker"), "--listen", "127.0.0.1:0",
                                      "--model-root", root], os.path.join(a.work, f"w{i}.log"), r"listening on (\S+)")
            procs.append(p)
            addrs.append(addr)
        cfg = os.path.join(a.work, "ring.toml")
        with open(cfg, "w") as f:
            f.write(f'[server]\nlisten = "127.0.0.1:0"\napi_keys = ["{KEY}"]\n'
                    f'max_concurrent_requests = {a.max_concurrent}\n'
                    f'[model]\nname = "tiny-glm"\npath = "{"tiny-glm" if addrs else model_dir}"\n'
                    f'local_dir = "{model_dir}"\n[ring]\nworkers = {json.dumps(addrs)}\n')
        server, url = ringproc.start([os.path.join(a.build, "server", "ring-server"), "--config", cfg],
                                     os.path.join(a.work, "server.log"), r"listening on (http://\S+)")
        procs.append(server)
        port = int(url.rsplit(":", 1)[1])
        if not ringproc.wait_ready(port, 60):
            raise SystemExit("server not ready")
        return run(a, port)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def run(a, port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=60)
    ttft, itl, errors = [], [], []
    done = [0]
    tokens = [0]
    lock = threading.Lock()
    stop_at = time.time() + a.seconds

    def worker(i):
        k = 0
        while time.time() < stop_at:
            k += 1
            try:
                t0 = time.perf_counter()
                last = None
                mine_itl, first, n = [], None, 0
                s = client.chat.completions.create(
                    model="tiny-glm", stream=True, max_tokens=a.max_tokens, temperature=1.0, seed=i * 100000 + k,
                    messages=[{"role": "user", "content": f"client {i} request {k}: tell me about rings"}],
                    stream_options={"include_usage": True})
                for ch in s:
                    now = time.perf_counter()
                    if ch.choices and (ch.choices[0].delta.content or
                                       getattr(ch.choices[0].delta, "reasoning_content", None)):
                        if first is None:
                            first = now - t0
                        elif last is not None:
                            mine_itl.append(now - last)
                        last = now
                    if ch.usage:
                        n = ch.usage.completion_tokens
                with lock:
                    if first is not None:
                        ttft.append(first)
                    itl.extend(mine_itl)
                    done[0] += 1
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e)[:200])

    t_start = time.time()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(a.seconds + 120)
    elapsed = time.time() - t_start
    deadline = time.time() + 10
    live = None
    while time.time() < deadline:
        live = ringproc.metric(port, "ring_sequences_live", key=KEY)
        if live == 0:
            break
        time.sleep(0.1)
    print(f"clients={a.clients} seconds={elapsed:.1f} max_tokens={a.max_tokens} workers={a.workers}")
    print(f"requests={done[0]} requests/s={done[0] / elapsed:.2f} completion tokens/s={tokens[0] / elapsed:.1f}")
    print(f"TTFT p50={pct(ttft, 50) * 1e3:.1f} ms p99={pct(ttft, 99) * 1e3:.1f} ms")
    print(f"ITL  p50={pct(itl, 50) * 1e3:.2f} ms p99={pct(itl, 99) * 1e3:.2f} ms")
    print(f"errors={len(errors)} sequences_live_after={live}")
    for e in errors[:5]:
        print("  error:", e)
    return 0 if not errors and live == 0 and done[0] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
