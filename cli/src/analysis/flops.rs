//! FLOPs, counted by running the real kernels on [`Counted`] numbers and
//! fitted exactly by `a*N*D + b*N + c*D + e`.

use super::*;

pub use fusegrad::probes::counted::{self, Counted};

/// FLOPs of one pass as `per_elem*N*D + per_row*N + per_col*D + fixed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlopFit {
    /// Per element of x.
    pub per_elem: f64,
    /// Per row.
    pub per_row: f64,
    /// Per column (element of gamma).
    pub per_col: f64,
    /// Per call.
    pub fixed: f64,
    /// Whether the fit predicts a fifth, held-out shape exactly.
    pub exact: bool,
}

/// Counted FLOPs of forward and backward of one path at `(n, d)`, on this
/// thread (a one-thread pool runs every task on the caller's pool thread).
fn count_flops(norm: Norm, fused: bool, n: usize, d: usize) -> Result<(u64, u64)> {
    let case = Case::new(norm, &[n, d], &[d]);
    let inputs = case.inputs::<Counted>()?;
    let tape = Tape::new();
    let vars: Vec<Var<Counted>> = inputs.iter().map(|t| tape.var(t.clone())).collect();
    let (x, p) = split_first(&vars)?;
    counted::take();
    let y = case.apply(fused, x, p)?;
    let fwd = counted::take();
    let c: Vec<Counted> = Rng::new(1).vec(n * d).into_iter().map(Counted).collect();
    let seed = Tensor::from_vec(vec![n, d], c)?;
    counted::take();
    y.backward_with(&seed)?;
    let bwd = counted::take();
    Ok((fwd, bwd))
}

/// Fits forward and backward FLOPs of one path (see [`FlopFit`]).
pub fn measure_flops(norm: Norm, fused: bool) -> Result<(FlopFit, FlopFit)> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| Error::InvalidArgument {
            op: "analysis::measure_flops",
            msg: e.to_string(),
        })?;
    pool.install(|| {
        let (n1, n2, d1, d2) = (4usize, 8usize, 256usize, 512usize);
        let f = |n, d| count_flops(norm, fused, n, d);
        let pts = [f(n1, d1)?, f(n2, d1)?, f(n1, d2)?, f(n2, d2)?, f(6, 384)?];
        let fit = |k: usize| -> FlopFit {
            let v = |i: usize| {
                let p: (u64, u64) = pts[i];
                (if k == 0 { p.0 } else { p.1 }) as f64
            };
            let (n1, n2, d1, d2) = (n1 as f64, n2 as f64, d1 as f64, d2 as f64);
            let a = (v(3) - v(1) - v(2) + v(0)) / ((n2 - n1) * (d2 - d1));
            let b = (v(1) - v(0)) / (n2 - n1) - a * d1;
            let c = (v(2) - v(0)) / (d2 - d1) - a * n1;
            let e = v(0) - a * n1 * d1 - b * n1 - c * d1;
            let predict = a * 6.0 * 384.0 + b * 6.0 + c * 384.0 + e;
            FlopFit {
                per_elem: a,
                per_row: b,
                per_col: c,
                fixed: e,
                exact: (predict - v(4)).abs() < 0.5,
            }
        };
        Ok((fit(0), fit(1)))
    })
}
