#!/usr/bin/env python3
"""Alternates two builds of a bench over rounds and compares their medians.

    scripts/ab_bench.py --rounds 5 OLD_EXE NEW_EXE [-- ARGS...]

Each executable prints lines `NAME SHAPE DTYPE VALUE ms` (benches/norms.rs
does). The two run one after the other, round after round (old first in
even rounds, new first in odd ones), so that a machine's drift falls on
both. Prints, per NAME and SHAPE, the median over rounds of each and
new/old; exits 1 if any ratio is above --limit (default 1.05).
"""
import argparse
import statistics
import subprocess
import sys


def run(exe, args):
    out = subprocess.run([exe] + args, capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[4] == "ms":
            got[(parts[0], parts[1], parts[2])] = float(parts[3])
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--limit", type=float, default=1.05)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    times = {"old": {}, "new": {}}
    for r in range(a.rounds):
        order = [("old", a.old), ("new", a.new)]
        if r % 2:
            order.reverse()
        for tag, exe in order:
            for k, v in run(exe, a.args).items():
                times[tag].setdefault(k, []).append(v)
        print("round %d done" % (r + 1), file=sys.stderr)
    worst = 0.0
    print("%-12s %-12s %-5s %10s %10s %7s" % ("norm", "shape", "dtype", "old ms", "new ms", "new/old"))
    for k in times["old"]:
        if k not in times["new"]:
            continue
        o, n = statistics.median(times["old"][k]), statistics.median(times["new"][k])
        worst = max(worst, n / o)
        print("%-12s %-12s %-5s %10.3f %10.3f %7.3f" % (k[0], k[1], k[2], o, n, n / o))
    print("worst new/old: %.3f (limit %.2f)" % (worst, a.limit))
    sys.exit(1 if worst > a.limit else 0)


if __name__ == "__main__":
    main()
