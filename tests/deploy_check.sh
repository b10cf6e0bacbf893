#!/usr/bin/env bash
# Checks the deploy/ artefacts: Prometheus alert rules and scrape config (promtool), the
# Grafana dashboard (valid JSON, every ring_* metric it queries exists in ring-server's or
# ring-worker's metrics list), and the relocatable bundle: built from ring-worker/ring-server/ringctl,
# copied to another directory, run from there with an empty LD_LIBRARY_PATH; the systemd
# units (systemd-analyze verify) with ExecStart pointing into that relocated bundle.
#   tests/deploy_check.sh SOURCE_DIR RINGCTL RING_WORKER RING_SERVER WORK_DIR
set -euo pipefail
src=$1 ringctl=$2 worker=$3 server=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
promtool check rules "$src/deploy/prometheus/alerts.yml"
promtool check config "$src/deploy/prometheus/prometheus.yml"
python3 - "$src" <<'PY'
import json, re, sys
src = sys.argv[1]
dash = json.load(open(f"{src}/deploy/grafana/ringserve.json"))
known = set()
for f in ["server/metrics.cc", "worker/worker_metrics.cc"]:  # ring-server and ring-worker
    known |= set(re.findall(r'Name\("(ring_[a-z_]+)"\)', open(f"{src}/{f}").read()))
used = set()
for text in [json.dumps(dash), open(f"{src}/deploy/prometheus/alerts.yml").read()]:
    used |= {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\b(ring_[a-z_]+)", text)}
missing = sorted(used - known)
if missing:
    sys.exit(f"dashboard/alerts use metrics ring-server does not export: {missing}")
print(f"dashboard: {len(dash['panels'])} panels; {len(used)} metrics used, all exported")
PY
bash "$src/deploy/bundle.sh" "$work/bundle" "$ringctl" "$worker" "$server"
mkdir -p "$work/elsewhere" && mv "$work/bundle" "$work/elsewhere/ringserve"
cd /
for b in ringctl ring-worker ring-server; do
  env -u LD_LIBRARY_PATH "$work/elsewhere/ringserve/bin/$b" --help > /dev/null
done
env -u LD_LIBRARY_PATH "$work/elsewhere/ringserve/bin/ringctl" synth --arch qwen3 --preset tiny \
  --out "$work/m" > /dev/null
env -u LD_LIBRARY_PATH "$work/elsewhere/ringserve/bin/ringctl" logits --model "$work/m" --tokens 1,2,3 \
  --out "$work/l.npy" 2> "$work/logits.txt"
grep -q "logits: 3 rows" "$work/logits.txt"
mkdir -p "$work/units"
for u in ring-worker ring-server; do
  sed "s|/opt/ringserve|$work/elsewhere/ringserve|g" "$src/deploy/systemd/$u.service" > "$work/units/$u.service"
done
# verify exits 0 on a directive it cannot parse (it only warns, naming file:line): fail on that too.
units_out=$(systemd-analyze verify "$work/units/ring-worker.service" "$work/units/ring-server.service" 2>&1) ||
  { echo "$units_out"; exit 1; }
if grep -q "$work/units/" <<< "$units_out"; then echo "$units_out"; exit 1; fi
echo "deploy checks passed (bundle runs from $work/elsewhere/ringserve; systemd units verify)"
