//! `fusegrad bench`: fused against composed LayerNorm and a plain copy, shape
//! by shape, in one process and one run, so every figure is a same-run ratio.

use crate::error::Result;
use crate::rng::Rng;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use crate::{ops, Error};
use rayon::prelude::*;
use std::time::Instant;

/// The shapes (N, D) of the targets.
pub const SHAPES: [(usize, usize); 8] = [
    (4096, 768),
    (16384, 1024),
    (8192, 4096),
    (65536, 256),
    (1024, 16384),
    (512, 2048),
    (32768, 128),
    (2048, 65536),
];

/// Minimal bytes per element moved by the fused f32 forward (read x, write y).
pub const FWD_BYTES_PER_ELEM: usize = 8;
/// ... and backward (read x and dy, write dx).
pub const BWD_BYTES_PER_ELEM: usize = 12;

/// One shape's figures. Times are medians in seconds.
#[derive(Debug, Clone)]
pub struct Row {
    pub n: usize,
    pub d: usize,
    pub fwd_s: f64,
    pub bwd_s: f64,
    /// Minimal bytes for forward + backward (per-element traffic plus the
    /// gamma/beta reads and dgamma/dbeta writes).
    pub min_bytes: f64,
    /// Effective GB/s of fwd+bwd over `min_bytes`.
    pub gbps: f64,
    /// Same-run copy rate: read+write bytes over time, GB/s.
    pub copy_gbps: f64,
    /// `gbps / copy_gbps`.
    pub copy_fraction: f64,
    /// Composed fwd+bwd median time (None if skipped).
    pub composed_s: Option<f64>,
    /// composed time / fused time.
    pub speedup: Option<f64>,
}

/// Median of `reps` timings of `f` after `warm` untimed calls.
pub fn median_time(warm: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warm {
        f()?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Repetitions so that one measurement takes about `budget_s` given one
/// timed call of `probe_s`.
fn reps_for(probe_s: f64, budget_s: f64) -> usize {
    ((budget_s / probe_s.max(1e-9)) as usize).clamp(3, 200)
}

/// Parallel copy of `src` into `dst`, chunked like the kernels.
fn par_copy(dst: &mut [f32], src: &[f32]) {
    const CHUNK: usize = 64 * 1024;
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Measures one shape. `composed` runs the composed twin too.
pub fn measure(n: usize, d: usize, budget_s: f64, composed: bool) -> Result<Row> {
    let numel = n.checked_mul(d).ok_or(Error::ShapeTooLarge {
        op: "bench",
        shape: vec![n, d],
    })?;
    let mut rng = Rng::new(42);
    let x = Tensor::from_vec(vec![n, d], random(&mut rng, numel))?;
    let dy = Tensor::from_vec(vec![n, d], random(&mut rng, numel))?;
    let gamma = Tensor::from_vec(vec![d], random(&mut rng, d))?;
    let beta = Tensor::from_vec(vec![d], random(&mut rng, d))?;

    let tape = Tape::new();
    let (xv, gv, bv) = (tape.var(x.clone()), tape.var(gamma.clone()), tape.var(beta.clone()));
    let fwd = || ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5);
    let s = Instant::now();
    let y = fwd()?;
    let probe = s.elapsed().as_secs_f64();
    let reps = reps_for(probe, budget_s);
    // Forward on a fresh tape each time would measure tape growth too; the
    // tape only grows by one node per call, which is negligible here.
    let fwd_s = median_time(2, reps, || fwd().map(|_| ()))?;
    let bwd_s = median_time(2, reps, || y.backward_with(&dy).map(|_| ()))?;

    let src = x.as_slice()?;
    let mut dst = vec![0.0f32; numel];
    let copy_s = median_time(2, reps, || {
        par_copy(&mut dst, src);
        Ok(())
    })?;
    let copy_gbps = 2.0 * (numel * 4) as f64 / copy_s / 1e9;

    let elems = numel as f64;
    let min_bytes = elems * (FWD_BYTES_PER_ELEM + BWD_BYTES_PER_ELEM) as f64 + (d * 4 * 5) as f64;
    let gbps = min_bytes / (fwd_s + bwd_s) / 1e9;

    let composed_s = if composed {
        let run = || -> Result<()> {
            let tape = Tape::new();
            let v: Vec<Var<f32>> = [&x, &gamma, &beta].iter().map(|t| tape.var((*t).clone())).collect();
            let y = ops::layer_norm_composed(&v[0], Some(&v[1]), Some(&v[2]), 1e-5)?;
            y.backward_with(&dy).map(|_| ())
        };
        let s = Instant::now();
        run()?;
        let probe = s.elapsed().as_secs_f64();
        Some(median_time(0, reps_for(probe, budget_s).min(7), run)?)
    } else {
        None
    };
    let fused = fwd_s + bwd_s;
    Ok(Row {
        n,
        d,
        fwd_s,
        bwd_s,
        min_bytes,
        gbps,
        copy_gbps,
        copy_fraction: gbps / copy_gbps,
        composed_s,
        speedup: composed_s.map(|c| c / fused),
    })
}

/// Table header for [`Row`]'s Display.
pub const HEADER: &str =
    "       N x D       fwd ms   bwd ms   GB/s  copy GB/s  of copy  composed ms  speed-up";

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7} x {:<6} {:>8.3} {:>8.3} {:>6.1} {:>10.1} {:>8.2}",
            self.n,
            self.d,
            self.fwd_s * 1e3,
            self.bwd_s * 1e3,
            self.gbps,
            self.copy_gbps,
            self.copy_fraction
        )?;
        match (self.composed_s, self.speedup) {
            (Some(c), Some(s)) => write!(f, " {:>12.2} {:>8.1}x", c * 1e3, s),
            _ => write!(f, " {:>12} {:>9}", "-", "-"),
        }
    }
}

impl Row {
    /// The row as a JSON object.
    pub fn json(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:e}"));
        format!(
            "{{\"n\":{},\"d\":{},\"fwd_s\":{:e},\"bwd_s\":{:e},\"min_bytes\":{:e},\"gbps\":{:.3},\"copy_gbps\":{:.3},\"copy_fraction\":{:.4},\"composed_s\":{},\"speedup\":{}}}",
            self.n,
            self.d,
            self.fwd_s,
            self.bwd_s,
            self.min_bytes,
            self.gbps,
            self.copy_gbps,
            self.copy_fraction,
            opt(self.composed_s),
            opt(self.speedup)
        )
    }
}

/// Time per op of recording and sweeping a chain of `len` tiny ops.
pub fn tape_overhead(len: usize, reps: usize) -> Result<f64> {
    let x0 = Tensor::from_vec(vec![4], vec![0.5f32, -0.25, 1.0, 2.0])?;
    let seed = Tensor::from_vec(vec![4], vec![1.0f32, -1.0, 0.5, 0.25])?;
    let t = median_time(3, reps, || {
        let tape = Tape::new();
        let c = tape.constant(x0.clone());
        let mut v = tape.var(x0.clone());
        for i in 0..len {
            v = if i % 2 == 0 {
                ops::scalar_mul(&v, 0.999)?
            } else {
                ops::add(&v, &c)?
            };
        }
        v.backward_with(&seed).map(|_| ())
    })?;
    Ok(t / len as f64)
}
