#!/usr/bin/env python3
"""Step time of data-parallel training at N ranks, from a ring all-reduce
cost model (docs/distributed.md).

Per bucket of s bytes on N ranks, a ring all-reduce takes
    t(s) = 2 (N - 1) * latency + 2 (N - 1) / N * s / bandwidth.
Buckets (reverse parameter order, `bucket_mb` each) become ready evenly
through the backward and go over the link one after another; whatever
finishes after the backward is exposed. Weak scaling: the per-rank batch
and so the per-rank compute stay fixed.

Usage: scripts/dp_cost_model.py --step-ms MS [--params P] [--backward 0.6]
       [--gbps 100] [--latency-us 5] [--bucket-mb 25] [--ranks 8,64,512]
"""
import argparse
import math


def exposed(params, ranks, backward_s, gbps, latency_s, bucket_mb):
    size = 4 * params
    bucket = bucket_mb * 2**20
    n_buckets = max(1, math.ceil(size / bucket))
    bw = gbps * 1e9 / 8
    done = 0.0
    total = 0.0
    for i in range(n_buckets):
        s = min(bucket, size - i * bucket)
        t = 2 * (ranks - 1) * latency_s + 2 * (ranks - 1) / ranks * s / bw
        total += t
        ready = backward_s * (i + 1) / n_buckets
        done = max(done, ready) + t
    return max(0.0, done - backward_s), total, n_buckets


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--step-ms", type=float, required=True,
                   help="one rank's compute per step, measured (ms)")
    p.add_argument("--params", type=float, default=829_292)
    p.add_argument("--backward", type=float, default=0.6,
                   help="fraction of the step that is the backward sweep")
    p.add_argument("--gbps", type=float, default=100.0)
    p.add_argument("--latency-us", type=float, default=5.0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--ranks", default="8,64,512")
    p.add_argument("--wider", type=float, default=10.0,
                   help="also a model this many times wider (params x wider^2)")
    a = p.parse_args()
    print(f"{'model':>8} {'params':>12} {'ranks':>6} {'buckets':>8} {'comm ms':>9} "
          f"{'exposed ms':>11} {'step ms':>9} {'efficiency':>10}")
    for name, k in (("default", 1.0), (f"{a.wider:g}x wide", a.wider ** 2)):
        params = a.params * k
        step = a.step_ms / 1e3 * k  # compute grows with the parameters
        for n in [int(x) for x in a.ranks.split(",")]:
            e, total, b = exposed(params, n, a.backward * step, a.gbps,
                                  a.latency_us * 1e-6, a.bucket_mb)
            print(f"{name:>8} {params:12.3g} {n:6d} {b:8d} {total * 1e3:9.2f} "
                  f"{e * 1e3:11.2f} {(step + e) * 1e3:9.1f} {step / (step + e):10.1%}")
        n = 2
        while n < 2**24:
            e, _, _ = exposed(params, n, a.backward * step, a.gbps,
                              a.latency_us * 1e-6, a.bucket_mb)
            if e > 0.05 * step:
                break
            n *= 2
        print(f"{name:>8}: exposed communication passes 5% of the step at {n} ranks")


if __name__ == "__main__":
    main()
