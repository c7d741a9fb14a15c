//! Fused against composed against finite differences: the three-way
//! check, its error measures and the random-case sweep.

use super::*;

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

/// The random case the property tests draw (tests/command/props.rs and
/// tests/command/props.rs draw `rng`'s seed with proptest):
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
    use fusegrad::tolerance::{norm_f32, norm_fused_vs_composed_f64, norm_vs_fd_f64};
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
