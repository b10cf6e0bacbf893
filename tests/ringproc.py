"""Process and HTTP helpers shared by the ring-server tests and benchmarks.

Every wait has a deadline: a process that does not print its "listening on" line in time
is killed and the caller fails with the log path.
"""
import http.client
import os
import re
import subprocess
import threading
import time


def start(cmd, log, pattern, timeout=30, env=None):
    """Starts `cmd` (stderr to `log`) and waits for a stdout line matching `pattern`.

    Returns (Popen, first regex group). stdout is drained in the background afterwards.
    """
    f = open(log, "w")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=env)
    found = []

    def reader():
        for line in p.stdout:
            if not found:
                m = re.search(pattern, line)
                if m:
                    found.append(m.group(1))
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.time() + timeout
    while time.time() < deadline and not found and p.poll() is None:
        time.sleep(0.02)
    if not found:
        p.kill()
        raise SystemExit(f"{cmd[0]} did not start within {timeout}s; see {log}")
    return p, found[0]


def raw(port, method, path, body=b"", headers=None, key=None, timeout=10):
    """One HTTP request on a fresh connection: (status, headers dict, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def wait_ready(port, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if raw(port, "GET", "/ready", timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def metric(port, name, key=None):
    """Value of an unlabelled Prometheus metric from /metrics, or None."""
    body = raw(port, "GET", "/metrics", key=key)[2].decode()
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.split()[-1])
    return None


def setup_tiny_ring_test():
    """Parses --ringctl/--worker/--server/--work and writes the tiny GLM test model once.

    Returns (args, models_root, model_dir)."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    root = os.path.join(a.work, "models")
    model_dir = os.path.join(root, "tiny-glm")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        subprocess.run([a.ringctl, "synth", "--arch", "glm_moe_dsa", "--preset", "tiny", "--quant", "mxfp4",
                        "--seed", "1", "--out", model_dir], check=True, timeout=120)
    return a, root, model_dir


def free_address():
    """A 127.0.0.1:PORT nobody listens on right now (for a server's admin_listen)."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"127.0.0.1:{port}"


def start_worker(args, root, log, env=None, extra=()):
    """Starts a loopback ring-worker over `root` (plus `extra` flags); returns (Popen, its address)."""
    return start([args.worker, "--listen", "127.0.0.1:0", "--model-root", root, *extra], log,
                 r"listening on (\S+)", env=env)


# Checks of a test script: each prints ok/FAIL as it runs; report() ends the script.
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def kill_all(procs):
    """Kills whatever of `procs` (Popen) is still running."""
    for p in procs:
        if p.poll() is None:
            p.kill()


def report(what):
    """Prints the failed checks, or that all `what` checks passed; the exit status."""
    if FAILS:
        print(f"{len(FAILS)} failure(s):\n  " + "\n  ".join(FAILS))
        return 1
    print(f"all {what} checks passed")
    return 0
