#!/usr/bin/env python3
"""PyTorch's layer_norm and rms_norm on a GPU, forward and backward, on the
shapes of `fusegrad bench --device cuda`, timed with CUDA events (median of
20 reps after warm-up), printed next to fusegrad's figures.

usage: bench_torch_cuda.py --fusegrad bench-cuda.json   (fusegrad's --json)
Run by scripts/gpu-check.sh on the GPU machine; needs torch with CUDA.
"""
import argparse, json, statistics
import torch
import torch.nn.functional as F

SHAPES = [(32768, 4096), (8192, 8192), (16384, 1024), (4096, 768), (2048, 65536)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def timed(setup, f, reps=20, warm=3):
    for _ in range(warm):
        f(setup())
    ts = []
    for _ in range(reps):
        s = setup()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f(s)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def measure(op, n, d, dt):
    x = torch.randn(n, d, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(d, device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(d, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(n, d, device="cuda", dtype=dt)
    if op == "layer_norm":
        fwd = lambda: F.layer_norm(x, (d,), g, b, 1e-5)
        ins = (x, g, b)
    else:
        fwd = lambda: F.rms_norm(x, (d,), g, 1e-6)
        ins = (x, g)
    t_f = timed(lambda: None, lambda _: fwd())
    t_b = timed(fwd, lambda y: torch.autograd.grad(y, ins, dy))
    return t_f, t_b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fusegrad", help="fusegrad bench --device cuda --json output")
    a = ap.parse_args()
    fg = {}
    if a.fusegrad:
        for r in json.load(open(a.fusegrad))["rows"]:
            fg[(r["op"], r["dtype"], r["n"], r["d"])] = r
    print(f"{'op':<11} {'dtype':<5} {'N x D':<13} {'torch fwd':>10} {'torch bwd':>10} "
          f"{'fg fwd':>9} {'fg bwd':>9} {'torch/fg fwd+bwd':>17}")
    for n, d in SHAPES:
        for op in ("layer_norm", "rms_norm"):
            for name, dt in DTYPES.items():
                tf, tb = measure(op, n, d, dt)
                r = fg.get((op, name, n, d))
                ff, fb = (r["fwd_us"], r["bwd_us"]) if r else (float("nan"),) * 2
                print(f"{op:<11} {name:<5} {f'{n}x{d}':<13} {tf:>10.1f} {tb:>10.1f} "
                      f"{ff:>9.1f} {fb:>9.1f} {(tf + tb) / (ff + fb):>16.2f}x")
                torch.cuda.empty_cache()


main()
