#!/usr/bin/env python3
"""PyTorch's CPU matrix product on the products of the default transformer's
training step, stored as the step stores them: the twin of
`cargo bench --features probes --bench matmul` (same rows, same table).

    python3 scripts/bench_torch_matmul.py [--threads 2] [--reps 20] [--rows 1024]
"""
import argparse
import time

import torch

# (in, out) of the model's Linear layers and how often each is in a step.
LAYERS = [(128, 384), (128, 128), (128, 512), (512, 128), (128, 108)]
COUNT = [4, 4, 4, 4, 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = args.rows
    print(f"threads: {torch.get_num_threads()}, rows: {rows}, torch {torch.__version__}")
    total_s = total_flop = 0.0
    for (i, o), count in zip(LAYERS, COUNT):
        for what, (m, k, n), (ta, tb) in [
            ("forward", (rows, i, o), (False, False)),
            ("input grad", (rows, o, i), (False, True)),
            ("weight grad", (i, rows, o), (True, False)),
        ]:
            a = torch.randn(k, m).t() if ta else torch.randn(m, k)
            b = torch.randn(n, k).t() if tb else torch.randn(k, n)
            a @ b
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - start)
            s = sorted(times)[len(times) // 2]
            flop = 2.0 * m * k * n
            total_s += s * count
            total_flop += flop * count
            print(f"{f'[{m}, {k}] @ [{k}, {n}]':>22} {s * 1e3:10.3f} {flop / s / 1e9:9.1f}  {what}")
    print(
        f"one step's products: {total_s * 1e3:.2f} ms, {total_flop / 1e9:.2f} GFLOP, "
        f"{total_flop / total_s / 1e9:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
