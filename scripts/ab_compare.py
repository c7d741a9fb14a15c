#!/usr/bin/env python3
"""Alternates two benchmark commands' JSON reports and compares them.

    scripts/ab_compare.py OLD_CMD NEW_CMD [--rounds 5]

Each command prints the LayerNorm report as one JSON object (with
`shapes` and `tape`): `fusegrad bench --json`, or the probes bench
binary with `--json --no-composed --budget 0.4`. Each round runs OLD then
NEW, one at a time. For every shape it prints the median fused
forward+backward time of each over the rounds and NEW/OLD; then the median
tape overhead per op of each.
"""
import argparse
import json
import statistics
import subprocess


def run(cmd):
    out = subprocess.run(cmd, shell=True, check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and '"shapes"' in line:
            return json.loads(line)
    raise SystemExit(f"no JSON report in the output of {cmd!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    times = {"old": {}, "new": {}}
    tape = {"old": [], "new": []}
    for r in range(a.rounds):
        for tag, b in (("old", a.old), ("new", a.new)):
            rep = run(b)
            for row in rep["shapes"]:
                key = (row["n"], row["d"])
                times[tag].setdefault(key, []).append(row["fwd_s"] + row["bwd_s"])
            tape[tag].append(rep["tape"]["s_per_op"])
        print(f"round {r + 1} done", flush=True)
    print(f"{'shape':>12} {'old fwd+bwd ms':>15} {'new fwd+bwd ms':>15} {'new/old':>8}")
    worst = 0.0
    for key in times["old"]:
        o = statistics.median(times["old"][key]) * 1e3
        n = statistics.median(times["new"][key]) * 1e3
        worst = max(worst, n / o)
        print(f"{key[0]:>6}x{key[1]:<5} {o:15.3f} {n:15.3f} {n / o:8.3f}")
    to = statistics.median(tape["old"]) * 1e9
    tn = statistics.median(tape["new"]) * 1e9
    print(f"tape overhead per op (1000-op chain): old {to:.0f} ns, new {tn:.0f} ns")
    print(f"worst new/old: {worst:.3f}")


if __name__ == "__main__":
    main()
