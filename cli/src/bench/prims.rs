//! Primitive ops against the memory: `add` and `mul` (same shape) forward
//! and backward, and `sum` / `sum_axes` forward, each timed interleaved
//! with a same-run copy (for ops that write) or a same-run read (for the
//! reductions) of the same bytes, as ratios of rates.
//!
//! Minimal bytes per element (f32): `add`/`mul` forward read `a`, `b` and
//! write `y` (12); `mul` backward reads `g`, `a`, `b` and writes `da`,
//! `db` (20); `add` backward hands `g` on to both inputs, so it moves
//! nothing and is reported as a time only. The reductions read `x` (4).
//!
//! The elementwise functions (`gelu`, `tanh`, `sigmoid`, `exp`, `log`)
//! read `x` and write `y` forward (8) and read `g` and the saved tensor
//! (`x` or `y`) and write `dx` backward (12). `log` runs on `|x| + 0.5`
//! so that its input is positive.

use super::{best_copy, median, reps_for};
use fusegrad::error::Result;
use fusegrad::ops;
use fusegrad::probes::cpu;
use fusegrad::rng::Rng;
use fusegrad::tape::{Tape, Var};
use fusegrad::tensor::Tensor;
use std::time::Instant;

/// The shapes (N, D) of the primitive targets.
pub const PRIM_SHAPES: [(usize, usize); 2] = [(4096, 768), (16384, 1024)];

/// One primitive on one shape.
#[derive(Debug, Clone)]
pub struct PrimRow {
    /// The op and pass, e.g. `mul bwd` or `sum_axes(0)`.
    pub what: String,
    /// Rows and columns of the operands.
    pub n: usize,
    /// Columns.
    pub d: usize,
    /// Median seconds.
    pub s: f64,
    /// Minimal bytes moved (0 where nothing need move).
    pub bytes: f64,
    /// The op's rate over the baseline's rate in the same reps (`None`
    /// where it moves nothing).
    pub fraction: Option<f64>,
    /// `copy` or `read`: the baseline.
    pub baseline: &'static str,
}

impl std::fmt::Display for PrimRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let frac = self.fraction.map_or("   (moves nothing)".into(), |v| {
            format!("{v:>8.2} of {}", self.baseline)
        });
        write!(
            f,
            "{:<14} {:>6} x {:<5} {:>9.3} ms {:>7.1} GB/s {frac}",
            self.what,
            self.n,
            self.d,
            self.s * 1e3,
            self.bytes / self.s / 1e9
        )
    }
}

impl PrimRow {
    /// The row as one JSON object.
    pub fn json(&self) -> String {
        format!(
            "{{\"op\":\"{}\",\"n\":{},\"d\":{},\"s\":{},\"bytes\":{},\"fraction\":{},\"baseline\":\"{}\"}}",
            self.what,
            self.n,
            self.d,
            super::num(self.s),
            self.bytes,
            self.fraction.map_or("null".into(), super::num),
            self.baseline
        )
    }
}

/// The fastest of a threaded read of `src` (each thread folds its block's
/// bits with `|`, which vectorizes and adds no rounding), in seconds.
fn read(src: &[f32]) -> f64 {
    let per = src.len().div_ceil(rayon::current_num_threads()).max(1);
    let s = Instant::now();
    let folds = cpu::run_each(src.chunks(per).collect(), |c| {
        c.iter().fold(0u32, |a, v| a | v.to_bits())
    });
    std::hint::black_box(folds);
    s.elapsed().as_secs_f64()
}

/// Runs `op` (which returns the seconds of its timed part) and the
/// baseline interleaved for about `budget_s`; returns (median op seconds,
/// median baseline seconds).
fn paired(
    budget_s: f64,
    mut op: impl FnMut() -> Result<f64>,
    mut base: impl FnMut() -> f64,
) -> Result<(f64, f64)> {
    let mut probe = f64::INFINITY;
    for _ in 0..3 {
        probe = probe.min(op()?);
        base();
    }
    let reps = reps_for(probe, budget_s, 5, 200);
    let (mut to, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        to.push(op()?);
        tb.push(base());
    }
    Ok((median(&mut to), median(&mut tb)))
}

/// Seconds of `f`.
fn timed<R>(f: impl FnOnce() -> Result<R>) -> Result<(R, f64)> {
    let s = Instant::now();
    let r = f()?;
    Ok((r, s.elapsed().as_secs_f64()))
}

/// Every primitive row for one shape.
pub fn measure_prims(n: usize, d: usize, budget_s: f64) -> Result<Vec<PrimRow>> {
    let numel = n * d;
    let mut rng = Rng::new(7);
    let mut rand = || -> Result<Tensor<f32>> {
        let v: Vec<f32> = (0..numel).map(|_| rng.normal() as f32).collect();
        Tensor::from_slice(&[n, d], &v)
    };
    let (a, b, g) = (rand()?, rand()?, rand()?);
    let mut rows = Vec::new();
    // A copy of `elems` f32 moves 8 bytes per element: sized per op so
    // that both sides move the same bytes.
    let pair = |bytes: f64| -> Vec<(Vec<f32>, Vec<f32>)> {
        let elems = ((bytes / 8.0) as usize).max(1);
        let mut src = fusegrad::probes::pool::fresh::<f32>(elems);
        src.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        vec![(src, fusegrad::probes::pool::fresh::<f32>(elems))]
    };
    let mut row = |what: String, (s, base_s): (f64, f64), bytes: f64, baseline| {
        rows.push(PrimRow {
            what,
            n,
            d,
            s,
            bytes,
            fraction: (bytes > 0.0).then(|| base_s / s),
            baseline,
        })
    };
    for (name, mul) in [("add", false), ("mul", true)] {
        let apply = |x: &Var<f32>, y: &Var<f32>| {
            if mul {
                ops::mul(x, y)
            } else {
                ops::add(x, y)
            }
        };
        let fwd_bytes = 12.0 * numel as f64;
        let mut cp = pair(fwd_bytes);
        let fwd = || {
            let t = Tape::new();
            let (x, y) = (t.var(a.clone()), t.var(b.clone()));
            timed(|| apply(&x, &y)).map(|(out, s)| {
                drop(out);
                s
            })
        };
        row(
            format!("{name} fwd"),
            paired(budget_s, fwd, || best_copy(&mut cp))?,
            fwd_bytes,
            "copy",
        );
        let bwd_bytes = if mul { 20.0 * numel as f64 } else { 0.0 };
        let mut cp = pair(bwd_bytes);
        let bwd = || {
            let t = Tape::new();
            let (x, y) = (t.var(a.clone()), t.var(b.clone()));
            let out = apply(&x, &y)?;
            timed(|| out.backward_with(&g)).map(|(grads, s)| {
                drop(grads);
                s
            })
        };
        row(
            format!("{name} bwd"),
            paired(budget_s, bwd, || best_copy(&mut cp))?,
            bwd_bytes,
            "copy",
        );
    }
    // Elementwise functions: forward and backward against a copy of the
    // bytes each moves.
    let pos: Tensor<f32> = {
        let v: Vec<f32> = a.as_slice()?.iter().map(|v| v.abs() + 0.5).collect();
        Tensor::from_slice(&[n, d], &v)?
    };
    type Fun = fn(&Var<f32>) -> Result<Var<f32>>;
    let funs: [(&str, Fun, &Tensor<f32>); 5] = [
        ("gelu", ops::gelu, &a),
        ("tanh", ops::tanh, &a),
        ("sigmoid", ops::sigmoid, &a),
        ("exp", ops::exp, &a),
        ("log", ops::log, &pos),
    ];
    for (name, f, x0) in funs {
        let fwd_bytes = 8.0 * numel as f64;
        let mut cp = pair(fwd_bytes);
        let fwd = || {
            let t = Tape::new();
            let x = t.var(x0.clone());
            timed(|| f(&x)).map(|(out, s)| {
                drop(out);
                s
            })
        };
        row(
            format!("{name} fwd"),
            paired(budget_s, fwd, || best_copy(&mut cp))?,
            fwd_bytes,
            "copy",
        );
        let bwd_bytes = 12.0 * numel as f64;
        let mut cp = pair(bwd_bytes);
        let bwd = || {
            let t = Tape::new();
            let x = t.var(x0.clone());
            let out = f(&x)?;
            timed(|| out.backward_with(&g)).map(|(grads, s)| {
                drop(grads);
                s
            })
        };
        row(
            format!("{name} bwd"),
            paired(budget_s, bwd, || best_copy(&mut cp))?,
            bwd_bytes,
            "copy",
        );
    }
    // The reductions read `x` once; the baseline reads the same bytes.
    let src: Vec<f32> = a.as_slice()?.to_vec();
    for (what, axes) in [
        ("sum", None),
        ("sum_axes(0)", Some(0)),
        ("sum_axes(1)", Some(1)),
    ] {
        let op = || {
            let t = Tape::new();
            let x = t.constant(a.clone());
            timed(|| match axes {
                None => ops::sum(&x),
                Some(ax) => ops::sum_axes(&x, &[ax], false),
            })
            .map(|(out, s)| {
                drop(out);
                s
            })
        };
        row(
            what.into(),
            paired(budget_s, op, || read(&src))?,
            4.0 * numel as f64,
            "read",
        );
    }
    Ok(rows)
}

/// [`measure_prims`] on every shape of [`PRIM_SHAPES`].
pub fn run_prims(budget_s: f64) -> Result<Vec<PrimRow>> {
    let mut rows = Vec::new();
    for &(n, d) in &PRIM_SHAPES {
        rows.extend(measure_prims(n, d, budget_s)?);
    }
    Ok(rows)
}

/// Table header for [`PrimRow`]'s Display.
pub const PRIM_HEADER: &str =
    "op               N x D         median      rate   of same-run baseline";
