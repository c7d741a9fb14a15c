#!/usr/bin/env python3
"""fusegrad's default transformer training step in PyTorch eager, op for op.

The twin of `fusegrad bench --train`: the same model (4 layers, 4 heads,
width 128, context 64, the vocabulary of fusegrad's own text), batch 16,
the same step (forward, cross-entropy, backward, clip_grad_norm_ 1.0,
AdamW lr 2e-3 on the warmup-cosine schedule, weight decay 0.01), and the
same figures: median step time, tokens/s (batch * context over it), peak
resident memory and its rise above the resident set before the model was
built. `--json` prints them as one object with the keys fusegrad's uses.

The model is written as src/nn/transformer.rs builds it: token plus
position embeddings (normal, std 0.02); pre-norm blocks of `nn.LayerNorm`
(eps 1e-5), one `nn.Linear(width, 3 width)` for q, k and v, split into
heads by reshape and permute, scores `q @ k^T` times `1/sqrt(head_dim)`,
`masked_fill` of the future with -inf, `softmax`, `@ v`, the heads
merged, `nn.Linear` projection and residual; `nn.Linear(width, 4 width)`,
exact GELU, `nn.Linear(4 width, width)` and residual; a final LayerNorm
and a `nn.Linear` head; Linear weights normal(0, 0.02), biases zero.
`--sdpa` replaces the attention's scores, mask, softmax and `@ v` with
`F.scaled_dot_product_attention(is_causal=True)`.

Optional and kept out of the tests and CI: it needs torch, which fusegrad
does not. Install it outside the repository:

    python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch

`--rounds K` is the driver: K rounds, each running `fusegrad bench --train
--json` (the binary given by `--fusegrad-bin`), then this script
op for op, then with `--sdpa`, each in a fresh process; it prints every
round and the medians of the per-round ratios (fusegrad over torch).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_text(root=REPO):
    """fusegrad's `app::transformer::own_text`: the .rs and .md files of
    src, ops, cli, docs, examples and tests (no `target` folder), and
    README.md, sorted by path."""
    files = []
    for d in ["src", "ops", "cli", "docs", "examples", "tests"]:
        for dirpath, dirs, names in os.walk(os.path.join(root, d)):
            dirs[:] = [x for x in dirs if x != "target"]
            files += [os.path.join(dirpath, n) for n in names if n.endswith((".rs", ".md"))]
    files.append(os.path.join(root, "README.md"))
    text = []
    for f in sorted(files):
        try:
            with open(f, encoding="utf-8") as fh:
                text.append(fh.read())
        except (OSError, UnicodeDecodeError):
            pass
    return "".join(text)


def status_bytes(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in bytes, or 0."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak():
    """Resets VmHWM to the current resident set (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def lr_at(s, peak, low, warmup, total):
    """fusegrad's WarmupCosine."""
    if s < warmup:
        return peak * (s + 1) / warmup
    if s >= total:
        return low
    q = (s - warmup) / max(total - warmup, 1)
    return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * q))


def build(vocab, context, width, heads, layers, sdpa):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def linear(i, o):
        lin = nn.Linear(i, o)
        nn.init.normal_(lin.weight, 0.0, 0.02)
        nn.init.zeros_(lin.bias)
        return lin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = linear(width, 3 * width)
            self.proj = linear(width, width)
            mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x):
            b, t, w = x.shape
            hd = w // heads
            qkv = self.qkv(x).reshape(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))
                y = torch.softmax(scores, dim=-1) @ v
            return self.proj(y.permute(0, 2, 1, 3).reshape(b, t, w))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width, eps=1e-5)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(width, eps=1e-5)
            self.fc1 = linear(width, 4 * width)
            self.fc2 = linear(4 * width, width)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            nn.init.normal_(self.wte.weight, 0.0, 0.02)
            nn.init.normal_(self.wpe.weight, 0.0, 0.02)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width, eps=1e-5)
            self.head = linear(width, vocab)

        def forward(self, ids):
            t = ids.shape[1]
            x = self.wte(ids) + self.wpe(torch.arange(t))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return Gpt()


def run(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = own_text()
    chars = sorted(set(text))
    vocab = args.vocab or len(chars)
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] % vocab for c in text], dtype=torch.long)
    train = ids[: len(ids) * 9 // 10]
    b, t = args.batch, args.context
    prior_peak = status_bytes("VmHWM")
    baseline = status_bytes("VmRSS")
    reset = reset_peak()
    model = build(vocab, t, args.width, args.heads, args.layers, args.sdpa)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(t + 1)

    def step(s):
        starts = torch.randint(0, len(train) - t - 1, (b,), generator=g)
        win = train[starts[:, None] + offsets]
        x, y = win[:, :-1], win[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(b * t, vocab), y.reshape(b * t))
        value = loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(s, args.lr, args.lr / 10, 50, 2000)
        opt.step()
        return value

    s = 0
    for _ in range(args.warmup):
        step(s)
        s += 1
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step(s)
        times.append(time.perf_counter() - t0)
        s += 1
    peak_now = status_bytes("VmHWM")
    med = statistics.median(times)
    return {
        "bench": "train",
        "framework": "torch-sdpa" if args.sdpa else "torch",
        "torch": torch.__version__,
        "layers": args.layers, "heads": args.heads, "width": args.width, "context": t,
        "batch": b, "vocab": vocab, "threads": torch.get_num_threads(),
        "warmup": args.warmup, "steps": args.steps,
        "step_ms_median": round(med * 1e3, 3),
        "step_ms_min": round(min(times) * 1e3, 3),
        "step_ms_max": round(max(times) * 1e3, 3),
        "tokens_per_s": round(b * t / med, 1),
        "peak_rss_mb": round((max(peak_now, prior_peak) if reset else peak_now) / 1e6, 1),
        "peak_rss_increase_mb": round(max(peak_now - baseline, 0) / 1e6, 1),
        "baseline_rss_mb": round(baseline / 1e6, 1),
        "peak_reset": reset,
        "load_avg": round(os.getloadavg()[0], 2),
    }


def child(args, extra):
    """One run of this script in a fresh process: its JSON object."""
    cmd = [sys.executable, os.path.abspath(__file__), "--json", "--threads", str(args.threads),
           "--steps", str(args.steps), "--warmup", str(args.warmup)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def rounds(args):
    fg_cmd = [args.fusegrad_bin, "bench", "--train", "--json"] + args.fusegrad_args.split()
    rows = []
    for k in range(args.rounds):
        out = subprocess.run(fg_cmd, check=True, capture_output=True, text=True, cwd=REPO)
        fg = json.loads(out.stdout)
        if not args.threads_given:
            args.threads = fg["threads"]
        extra = ["--vocab", str(fg["vocab"])]
        eager = child(args, extra)
        sdpa = child(args, extra + ["--sdpa"])
        row = {"fusegrad": fg, "torch": eager, "torch_sdpa": sdpa}
        rows.append(row)
        print(f"round {k + 1}: " + "; ".join(
            f"{n} {r['tokens_per_s']:,.0f} tok/s, {r['step_ms_median']:.1f} ms, "
            f"peak {r['peak_rss_mb']:.0f} MB (+{r['peak_rss_increase_mb']:.0f})"
            for n, r in [("fusegrad", fg), ("torch", eager), ("torch-sdpa", sdpa)])
            + f"; load {os.getloadavg()[0]:.1f}", flush=True,
            file=sys.stderr if args.json else sys.stdout)
    summary = {}
    for key in ["fusegrad", "torch", "torch_sdpa"]:
        rs = [r[key] for r in rows]
        summary[key] = {f: statistics.median(r[f] for r in rs)
                        for f in ["tokens_per_s", "step_ms_median", "peak_rss_mb",
                                  "peak_rss_increase_mb"]}
    for key in ["torch", "torch_sdpa"]:
        summary["fusegrad_over_" + key] = {
            "tokens_per_s": statistics.median(
                r["fusegrad"]["tokens_per_s"] / r[key]["tokens_per_s"] for r in rows),
            "peak_rss": statistics.median(
                r["fusegrad"]["peak_rss_mb"] / r[key]["peak_rss_mb"] for r in rows),
            "peak_rss_increase": statistics.median(
                r["fusegrad"]["peak_rss_increase_mb"] / r[key]["peak_rss_increase_mb"]
                for r in rows),
        }
    if args.json:
        print(json.dumps({"rounds": rows, "medians": summary}))
        return
    t = rows[0]["torch"]
    print(f"\nmedians of {args.rounds} rounds (torch {t['torch']}, {t['threads']} threads; "
          f"fusegrad {rows[0]['fusegrad']['threads']} threads):")
    print(f"{'':<12} {'tokens/s':>10} {'step ms':>9} {'peak MB':>8} {'rise MB':>8}")
    for key, name in [("fusegrad", "fusegrad"), ("torch", "torch"), ("torch_sdpa", "torch-sdpa")]:
        m = summary[key]
        print(f"{name:<12} {m['tokens_per_s']:>10,.0f} {m['step_ms_median']:>9.1f} "
              f"{m['peak_rss_mb']:>8.0f} {m['peak_rss_increase_mb']:>8.0f}")
    for key, name in [("torch", "torch eager"), ("torch_sdpa", "torch SDPA")]:
        m = summary["fusegrad_over_" + key]
        print(f"fusegrad / {name}: tokens/s {m['tokens_per_s']:.2f}x, peak RSS "
              f"{m['peak_rss']:.2f}x, peak rise {m['peak_rss_increase']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default 2; with --rounds, fusegrad's count)")
    ap.add_argument("--steps", type=int, default=300, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sdpa", action="store_true",
                    help="attention through F.scaled_dot_product_attention(is_causal=True)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--vocab", type=int, default=0,
                    help="vocabulary (default: the alphabet of fusegrad's own text)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=0,
                    help="alternate fusegrad, torch and torch --sdpa this many times")
    ap.add_argument("--fusegrad-bin", default=os.path.join(REPO, "target/release/fusegrad"))
    ap.add_argument("--fusegrad-args", default="--profile-every 0",
                    help="extra arguments of `fusegrad bench --train --json`, for --rounds")
    args = ap.parse_args()
    args.threads_given = args.threads is not None
    if args.threads is None:
        args.threads = 2
    if args.rounds > 0:
        rounds(args)
        return
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['framework']} {r['torch']}, {r['threads']} threads: {r['layers']} layers, "
          f"{r['heads']} heads, width {r['width']}, context {r['context']}, vocabulary "
          f"{r['vocab']}; batch {r['batch']}")
    print(f"{r['steps']} timed steps after {r['warmup']} warm-up: median "
          f"{r['step_ms_median']:.1f} ms (fastest {r['step_ms_min']:.1f}, slowest "
          f"{r['step_ms_max']:.1f}), {r['tokens_per_s']:,.0f} tokens/s")
    print(f"memory: peak resident {r['peak_rss_mb']:.0f} MB; during the bench "
          f"{r['peak_rss_increase_mb']:.0f} MB above the {r['baseline_rss_mb']:.0f} MB before "
          f"the model was built")


if __name__ == "__main__":
    main()
