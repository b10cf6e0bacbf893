#!/usr/bin/env python3
"""Where a latency-bound kernel's cycles go, from Nsight Compute's text output.

  ncu_stall_report.py [--details DETAILS.txt] [--sass SASS.csv] [--top N]

DETAILS: `ncu --set full ... APP` printed as text (the default `--page details`): per profiled
launch, its duration, elapsed cycles, the cycles its multiprocessors were active, warps,
instructions, cycles per issued instruction, registers and shared memory. A decode step's
small kernels are bound by latency, not by a unit's throughput: what they cost is
(instructions a warp issues) x (cycles between two of its issues), so both are printed.
SASS: `ncu --set full --page source --print-source sass --csv ... APP`: per kernel, the
share of each warp-stall reason in the sampled cycles and the N instructions with the
most samples (the place and the reason a warp waits).
ncu replays a launch with the caches flushed (its default cache control), so data a kernel
finds in L2 in a real run (a producer's output) comes from DRAM here: durations are upper
bounds for such kernels; the instruction counts and stall shapes are not affected.
Output: markdown on stdout.
"""
import csv
import io
import re
import sys
from collections import OrderedDict, defaultdict

# "  void ns::Kernel<...>(args) (32, 4, 1)x(256, 1, 1), Context 1, Stream 13, Device 0, CC 9.0"
_LAUNCH = re.compile(r"^\s+(?:void )?(.+?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
# "    Duration                         us        15.81"
_METRIC = re.compile(r"^\s{4}(\S.*?\S)\s{2,}(\S+(?:/\S+)?)?\s+([-\d.,]+)\s*$")

METRICS = ("Duration", "Elapsed Cycles", "SM Active Cycles", "SM Frequency",
           "Executed Instructions", "Warp Cycles Per Issued Instruction",
           "Registers Per Thread", "Dynamic Shared Memory Per Block", "Achieved Occupancy",
           "L2 Hit Rate", "Eligible Warps Per Scheduler")


def short_name(name):
    """The kernel's name without namespaces, casts in its template arguments and parameters."""
    n = re.sub(r"^void ", "", name.strip())
    n = re.sub(r"\((?:int|long|unsigned|bool|short|char)\)", "", n)  # SASS: <(int)512, ...>
    n = re.sub(r"(?:<unnamed>|unnamed>|\w+)::", "", n)  # details: "unnamed>::" (truncated)
    depth = 0
    for i, ch in enumerate(n):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            return n[:i].strip()
    return n.strip()


def parse_details(text):
    """Launches in order: dict(name, grid, block, metrics{name: (unit, value)})."""
    launches = []
    cur = None
    for line in text.splitlines():
        m = _LAUNCH.match(line)
        if m:
            cur = {"name": short_name(m.group(1)),
                   "grid": tuple(int(m.group(i)) for i in (2, 3, 4)),
                   "block": tuple(int(m.group(i)) for i in (5, 6, 7)),
                   "metrics": {}}
            launches.append(cur)
            continue
        if cur is None:
            continue
        m = _METRIC.match(line)
        if m and m.group(1) in METRICS and m.group(1) not in cur["metrics"]:
            unit = m.group(2) or ""
            cur["metrics"][m.group(1)] = (unit, float(m.group(3).replace(",", "")))
    return launches


def launch_row(l):
    """One launch's figures: the instructions a warp issues and the cycles between them."""
    g = l["metrics"]
    blocks = l["grid"][0] * l["grid"][1] * l["grid"][2]
    threads = l["block"][0] * l["block"][1] * l["block"][2]
    warps = blocks * ((threads + 31) // 32)
    dur = g.get("Duration", ("", float("nan")))
    dur_us = dur[1] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}.get(dur[0], 1.0)
    instr = g.get("Executed Instructions", ("", float("nan")))[1]
    cpi = g.get("Warp Cycles Per Issued Instruction", ("", float("nan")))[1]
    per_warp = instr / warps if warps else float("nan")
    return {"name": l["name"], "grid": "x".join(map(str, l["grid"])),
            "block": threads, "regs": g.get("Registers Per Thread", ("", float("nan")))[1],
            "dur_us": dur_us, "elapsed": g.get("Elapsed Cycles", ("", float("nan")))[1],
            "per_warp": per_warp, "cpi": cpi, "warp_cycles": per_warp * cpi,
            "eligible": g.get("Eligible Warps Per Scheduler", ("", float("nan")))[1]}


def parse_sass(text):
    """Kernels in order: (name, rows); rows are dicts of the CSV's columns."""
    kernels = []
    lines = text.splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith('"Kernel Name"')]
    for j, s in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(lines)
        name = next(csv.reader([lines[s]]))[1]
        body = [l for l in lines[s + 1:end] if l.startswith('"')]
        rows = list(csv.reader(io.StringIO("\n".join(body))))
        if not rows:
            continue
        hdr = rows[0]
        data = [dict(zip(hdr, r)) for r in rows[1:] if len(r) == len(hdr)]
        kernels.append((short_name(name), data))
    return kernels


def stall_shares(rows):
    """Each stall reason's share of the sampled warp cycles (all samples), largest first."""
    tot = defaultdict(int)
    for r in rows:
        for k, v in r.items():
            if k.startswith("stall_") and "(Not Issued)" not in k:
                try:
                    tot[k[len("stall_"):]] += int(v)
                except ValueError:
                    pass
    s = sum(tot.values())
    return s, OrderedDict(sorted(((k, v / s) for k, v in tot.items() if v), key=lambda kv: -kv[1])) if s else OrderedDict()


def top_instructions(rows, n):
    """The n instructions with the most samples: (address tail, SASS, samples, main reason, executed)."""
    def samples(r):
        try:
            return int(r.get("Warp Stall Sampling (All Samples)", "0"))
        except ValueError:
            return 0
    out = []
    for r in sorted(rows, key=lambda r: -samples(r))[:n]:
        if samples(r) == 0:
            break
        reasons = {k[len("stall_"):]: int(v) for k, v in r.items()
                   if k.startswith("stall_") and "(Not Issued)" not in k and v.isdigit()}
        main = max(reasons, key=reasons.get) if reasons else "-"
        out.append((r.get("Address", "")[-5:], " ".join(r.get("Source", "").split()), samples(r), main,
                    r.get("Instructions Executed", "")))
    return out


def main(argv):
    details = sass = None
    top = 12
    i = 1
    while i < len(argv):
        if argv[i] == "--details" and i + 1 < len(argv):
            details = argv[i + 1]; i += 2
        elif argv[i] == "--sass" and i + 1 < len(argv):
            sass = argv[i + 1]; i += 2
        elif argv[i] == "--top" and i + 1 < len(argv):
            top = int(argv[i + 1]); i += 2
        else:
            print(__doc__, file=sys.stderr)
            return 2
    if details is None and sass is None:
        print(__doc__, file=sys.stderr)
        return 2
    if details:
        launches = parse_details(open(details, errors="replace").read())
        print("| kernel | grid | threads | regs | duration us | elapsed cycles | instructions a warp | "
              "cycles per issue | warp cycles | eligible warps / scheduler |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for l in launches:
            r = launch_row(l)
            print(f"| `{r['name']}` | {r['grid']} | {r['block']} | {r['regs']:.0f} | {r['dur_us']:.2f} | "
                  f"{r['elapsed']:.0f} | {r['per_warp']:.0f} | {r['cpi']:.2f} | {r['warp_cycles']:.0f} | "
                  f"{r['eligible']:.2f} |")
        if not launches:
            print("(no launch found)")
    if sass:
        for name, rows in parse_sass(open(sass, errors="replace").read()):
            n, shares = stall_shares(rows)
            print(f"\n`{name}`: {n} samples; stall reasons: " +
                  ", ".join(f"{k} {100 * v:.1f}%" for k, v in list(shares.items())[:8]))
            print("| address | instruction | samples | main reason | executed (warps) |")
            print("|---|---|---:|---|---:|")
            for a, src, s, why, ex in top_instructions(rows, top):
                print(f"| {a} | `{src[:60]}` | {s} | {why} | {ex} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
