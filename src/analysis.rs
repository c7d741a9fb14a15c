//! Measurements behind docs/layernorm.md: every figure the page reports is
//! computed here, from the real ops, not typed in.
//!
//! - [`report`]: for LayerNorm and RMSNorm, fused and composed:
//!   * FLOPs, *counted* by running the real kernels and graphs on a
//!     counting number type ([`Counted`]: every `+ - * /`, `sqrt` and other
//!     arithmetic call on the element or accumulation type adds one; `mul_add`
//!     adds two; comparisons, negation and conversions add none). Counts at
//!     four shapes are fitted exactly by `a*N*D + b*N + c*D + e`, so `a` is
//!     the per-element cost, `b` the per-row cost, `c` per column (the
//!     dgamma/dbeta reduction) and a fifth shape checks the fit.
//!   * Bytes moved, from a traffic model applied node by node to the graph
//!     actually recorded on a tape ([`Tape::nodes`]): see [`node_traffic`].
//!   * Bytes saved for backward, from [`Tape::saved_bytes`].
//! - [`three_way`] / [`three_way_table`]: fused vs composed vs finite
//!   differences on representative cases.

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::gradcheck::{self, Options};
use crate::ops;
use crate::rng::Rng;
use crate::shape::{alloc, checked_numel};
use crate::tape::{NodeInfo, NodeMemory, Tape, Var};
use crate::tensor::Tensor;
use std::fmt;

// ------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------

/// Which normalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// LayerNorm with gamma and beta.
    LayerNorm,
    /// RMSNorm with gamma.
    RmsNorm,
}

impl Norm {
    /// The fused op's name.
    pub fn name(self) -> &'static str {
        match self {
            Norm::LayerNorm => "layer_norm",
            Norm::RmsNorm => "rms_norm",
        }
    }
}

/// One randomized input set: `x = offset + scale * z` with `z` standard
/// normal, `gamma = 1 + 0.5 z'`, `beta = 0.5 z''` (LayerNorm only).
#[derive(Debug, Clone)]
pub struct Case {
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// Shape of `x`.
    pub shape: Vec<usize>,
    /// The normalized trailing dims (the shape of gamma and beta).
    pub normalized: Vec<usize>,
    /// Spread of `x`.
    pub scale: f64,
    /// Common offset of `x`.
    pub offset: f64,
    /// eps.
    pub eps: f64,
    /// Seed for the values and the cotangent.
    pub seed: u64,
}

impl Case {
    /// A well-scaled case (scale 1, offset 0, eps 1e-5).
    pub fn new(norm: Norm, shape: &[usize], normalized: &[usize]) -> Self {
        Case {
            norm,
            shape: shape.to_vec(),
            normalized: normalized.to_vec(),
            scale: 1.0,
            offset: 0.0,
            eps: 1e-5,
            seed: 1,
        }
    }

    /// Row length D (saturating: a D that overflows is no real row).
    pub fn d(&self) -> usize {
        self.normalized
            .iter()
            .fold(1usize, |p, &v| p.saturating_mul(v))
    }

    /// The inputs `[x, gamma, beta?]` in f64. `ShapeTooLarge` /
    /// `OutOfMemory` for shapes that cannot be allocated.
    pub fn values(&self) -> Result<Vec<Tensor<f64>>> {
        let mut rng = Rng::new(self.seed ^ 0xA11C_E5ED);
        let op = "analysis::Case::values";
        let (mut x, mut gamma) = (alloc(op, &self.shape)?, alloc(op, &self.normalized)?);
        let n = checked_numel(op, &self.shape, 8)?;
        let d = checked_numel(op, &self.normalized, 8)?;
        x.extend((0..n).map(|_| self.offset + self.scale * rng.normal()));
        gamma.extend((0..d).map(|_| 1.0 + 0.5 * rng.normal()));
        let mut out = vec![
            Tensor::from_vec(self.shape.clone(), x)?,
            Tensor::from_vec(self.normalized.clone(), gamma)?,
        ];
        if self.norm == Norm::LayerNorm {
            let beta = (0..d).map(|_| 0.5 * rng.normal()).collect();
            out.push(Tensor::from_vec(self.normalized.clone(), beta)?);
        }
        Ok(out)
    }

    /// [`Case::values`] rounded to `T`.
    pub fn inputs<T: Element>(&self) -> Result<Vec<Tensor<T>>> {
        self.values()?.iter().map(|t| t.cast::<T>()).collect()
    }

    /// Applies the fused (`fused = true`) or composed op to `x` and params
    /// `[gamma, beta?]`.
    pub fn apply<T: Element>(&self, fused: bool, x: &Var<T>, p: &[Var<T>]) -> Result<Var<T>> {
        let (g, b) = (p.first(), p.get(1));
        let nd = &self.normalized;
        match (self.norm, fused) {
            (Norm::LayerNorm, true) => ops::layer_norm_nd(x, nd, g, b, self.eps),
            (Norm::LayerNorm, false) => ops::layer_norm_composed_nd(x, nd, g, b, self.eps),
            (Norm::RmsNorm, true) => ops::rms_norm_nd(x, nd, g, self.eps),
            (Norm::RmsNorm, false) => ops::rms_norm_composed_nd(x, nd, g, self.eps),
        }
    }

    /// The fused op on `[x, gamma, beta?]`.
    pub fn fused<T: Element>(&self, v: &[Var<T>]) -> Result<Var<T>> {
        let (x, p) = split_first(v)?;
        self.apply(true, x, p)
    }

    /// The composed twin on `[x, gamma, beta?]`.
    pub fn composed<T: Element>(&self, v: &[Var<T>]) -> Result<Var<T>> {
        let (x, p) = split_first(v)?;
        self.apply(false, x, p)
    }
}

fn split_first<T: Element>(v: &[Var<T>]) -> Result<(&Var<T>, &[Var<T>])> {
    v.split_first().ok_or_else(|| Error::InvalidArgument {
        op: "analysis",
        msg: "no inputs".into(),
    })
}

/// Per-row statistics of `x` (rows of `d`) in f64: for each row
/// `(max |x_j|, scale)` where scale is `sqrt(var + eps)` (LayerNorm) or
/// `sqrt(mean(x^2) + eps)` (RMSNorm).
fn row_scales(norm: Norm, x: &[f64], d: usize, eps: f64) -> Vec<(f64, f64)> {
    x.chunks(d.max(1))
        .map(|r| {
            let df = r.len() as f64;
            let big = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let spread = match norm {
                Norm::LayerNorm => {
                    let m = r.iter().sum::<f64>() / df;
                    r.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / df
                }
                Norm::RmsNorm => r.iter().map(|v| v * v).sum::<f64>() / df,
            };
            (big, (spread + eps).sqrt())
        })
        .collect()
}

/// Condition number of the normalization of `x`: the largest
/// `max|x| / sqrt(var + eps)` over rows (`sqrt(mean(x^2) + eps)` for
/// RMSNorm), at least 1. An input's rounding error `|x| * u` becomes an
/// error of about `cond * u` in `xhat`; it is about 3 for centred data and
/// `offset / std` for data with a large common offset. RMSNorm's is at most
/// `sqrt(D)`.
pub fn condition(norm: Norm, x: &[f64], d: usize, eps: f64) -> f64 {
    row_scales(norm, x, d, eps)
        .iter()
        .map(|(b, s)| b / s)
        .fold(1.0, f64::max)
}

// ------------------------------------------------------------------------
// Three-way check
// ------------------------------------------------------------------------

/// Output and gradients `(y, [dx, dgamma, dbeta?])` in f64.
type Run = (Vec<f64>, Vec<Vec<f64>>);

/// The cotangent of a case: `Rng::new(seed).vec(..)`, the one
/// [`gradcheck::check`] draws for the same seed.
fn cotangent(case: &Case, numel: usize) -> Vec<f64> {
    Rng::new(case.seed).vec(numel)
}

/// A graph builder: inputs to output.
type Graph<'a, T> = &'a dyn Fn(&[Var<T>]) -> Result<Var<T>>;

/// Forward and backward of `f` on `inputs` (all vars) with the case's
/// cotangent (rounded to `T`).
fn run<T: Element>(case: &Case, f: Graph<'_, T>, inputs: &[Tensor<T>]) -> Result<Run> {
    let tape = Tape::new();
    let vars: Vec<Var<T>> = inputs.iter().map(|t| tape.var(t.clone())).collect();
    let y = f(&vars)?;
    let c: Vec<T> = cotangent(case, y.value().numel())
        .into_iter()
        .map(T::from_f64)
        .collect();
    let g = y.backward_with(&Tensor::from_vec(y.shape().to_vec(), c)?)?;
    let grads = vars
        .iter()
        .map(|v| g.wrt(v)?.to_f64_vec())
        .collect::<Result<Vec<_>>>()?;
    Ok((y.value().to_f64_vec()?, grads))
}

/// The size of the terms each result is made of, computed in f64 from the
/// inputs and the cotangent `c`, with `g = c * gamma`, `rstd` per row and
/// `xh = max(1, |xhat|)` (`xhat` counts as a unit-scale quantity: its
/// rounding error is absolute, about `cond * u`, however small `xhat` is):
///
/// - `y`: `max (|gamma| xh + |beta|)`
/// - `dx`: `max over rows of rstd * max |g| * max xh` (the size of the terms
///   `g`, `<g>` and `xhat <g xhat>` that the formula subtracts)
/// - `dgamma`: `max over columns of sum over rows |c| xh`
/// - `dbeta`: `max over columns of sum over rows |c|`
///
/// Differences are measured against these rather than against the result
/// itself: when terms cancel (dx of a row of 1 or 2 elements, or RMSNorm's
/// dx at D = 1, is nearly 0) only the rounding of the terms is left, and a
/// relative error of the tiny result means nothing. Zero scales (no rows)
/// become 1.
pub fn term_scales(case: &Case, inputs: &[Tensor<f64>]) -> Result<Vec<f64>> {
    let d = case.d().max(1);
    let x = inputs
        .first()
        .map(|t| t.to_f64_vec())
        .transpose()?
        .unwrap_or_default();
    let gamma = inputs
        .get(1)
        .map(|t| t.to_f64_vec())
        .transpose()?
        .unwrap_or_else(|| vec![1.0; d]);
    let beta = inputs
        .get(2)
        .map(|t| t.to_f64_vec())
        .transpose()?
        .unwrap_or_else(|| vec![0.0; d]);
    let c = cotangent(case, x.len());
    let (mut sy, mut sx) = (0.0f64, 0.0f64);
    let (mut sg, mut sb) = (vec![0.0f64; d], vec![0.0f64; d]);
    for (xr, cr) in x.chunks(d).zip(c.chunks(d)) {
        let df = d as f64;
        let (m, spread) = match case.norm {
            Norm::LayerNorm => {
                let m = xr.iter().sum::<f64>() / df;
                (m, xr.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / df)
            }
            Norm::RmsNorm => (0.0, xr.iter().map(|v| v * v).sum::<f64>() / df),
        };
        let rstd = 1.0 / (spread + case.eps).sqrt();
        let (mut gmax, mut xmax) = (0.0f64, 1.0f64);
        for j in 0..xr.len() {
            let xh = ((xr[j] - m) * rstd).abs().max(1.0);
            sy = sy.max((gamma[j] * xh).abs() + beta[j].abs());
            gmax = gmax.max((cr[j] * gamma[j]).abs());
            xmax = xmax.max(xh);
            sg[j] += (cr[j] * xh).abs();
            sb[j] += cr[j].abs();
        }
        sx = sx.max(rstd * gmax * xmax);
    }
    let fold = |v: &[f64]| v.iter().fold(0.0f64, |a, b| a.max(*b));
    let mut out = vec![sy, sx, fold(&sg)];
    if case.norm == Norm::LayerNorm {
        out.push(fold(&sb));
    }
    Ok(out
        .into_iter()
        .map(|s| if s > 0.0 && s.is_finite() { s } else { 1.0 })
        .collect())
}

/// `max |a - b| / scale` (NaN if any difference is NaN).
pub fn scaled_diff(a: &[f64], b: &[f64], scale: f64) -> f64 {
    let mut m = 0.0f64;
    for (p, q) in a.iter().zip(b) {
        let e = (p - q).abs();
        if e.is_nan() {
            return f64::NAN;
        }
        m = m.max(e);
    }
    if a.len() != b.len() {
        return f64::NAN;
    }
    m / scale
}

fn nan_max(m: f64, v: f64) -> f64 {
    if m.is_nan() || v.is_nan() {
        f64::NAN
    } else {
        m.max(v)
    }
}

/// Differences between two runs of a case, each scaled by the size of the
/// terms the result is made of (see [`term_scales`]).
#[derive(Debug, Clone)]
pub struct Diffs {
    /// Output.
    pub output: f64,
    /// Per input: dx, dgamma, dbeta.
    pub grads: Vec<f64>,
}

impl Diffs {
    /// The largest gradient difference.
    pub fn max_grad(&self) -> f64 {
        self.grads.iter().copied().fold(0.0, nan_max)
    }
    /// The largest difference of all.
    pub fn max(&self) -> f64 {
        nan_max(self.output, self.max_grad())
    }
}

impl fmt::Display for Diffs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "y {:.2e}", self.output)?;
        for (name, g) in ["dx", "dgamma", "dbeta"].iter().zip(&self.grads) {
            write!(f, ", {name} {g:.2e}")?;
        }
        Ok(())
    }
}

fn diffs(a: &Run, b: &Run, scales: &[f64]) -> Diffs {
    let s = |i: usize| scales.get(i).copied().unwrap_or(1.0);
    Diffs {
        output: scaled_diff(&a.0, &b.0, s(0)),
        grads: a
            .1
            .iter()
            .zip(&b.1)
            .enumerate()
            .map(|(i, (p, q))| scaled_diff(p, q, s(i + 1)))
            .collect(),
    }
}

/// Fused against composed, both in `T`, on the same inputs and cotangent.
pub fn fused_vs_composed<T: Element>(case: &Case) -> Result<Diffs> {
    let inputs = case.inputs::<T>()?;
    let wide: Vec<Tensor<f64>> = inputs.iter().map(|t| t.cast()).collect::<Result<_>>()?;
    let a = run::<T>(case, &|v| case.fused(v), &inputs)?;
    let b = run::<T>(case, &|v| case.composed(v), &inputs)?;
    Ok(diffs(&a, &b, &term_scales(case, &wide)?))
}

/// The fused op in `T` against the fused op in f64 on the same (`T`-rounded)
/// inputs and cotangent.
pub fn vs_f64<T: Element>(case: &Case) -> Result<Diffs> {
    let lo = case.inputs::<T>()?;
    let hi: Vec<Tensor<f64>> = lo.iter().map(|t| t.cast()).collect::<Result<_>>()?;
    let a = run::<T>(case, &|v| case.fused(v), &lo)?;
    let b = run::<f64>(case, &|v| case.fused(v), &hi)?;
    Ok(diffs(&a, &b, &term_scales(case, &hi)?))
}

/// Result of [`fd_error`].
#[derive(Debug, Clone, Copy)]
pub struct FdResult {
    /// Largest difference over the inputs, each scaled as in [`term_scales`].
    pub max_diff: f64,
    /// Elements compared in all.
    pub checked: usize,
    /// The case's [`condition`].
    pub cond: f64,
}

/// The fused op's f64 gradients against central finite differences
/// ([`gradcheck::check`]) on up to `max_checks` sampled elements of each of
/// x, gamma, beta.
///
/// Steps: x gets `h ~ s * FD_X_STEP(cond, N*D)` with `s` the smallest row
/// scale `sqrt(var + eps)`; the output is linear in gamma and beta, so
/// their step (`1e-3 max(1, |p|)`) only has to beat rounding.
pub fn fd_error(case: &Case, max_checks: usize) -> Result<FdResult> {
    let inputs = case.inputs::<f64>()?;
    let Some((x, params)) = inputs.split_first() else {
        return Err(Error::InvalidArgument {
            op: "analysis::fd_error",
            msg: "no inputs".into(),
        });
    };
    let params = params.to_vec();
    let xs = x.as_slice()?;
    let d = case.d();
    let rows = row_scales(case.norm, xs, d, case.eps);
    let cond = condition(case.norm, xs, d, case.eps);
    let s_min = rows.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    // Keep the step finite for a case without rows.
    let s_min = if s_min.is_finite() { s_min } else { 1.0 };
    let x_max = rows.iter().map(|r| r.0).fold(0.0, f64::max);
    let scales = term_scales(case, &inputs)?;
    let mut worst = 0.0f64;
    let mut checked = 0;
    let opts = |step: f64| Options {
        step,
        atol: f64::INFINITY,
        rtol: 0.0,
        max_checks,
        seed: case.seed,
    };
    if !xs.is_empty() {
        // Check in u = x / a with a power of two a >= max|x| (exact both
        // ways), so |u| <= 1 and gradcheck's step `step * max(1, |u|)` is
        // the same absolute step for every element; dL/du = a dL/dx.
        let a = 2f64.powi(x_max.max(f64::MIN_POSITIVE).log2().ceil() as i32);
        let u = x.cast::<f64>()?;
        let u = Tensor::from_vec(u.shape().to_vec(), xs.iter().map(|v| v / a).collect())?;
        let h = s_min * fd_x_step(cond, xs.len());
        let p = params.clone();
        let rep = gradcheck::check(
            |v| {
                let t = v[0].tape();
                let pv: Vec<Var<f64>> = p.iter().map(|q| t.constant(q.clone())).collect();
                case.apply(true, &ops::scalar_mul(&v[0], a)?, &pv)
            },
            std::slice::from_ref(&u),
            &opts(h / a),
        )?;
        let s = scales.get(1).copied().unwrap_or(1.0) * a;
        for r in &rep.inputs {
            worst = nan_max(worst, r.max_abs / s);
            checked += r.checked;
        }
    }
    let xc = x.clone();
    let rep = gradcheck::check(
        |v| {
            let xv = v[0].tape().constant(xc.clone());
            case.apply(true, &xv, v)
        },
        &params,
        &opts(1e-3),
    )?;
    for (k, r) in rep.inputs.iter().enumerate() {
        let s = scales.get(2 + k).copied().unwrap_or(1.0);
        worst = nan_max(worst, r.max_abs / s);
        checked += r.checked;
    }
    Ok(FdResult {
        max_diff: worst,
        checked,
        cond,
    })
}

/// Relative finite-difference step for x, in units of the row scale: it
/// balances truncation error `~ (h/s)^2` against rounding error
/// `~ 2^-52 (cond + numel) / (h/s)` in `<c, y>`.
pub fn fd_x_step(cond: f64, numel: usize) -> f64 {
    (f64::EPSILON * (cond + numel as f64)).cbrt()
}

/// One row of the three-way table.
#[derive(Debug, Clone)]
pub struct ThreeWayRow {
    /// Op name.
    pub op: &'static str,
    /// Shape of x.
    pub shape: Vec<usize>,
    /// Normalized dims.
    pub normalized: Vec<usize>,
    /// Common offset of x.
    pub offset: f64,
    /// Spread of x.
    pub scale: f64,
    /// eps.
    pub eps: f64,
    /// Condition number ([`condition`]).
    pub cond: f64,
    /// Fused vs composed (f64).
    pub fc: Diffs,
    /// Fused vs finite differences (f64).
    pub fd: FdResult,
}

impl ThreeWayRow {
    /// Column titles matching `Display`.
    pub fn header() -> String {
        format!(
            "{:<10} {:<13} {:<9} {:>6} {:>6} {:>6} {:>7} {:>9} {:>9} {:>9} {:>4}",
            "op",
            "shape",
            "normed",
            "offset",
            "scale",
            "eps",
            "cond",
            "y f-c",
            "grad f-c",
            "vs FD",
            "FD n"
        )
    }
}

impl fmt::Display for ThreeWayRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<10} {:<13} {:<9} {:>6.0e} {:>6.0e} {:>6.0e} {:>7.1e} {:>9.2e} {:>9.2e} {:>9.2e} {:>4}",
            self.op,
            format!("{:?}", self.shape),
            format!("{:?}", self.normalized),
            self.offset,
            self.scale,
            self.eps,
            self.cond,
            self.fc.output,
            self.fc.max_grad(),
            self.fd.max_diff,
            self.fd.checked
        )
    }
}

/// Rows of the three-way check.
#[derive(Debug, Clone)]
pub struct ThreeWay(pub Vec<ThreeWayRow>);

impl fmt::Display for ThreeWay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", ThreeWayRow::header())?;
        for r in &self.0 {
            writeln!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Fused vs composed vs finite differences, all in f64, for one case.
pub fn three_way(case: &Case, max_checks: usize) -> Result<ThreeWayRow> {
    let fc = fused_vs_composed::<f64>(case)?;
    let fd = fd_error(case, max_checks)?;
    Ok(ThreeWayRow {
        op: case.norm.name(),
        shape: case.shape.clone(),
        normalized: case.normalized.clone(),
        offset: case.offset,
        scale: case.scale,
        eps: case.eps,
        cond: fd.cond,
        fc,
        fd,
    })
}

/// The representative cases of [`three_way_table`].
pub fn three_way_cases() -> Vec<Case> {
    use Norm::*;
    let with = |norm, shape: &[usize], nd: &[usize], scale, offset, eps, seed| Case {
        scale,
        offset,
        eps,
        seed,
        ..Case::new(norm, shape, nd)
    };
    vec![
        with(LayerNorm, &[8, 768], &[768], 1.0, 0.0, 1e-5, 1),
        with(LayerNorm, &[4, 3, 1021], &[1021], 1.0, 0.0, 1e-5, 2),
        with(LayerNorm, &[2, 16, 64], &[16, 64], 1.0, 0.0, 1e-5, 3),
        with(LayerNorm, &[64, 7], &[7], 1e-3, 0.0, 1e-2, 4),
        with(LayerNorm, &[4, 2048], &[2048], 1e6, 0.0, 1e-12, 5),
        with(LayerNorm, &[4, 1024], &[1024], 1.0, 1e4, 1e-5, 6),
        with(LayerNorm, &[4, 1024], &[1024], 1e-3, 1e8, 1e-12, 7),
        with(LayerNorm, &[2, 16384], &[16384], 1.0, 0.0, 1e-5, 8),
        with(RmsNorm, &[8, 768], &[768], 1.0, 0.0, 1e-5, 9),
        with(RmsNorm, &[4, 3, 1021], &[1021], 1.0, 0.0, 1e-6, 10),
        with(RmsNorm, &[2, 16, 64], &[16, 64], 1.0, 3.0, 1e-5, 11),
        with(RmsNorm, &[4, 2048], &[2048], 1e-3, 0.0, 1e-2, 12),
    ]
}

/// [`three_way`] on [`three_way_cases`], 32 finite-difference checks per
/// input.
pub fn three_way_table() -> Result<ThreeWay> {
    three_way_cases()
        .iter()
        .map(|c| three_way(c, 32))
        .collect::<Result<Vec<_>>>()
        .map(ThreeWay)
}

/// The random case the property tests draw (tests/layer_norm_props.rs and
/// tests/rms_norm_props.rs draw `rng`'s seed with proptest):
///
/// - normalized over 1 or 2 trailing dims of total size D in `1..=2048`
///   (half the time a prime, a power of two or a neighbour of one); with 2
///   dims, D is split at a random divisor;
/// - 0 to `4 - dims` leading dims: none (N = 1), `[0..=64]`, `[0..=8; 2]`
///   or `[0..=4; 3]`, so rank 1 to 4 and N from 0 to 64;
/// - `x = offset + scale z`: scale `10^U(-3, 6)`, offset 0 half the time,
///   else `+-10^U(0, log10 max_offset)`; eps `10^U(-12, -2)`.
pub fn random_case(rng: &mut Rng, norm: Norm, max_offset: f64) -> Case {
    const SPECIAL: [usize; 17] = [
        1, 2, 3, 5, 7, 13, 31, 64, 127, 509, 768, 1021, 1024, 1031, 2039, 2047, 2048,
    ];
    let d = if rng.uniform() < 0.5 {
        SPECIAL[rng.below(SPECIAL.len())]
    } else {
        1 + rng.below(2048)
    };
    let normalized = if rng.uniform() < 0.5 {
        vec![d]
    } else {
        let divisors: Vec<usize> = (1..=d).filter(|a| d % a == 0).collect();
        let a = divisors[rng.below(divisors.len())];
        vec![a, d / a]
    };
    let mut shape: Vec<usize> = match rng.below(5 - normalized.len()) {
        0 => vec![],
        1 => vec![rng.below(65)],
        2 => vec![rng.below(9), rng.below(9)],
        _ => vec![rng.below(5), rng.below(5), rng.below(5)],
    };
    shape.extend(&normalized);
    let scale = 10f64.powf(rng.range(-3.0, 6.0));
    let offset = if rng.uniform() < 0.5 {
        0.0
    } else {
        let sign = if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
        sign * 10f64.powf(rng.range(0.0, max_offset.log10()))
    };
    Case {
        scale,
        offset,
        eps: 10f64.powf(rng.range(-12.0, -2.0)),
        seed: rng.next_u64(),
        ..Case::new(norm, &shape, &normalized)
    }
}

/// Worst observations of [`sweep`]: each comparison's largest difference
/// divided by `cond * u` (the part of the tolerance that scales), and by
/// the whole named tolerance (below 1 means it passes).
#[derive(Debug, Clone, Default)]
pub struct Sweep {
    /// Cases run (LayerNorm and RMSNorm alternate).
    pub cases: usize,
    /// f64 fused vs composed: max of diff / (cond 2^-52).
    pub f64_fc_per_cond_u: f64,
    /// ... and max of diff / `norm_fused_vs_composed_f64(cond)`.
    pub f64_fc_of_tol: f64,
    /// f32 fused vs composed: max of diff / (cond 2^-23).
    pub f32_fc_per_cond_u: f64,
    /// ... and of diff / `norm_f32(cond)`.
    pub f32_fc_of_tol: f64,
    /// f32 fused vs f64 fused: max of diff / (cond 2^-23).
    pub f32_f64_per_cond_u: f64,
    /// ... and of diff / `norm_f32(cond)`.
    pub f32_f64_of_tol: f64,
    /// f64 fused vs finite differences: max of diff / `norm_vs_fd_f64(cond)`
    /// (cases up to 40k elements, 8 checks per input).
    pub fd_of_tol: f64,
    /// Largest finite-difference error seen, and the cond where it was.
    pub fd_worst: (f64, f64),
}

impl fmt::Display for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} random cases; worst difference / (cond u) and / tolerance:",
            self.cases
        )?;
        writeln!(
            f,
            "  f64 fused vs composed   {:>7.2}  {:.2e}",
            self.f64_fc_per_cond_u, self.f64_fc_of_tol
        )?;
        writeln!(
            f,
            "  f32 fused vs composed   {:>7.2}  {:.2e}",
            self.f32_fc_per_cond_u, self.f32_fc_of_tol
        )?;
        writeln!(
            f,
            "  f32 fused vs f64 fused  {:>7.2}  {:.2e}",
            self.f32_f64_per_cond_u, self.f32_f64_of_tol
        )?;
        writeln!(
            f,
            "  f64 fused vs FD               -  {:.2e} (largest error {:.2e} at cond {:.1e})",
            self.fd_of_tol, self.fd_worst.0, self.fd_worst.1
        )
    }
}

/// Runs `iters` random cases ([`random_case`]; offsets up to 1e8 in f64 and
/// 1e4 in f32) through every comparison the property tests make and keeps
/// the worst ratios: the measurement the factor in the norm tolerances
/// (src/tolerance.rs) rests on.
pub fn sweep(iters: usize, seed: u64) -> Result<Sweep> {
    use crate::tolerance::{norm_f32, norm_fused_vs_composed_f64, norm_vs_fd_f64};
    let mut rng = Rng::new(seed);
    let mut w = Sweep {
        cases: iters,
        ..Sweep::default()
    };
    let (u64_, u32_) = (f64::EPSILON, f32::EPSILON as f64);
    for i in 0..iters {
        let norm = if i % 2 == 0 {
            Norm::LayerNorm
        } else {
            Norm::RmsNorm
        };
        let mut case = random_case(&mut rng, norm, 1e8);
        let d = case.d();
        let x = case.inputs::<f64>()?[0].to_f64_vec()?;
        let k = condition(norm, &x, d, case.eps);
        let fc = fused_vs_composed::<f64>(&case)?.max();
        w.f64_fc_per_cond_u = nan_max(w.f64_fc_per_cond_u, fc / (k * u64_));
        w.f64_fc_of_tol = nan_max(w.f64_fc_of_tol, fc / norm_fused_vs_composed_f64(k).rtol);
        if x.len() <= 40_000 {
            let fd = fd_error(&case, 8)?;
            w.fd_of_tol = nan_max(w.fd_of_tol, fd.max_diff / norm_vs_fd_f64(k).rtol);
            if fd.max_diff.is_nan() || fd.max_diff > w.fd_worst.0 {
                w.fd_worst = (fd.max_diff, k);
            }
        }
        case.offset = case.offset.clamp(-1e4, 1e4);
        let x = case.inputs::<f32>()?[0].to_f64_vec()?;
        let k = condition(norm, &x, d, case.eps);
        let fc = fused_vs_composed::<f32>(&case)?.max();
        w.f32_fc_per_cond_u = nan_max(w.f32_fc_per_cond_u, fc / (k * u32_));
        w.f32_fc_of_tol = nan_max(w.f32_fc_of_tol, fc / norm_f32(k).rtol);
        let lo = vs_f64::<f32>(&case)?.max();
        w.f32_f64_per_cond_u = nan_max(w.f32_f64_per_cond_u, lo / (k * u32_));
        w.f32_f64_of_tol = nan_max(w.f32_f64_of_tol, lo / norm_f32(k).rtol);
    }
    Ok(w)
}

// ------------------------------------------------------------------------
// FLOP counting
// ------------------------------------------------------------------------

mod counted {
    //! A number type that counts its arithmetic, to measure FLOPs.
    use crate::dtype::{Accum, Element};
    use num_traits::{Float, FromPrimitive, Num, NumCast, One, ToPrimitive, Zero};
    use std::cell::Cell;
    use std::num::FpCategory;
    use std::ops::*;

    thread_local! {
        static FLOPS: Cell<u64> = const { Cell::new(0) };
    }

    fn tick(n: u64) {
        FLOPS.with(|c| c.set(c.get() + n));
    }

    /// Operations counted on this thread since the last [`take`].
    pub fn take() -> u64 {
        FLOPS.with(|c| c.replace(0))
    }

    /// An f64 that counts the arithmetic done with it.
    #[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd)]
    pub struct Counted(pub f64);

    macro_rules! binop {
        ($($tr:ident $f:ident $atr:ident $af:ident $op:tt),*) => {$(
            impl $tr for Counted {
                type Output = Counted;
                #[inline(always)]
                fn $f(self, o: Counted) -> Counted { tick(1); Counted(self.0 $op o.0) }
            }
            impl $atr for Counted {
                #[inline(always)]
                fn $af(&mut self, o: Counted) { tick(1); self.0 = self.0 $op o.0 }
            }
        )*};
    }
    binop!(Add add AddAssign add_assign +, Sub sub SubAssign sub_assign -,
           Mul mul MulAssign mul_assign *, Div div DivAssign div_assign /,
           Rem rem RemAssign rem_assign %);

    impl Neg for Counted {
        type Output = Counted;
        fn neg(self) -> Counted {
            Counted(-self.0)
        }
    }

    impl std::iter::Sum for Counted {
        fn sum<I: Iterator<Item = Counted>>(it: I) -> Counted {
            it.fold(Counted(0.0), |a, b| a + b)
        }
    }

    impl Zero for Counted {
        fn zero() -> Self {
            Counted(0.0)
        }
        fn is_zero(&self) -> bool {
            self.0 == 0.0
        }
    }
    impl One for Counted {
        fn one() -> Self {
            Counted(1.0)
        }
    }
    impl Num for Counted {
        type FromStrRadixErr = <f64 as Num>::FromStrRadixErr;
        fn from_str_radix(s: &str, r: u32) -> Result<Self, Self::FromStrRadixErr> {
            f64::from_str_radix(s, r).map(Counted)
        }
    }
    impl ToPrimitive for Counted {
        fn to_i64(&self) -> Option<i64> {
            self.0.to_i64()
        }
        fn to_u64(&self) -> Option<u64> {
            self.0.to_u64()
        }
        fn to_f64(&self) -> Option<f64> {
            Some(self.0)
        }
    }
    impl NumCast for Counted {
        fn from<N: ToPrimitive>(n: N) -> Option<Self> {
            n.to_f64().map(Counted)
        }
    }
    impl FromPrimitive for Counted {
        fn from_i64(n: i64) -> Option<Self> {
            Some(Counted(n as f64))
        }
        fn from_u64(n: u64) -> Option<Self> {
            Some(Counted(n as f64))
        }
        fn from_f64(n: f64) -> Option<Self> {
            Some(Counted(n))
        }
    }

    macro_rules! free {
        ($($f:ident),*) => {$( fn $f() -> Self { Counted(f64::$f()) } )*};
    }
    macro_rules! pred {
        ($($f:ident),*) => {$( fn $f(self) -> bool { self.0.$f() } )*};
    }
    macro_rules! unary {
        ($($f:ident),*) => {$( fn $f(self) -> Self { tick(1); Counted(self.0.$f()) } )*};
    }
    macro_rules! exact {
        ($($f:ident),*) => {$( fn $f(self) -> Self { Counted(self.0.$f()) } )*};
    }
    macro_rules! binary {
        ($($f:ident),*) => {$( fn $f(self, o: Self) -> Self { tick(1); Counted(self.0.$f(o.0)) } )*};
    }

    impl Float for Counted {
        free!(
            nan,
            infinity,
            neg_infinity,
            neg_zero,
            min_value,
            min_positive_value,
            max_value
        );
        pred!(
            is_nan,
            is_infinite,
            is_finite,
            is_normal,
            is_sign_positive,
            is_sign_negative
        );
        unary!(
            recip, sqrt, exp, exp2, ln, log2, log10, cbrt, sin, cos, tan, asin, acos, atan, exp_m1,
            ln_1p, sinh, cosh, tanh, asinh, acosh, atanh
        );
        exact!(floor, ceil, round, trunc, fract, abs, signum);
        binary!(powf, log, hypot, atan2);
        fn classify(self) -> FpCategory {
            self.0.classify()
        }
        fn mul_add(self, a: Self, b: Self) -> Self {
            tick(2);
            Counted(self.0.mul_add(a.0, b.0))
        }
        fn powi(self, n: i32) -> Self {
            tick(1);
            Counted(self.0.powi(n))
        }
        fn max(self, o: Self) -> Self {
            Counted(self.0.max(o.0))
        }
        fn min(self, o: Self) -> Self {
            Counted(self.0.min(o.0))
        }
        #[allow(deprecated)]
        fn abs_sub(self, o: Self) -> Self {
            tick(1);
            Counted((self.0 - o.0).max(0.0))
        }
        fn sin_cos(self) -> (Self, Self) {
            tick(2);
            (Counted(self.0.sin()), Counted(self.0.cos()))
        }
        fn integer_decode(self) -> (u64, i16, i8) {
            Float::integer_decode(self.0)
        }
    }

    impl Accum for Counted {
        fn f64(self) -> f64 {
            self.0
        }
        fn of(v: f64) -> Self {
            Counted(v)
        }
    }

    impl Element for Counted {
        crate::dtype::kernels!(Counted);
        type Acc = Counted;
        const NAME: &'static str = "counted";
        fn pool() -> &'static crate::device::pool::Pool<Self> {
            static P: crate::device::pool::Pool<Counted> = crate::device::pool::Pool::new();
            &P
        }
        fn to_acc(self) -> Counted {
            self
        }
        fn from_acc(a: Counted) -> Self {
            a
        }
    }
}

pub use counted::Counted;

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

// ------------------------------------------------------------------------
// Memory traffic
// ------------------------------------------------------------------------

/// Bytes one node reads and writes, forward and backward.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTraffic {
    /// Op name.
    pub op: &'static str,
    /// Output shape.
    pub shape: Vec<usize>,
    /// Forward bytes (read + written).
    pub fwd: usize,
    /// Backward bytes (read + written), including summing broadcast
    /// gradients back and accumulating fan-out.
    pub bwd: usize,
    /// False when the op is not in the model and a generic estimate was used.
    pub modelled: bool,
}

/// Bytes moved by a recorded graph, forward and backward.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    /// Per node (ops only, oldest first).
    pub nodes: Vec<NodeTraffic>,
    /// Forward total.
    pub fwd: usize,
    /// Backward total.
    pub bwd: usize,
}

/// The traffic model, applied to the nodes of a graph whose elements take
/// `elem` bytes and whose statistics take `acc` bytes.
///
/// Each op streams its operands from memory once and writes its result once
/// (what the kernels in `ops/` do; re-reads of a row that is still in cache,
/// of a small broadcast operand and of an operand passed twice count once). With `O` the output's
/// element count, `I` an input's and `s = elem`:
///
/// | op | forward | backward, per input that needs a gradient |
/// |---|---|---|
/// | `add`, `sub` | `s(I_a + I_b + O)` | none (`g` is passed on; `sub` negates its second: `2sO`) |
/// | `mul` | `s(I_a + I_b + O)` | read `g` and the other operand, write: `s(O + I_other + O)` |
/// | `mean_axes`, `sum_axes` | `s(I + O)` | read `g`, write the broadcast: `s(O + I)` |
/// | `rsqrt`, `sqrt`, `exp` | `s(I + O)` | read `g` and the saved output, write: `3sO` |
/// | `scalar_add` | `s(I + O)` | none (`g` is passed on) |
/// | `reshape` | none (shared storage) | none |
/// | `layer_norm` (fused) | read x, gamma, beta; write y, 2N stats | read x, dy, gamma, stats; write dx; write and read one `2D` partial per group; write dgamma, dbeta |
/// | `rms_norm` (fused) | read x, gamma; write y, N stats | as `layer_norm` with one statistic and a `D` partial |
///
/// On top of the table: a gradient of the broadcast output shape for a
/// smaller input is summed back (`s(O + I)`), and a node that receives `k`
/// gradients accumulates `k - 1` times (read two, write one: `3sI` each).
/// Ops outside the table get a generic estimate (forward: read inputs,
/// write output; backward: read `g` and every input, write every needed
/// gradient) and are flagged `modelled = false`.
pub fn node_traffic(nodes: &[NodeInfo], elem: usize, acc: usize) -> Traffic {
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let mut contrib = vec![0usize; nodes.len()];
    let mut out = Vec::new();
    for node in nodes.iter().filter(|n| n.op != "leaf") {
        let o = numel(&node.shape);
        let ins: Vec<&NodeInfo> = node.inputs.iter().filter_map(|&i| nodes.get(i)).collect();
        let isz: Vec<usize> = ins.iter().map(|n| numel(&n.shape)).collect();
        let need: Vec<bool> = ins.iter().map(|n| n.requires_grad).collect();
        // Forward reads: each distinct input once (mul(x, x) streams x once).
        let sum_in: usize = isz
            .iter()
            .enumerate()
            .filter(|(k, _)| !node.inputs[..*k].contains(&node.inputs[*k]))
            .map(|(_, v)| v)
            .sum();
        let back = |i: usize| {
            if ins[i].shape != node.shape {
                o + isz[i]
            } else {
                0
            }
        };
        let mut modelled = true;
        let (fwd, bwd) = match node.op {
            "add" | "sub" => {
                let mut b = 0;
                for (i, _) in need.iter().enumerate().filter(|(_, n)| **n) {
                    b += back(i) + if node.op == "sub" && i == 1 { 2 * o } else { 0 };
                }
                ((sum_in + o) * elem, b * elem)
            }
            "mul" => {
                let mut b = 0;
                for (i, _) in need.iter().enumerate().filter(|(_, n)| **n) {
                    let other = isz.get(1 - i.min(1)).copied().unwrap_or(0);
                    b += 2 * o + other + back(i);
                }
                ((sum_in + o) * elem, b * elem)
            }
            "mean_axes" | "sum_axes" | "mean" | "sum" => (
                (sum_in + o) * elem,
                if need[0] { (o + sum_in) * elem } else { 0 },
            ),
            "rsqrt" | "sqrt" | "exp" => {
                ((sum_in + o) * elem, if need[0] { 3 * o * elem } else { 0 })
            }
            "scalar_add" => ((sum_in + o) * elem, 0),
            "reshape" => (0, 0),
            "layer_norm" | "rms_norm" => {
                let stats = if node.op == "layer_norm" { 2 } else { 1 };
                fused_traffic_node(node, &isz, &need, elem, acc, stats)
            }
            _ => {
                modelled = false;
                let b: usize = isz
                    .iter()
                    .zip(&need)
                    .map(|(i, n)| if *n { *i } else { 0 })
                    .sum();
                ((sum_in + o) * elem, (o + sum_in + b) * elem)
            }
        };
        for (k, &j) in node.inputs.iter().enumerate() {
            if need.get(k).copied().unwrap_or(false) {
                if let Some(c) = contrib.get_mut(j) {
                    *c += 1;
                }
            }
        }
        out.push(NodeTraffic {
            op: node.op,
            shape: node.shape.clone(),
            fwd,
            bwd,
            modelled,
        });
    }
    // Fan-out: every gradient after the first is accumulated.
    let accumulate: usize = nodes
        .iter()
        .zip(&contrib)
        .map(|(n, &c)| c.saturating_sub(1) * 3 * numel(&n.shape) * elem)
        .sum();
    let fwd = out.iter().map(|t| t.fwd).sum();
    let bwd = out.iter().map(|t| t.bwd).sum::<usize>() + accumulate;
    Traffic {
        nodes: out,
        fwd,
        bwd,
    }
}

/// The fused ops' row of the traffic table.
fn fused_traffic_node(
    node: &NodeInfo,
    isz: &[usize],
    need: &[bool],
    elem: usize,
    acc: usize,
    stats: usize,
) -> (usize, usize) {
    let nd = isz.first().copied().unwrap_or(0);
    // Row length: a parameter's size, else the last dim (the node does not
    // record its normalized shape; without parameters this assumes the
    // last-axis form).
    let d = isz
        .get(1)
        .copied()
        .or_else(|| node.shape.last().copied())
        .unwrap_or(1)
        .max(1);
    let n = nd / d;
    let params: usize = isz.iter().skip(1).sum();
    let fwd = (nd + params + nd) * elem + stats * n * acc;
    let groups = crate::ops::layer_norm::cpu::groups(n, d);
    let want_params = need.iter().skip(1).any(|&b| b);
    // Each group writes its partial rows and the reduction reads them back.
    let partial = if want_params {
        2 * groups * (isz.len() - 1) * d * acc
    } else {
        0
    };
    let gamma = isz.get(1).copied().unwrap_or(0);
    let bwd = (2 * nd + gamma + nd) * elem
        + stats * n * acc
        + partial
        + need
            .iter()
            .zip(isz)
            .skip(1)
            .map(|(b, i)| if *b { *i } else { 0 })
            .sum::<usize>()
            * elem;
    (fwd, bwd)
}

// ------------------------------------------------------------------------
// The report
// ------------------------------------------------------------------------

/// Everything docs/layernorm.md reports for one normalization.
#[derive(Debug, Clone)]
pub struct NormReport {
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// Element type of the memory figures.
    pub dtype: &'static str,
    /// Rows.
    pub n: usize,
    /// Row length.
    pub d: usize,
    /// Fused forward / backward FLOPs.
    pub fused_flops: (FlopFit, FlopFit),
    /// Composed forward / backward FLOPs.
    pub composed_flops: (FlopFit, FlopFit),
    /// Fused traffic at `(n, d)`.
    pub fused_traffic: Traffic,
    /// Composed traffic at `(n, d)`.
    pub composed_traffic: Traffic,
    /// `Tape::saved_bytes` after the fused forward (leaf inputs).
    pub fused_saved: usize,
    /// `Tape::saved_bytes` after the composed forward.
    pub composed_saved: usize,
    /// The composed graph's saved bytes node by node.
    pub composed_saved_nodes: Vec<NodeMemory>,
}

/// [`NormReport`] for LayerNorm and RMSNorm.
#[derive(Debug, Clone)]
pub struct Report(pub Vec<NormReport>);

fn graph<T: Element>(case: &Case, fused: bool) -> Result<Tape<T>> {
    let tape = Tape::new();
    let vars: Vec<Var<T>> = case
        .inputs::<T>()?
        .into_iter()
        .map(|t| tape.var(t))
        .collect();
    let (x, p) = split_first(&vars)?;
    case.apply(fused, x, p)?;
    Ok(tape)
}

fn norm_report<T: Element>(norm: Norm, n: usize, d: usize) -> Result<NormReport> {
    let case = Case::new(norm, &[n, d], &[d]);
    let (elem, acc) = (std::mem::size_of::<T>(), std::mem::size_of::<T::Acc>());
    let fused = graph::<T>(&case, true)?;
    let composed = graph::<T>(&case, false)?;
    Ok(NormReport {
        norm,
        dtype: T::NAME,
        n,
        d,
        fused_flops: measure_flops(norm, true)?,
        composed_flops: measure_flops(norm, false)?,
        fused_traffic: node_traffic(&fused.nodes(), elem, acc),
        composed_traffic: node_traffic(&composed.nodes(), elem, acc),
        fused_saved: fused.saved_bytes(),
        composed_saved: composed.saved_bytes(),
        composed_saved_nodes: composed.saved_bytes_per_node(),
    })
}

/// The analysis for f32 tensors of `n` rows of `d` (FLOPs do not depend on
/// the shape beyond the fit; bytes and saved memory are for `(n, d)`).
pub fn report(n: usize, d: usize) -> Result<Report> {
    Ok(Report(vec![
        norm_report::<f32>(Norm::LayerNorm, n, d)?,
        norm_report::<f32>(Norm::RmsNorm, n, d)?,
    ]))
}

/// [`report`] at the shape docs/layernorm.md uses: 4096 rows of 1024.
pub fn default_report() -> Result<Report> {
    report(4096, 1024)
}

impl fmt::Display for FlopFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>5.1}/elem {:>6.1}/row {:>4.1}/col {:>4.0} fixed{}",
            self.per_elem,
            self.per_row,
            self.per_col,
            self.fixed,
            if self.exact { "" } else { " (fit not exact)" }
        )
    }
}

impl fmt::Display for NormReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nd = (self.n * self.d) as f64;
        let name = self.norm.name();
        writeln!(f, "== {name}: {} x {} ({}) ==", self.n, self.d, self.dtype)?;
        writeln!(
            f,
            "FLOPs (counted)      forward                                   backward"
        )?;
        writeln!(
            f,
            "  fused              {}   {}",
            self.fused_flops.0, self.fused_flops.1
        )?;
        writeln!(
            f,
            "  composed           {}   {}",
            self.composed_flops.0, self.composed_flops.1
        )?;
        writeln!(
            f,
            "Bytes moved per element (model)   forward   backward   total"
        )?;
        for (label, t) in [
            ("fused", &self.fused_traffic),
            ("composed", &self.composed_traffic),
        ] {
            writeln!(
                f,
                "  {label:<31} {:>8.2} {:>10.2} {:>7.2}",
                t.fwd as f64 / nd,
                t.bwd as f64 / nd,
                (t.fwd + t.bwd) as f64 / nd
            )?;
        }
        writeln!(
            f,
            "  ratio composed / fused          {:>8.2} {:>10.2} {:>7.2}",
            self.composed_traffic.fwd as f64 / self.fused_traffic.fwd.max(1) as f64,
            self.composed_traffic.bwd as f64 / self.fused_traffic.bwd.max(1) as f64,
            (self.composed_traffic.fwd + self.composed_traffic.bwd) as f64
                / (self.fused_traffic.fwd + self.fused_traffic.bwd).max(1) as f64
        )?;
        writeln!(
            f,
            "  composed graph, node by node (bytes per element of x):"
        )?;
        for t in &self.composed_traffic.nodes {
            writeln!(
                f,
                "    {:<12} {:<12} fwd {:>5.2} bwd {:>5.2}{}",
                t.op,
                format!("{:?}", t.shape),
                t.fwd as f64 / nd,
                t.bwd as f64 / nd,
                if t.modelled {
                    ""
                } else {
                    " (generic estimate)"
                }
            )?;
        }
        writeln!(f, "Saved for backward (Tape::saved_bytes, leaf inputs)")?;
        writeln!(
            f,
            "  fused     {:>12} B = {:.4} B/elem",
            self.fused_saved,
            self.fused_saved as f64 / nd
        )?;
        writeln!(
            f,
            "  composed  {:>12} B = {:.4} B/elem ({:.0}x fused)",
            self.composed_saved,
            self.composed_saved as f64 / nd,
            self.composed_saved as f64 / self.fused_saved.max(1) as f64
        )?;
        for m in self.composed_saved_nodes.iter().filter(|m| m.bytes > 0) {
            writeln!(f, "    {:<12} {:>12} B", m.op, m.bytes)?;
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.0 {
            writeln!(f, "{r}")?;
        }
        Ok(())
    }
}
