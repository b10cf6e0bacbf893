#!/usr/bin/env python3
"""Ring integration test: ring-worker processes vs the in-process engine.

Synthesizes tiny checkpoints, starts ring-workers on loopback (port 0: each prints the
port it bound), and checks that `ringctl logits --workers ...` writes logits BIT-IDENTICAL
to in-process `ringctl logits` for 1-4 workers, including a GLM split right before its
IndexShare "shared" layer (tiny GLM layers: full, full, shared, full), with fp32 and with
the checkpoint dtype (bf16) on the wire. Then the failure
paths: a corrupted frame, a SIGKILLed worker, a stalled worker, paths escaping the root.

  .venv/bin/python tests/ring_integration_test.py --ringctl build/server/ringctl \\
      --worker build/worker/ring-worker --work /tmp/ring_it

Never hangs: every subprocess has a timeout and every worker is killed at exit.
"""
import argparse
import json
import re
import urllib.request
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

RESULTS = []
WORKERS = []  # Popen objects, killed at exit

# 24 prompt tokens > the tiny GLM's index_topk (16), so the top-k carry is not dense.
PROMPT = ",".join(str(7 * i % 1000 + 1) for i in range(24))
COMMON = ["--tokens", PROMPT, "--prefill-chunk", "10", "--decode", "4"]


METRICS = {}  # worker address -> its /metrics URL (workers started with --metrics-listen)


def check(name, ok, detail="", show=False):
    """Records one result; `show` prints `detail` on success too (the error text under test)."""
    RESULTS.append(ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok and not show else f": {detail}"), flush=True)


def start_worker(ringctl_args, root, env_extra=None, extra=()):
    env = dict(os.environ, **(env_extra or {}))
    p = subprocess.Popen([ringctl_args.worker, "--listen", "127.0.0.1:0", "--model-root", root, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    WORKERS.append(p)
    line = p.stdout.readline()  # "ring-worker listening on ADDR"; EOF if it died
    if "listening on" not in line:
        raise RuntimeError(f"ring-worker did not start: {line!r} {p.stderr.read()}")
    addr = re.search(r"listening on (\S+)", line).group(1)
    m = re.search(r"metrics (http://\S+)\)", line)
    if m:
        METRICS[addr] = m.group(1)
    return p, addr


def stop_all():
    for p in WORKERS:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def ringctl(args, cmd, timeout=120):
    return subprocess.run([args.ringctl] + cmd, capture_output=True, text=True, timeout=timeout)


def logits(args, model_args, out, act="f32", timeout=120):
    r = ringctl(args, ["logits"] + model_args + COMMON + ["--act", act, "--out", out], timeout)
    if r.returncode != 0:
        raise RuntimeError(f"ringctl logits {' '.join(model_args)} failed: {r.stderr.strip()}")
    return np.load(out)


def bit_identical(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    root = os.path.join(args.work, "models")
    os.makedirs(root)

    models = {"glm": ["--arch", "glm_moe_dsa", "--quant", "mxfp4"],
              "qwen": ["--arch", "qwen3_moe", "--quant", "affine", "--bits", "4"]}
    for name, synth in models.items():
        r = ringctl(args, ["synth", "--preset", "tiny", *synth, "--out", os.path.join(root, name)])
        if r.returncode != 0:
            raise RuntimeError(f"synth {name}: {r.stderr}")

    addrs = [start_worker(args, root)[1] for _ in range(4)]

    # --- bit-identical logits, 1..4 workers --------------------------------------------
    for name in models:
        ref = logits(args, ["--model", os.path.join(root, name)], os.path.join(args.work, f"{name}_ref.npy"))
        cases = [(n, None) for n in range(1, 5)]
        if name == "glm":
            # Boundaries right before the shared layer 2: "2,2" and "1,1,1,1" (a shared layer
            # alone in a stage, fed only by the carried top-k), plus "1,2,1" (after it).
            cases += [(2, "2,2"), (4, "1,1,1,1"), (3, "1,2,1")]
        for n, split in cases:
            label = f"{name} {n} worker(s)" + (f" --split {split}" if split else "")
            cmd = ["--workers", ",".join(addrs[:n]), "--model", name] + (["--split", split] if split else [])
            try:
                got = logits(args, cmd, os.path.join(args.work, f"{name}_{n}_{split}.npy"))
                check(f"bit-identical logits: {label}", bit_identical(ref, got),
                      f"max |diff| {np.max(np.abs(ref - got)) if ref.shape == got.shape else 'shape'}")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                check(f"bit-identical logits: {label}", False, str(e))

    # --- checkpoint activation dtype (bf16 on the wire): exact too, since a bf16 stage
    # already rounds what it hands on ------------------------------------------------------
    for name in models:
        try:
            ref = logits(args, ["--model", os.path.join(root, name)],
                         os.path.join(args.work, f"{name}_auto_ref.npy"), act="auto")
            got = logits(args, ["--workers", ",".join(addrs[:2]), "--model", name],
                         os.path.join(args.work, f"{name}_auto_2.npy"), act="auto")
            check(f"bit-identical logits, --act auto: {name} 2 workers", bit_identical(ref, got))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            check(f"bit-identical logits, --act auto: {name} 2 workers", False, str(e))

    # --- corrupted frame: the 2nd frame the faulty worker sends ---------------------------
    _, bad = start_worker(args, root, {"RING_TEST_CORRUPT_FRAME": "2"})
    r = ringctl(args, ["logits", "--workers", f"{addrs[0]},{bad}", "--model", "glm", *COMMON,
                       "--act", "f32"], timeout=60)
    check("corrupt frame fails naming the hop and 'checksum'",
          r.returncode != 0 and "checksum" in r.stderr and bad in r.stderr, r.stderr.strip(), show=True)

    # --- NaN produced by a stage: the step fails at that stage, naming it and its layers ----
    _, nan_addr = start_worker(args, root, {"RING_TEST_NAN_AT_STEP": "2"})
    r = ringctl(args, ["logits", "--workers", f"{addrs[0]},{nan_addr}", "--model", "glm", *COMMON,
                       "--act", "f32"], timeout=60)
    check("NaN at a stage fails the step naming the stage and its layers",
          r.returncode != 0 and "NaN" in r.stderr and nan_addr in r.stderr and "layers 2..4" in r.stderr,
          r.stderr.strip(), show=True)

    # --- shadow verification: sampled steps recomputed on the CPU reference per layer ------
    # A clean worker stays quiet; a worker whose q_b_proj kernel of layer 3 is wrong (test
    # fault switch) reports the divergence at layer 3, and with --shadow-degrade stops taking
    # new sequences, so a coordinator leaves it out.
    _, clean_sh = start_worker(args, root, extra=("--shadow-rate", "1"))
    _, bad_sh = start_worker(args, root, {"RING_TEST_FAULT": "scale:layers.3.self_attn.q_b_proj"},
                             extra=("--shadow-rate", "1", "--shadow-degrade", "--metrics-listen", "0"))
    # A layer is judged from its 8th check on (worker/shadow_checker.h min_checks): 3 prefill
    # chunks + 8 decode steps.
    shadow_run = ["--tokens", PROMPT, "--prefill-chunk", "10", "--decode", "8", "--act", "f32"]
    r = ringctl(args, ["logits", "--workers", f"{clean_sh},{bad_sh}", "--model", "glm", *shadow_run],
                timeout=60)
    check("shadow: the ring serves while shadow checks run", r.returncode == 0, r.stderr.strip())

    def describe(addr):
        d = ringctl(args, ["describe", "--worker", addr, "--json"], timeout=30)
        return json.loads(d.stdout) if d.returncode == 0 else {}

    want_steps = 11  # 24 prompt tokens in chunks of 10, then 8 decode steps
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dc, db = describe(clean_sh), describe(bad_sh)
        if (int(dc.get("shadow", {}).get("steps_checked", 0)) >= want_steps and
                int(db.get("shadow", {}).get("steps_checked", 0)) >= want_steps):
            break
        time.sleep(0.2)
    sc, sb = dc.get("shadow", {}), db.get("shadow", {})
    check("shadow: clean worker checked every step, no divergence, exact (CPU vs CPU)",
          int(sc.get("steps_checked", 0)) >= want_steps and int(sc.get("divergences", 0)) == 0
          and sc.get("max_relative_difference", 0) == 0 and not dc.get("degraded_reason"), str(sc))
    layers = {int(l["layer"]): l for l in sb.get("layers", [])}
    check("shadow: faulty kernel diverges at layer 3 only, worker degraded",
          int(sb.get("divergences", 0)) > 0 and 2 in layers
          and layers[2].get("max_relative_difference", 0) == 0  # proto JSON omits zeros
          and layers.get(3, {}).get("max_relative_difference", 0) > 0.01
          and "layer 3" in sb.get("last_divergence", "") and "layer 3" in db.get("degraded_reason", ""),
          f"{sb} degraded: {db.get('degraded_reason')!r}")
    r = ringctl(args, ["logits", "--workers", f"{clean_sh},{bad_sh}", "--model", "glm", *shadow_run],
                timeout=60)
    check("shadow: a degraded worker refuses new sequences, naming why",
          r.returncode != 0 and "degraded" in r.stderr and "layer 3" in r.stderr, r.stderr.strip(), show=True)
    try:
        text = urllib.request.urlopen(METRICS[bad_sh], timeout=10).read().decode()
    except (OSError, KeyError) as e:
        text = f"no metrics: {e}"
    div = re.search(r'^ring_worker_shadow_divergences_total\{stage="1"\} (\S+)', text, re.M)
    rel3 = re.search(r'^ring_worker_shadow_relative_difference\{layer="3",stage="1"\} (\S+)', text, re.M)
    check("shadow: worker metrics export divergences, per-layer difference and degraded",
          div is not None and float(div.group(1)) > 0 and rel3 is not None and float(rel3.group(1)) > 0.01
          and re.search(r"^ring_worker_degraded 1", text, re.M) is not None, text[-1500:])
    d = ringctl(args, ["describe", "--worker", bad_sh], timeout=30)
    check("ringctl describe shows the shadow table and DEGRADED", d.returncode == 0 and
          "DEGRADED" in d.stdout and "layer    3" in d.stdout, d.stdout + d.stderr)

    # --- admission gate: each worker verifies its layers before it may serve ---------------
    r = ringctl(args, ["logits", "--workers", f"{addrs[0]},{addrs[1]}", "--model", "glm", *COMMON,
                       "--act", "f32", "--admission-prompt-len", "6"], timeout=120)
    check("admission: clean workers pass and serve", r.returncode == 0, r.stderr.strip())
    _, bad_adm = start_worker(args, root, {"RING_TEST_FAULT": "scale:layers.2.mlp.shared_experts.down_proj"})
    r = ringctl(args, ["logits", "--workers", f"{addrs[0]},{bad_adm}", "--model", "glm", *COMMON,
                       "--act", "f32", "--admission-prompt-len", "6"], timeout=120)
    check("admission: a wrong kernel is refused, naming the worker and the op",
          r.returncode != 0 and bad_adm in r.stderr and "admission verify" in r.stderr
          and "shared_experts.down_proj" in r.stderr, r.stderr.strip(), show=True)
    d = describe(bad_adm)
    check("admission: the refused worker reports itself degraded",
          "admission verify failed" in d.get("degraded_reason", ""), str(d.get("degraded_reason")))

    # --- SIGKILL mid-run: must fail fast, naming the dead worker ----------------------------
    victim, vaddr = start_worker(args, root)
    t0 = time.monotonic()
    p = subprocess.Popen([args.ringctl, "logits", "--workers", f"{addrs[0]},{vaddr}", "--model", "glm",
                          "--tokens", PROMPT, "--decode", "3000", "--act", "f32", "--step-timeout", "10"],
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    still_running = p.poll() is None
    victim.kill()
    try:
        _, err = p.communicate(timeout=30)
        check("SIGKILLed worker: ringctl fails within its deadline naming the worker",
              still_running and p.returncode != 0 and vaddr in err,
              f"running at kill: {still_running}, rc {p.returncode}, {err.strip()}", show=True)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        check("SIGKILLed worker: ringctl fails within its deadline", False, "ringctl hung")
    print(f"  (killed after {time.monotonic() - t0:.1f}s)")

    # --- stalled worker (SIGSTOP): the per-call deadline fires --------------------------
    sleeper, saddr = start_worker(args, root)
    r = ringctl(args, ["logits", "--workers", saddr, "--model", "glm", "--tokens", "1,2,3", "--act", "f32"])
    ok_before = r.returncode == 0
    sleeper.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        r = ringctl(args, ["logits", "--workers", saddr, "--model", "glm", "--tokens", "1,2,3",
                           "--act", "f32", "--step-timeout", "2"], timeout=30)
        took = time.monotonic() - t0
        check("stalled worker: deadline exceeded within the step timeout, naming the worker",
              ok_before and r.returncode != 0 and saddr in r.stderr and took < 10,
              f"took {took:.1f}s: {r.stderr.strip()}", show=True)
    except subprocess.TimeoutExpired:
        check("stalled worker: deadline", False, "ringctl hung")
    sleeper.send_signal(signal.SIGCONT)

    # --- stalled mid-decode: the sequence's open Forward stream has no call deadline; the
    # per-step watchdog must cancel it and name the worker -----------------------------
    mid, maddr_stall = start_worker(args, root)
    p = subprocess.Popen([args.ringctl, "logits", "--workers", f"{addrs[0]},{maddr_stall}", "--model", "glm",
                          "--tokens", PROMPT, "--decode", "3000", "--act", "f32", "--step-timeout", "2"],
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    running = p.poll() is None
    mid.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
        check("worker stalled mid-decode: the step deadline fires on the open stream, naming the worker",
              running and p.returncode != 0 and maddr_stall in err and "deadline" in err.lower() and took < 10,
              f"running at stop: {running}, rc {p.returncode}, took {took:.1f}s: {err.strip()}", show=True)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        check("worker stalled mid-decode: step deadline", False, "ringctl hung")
    mid.send_signal(signal.SIGCONT)

    # --- LoadStage paths escaping --model-root are refused --------------------------------
    for bad_model, word in [("../models/glm", "escape"), ("/etc", "absolute"), (root + "/glm", "absolute")]:
        r = ringctl(args, ["logits", "--workers", addrs[0], "--model", bad_model, "--tokens", "1"], timeout=60)
        check(f"model path {bad_model!r} refused", r.returncode != 0 and word in r.stderr, r.stderr.strip())

    # --- inter-node auth: shared token, mutual TLS, no open listener without either ------
    token = os.path.join(args.work, "ring.token")
    with open(token, "w") as f:
        f.write("s3cret-ring-token-0123456789\n")
    _, taddr = start_worker(args, root, extra=("--auth-token-file", token))
    base = ["logits", "--workers", taddr, "--model", "glm", "--tokens", "1,2,3", "--act", "f32"]
    r = ringctl(args, base, timeout=60)
    check("token worker refuses a caller without the token",
          r.returncode != 0 and "no ring auth token" in r.stderr and taddr in r.stderr, r.stderr.strip(), show=True)
    wrong = os.path.join(args.work, "wrong.token")
    with open(wrong, "w") as f:
        f.write("not-the-ring-token-000000000\n")
    r = ringctl(args, base + ["--auth-token-file", wrong], timeout=60)
    check("token worker refuses a wrong token", r.returncode != 0 and "wrong ring auth token" in r.stderr,
          r.stderr.strip())
    r = ringctl(args, base + ["--auth-token-file", token], timeout=60)
    check("token worker serves a caller with the token", r.returncode == 0, r.stderr.strip())
    pki = os.path.join(args.work, "pki")
    os.makedirs(pki, exist_ok=True)

    def ossl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=60)
    try:
        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{pki}/ca.key", "-out", f"{pki}/ca.pem",
             "-days", "2", "-subj", "/CN=ringserve-test-ca")
        for name, ext in [("worker", "subjectAltName=IP:127.0.0.1"), ("coord", "extendedKeyUsage=clientAuth")]:
            ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{pki}/{name}.key", "-out", f"{pki}/{name}.csr",
                 "-subj", f"/CN={name}")
            with open(f"{pki}/{name}.ext", "w") as f:
                f.write(ext + "\n")
            ossl("x509", "-req", "-in", f"{pki}/{name}.csr", "-CA", f"{pki}/ca.pem", "-CAkey", f"{pki}/ca.key",
                 "-CAcreateserial", "-out", f"{pki}/{name}.pem", "-days", "2", "-extfile", f"{pki}/{name}.ext")
        _, maddr = start_worker(args, root, extra=("--tls-cert", f"{pki}/worker.pem", "--tls-key",
                                                   f"{pki}/worker.key", "--tls-client-ca", f"{pki}/ca.pem"))
        mbase = ["logits", "--workers", maddr, "--model", "glm", "--tokens", "1,2,3", "--act", "f32",
                 "--step-timeout", "5"]
        r = ringctl(args, mbase + ["--tls-ca", f"{pki}/ca.pem", "--tls-cert", f"{pki}/coord.pem",
                                   "--tls-key", f"{pki}/coord.key"], timeout=60)
        check("mutual TLS: a coordinator with a CA-signed client certificate is served", r.returncode == 0,
              r.stderr.strip())
        r = ringctl(args, mbase + ["--tls-ca", f"{pki}/ca.pem"], timeout=60)
        check("mutual TLS: a coordinator without a client certificate is refused", r.returncode != 0,
              r.stderr.strip(), show=True)
        r = ringctl(args, mbase, timeout=60)
        check("mutual TLS: a plaintext coordinator is refused", r.returncode != 0, r.stderr.strip())
    except subprocess.CalledProcessError as e:
        check("mutual TLS setup (openssl)", False, e.stderr)
    r = subprocess.run([args.worker, "--listen", "0.0.0.0:0", "--model-root", root], capture_output=True,
                       text=True, timeout=30)
    check("a worker will not listen beyond loopback without a token or mTLS",
          r.returncode == 2 and "refusing" in r.stderr, r.stderr.strip())

    # --- SIGTERM: clean exit ------------------------------------------------------------
    term, _ = start_worker(args, root)
    term.send_signal(signal.SIGTERM)
    try:
        check("SIGTERM: worker exits 0", term.wait(timeout=15) == 0, f"rc {term.returncode}")
    except subprocess.TimeoutExpired:
        check("SIGTERM: worker exits 0", False, "did not exit")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a setup failure is a failure, not a crash with workers left
        check("setup", False, repr(e))
    finally:
        stop_all()
    passed = sum(RESULTS)
    print(f"{passed} passed, {len(RESULTS) - passed} failed")
    sys.exit(0 if RESULTS and passed == len(RESULTS) else 1)
