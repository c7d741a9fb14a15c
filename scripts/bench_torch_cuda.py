#!/usr/bin/env python3
"""PyTorch's layer_norm and rms_norm on a GPU, forward and backward, on
exactly the shapes and dtypes of a `fusegrad bench --device cuda --json`
run (its JSON Lines), with as many reps, timed the same way: CUDA events
around the op, a GPU spin queued ahead of the start event so the window
holds the device work only, median of the reps after warm-up.

usage: bench_torch_cuda.py --fusegrad bench-cuda.jsonl [--table FILE] [--reps N]

Prints one JSON object per line, keys op, dtype, n, d, fwd_us, bwd_us (and
late_reps: reps whose start event fired before the host had queued the
op). With --table, also writes a Markdown table of fusegrad against torch
to FILE, rewritten after every row. Exit status 1, with a line on stderr,
when the fusegrad file has no complete row or torch (with CUDA) is missing. The reading and table functions
need no torch: `import bench_torch_cuda` works anywhere.
"""
import argparse
import json
import math
import os
import statistics
import sys

ROW_KEYS = ("op", "dtype", "n", "d", "fwd_us", "bwd_us")


class NoRows(Exception):
    """The fusegrad file has no complete row."""


def read_fusegrad(lines):
    """(header, rows, skipped) from fusegrad's JSON Lines: the header is
    the first object without "op" (or {}), rows are the objects with every
    key of ROW_KEYS, in file order; skipped counts lines that are not such
    objects (a line cut short by a timeout is one)."""
    header, rows, skipped = {}, [], 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(obj, dict):
            skipped += 1
        elif "op" not in obj:
            header = header or obj
        elif all(k in obj for k in ROW_KEYS):
            rows.append(obj)
        else:
            skipped += 1
    return header, rows, skipped


def load_fusegrad(path):
    """read_fusegrad on a file; NoRows with a sentence when nothing usable
    is there."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            header, rows, skipped = read_fusegrad(f)
    except OSError as e:
        raise NoRows("cannot read %s: %s" % (path, e.strerror or e))
    if not rows:
        what = "is empty" if not header and not skipped else "has no complete row"
        raise NoRows("%s %s (did `fusegrad bench --device cuda --json` finish a row?)"
                     % (path, what))
    return header, rows, skipped


def cases(rows):
    """(op, dtype, n, d) of every row, first occurrence order, no repeats."""
    seen, out = set(), []
    for r in rows:
        k = (r["op"], r["dtype"], int(r["n"]), int(r["d"]))
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out


def _f(v, digits=1):
    return "-" if v is None or not math.isfinite(v) else "%.*f" % (digits, v)


def _ratio(a, b):
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def markdown(fg_rows, torch_rows):
    """The side-by-side table: per fusegrad row, its times and fractions of
    the same-run copy, torch's times (where measured) and torch / fusegrad
    (above 1: fusegrad is faster)."""
    torch = {(r["op"], r["dtype"], int(r["n"]), int(r["d"])): r for r in torch_rows}
    out = [
        "| op | dtype | N x D | fusegrad fwd µs | fusegrad bwd µs | torch fwd µs "
        "| torch bwd µs | torch/fusegrad fwd | torch/fusegrad bwd "
        "| fusegrad fwd of copy | fusegrad bwd of copy |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in fg_rows:
        key = (r["op"], r["dtype"], int(r["n"]), int(r["d"]))
        t = torch.get(key, {})
        ff, fb = r.get("fwd_us"), r.get("bwd_us")
        tf, tb = t.get("fwd_us"), t.get("bwd_us")
        out.append("| %s | %s | %dx%d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key[0], key[1], key[2], key[3], _f(ff), _f(fb), _f(tf), _f(tb),
            _f(_ratio(tf, ff), 2), _f(_ratio(tb, fb), 2),
            _f(r.get("fwd_of_copy"), 2), _f(r.get("bwd_of_copy"), 2)))
    return "\n".join(out) + "\n"


def write_table(path, fg_rows, torch_rows):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(markdown(fg_rows, torch_rows))
    os.replace(path + ".tmp", path)


# ---- torch (imported only here) ---------------------------------------------

def import_torch():
    """torch with a usable GPU, or None after printing why not."""
    try:
        import torch
        import torch.nn.functional  # noqa: F401
    except ImportError as e:
        print("bench_torch_cuda: torch is missing (%s): install PyTorch with CUDA to compare" % e,
              file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("bench_torch_cuda: torch %s sees no CUDA GPU: nothing to compare" % torch.__version__,
              file=sys.stderr)
        return None
    return torch


class Timer:
    """CUDA-event windows with torch.cuda._sleep ahead of the start event,
    the spin doubling whenever the start event fired before the host had
    queued the op (as fusegrad's bench does)."""

    START, MAX = 400_000, 1 << 26

    def __init__(self, torch):
        self.torch = torch
        self.cycles = self.START
        self.start = torch.cuda.Event(enable_timing=True)
        self.stop = torch.cuda.Event(enable_timing=True)
        self.late = 0

    def window(self, s, f):
        self.torch.cuda._sleep(self.cycles)
        self.start.record()
        f(s)
        self.stop.record()
        late = self.start.query()
        if late:
            self.cycles = min(2 * self.cycles, self.MAX)
        self.stop.synchronize()
        return self.start.elapsed_time(self.stop) * 1e3, late

    def median(self, setup, f, reps, warm=3):
        w = 0
        while True:
            _, late = self.window(setup(), f)
            w += 1
            if w >= warm and (not late or w >= warm + 4):
                break
        ts = []
        for _ in range(max(reps, 1)):
            us, late = self.window(setup(), f)
            self.late += late
            ts.append(us)
        return statistics.median(ts)


DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16"}


def measure(torch, timer, op, dtype, n, d, reps):
    """torch's forward and backward times (µs) for one case, or None when
    this torch lacks the op or the dtype."""
    F = torch.nn.functional
    if dtype not in DTYPES or (op == "rms_norm" and not hasattr(F, "rms_norm")):
        return None
    dt = getattr(torch, DTYPES[dtype])
    x = torch.randn(n, d, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(d, device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(d, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(n, d, device="cuda", dtype=dt)
    if op == "layer_norm":
        fwd, ins = (lambda: F.layer_norm(x, (d,), g, b, 1e-5)), (x, g, b)
    elif op == "rms_norm":
        fwd, ins = (lambda: F.rms_norm(x, (d,), g, 1e-6)), (x, g)
    else:
        return None
    timer.late = 0
    t_f = timer.median(lambda: None, lambda _: fwd(), reps)
    t_b = timer.median(fwd, lambda y: torch.autograd.grad(y, ins, dy), reps)
    return t_f, t_b, timer.late


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fusegrad", required=True, metavar="FILE",
                    help="fusegrad bench --device cuda --json output (JSON Lines)")
    ap.add_argument("--table", metavar="FILE", help="also write a Markdown side-by-side table")
    ap.add_argument("--reps", type=int, help="timed reps (default: the fusegrad run's, else 20)")
    ap.add_argument("--table-only", action="store_true",
                    help="print fusegrad's rows as the Markdown table, without torch")
    a = ap.parse_args(argv)
    try:
        header, fg_rows, skipped = load_fusegrad(a.fusegrad)
    except NoRows as e:
        print("bench_torch_cuda: %s" % e, file=sys.stderr)
        return 1
    if skipped:
        print("bench_torch_cuda: %s: skipped %d line(s) that are not complete rows"
              % (a.fusegrad, skipped), file=sys.stderr)
    if a.table_only:
        sys.stdout.write(markdown(fg_rows, []))
        return 0
    reps = a.reps or int(header.get("reps") or 20)
    torch = import_torch()
    if torch is None:
        return 1
    timer = Timer(torch)
    torch_rows = []
    for op, dtype, n, d in cases(fg_rows):
        m = measure(torch, timer, op, dtype, n, d, reps)
        if m is None:
            print("bench_torch_cuda: torch %s has no %s for %s: skipped"
                  % (torch.__version__, op, dtype), file=sys.stderr)
            continue
        row = {"op": op, "dtype": dtype, "n": n, "d": d,
               "fwd_us": round(m[0], 2), "bwd_us": round(m[1], 2), "late_reps": m[2]}
        torch_rows.append(row)
        print(json.dumps(row, separators=(",", ":")), flush=True)
        if a.table:
            write_table(a.table, fg_rows, torch_rows)
        torch.cuda.empty_cache()
    if a.table:
        write_table(a.table, fg_rows, torch_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
