#!/usr/bin/env python3
"""The closed ring (ring.topology = "closed"), end to end with real processes on loopback.

Each stage pushes its output straight to the next worker (Worker.Relay), the last stage
samples and sends the token to stage 0, which starts the next step itself; ring-server
only listens (Worker.Generate). Checks:
  - 1, 2, 3 and 4 stages of tiny GLM-5.2-style (a boundary right before the shared-indexer
    layer included) and Qwen3-MoE checkpoints generate exactly what the in-process engine
    generates: greedy, and seeded sampling with penalties, top-k/top-p and logprobs (token
    ids and log-probabilities equal);
  - the star topology (coordinator drives each step) gives the same as the closed one;
  - faults inside the ring reach the client naming the stage: a corrupted frame between
    two workers (checksum, counted by the receiving worker), NaN produced by a stage, a
    stalled stage (SIGSTOP: the step deadline fires at stage 0, the error and the worker
    flight recorders name the stalled worker, and the request replays on the survivors
    with the identical stream).
Every wait has a deadline; CTest bounds the whole script.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

import ringproc
from ringproc import check, start, wait_ready


def post(port, body, timeout=60):
    status, _, data = ringproc.raw(port, "POST", "/v1/completions", body=json.dumps(body).encode(), timeout=timeout)
    return status, json.loads(data)


def completion(port, prompt, **kw):
    body = {"model": "m", "prompt": prompt, "max_tokens": 12, "ignore_eos": True, "logprobs": 3, **kw}
    status, d = post(port, body)
    if status != 200:
        return status, d
    lp = d["choices"][0]["logprobs"]
    # Token text + logprob + alternatives: equal only if the same ids came out.
    return status, (d["choices"][0]["text"], lp["token_logprobs"], lp["top_logprobs"])


def start_server(a, work, name, model_dir, model_path, workers=None, split=None, topology="closed", extra="",
                 act="auto"):
    cfg = os.path.join(work, f"{name}.toml")
    ring = ""
    if workers:
        ring = f'workers = {json.dumps(workers)}\nplan = "even"\ntopology = "{topology}"\nstep_timeout_s = 4\n'
        if split:
            ring += f"split = {json.dumps(split)}\n"
    with open(cfg, "w") as f:
        f.write(f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "off"
auth = "disabled"
max_concurrent_requests = 4
[model]
name = "m"
path = "{model_path}"
local_dir = "{model_dir}"
prefill_chunk = 5
act_dtype = "{act}"
[ring]
failover_timeout_s = 30
{ring}{extra}""")
    p, url = start([a.server, "--config", cfg], os.path.join(work, f"{name}.log"), r"listening on (http://\S+)")
    port = int(url.rsplit(":", 1)[1])
    if not wait_ready(port, timeout=60):
        p.kill()
        raise SystemExit(f"{name}: not ready; see {work}/{name}.log")
    return p, port


def main():
    a, root, glm_dir = ringproc.setup_tiny_ring_test()
    work = a.work
    qwen_dir = os.path.join(root, "tiny-qwen-moe")
    if not os.path.exists(os.path.join(qwen_dir, "config.json")):
        subprocess.run([a.ringctl, "synth", "--arch", "qwen3_moe", "--preset", "tiny", "--quant", "affine",
                        "--bits", "4", "--seed", "2", "--out", qwen_dir], check=True, timeout=120)
    procs = []
    try:
        workers = []
        for i in range(4):
            p, addr = ringproc.start_worker(a, root, os.path.join(work, f"worker{i}.log"))
            procs.append(p)
            workers.append(addr)

        prompt = [11, 22, 33, 44, 55, 66, 77, 88, 99, 100, 101, 102, 103]  # 13 > index_topk: sparse DSA
        requests = {
            "greedy": dict(temperature=0),
            "sampled": dict(temperature=0.9, top_p=0.9, seed=7, frequency_penalty=0.4, presence_penalty=0.2),
            "top-k": dict(temperature=1.2, top_k=5, seed=3),
        }
        for family, model_dir, model_path, splits in [
                ("glm", glm_dir, "tiny-glm", [None, None, None, None, [2, 2], [1, 1, 1, 1], [1, 2, 1]]),
                ("qwen3-moe", qwen_dir, "tiny-qwen-moe", [None, None, None, None])]:
            local, lport = start_server(a, work, f"{family}-local", model_dir, model_path)
            procs.append(local)
            want = {k: completion(lport, prompt, **r) for k, r in requests.items()}
            local.kill()
            check(all(s == 200 for s, _ in want.values()), f"{family}: in-process reference answers")
            n_default = 0
            for split in splits:
                n = len(split) if split else (n_default := n_default + 1)
                label = f"{family} closed ring, {n} stage(s)" + (f" split {split}" if split else "")
                srv, port = start_server(a, work, f"{family}-{n}-{split}", model_dir, model_path,
                                         workers=workers[:n], split=split)
                procs.append(srv)
                for k, r in requests.items():
                    got = completion(port, prompt, **r)
                    check(got == want[k], f"{label}: {k} tokens and logprobs identical to the in-process engine")
                if n == 2 and not split:
                    # Workers on one host: both hops carry their frames through shared memory
                    # (CPU workers: no NCCL), and each worker says so for both directions.
                    for w in workers[:2]:
                        d = json.loads(subprocess.run([a.ringctl, "describe", "--worker", w, "--json"],
                                                      capture_output=True, text=True, timeout=30).stdout)
                        check(d.get("next_transport") == "shm" and d.get("prev_transport", "").startswith("shm from stage")
                              and d.get("host_id"), f"{label}: hop transports reported: {d.get('next_transport')!r}, "
                              f"{d.get('prev_transport')!r}")
                if n == 3 and not split:
                    srv.kill()
                    star, sport = start_server(a, work, f"{family}-star", model_dir, model_path,
                                               workers=workers[:3], topology="star")
                    procs.append(star)
                    for k, r in requests.items():
                        check(completion(sport, prompt, **r) == want[k], f"{family} star ring, 3 stages: {k} identical")
                    star_hop_metrics(sport, 3)
                    star.kill()
                else:
                    srv.kill()

        fault_tests(a, root, glm_dir, work, procs, prompt)
    finally:
        ringproc.kill_all(procs)
    return ringproc.report("closed ring")


def star_hop_metrics(port, stages):
    # The star: every step of every stage is a Forward round trip from the coordinator; the
    # reply carries the worker's own time, so the rest is the hop's transport.
    text = ringproc.raw(port, "GET", "/metrics")[2].decode()

    def total(name, **labels):
        sel = "".join(f'(?=[^}}]*{k}="{v}")' for k, v in labels.items())
        return sum(float(m) for m in re.findall(rf"^{name}\{{{sel}[^}}]*\}} (\S+)$", text, re.M))
    for i in range(stages):
        hop = f"coordinator-stage{i}"
        steps = total("ring_stage_round_trip_seconds_count", stage=str(i))
        check(steps > 0 and total("ring_hop_latency_seconds_count", hop=hop) == steps,
              f"star: ring_hop_latency_seconds{{hop={hop}}} observes every step of stage {i} ({steps})")
        check(0 < total("ring_hop_latency_seconds_sum", hop=hop) <= total("ring_stage_round_trip_seconds_sum", stage=str(i)),
              f"star: {hop} transport time is part of the stage's round trip")
        check(total("ring_hop_bytes_total", hop=hop, direction="sent") > 0 and
              total("ring_hop_bytes_total", hop=hop, direction="received") > 0,
              f"star: ring_hop_bytes_total{{hop={hop}}} counts both directions")
    check(set(re.findall(r'ring_hop_latency_seconds_count\{hop="([^"]+)"\}', text)) ==
          {f"coordinator-stage{i}" for i in range(stages)}, "star: ring_hop_latency_seconds has one series per stage")


def fault_tests(a, root, model_dir, work, procs, prompt):
    p0, w0 = ringproc.start_worker(a, root, os.path.join(work, "f0.log"))
    p2, w2 = ringproc.start_worker(a, root, os.path.join(work, "f2.log"))
    procs += [p0, p2]

    def faulty_middle_stage(name, env):
        # A ring w0 | faulty | w2 (layers 2 | 1 | 1) and one greedy request through it:
        # (faulty worker's address, server process, port, HTTP status, error body).
        pf, wf = ringproc.start_worker(a, root, os.path.join(work, f"{name}.log"), env=dict(os.environ, **env))
        procs.append(pf)
        srv, port = start_server(a, work, name, model_dir, "tiny-glm", workers=[w0, wf, w2], split=[2, 1, 1])
        procs.append(srv)
        status, d = post(port, {"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        return wf, srv, port, status, json.dumps(d)

    # A worker that damages the 3rd frame it pushes on (after the checksum, like a bad NIC):
    # the next worker refuses it, the error comes round to stage 0 and to the client.
    wc, srv, port, status, msg = faulty_middle_stage("corrupt", {"RING_TEST_CORRUPT_FRAME": "3"})
    check(status >= 500 and "checksum" in msg and f"stage 2 ({w2}) <- stage 1 ({wc})" in msg,
          f"corrupted frame between workers: {status}, the error names the hop ({msg[:300]})")
    status, _ = post(port, {"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    check(status == 200, "the next request is served (one bad frame does not break the ring)")
    srv.kill()

    # NaN out of a stage: refused there, named with its layers.
    wn, srv, _, status, msg = faulty_middle_stage("nan", {"RING_TEST_NAN_AT_STEP": "2"})
    check(status >= 500 and "NaN" in msg and f"stage 1 ({wn}) (layers 2..3)" in msg,
          f"NaN produced by stage 1: {status}, named with its layers ({msg[:300]})")
    srv.kill()

    # A stalled middle stage: stage 0's step deadline (4 s) fires; the error names where the
    # step was pushed, the flight recorders show the stalled worker not answering, and the
    # request is replayed on a ring re-formed without it: the stream is unchanged.
    ps, ws = ringproc.start_worker(a, root, os.path.join(work, "fs.log"))
    procs.append(ps)
    # fp32 between stages: a replay computes the emitted tokens as prefill rows where the
    # first attempt decoded them one by one (another attention form); in bf16 that
    # difference alone can flip a sampled token, in fp32 it stays far below the draw's.
    srv, port = start_server(a, work, "stall", model_dir, "tiny-glm", workers=[w0, ws, w2], split=[2, 1, 1],
                             act="f32")
    procs.append(srv)
    body = {"model": "m", "prompt": prompt, "max_tokens": 40, "temperature": 0.8, "seed": 11, "ignore_eos": True,
            "stream": True}

    def stream(during=None):
        # The streamed text (chunks as sent), calling `during` after the 5th chunk.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        text, chunks, at = [], 0, None
        for line in c.getresponse():
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices"):
                text.append(ev["choices"][0]["text"])
            chunks += 1
            if chunks == 5 and during:
                during()
                at = time.time()
        return "".join(text), at
    want, _ = stream()
    check(len(want) > 0, "stall test: reference stream")
    got, stalled_at = stream(lambda: ps.send_signal(signal.SIGSTOP))
    took = time.time() - stalled_at
    ps.send_signal(signal.SIGCONT)
    check(got == want and took < 40,
          f"SIGSTOPped middle stage of a closed ring: replayed, stream identical ({took:.1f}s; {got!r} vs {want!r})")
    log = open(os.path.join(work, "stall.log")).read()
    check(f"did not come round the ring" in log and f"pushed to stage 1 ({ws})" in log and
          f"stage 1 ({ws}): no answer" in log,
          "the deadline error names the hop the step was pushed to, and the flight recorders the stalled worker")
    srv.kill()


if __name__ == "__main__":
    sys.exit(main())
