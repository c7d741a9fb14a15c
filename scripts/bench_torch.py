#!/usr/bin/env python3
"""PyTorch's CPU layer_norm, forward + backward, on the shapes of `fusegrad bench`.

Optional and kept out of the tests and CI: it needs torch, which fusegrad
does not. Install it into a separate environment, for example

    python3 -m venv /work/torchenv && /work/torchenv/bin/pip install torch

then run `fusegrad bench --json > fg.json` (or the bench probe,
`cargo bench --features probes --bench bench -- --json`) and, right after, `/work/torchenv/bin/python scripts/bench_torch.py --fusegrad fg.json`.

On a shared machine the two runs can land in different spells of load. With
`--rounds K` the script instead alternates, shape by shape, a run of the
bench probe on that one shape (`cargo bench --features probes --bench bench`
from the current directory, or the binary given by `--fusegrad-bin`) and the
PyTorch timing, K times, and reports every round's ratio and their median.

PyTorch runs with 2 threads and its default CPU allocator (glibc malloc), as
most users run it. Forward records the graph (grad mode on), as fusegrad's
does; backward is `torch.autograd.grad`, which returns fresh dx, dgamma and
dbeta each time, as fusegrad's sweep does. Times are medians after warm-up.
Effective GB/s count the same minimal bytes as `fusegrad bench`.
"""

import argparse
import json
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

SHAPES = [(4096, 768), (16384, 1024), (8192, 4096), (65536, 256),
          (1024, 16384), (512, 2048), (32768, 128), (2048, 65536)]


def median_time(f, budget):
    f()
    t0 = time.perf_counter()
    f()
    probe = time.perf_counter() - t0
    reps = max(5, min(200, int(budget / max(probe, 1e-9))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), reps


def measure(n, d, budget):
    g = torch.Generator().manual_seed(42)
    x = torch.randn(n, d, generator=g).requires_grad_()
    dy = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g).requires_grad_()
    b = torch.randn(d, generator=g).requires_grad_()
    fwd_s, reps = median_time(lambda: F.layer_norm(x, (d,), w, b, 1e-5), budget)
    y = F.layer_norm(x, (d,), w, b, 1e-5)
    bwd_s, _ = median_time(
        lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True), budget)
    min_bytes = 20.0 * n * d + 20.0 * d
    return {"n": n, "d": d, "reps": reps, "fwd_s": fwd_s, "bwd_s": bwd_s,
            "gbps": min_bytes / (fwd_s + bwd_s) / 1e9}


BENCH_PROBE = ["cargo", "bench", "-q", "--features", "probes", "--bench", "bench", "--"]


def fusegrad_time(binary, n, d, budget):
    """fwd + bwd seconds of one run of the bench probe on one shape."""
    cmd = [binary] if binary else BENCH_PROBE
    out = subprocess.run(cmd + ["--json", "--no-composed", "--budget", str(budget),
                                "--shape", f"{n}x{d}"], check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)["shapes"][0]
    return r["fwd_s"] + r["bwd_s"]


def interleaved(shapes, rounds, binary, budget):
    """Per shape, `rounds` alternations of fusegrad and torch; the ratios."""
    for n, d in shapes:
        ratios = []
        for _ in range(rounds):
            f = fusegrad_time(binary, n, d, budget)
            r = measure(n, d, budget)
            ratios.append((r["fwd_s"] + r["bwd_s"]) / f)
        med = statistics.median(ratios)
        print(f"{n:>7} x {d:<6} fusegrad/torch speed, {rounds} rounds: "
              + ", ".join(f"{x:.2f}x" for x in ratios) + f"   median {med:.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per pass per shape")
    ap.add_argument("--fusegrad", help="JSON from `fusegrad bench --json`, for the ratio")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rounds", type=int, default=0,
                    help="alternate fusegrad and torch this many times per shape")
    ap.add_argument("--fusegrad-bin", default="",
                    help="a built bench probe (default: run it through cargo bench), for --rounds")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.rounds > 0:
        interleaved(SHAPES, args.rounds, args.fusegrad_bin, args.budget)
        print(f"torch {torch.__version__}, {args.threads} threads, default allocator")
        return
    fg = {}
    if args.fusegrad:
        with open(args.fusegrad) as f:
            fg = {(r["n"], r["d"]): r for r in json.load(f)["shapes"]}
    shapes = list(fg) if fg else SHAPES
    rows = []
    for n, d in shapes:
        r = measure(n, d, args.budget)
        if (n, d) in fg:
            f = fg[(n, d)]
            r["fusegrad_s"] = f["fwd_s"] + f["bwd_s"]
            r["speedup"] = (r["fwd_s"] + r["bwd_s"]) / r["fusegrad_s"]
        rows.append(r)
        if not args.json:
            line = (f"{n:>7} x {d:<6} torch fwd {r['fwd_s'] * 1e3:8.3f} ms  bwd "
                    f"{r['bwd_s'] * 1e3:8.3f} ms  {r['gbps']:6.1f} GB/s")
            if "speedup" in r:
                line += (f"   fusegrad {r['fusegrad_s'] * 1e3:8.3f} ms  "
                         f"fusegrad/torch speed {r['speedup']:5.2f}x")
            print(line, flush=True)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": args.threads,
                          "shapes": rows}))
    else:
        print(f"torch {torch.__version__}, {args.threads} threads, default allocator")


if __name__ == "__main__":
    main()
