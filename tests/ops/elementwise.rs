//! Primitive ops (reductions, unary arithmetic, activations, shape ops):
//! for every op, over random shapes and value scales from 1e-3 to 1e3,
//! (a) the f64 gradient against central finite differences and (b) the f32
//! run against the f64 run, outputs and gradients, with random cotangents.
//! Then exact values on small cases, saved-state sizes, and error variants.
#![allow(clippy::type_complexity)]

use crate::common::max_abs;
use fusegrad::gradcheck::{self, Options};
use fusegrad::rng::Rng;
use fusegrad::special::{erf, normal_cdf, normal_pdf};
use fusegrad::tolerance::{Tolerance, F32_VS_F64_TERMS, F64_VS_FD};
use fusegrad::{ops, Element, Error, Result, Tape, Tensor, Var};
use ndarray::{arr1, arr2, ArrayD, Axis, IxDyn};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::f64::consts::FRAC_1_SQRT_2;

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// Relative finite-difference step. `gradcheck` steps by
/// `h = step * max(1, |x|)`; we pass `FD_STEP * min(1, s)` for a case of
/// scale `s` ([`step`]), so `h / |x|` is at most 1e-4 at every scale (inputs have
/// `|x| >= s / 10`). The truncation error, `h^2 |f'''| / 6`, then stays
/// below 1e-7 of `|f'|` for every op here (powi(x, -3) is the worst), well
/// inside `F64_VS_FD.rtol`, except in the gelus' negative tails (see
/// [`gelu_step`] and [`gelu_erf_step`]).
const FD_STEP: f64 = 1e-5;

/// The finite-difference step for a case of scale `s`.
fn step(s: f64) -> f64 {
    FD_STEP * s.min(1.0)
}

/// gelu_tanh's negative tail is `~ x e^(2u)`, whose log-slope `lambda ~ 0.21
/// x^2` makes the relative truncation error `(h lambda)^2 / 6`; for
/// `|x| <= 10` that is < 1e-6 with [`step`], and the step shrinks as `s^-3`
/// up to `|x| = 25`, past which the tail underflows to exactly 0.
fn gelu_step(s: f64) -> f64 {
    step(s) * (10.0 / s.clamp(10.0, 25.0)).powi(3)
}

/// The exact gelu's negative tail is `~ -phi(x)`, log-slope `~ |x|`, so the
/// relative truncation error is `(h x)^2 / 6` with `h ~ step |x|`; the step
/// shrinks as `s^-2` up to `|x| = 40`, past which the tail is exactly 0.
fn gelu_erf_step(s: f64) -> f64 {
    step(s) * (10.0 / s.clamp(10.0, 40.0)).powi(2)
}

/// One random test input: raw values `±[0.1, 1]` (never near 0), a scale
/// `s = 10^e` with `e` uniform in [-3, 3], and a seed for the cotangents.
#[derive(Debug, Clone)]
struct Input {
    shape: Vec<usize>,
    raw: Vec<f64>,
    scale: f64,
    seed: u64,
}

/// Rank 0..=4, dims 1..=4, now and then a 0.
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=4)
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![12 => 1usize..=4, 1 => Just(0usize)]
}

fn input_with_shape(shape: Vec<usize>) -> impl Strategy<Value = Input> {
    let n: usize = shape.iter().product();
    (
        Just(shape),
        prop::collection::vec((any::<bool>(), 0.1f64..=1.0), n),
        -3.0f64..=3.0,
        any::<u64>(),
    )
        .prop_map(|(shape, v, e, seed)| Input {
            shape,
            raw: v
                .into_iter()
                .map(|(neg, m)| if neg { -m } else { m })
                .collect(),
            scale: 10f64.powf(e),
            seed,
        })
}

fn input() -> impl Strategy<Value = Input> {
    shape().prop_flat_map(input_with_shape)
}

/// How the f32-vs-f64 comparison sizes each value (see `F32_VS_F64_TERMS`).
enum Mag<'a> {
    /// Relative to the value itself: ops whose formulas do not cancel.
    Rel,
    /// Linear ops with nonnegative coefficients (sums, means, broadcasts),
    /// which cancel when signs mix: output against the same op on `|x|`,
    /// gradient against the gradient for cotangent `|c|`.
    OfAbs,
    /// Elementwise ops with a cancelling formula: `(x, y, g) -> (m_y, m_dx)`.
    Pointwise(&'a dyn Fn(f64, f64, f64) -> (f64, f64)),
}

/// The op written once, instantiated for f64 and for f32.
macro_rules! pair {
    (|$v:ident| $body:expr) => {
        (
            |$v: &Var<f64>| -> Result<Var<f64>> { $body },
            |$v: &Var<f32>| -> Result<Var<f32>> { $body },
        )
    };
}

fn tc(e: Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

fn abs_tensor(t: &Tensor<f64>) -> Result<Tensor<f64>> {
    Tensor::from_vec(
        t.shape().to_vec(),
        t.as_slice()?.iter().map(|a| a.abs()).collect(),
    )
}

/// Runs both checks for one op on one input; `domain` maps a raw value and
/// the scale to the op's input.
fn run<F, G>(
    name: &str,
    inp: &Input,
    domain: impl Fn(f64, f64) -> f64,
    ops: (F, G),
    mag: Mag,
) -> std::result::Result<(), TestCaseError>
where
    F: Fn(&Var<f64>) -> Result<Var<f64>>,
    G: Fn(&Var<f32>) -> Result<Var<f32>>,
{
    run_with_step(name, inp, domain, ops, mag, step)
}

/// [`run`] with the finite-difference step given as a function of the scale.
fn run_with_step<F, G>(
    name: &str,
    inp: &Input,
    domain: impl Fn(f64, f64) -> f64,
    ops: (F, G),
    mag: Mag,
    step: fn(f64) -> f64,
) -> std::result::Result<(), TestCaseError>
where
    F: Fn(&Var<f64>) -> Result<Var<f64>>,
    G: Fn(&Var<f32>) -> Result<Var<f32>>,
{
    // Inputs exactly representable in f32, so the f32 run sees the same
    // numbers and only its arithmetic differs.
    let x32: Vec<f32> = inp
        .raw
        .iter()
        .map(|&r| domain(r, inp.scale) as f32)
        .collect();
    let x64: Vec<f64> = x32.iter().map(|&v| f64::from(v)).collect();
    let xt = Tensor::from_vec(inp.shape.clone(), x64).map_err(tc)?;
    fd_check(name, &xt, step(inp.scale), inp.seed, &ops.0)?;
    f32_check(name, &xt, &x32, inp.seed, &ops.0, &ops.1, mag)
}

/// (a) The f64 analytic gradient against central differences of
/// `L = <c, f(x)>` (random `c` in [-1, 1), drawn by `gradcheck::check`).
///
/// `rtol` is `F64_VS_FD.rtol`. `atol` is made scale-aware, because inputs
/// span 1e-3..1e3 and outputs (e.g. exp) far more:
/// - `F64_VS_FD.atol * G`, where `G` is the largest absolute row sum of
///   the Jacobian (the gradient for `c = 1`: for these ops each input's
///   Jacobian row has one sign, so `G >= |dL/dx|`), i.e. the absolute part
///   is measured in the gradient's own unit;
/// - plus the rounding noise of the probe: `L` is a dot product of `n`
///   terms, so each evaluation errs by up to about
///   `(n + 2) (eps sum|f_j| + MIN_POSITIVE)` (the last term for values that
///   are subnormal in f64), and the difference quotient divides two of them
///   by `2h`. No gradient can be checked below that floor (e.g. `tanh`
///   saturated at `|x| = 1e3`, whose gradient is smaller than the noise in
///   `L`).
fn fd_check<F>(
    name: &str,
    x: &Tensor<f64>,
    step: f64,
    seed: u64,
    f: &F,
) -> std::result::Result<(), TestCaseError>
where
    F: Fn(&Var<f64>) -> Result<Var<f64>>,
{
    let tape = Tape::new();
    let v = tape.var(x.clone());
    let y = f(&v).map_err(tc)?;
    let ones = Tensor::full(y.shape(), 1.0).map_err(tc)?;
    let row_sums = y
        .backward_with(&ones)
        .and_then(|g| g.wrt(&v)?.to_f64_vec())
        .map_err(tc)?;
    let ys = y.value().as_slice().map_err(tc)?;
    let sum_f: f64 = ys.iter().map(|a| a.abs()).sum();
    let min_x = x
        .as_slice()
        .map_err(tc)?
        .iter()
        .fold(f64::INFINITY, |m, a| m.min(a.abs()));
    let h_min = step * min_x.max(1.0);
    let noise = (ys.len() + 2) as f64 * (f64::EPSILON * sum_f + f64::MIN_POSITIVE) / h_min;
    let opts = Options {
        step,
        atol: F64_VS_FD.atol * max_abs(&row_sums) + noise,
        rtol: F64_VS_FD.rtol,
        seed,
        ..Options::default()
    };
    let report =
        gradcheck::check(|v: &[Var<f64>]| f(&v[0]), std::slice::from_ref(x), &opts).map_err(tc)?;
    prop_assert!(
        report.passed(),
        "{}: finite differences disagree (atol {:.3e}, rtol {:.1e})\n{}\n{}",
        name,
        opts.atol,
        opts.rtol,
        gradcheck::Report::header(),
        report
    );
    Ok(())
}

/// Forward and backward with cotangent `c`; returns (shape, y, dx) in f64.
type Run = (Vec<usize>, Vec<f64>, Vec<f64>);

fn forward_backward<T: Element>(
    x: Tensor<T>,
    c: &[f64],
    f: &dyn Fn(&Var<T>) -> Result<Var<T>>,
) -> Result<Run> {
    let tape = Tape::new();
    let v = tape.var(x);
    let y = f(&v)?;
    let ct: Vec<T> = c.iter().map(|&a| T::from_f64(a)).collect();
    let seed = Tensor::from_vec(y.shape().to_vec(), ct)?;
    let dx = y.backward_with(&seed)?.wrt(&v)?.to_f64_vec()?;
    Ok((y.shape().to_vec(), y.value().to_f64_vec()?, dx))
}

/// (b) The f32 run against the f64 run on the same inputs and cotangent,
/// within `F32_VS_F64_TERMS` of the magnitudes `mag` gives.
fn f32_check<F, G>(
    name: &str,
    x64: &Tensor<f64>,
    x32: &[f32],
    seed: u64,
    f64f: &F,
    f32f: &G,
    mag: Mag,
) -> std::result::Result<(), TestCaseError>
where
    F: Fn(&Var<f64>) -> Result<Var<f64>>,
    G: Fn(&Var<f32>) -> Result<Var<f32>>,
{
    let n_out = f64f(&Tape::new().constant(x64.clone()))
        .map_err(tc)?
        .value()
        .numel();
    // A cotangent that f32 holds exactly.
    let c: Vec<f64> = Rng::new(seed ^ 0xC07A)
        .vec(n_out)
        .into_iter()
        .map(|a| f64::from(a as f32))
        .collect();
    let (s64, y64, d64) = forward_backward(x64.clone(), &c, f64f).map_err(tc)?;
    let x32t = Tensor::from_vec(x64.shape().to_vec(), x32.to_vec()).map_err(tc)?;
    let (s32, y32, d32) = forward_backward(x32t, &c, f32f).map_err(tc)?;
    prop_assert_eq!(&s64, &s32, "{}: f32 and f64 output shapes differ", name);
    let (m_y, m_d): (Vec<f64>, Vec<f64>) = match mag {
        Mag::Rel => (vec![0.0; y64.len()], vec![0.0; d64.len()]),
        Mag::OfAbs => {
            let c_abs: Vec<f64> = c.iter().map(|a| a.abs()).collect();
            let abs = abs_tensor(x64).map_err(tc)?;
            let (_, m_y, m_d) = forward_backward(abs, &c_abs, f64f).map_err(tc)?;
            (m_y, m_d)
        }
        Mag::Pointwise(p) => x64
            .as_slice()
            .map_err(tc)?
            .iter()
            .zip(&y64)
            .zip(&c)
            .map(|((&x, &y), &g)| p(x, y, g))
            .unzip(),
    };
    compare(name, "output", &y32, &y64, &m_y, F32_VS_F64_TERMS)?;
    compare(name, "gradient", &d32, &d64, &m_d, F32_VS_F64_TERMS)
}

/// `|got - want| <= atol + rtol * max(m, |want|)` everywhere; NaN matches
/// only NaN.
fn compare(
    name: &str,
    what: &str,
    got: &[f64],
    want: &[f64],
    m: &[f64],
    tol: Tolerance,
) -> std::result::Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(m).enumerate() {
        let ok =
            (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol.atol + tol.rtol * m.max(w.abs());
        prop_assert!(
            ok,
            "{}: f32 {}[{}] = {:e}, f64 = {:e} (magnitude {:e}, {:?})",
            name,
            what,
            i,
            g,
            w,
            m,
            tol
        );
    }
    Ok(())
}

/// The f64 forward against an independent ndarray reference: same shape,
/// and values within `1e-12` of the same computation on `|x|` (exact for
/// shape ops; summation order may differ for reductions).
fn check_reference(
    name: &str,
    inp: &Input,
    f: impl Fn(&Var<f64>) -> Result<Var<f64>>,
    reference: impl Fn(&ArrayD<f64>) -> ArrayD<f64>,
) -> std::result::Result<(), TestCaseError> {
    let x: Vec<f64> = inp.raw.iter().map(|r| r * inp.scale).collect();
    let xt = Tensor::from_vec(inp.shape.clone(), x).map_err(tc)?;
    let y = f(&Tape::new().constant(xt.clone())).map_err(tc)?;
    let xa = xt.to_array().map_err(tc)?;
    let want = reference(&xa);
    let mag = reference(&xa.mapv(f64::abs));
    prop_assert_eq!(y.shape(), want.shape(), "{}: output shape", name);
    let got = y.value().as_slice().map_err(tc)?;
    for ((&g, &w), &m) in got.iter().zip(want.iter()).zip(mag.iter()) {
        prop_assert!(
            (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-12 * m,
            "{}: {} vs reference {}",
            name,
            g,
            w
        );
    }
    Ok(())
}

/// An elementwise op's f64 forward against a scalar reference formula on
/// the same inputs: within `1e-12 * max(|want|, mag(x))`, where `mag` sizes
/// the reference's own cancellation (0 where it has none).
fn check_pointwise(
    name: &str,
    inp: &Input,
    domain: impl Fn(f64, f64) -> f64,
    f: impl Fn(&Var<f64>) -> Result<Var<f64>>,
    reference: impl Fn(f64) -> f64,
    mag: impl Fn(f64) -> f64,
) -> std::result::Result<(), TestCaseError> {
    let x: Vec<f64> = inp.raw.iter().map(|&r| domain(r, inp.scale)).collect();
    let xt = Tensor::from_vec(inp.shape.clone(), x.clone()).map_err(tc)?;
    let y = f(&Tape::new().constant(xt)).map_err(tc)?;
    prop_assert_eq!(y.shape(), &inp.shape[..]);
    for (&xv, &g) in x.iter().zip(y.value().as_slice().map_err(tc)?) {
        let w = reference(xv);
        prop_assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(mag(xv)),
            "{}({}) = {} vs reference {}",
            name,
            xv,
            g,
            w
        );
    }
    Ok(())
}

fn no_mag(_: f64) -> f64 {
    0.0
}

/// ndarray reference for a reduction: `sum_axis` per axis, highest first.
fn reduce_reference(x: &ArrayD<f64>, axes: &[isize], keep: bool, mean: bool) -> ArrayD<f64> {
    let r = x.ndim() as isize;
    let mut ax: Vec<usize> = if axes.is_empty() {
        (0..x.ndim()).collect()
    } else {
        axes.iter()
            .map(|&a| ((a + r) % r.max(1)) as usize)
            .collect()
    };
    ax.sort_unstable();
    let count: usize = ax.iter().map(|&a| x.shape()[a]).product();
    let mut y = x.clone();
    for &a in ax.iter().rev() {
        y = y.sum_axis(Axis(a));
    }
    if keep {
        for &a in &ax {
            y = y.insert_axis(Axis(a));
        }
    }
    if mean {
        y.mapv_inplace(|v| v / count as f64);
    }
    y
}

// Input domains: `r` is the raw value in ±[0.1, 1], `s` the scale.
fn signed(r: f64, s: f64) -> f64 {
    r * s
}
/// For log, sqrt and rsqrt.
fn positive(r: f64, s: f64) -> f64 {
    r.abs() * s
}
/// exp's argument stays within ±50, so e^x and its gradient stay far from
/// f32 overflow (at e^88.7).
fn exp_arg(r: f64, s: f64) -> f64 {
    r * s.min(50.0)
}

const GELU_K: f64 = 0.797_884_560_802_865_4;
const GELU_A: f64 = 0.044_715;

/// Reference logistic function, without overflow.
fn sigmoid(v: f64) -> f64 {
    if v >= 0.0 {
        1.0 / (1.0 + (-v).exp())
    } else {
        v.exp() / (1.0 + v.exp())
    }
}

// ---------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------

/// Random axes for a reduction: a subset of the axes, each written either
/// way (d or d - rank), in either order; an empty list means every axis.
fn reduce_case() -> impl Strategy<Value = (Input, Vec<isize>, bool)> {
    input().prop_flat_map(|inp| {
        let r = inp.shape.len();
        (
            Just(inp),
            prop::collection::vec((any::<bool>(), any::<bool>()), r),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(inp, picks, rev, keep)| {
                let r = inp.shape.len() as isize;
                let mut axes: Vec<isize> = (0..r)
                    .zip(&picks)
                    .filter(|(_, p)| p.0)
                    .map(|(d, p)| if p.1 { d - r } else { d })
                    .collect();
                if rev {
                    axes.reverse();
                }
                (inp, axes, keep)
            })
    })
}

/// A reshape target: adjacent dims merged at random, up to two 1s added,
/// the result shuffled (same element count, different layout).
fn reshape_case() -> impl Strategy<Value = (Input, Vec<usize>)> {
    input()
        .prop_flat_map(|inp| {
            let r = inp.shape.len();
            (
                Just(inp),
                prop::collection::vec(any::<bool>(), r),
                0usize..=2,
            )
        })
        .prop_flat_map(|(inp, merge, ones)| {
            let mut dims: Vec<usize> = Vec::new();
            for (&d, &m) in inp.shape.iter().zip(&merge) {
                match dims.last_mut() {
                    Some(last) if m => *last *= d,
                    _ => dims.push(d),
                }
            }
            dims.extend(std::iter::repeat_n(1, ones));
            (Just(inp), Just(dims).prop_shuffle())
        })
}

/// Rank >= 1 and two axes in `-rank..rank` (possibly equal).
fn transpose_case() -> impl Strategy<Value = (Input, isize, isize)> {
    prop::collection::vec(dim(), 1..=4)
        .prop_flat_map(input_with_shape)
        .prop_flat_map(|inp| {
            let r = inp.shape.len() as isize;
            (Just(inp), -r..r, -r..r)
        })
}

fn permute_case() -> impl Strategy<Value = (Input, Vec<usize>)> {
    input().prop_flat_map(|inp| {
        let perm: Vec<usize> = (0..inp.shape.len()).collect();
        (Just(inp), Just(perm).prop_shuffle())
    })
}

/// A target shape and an input that broadcasts to it: some leading axes
/// dropped, and some of the others set to 1.
fn broadcast_case() -> impl Strategy<Value = (Input, Vec<usize>)> {
    shape()
        .prop_flat_map(|target| {
            let r = target.len();
            (Just(target), 0..=r, prop::collection::vec(any::<bool>(), r))
        })
        .prop_flat_map(|(target, drop, ones)| {
            let from: Vec<usize> = target[drop..]
                .iter()
                .zip(&ones[drop..])
                .map(|(&d, &one)| if one { 1 } else { d })
                .collect();
            (input_with_shape(from), Just(target))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_sum(inp in input()) {
        run("sum", &inp, signed, pair!(|v| ops::sum(v)), Mag::OfAbs)?;
        check_reference("sum", &inp, ops::sum, |x| reduce_reference(x, &[], false, false))?;
    }

    #[test]
    fn prop_mean(inp in input()) {
        run("mean", &inp, signed, pair!(|v| ops::mean(v)), Mag::OfAbs)?;
        check_reference("mean", &inp, ops::mean, |x| reduce_reference(x, &[], false, true))?;
    }

    #[test]
    fn prop_sum_axes((inp, axes, keep) in reduce_case()) {
        run("sum_axes", &inp, signed, pair!(|v| ops::sum_axes(v, &axes, keep)), Mag::OfAbs)?;
        check_reference("sum_axes", &inp, |v| ops::sum_axes(v, &axes, keep), |x| {
            reduce_reference(x, &axes, keep, false)
        })?;
    }

    #[test]
    fn prop_mean_axes((inp, axes, keep) in reduce_case()) {
        run("mean_axes", &inp, signed, pair!(|v| ops::mean_axes(v, &axes, keep)), Mag::OfAbs)?;
        check_reference("mean_axes", &inp, |v| ops::mean_axes(v, &axes, keep), |x| {
            reduce_reference(x, &axes, keep, true)
        })?;
    }

    #[test]
    fn prop_neg(inp in input()) {
        run("neg", &inp, signed, pair!(|v| ops::neg(v)), Mag::Rel)?;
        check_pointwise("neg", &inp, signed, ops::neg, |x| -x, no_mag)?;
    }

    #[test]
    fn prop_scalar_add(inp in input(), c in -1.0f64..1.0) {
        let c = c * inp.scale;
        // x + c can cancel; its terms have size |x| + |c|.
        let m = |x: f64, _: f64, g: f64| (x.abs() + c.abs(), g.abs());
        run("scalar_add", &inp, signed, pair!(|v| ops::scalar_add(v, c)), Mag::Pointwise(&m))?;
        check_pointwise("scalar_add", &inp, signed, |v| ops::scalar_add(v, c), |x| x + c, |x| x.abs() + c.abs())?;
    }

    #[test]
    fn prop_scalar_mul(inp in input(), c in -10.0f64..10.0) {
        run("scalar_mul", &inp, signed, pair!(|v| ops::scalar_mul(v, c)), Mag::Rel)?;
        check_pointwise("scalar_mul", &inp, signed, |v| ops::scalar_mul(v, c), |x| x * c, no_mag)?;
    }

    #[test]
    fn prop_powi(inp in input(), n in -3i32..=4) {
        run("powi", &inp, signed, pair!(|v| ops::powi(v, n)), Mag::Rel)?;
        check_pointwise("powi", &inp, signed, |v| ops::powi(v, n), |x| x.powi(n), no_mag)?;
    }

    #[test]
    fn prop_sqrt(inp in input()) {
        run("sqrt", &inp, positive, pair!(|v| ops::sqrt(v)), Mag::Rel)?;
        check_pointwise("sqrt", &inp, positive, ops::sqrt, f64::sqrt, no_mag)?;
    }

    #[test]
    fn prop_rsqrt(inp in input()) {
        run("rsqrt", &inp, positive, pair!(|v| ops::rsqrt(v)), Mag::Rel)?;
        check_pointwise("rsqrt", &inp, positive, ops::rsqrt, |x| 1.0 / x.sqrt(), no_mag)?;
    }

    #[test]
    fn prop_exp(inp in input()) {
        run("exp", &inp, exp_arg, pair!(|v| ops::exp(v)), Mag::Rel)?;
        check_pointwise("exp", &inp, exp_arg, ops::exp, f64::exp, no_mag)?;
    }

    #[test]
    fn prop_log(inp in input()) {
        run("log", &inp, positive, pair!(|v| ops::log(v)), Mag::Rel)?;
        check_pointwise("log", &inp, positive, ops::log, f64::ln, no_mag)?;
    }

    #[test]
    fn prop_tanh(inp in input()) {
        // dx = g (1 - y^2): the parts of the difference have size |g|.
        let m = |_: f64, y: f64, g: f64| (y.abs(), g.abs());
        run("tanh", &inp, signed, pair!(|v| ops::tanh(v)), Mag::Pointwise(&m))?;
        check_pointwise("tanh", &inp, signed, ops::tanh, f64::tanh, no_mag)?;
    }

    #[test]
    fn prop_sigmoid(inp in input()) {
        // dx = g y (1 - y): the parts have size |g| y.
        let m = |_: f64, y: f64, g: f64| (y.abs(), (g * y).abs());
        run("sigmoid", &inp, signed, pair!(|v| ops::sigmoid(v)), Mag::Pointwise(&m))?;
        check_pointwise("sigmoid", &inp, signed, ops::sigmoid, sigmoid, no_mag)?;
    }

    #[test]
    fn prop_relu(inp in input()) {
        // |x| >= s/10, so finite differences never straddle the kink at 0.
        run("relu", &inp, signed, pair!(|v| ops::relu(v)), Mag::Rel)?;
        check_pointwise("relu", &inp, signed, ops::relu, |x| x.max(0.0), no_mag)?;
    }

    #[test]
    fn prop_gelu_tanh(inp in input()) {
        // y = x sigma(2u) has no cancelling step (Rel). dx/g = s + 2x s (1-s)
        // k (1 + 3a x^2) with s = sigma(2u) cancels where its two parts
        // have opposite signs (x < 0); they are accurate to a few ulps each.
        let m = |x: f64, y: f64, g: f64| {
            let u = 2.0 * GELU_K * (x + GELU_A * x * x * x);
            let (s, s_neg) = (sigmoid(u), sigmoid(-u));
            let tail = 2.0 * x.abs() * s * s_neg * GELU_K * (1.0 + 3.0 * GELU_A * x * x);
            (y.abs(), g.abs() * (s + tail))
        };
        run_with_step("gelu_tanh", &inp, signed, pair!(|v| ops::gelu_tanh(v)), Mag::Pointwise(&m), gelu_step)?;
        // The textbook tanh form cancels for x < 0 (its error is ~|x| ulps).
        check_pointwise("gelu_tanh", &inp, signed, ops::gelu_tanh, |x| 0.5 * x * (1.0 + (GELU_K * (x + GELU_A * x * x * x)).tanh()), f64::abs)?;
    }

    #[test]
    fn prop_gelu(inp in input()) {
        // y = x Phi(x) has no cancelling step (Rel). dx/g = Phi + x phi
        // cancels where its two parts have opposite signs (x < 0).
        let m = |x: f64, y: f64, g: f64| {
            (y.abs(), g.abs() * (normal_cdf(x) + x.abs() * normal_pdf(x)))
        };
        run_with_step("gelu", &inp, signed, pair!(|v| ops::gelu(v)), Mag::Pointwise(&m), gelu_erf_step)?;
        // PyTorch's formula cancels in 1 + erf for x < 0 (error ~|x| ulps).
        check_pointwise("gelu", &inp, signed, ops::gelu, |x| 0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2)), f64::abs)?;
    }

    #[test]
    fn prop_reshape((inp, to) in reshape_case()) {
        run("reshape", &inp, signed, pair!(|v| ops::reshape(v, &to)), Mag::Rel)?;
        check_reference("reshape", &inp, |v| ops::reshape(v, &to), |x| {
            x.to_shape(IxDyn(&to)).map(|a| a.to_owned()).unwrap_or_else(|_| x.clone())
        })?;
    }

    #[test]
    fn prop_transpose((inp, a0, a1) in transpose_case()) {
        run("transpose", &inp, signed, pair!(|v| ops::transpose(v, a0, a1)), Mag::Rel)?;
        let r = inp.shape.len() as isize;
        check_reference("transpose", &inp, |v| ops::transpose(v, a0, a1), |x| {
            let mut t = x.view();
            t.swap_axes(((a0 + r) % r) as usize, ((a1 + r) % r) as usize);
            t.to_owned()
        })?;
    }

    #[test]
    fn prop_permute((inp, perm) in permute_case()) {
        run("permute", &inp, signed, pair!(|v| ops::permute(v, &perm)), Mag::Rel)?;
        check_reference("permute", &inp, |v| ops::permute(v, &perm), |x| {
            x.view().permuted_axes(IxDyn(&perm)).to_owned()
        })?;
    }

    #[test]
    fn prop_broadcast_to((inp, to) in broadcast_case()) {
        // The tape sums the gradient over the repeated axes, which cancels
        // when the cotangent's signs mix: sized like a reduction.
        run("broadcast_to", &inp, signed, pair!(|v| ops::broadcast_to(v, &to)), Mag::OfAbs)?;
        check_reference("broadcast_to", &inp, |v| ops::broadcast_to(v, &to), |x| {
            x.broadcast(IxDyn(&to)).map(|a| a.to_owned()).unwrap_or_else(|| x.clone())
        })?;
    }
}

// ---------------------------------------------------------------------------
// Exact values on small cases
// ---------------------------------------------------------------------------

#[test]
fn sum_axes_values_and_grad() {
    let tape = Tape::new();
    let x = tape.var(arr2(&[[1.0f64, 2.0, 3.0], [4.0, 5.0, 6.0]]));
    let y = ops::sum_axes(&x, &[0], false).unwrap();
    assert_eq!(y.value().as_slice().unwrap(), &[5.0, 7.0, 9.0]);
    let y = ops::mean_axes(&x, &[-1], true).unwrap();
    assert_eq!(y.shape(), &[2, 1]);
    assert_eq!(y.value().as_slice().unwrap(), &[2.0, 5.0]);
    let g = y
        .backward_with(&Tensor::from_vec(vec![2, 1], vec![3.0, 6.0]).unwrap())
        .unwrap();
    assert_eq!(
        g.wrt(&x).unwrap().as_slice().unwrap(),
        &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    );
    let s = ops::sum(&x).unwrap();
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.value().as_slice().unwrap(), &[21.0]);
    let e = tape.var(Tensor::<f64>::zeros(&[0, 3]).unwrap());
    let m = ops::mean_axes(&e, &[0], false).unwrap();
    assert!(m.value().as_slice().unwrap().iter().all(|v| v.is_nan()));
    assert!(matches!(
        ops::sum_axes(&x, &[2], false),
        Err(Error::AxisOutOfRange {
            axis: 2,
            rank: 2,
            ..
        })
    ));
}

#[test]
fn unary_values_and_grads() {
    let tape = Tape::new();
    let x = tape.var(arr2(&[[0.5f64, 2.0], [4.0, 9.0]]));
    // A non-uniform cotangent: each gradient entry is seed * f'(x).
    let seed = Tensor::from_array(arr2(&[[0.75f64, -1.25], [2.5, -0.5]]));
    let s = seed.as_slice().unwrap().to_vec();
    let cases: Vec<(fusegrad::Var<f64>, fn(f64) -> (f64, f64))> = vec![
        (ops::neg(&x).unwrap(), |v| (-v, -1.0)),
        (ops::scalar_add(&x, 1.5).unwrap(), |v| (v + 1.5, 1.0)),
        (ops::scalar_mul(&x, -3.0).unwrap(), |v| (-3.0 * v, -3.0)),
        (ops::powi(&x, 3).unwrap(), |v| (v * v * v, 3.0 * v * v)),
        (ops::powi(&x, -2).unwrap(), |v| {
            (1.0 / (v * v), -2.0 / (v * v * v))
        }),
        (ops::sqrt(&x).unwrap(), |v| (v.sqrt(), 0.5 / v.sqrt())),
        (ops::rsqrt(&x).unwrap(), |v| {
            (1.0 / v.sqrt(), -0.5 * v.powf(-1.5))
        }),
        (ops::exp(&x).unwrap(), |v| (v.exp(), v.exp())),
        (ops::log(&x).unwrap(), |v| (v.ln(), 1.0 / v)),
    ];
    for (y, f) in cases {
        let g = y.backward_with(&seed).unwrap().wrt(&x).unwrap();
        let xs = x.value().as_slice().unwrap();
        for (((&xv, &yv), &gv), &sv) in xs
            .iter()
            .zip(y.value().as_slice().unwrap())
            .zip(g.as_slice().unwrap())
            .zip(&s)
        {
            let (wy, wg) = f(xv);
            let wg = wg * sv;
            assert!(
                (yv - wy).abs() <= 1e-12 * wy.abs().max(1.0),
                "{y:?} {yv} vs {wy}"
            );
            assert!(
                (gv - wg).abs() <= 1e-12 * wg.abs().max(1.0),
                "{y:?} {gv} vs {wg}"
            );
        }
    }
}

#[test]
fn activation_values_and_grads() {
    let tape = Tape::new();
    let x = tape.var(arr1(&[-2.0f64, -0.5, 0.25, 3.0]));
    // A non-uniform cotangent: each gradient entry is seed * f'(x).
    let seed = Tensor::from_array(arr1(&[0.75f64, -1.25, 2.5, -0.5]));
    let s = seed.as_slice().unwrap().to_vec();
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let gelu = |v: f64| 0.5 * v * (1.0 + (GELU_K * (v + GELU_A * v * v * v)).tanh());
    let cases: Vec<(fusegrad::Var<f64>, Box<dyn Fn(f64) -> (f64, f64)>)> = vec![
        (
            ops::tanh(&x).unwrap(),
            Box::new(|v: f64| (v.tanh(), 1.0 - v.tanh().powi(2))),
        ),
        (
            ops::sigmoid(&x).unwrap(),
            Box::new(move |v: f64| (sig(v), sig(v) * (1.0 - sig(v)))),
        ),
        (
            ops::relu(&x).unwrap(),
            Box::new(|v: f64| (v.max(0.0), if v > 0.0 { 1.0 } else { 0.0 })),
        ),
        (
            ops::gelu_tanh(&x).unwrap(),
            // Derivative by a wide central difference of the textbook form.
            Box::new(move |v: f64| (gelu(v), (gelu(v + 1e-5) - gelu(v - 1e-5)) / 2e-5)),
        ),
        (
            ops::gelu(&x).unwrap(),
            // PyTorch's formula; slope Phi(x) + x phi(x).
            Box::new(|v: f64| {
                let phi = (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
                let cdf = 0.5 * (1.0 + erf(v * FRAC_1_SQRT_2));
                (v * cdf, cdf + v * phi)
            }),
        ),
    ];
    for (y, f) in cases {
        let g = y.backward_with(&seed).unwrap().wrt(&x).unwrap();
        let xs = x.value().as_slice().unwrap();
        let ys = y.value().as_slice().unwrap();
        for (((&xv, &yv), &gv), &sv) in xs.iter().zip(ys).zip(g.as_slice().unwrap()).zip(&s) {
            let (wy, wg) = f(xv);
            let wg = wg * sv;
            assert!((yv - wy).abs() <= 1e-12, "{y:?} at {xv}: {yv} vs {wy}");
            assert!((gv - wg).abs() <= 1e-9, "{y:?}' at {xv}: {gv} vs {wg}");
        }
    }
}

#[test]
fn saved_state_is_what_backward_needs() {
    let tape = Tape::new();
    let data: Vec<f32> = (0..32).map(|i| 0.1 * i as f32 + 0.05).collect();
    let x = tape.var(Tensor::from_vec(vec![4, 8], data).unwrap());
    let saved = |y: &Var<f32>| -> usize {
        tape.saved_bytes_per_node()
            .into_iter()
            .find(|n| n.id == y.id())
            .map(|n| n.bytes)
            .unwrap()
    };
    // 32 f32 values = 128 bytes. Inputs here are leaves, which the graph
    // holds anyway, so ops that keep their input add nothing.
    let cases: Vec<(&str, Var<f32>, usize)> = vec![
        ("exp keeps y", ops::exp(&x).unwrap(), 128),
        ("sqrt keeps y", ops::sqrt(&x).unwrap(), 128),
        ("rsqrt keeps y", ops::rsqrt(&x).unwrap(), 128),
        ("tanh keeps y", ops::tanh(&x).unwrap(), 128),
        ("sigmoid keeps y", ops::sigmoid(&x).unwrap(), 128),
        ("log keeps x", ops::log(&x).unwrap(), 0),
        ("powi keeps x", ops::powi(&x, 3).unwrap(), 0),
        // f32 on the CPU: the slope, from the forward pass, in place of x.
        ("gelu keeps its slope", ops::gelu(&x).unwrap(), 128),
        ("gelu_tanh keeps x", ops::gelu_tanh(&x).unwrap(), 0),
        ("relu keeps 1 bit each", ops::relu(&x).unwrap(), 4),
        ("neg", ops::neg(&x).unwrap(), 0),
        ("scalar_add", ops::scalar_add(&x, 1.0).unwrap(), 0),
        ("scalar_mul", ops::scalar_mul(&x, 2.0).unwrap(), 0),
        ("sum_axes", ops::sum_axes(&x, &[1], false).unwrap(), 0),
        ("mean", ops::mean(&x).unwrap(), 0),
        ("reshape", ops::reshape(&x, &[8, 4]).unwrap(), 0),
        ("transpose", ops::transpose(&x, 0, 1).unwrap(), 0),
        ("permute", ops::permute(&x, &[1, 0]).unwrap(), 0),
        (
            "broadcast_to",
            ops::broadcast_to(&x, &[2, 4, 8]).unwrap(),
            0,
        ),
    ];
    for (what, y, want) in &cases {
        assert_eq!(saved(y), *want, "{what}");
    }
    // A non-leaf input kept by log is counted; relu after neg keeps 4 bytes
    // and nothing of neg's output.
    let t2 = Tape::new();
    let x2 = t2.var(Tensor::from_vec(vec![32], vec![1.5f32; 32]).unwrap());
    let before = t2.saved_bytes();
    let _ = ops::log(&ops::scalar_add(&x2, 1.0).unwrap()).unwrap();
    assert_eq!(t2.saved_bytes() - before, 128);
    let t3 = Tape::new();
    let x3 = t3.var(Tensor::from_vec(vec![32], vec![1.5f32; 32]).unwrap());
    let _ = ops::relu(&ops::neg(&x3).unwrap()).unwrap();
    assert_eq!(t3.saved_bytes(), 4);
}

#[test]
fn nan_propagates_and_saturation_stays_finite() {
    let tape = Tape::new();
    let x = tape.var(arr1(&[f64::NAN, 1.0]));
    for y in [
        ops::sum(&x).unwrap(),
        ops::mean(&x).unwrap(),
        ops::relu(&x).unwrap(),
        ops::exp(&x).unwrap(),
        ops::sigmoid(&x).unwrap(),
        ops::gelu(&x).unwrap(),
        ops::gelu_tanh(&x).unwrap(),
        ops::tanh(&x).unwrap(),
    ] {
        assert!(y.value().as_slice().unwrap()[0].is_nan(), "{y:?}");
    }
    // Huge |x|: outputs and gradients finite, no 0 * inf.
    let big = [-1e300f64, -1e20, -1e3, 1e3, 1e20, 1e300];
    let x = tape.var(arr1(&big));
    // A non-uniform cotangent; the expected gradients are seed * f'(x).
    let seed = Tensor::from_array(arr1(&[0.5f64, -1.5, 2.0, -0.25, 3.0, -4.0]));
    for (y, want_g) in [
        (ops::gelu(&x).unwrap(), [0.0, 0.0, 0.0, -0.25, 3.0, -4.0]),
        (
            ops::gelu_tanh(&x).unwrap(),
            [0.0, 0.0, 0.0, -0.25, 3.0, -4.0],
        ),
        (ops::sigmoid(&x).unwrap(), [0.0; 6]),
        (ops::tanh(&x).unwrap(), [0.0; 6]),
    ] {
        assert!(
            y.value().as_slice().unwrap().iter().all(|v| v.is_finite()),
            "{y:?}"
        );
        let g = y.backward_with(&seed).unwrap().wrt(&x).unwrap();
        assert_eq!(g.as_slice().unwrap(), &want_g, "{y:?}");
    }
    let tf = Tape::new();
    let xf = tf.var(arr1(&[-1e30f32, 1e30]));
    let seed = Tensor::from_array(arr1(&[0.5f32, -2.0]));
    for y in [ops::gelu(&xf).unwrap(), ops::gelu_tanh(&xf).unwrap()] {
        let g = y.backward_with(&seed).unwrap().wrt(&xf).unwrap();
        assert_eq!(g.as_slice().unwrap(), &[0.0, -2.0], "{y:?}");
    }
}

#[test]
fn errors_name_the_problem_and_record_nothing() {
    let tape = Tape::<f64>::new();
    let x = tape.var(Tensor::zeros(&[2, 3]).unwrap());
    let s = tape.var(Tensor::scalar(1.0));
    let recorded = tape.len();

    // Axes out of range or repeated.
    assert!(matches!(
        ops::sum_axes(&x, &[2], false),
        Err(Error::AxisOutOfRange {
            op: "sum_axes",
            axis: 2,
            rank: 2,
            ..
        })
    ));
    assert!(matches!(
        ops::mean_axes(&x, &[0, -3], true),
        Err(Error::AxisOutOfRange {
            op: "mean_axes",
            axis: -3,
            rank: 2,
            ..
        })
    ));
    assert!(matches!(
        ops::sum_axes(&s, &[0], false),
        Err(Error::AxisOutOfRange {
            axis: 0,
            rank: 0,
            ..
        })
    ));
    assert!(matches!(
        ops::sum_axes(&x, &[1, -1], false),
        Err(Error::InvalidArgument { op: "sum_axes", .. })
    ));
    assert!(matches!(
        ops::transpose(&x, 0, 2),
        Err(Error::AxisOutOfRange {
            op: "transpose",
            axis: 2,
            ..
        })
    ));
    assert!(matches!(
        ops::transpose(&x, -3, 0),
        Err(Error::AxisOutOfRange {
            op: "transpose",
            axis: -3,
            ..
        })
    ));
    assert!(matches!(
        ops::transpose(&s, 0, 0),
        Err(Error::AxisOutOfRange { rank: 0, .. })
    ));

    // Reshape to another element count, or to one that overflows.
    match ops::reshape(&x, &[4]) {
        Err(Error::ShapeMismatch { op, lhs, rhs }) => {
            assert_eq!((op, lhs, rhs), ("reshape", vec![2, 3], vec![4]))
        }
        other => panic!("reshape [2,3] -> [4]: {other:?}"),
    }
    assert!(matches!(
        ops::reshape(&x, &[3, 0]),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::reshape(&x, &[usize::MAX, 2]),
        Err(Error::ShapeTooLarge { op: "reshape", .. })
    ));

    // Permutations that are not permutations.
    assert!(matches!(
        ops::permute(&x, &[0]),
        Err(Error::InvalidArgument { op: "permute", .. })
    ));
    assert!(matches!(
        ops::permute(&x, &[1, 1]),
        Err(Error::InvalidArgument { op: "permute", .. })
    ));
    assert!(matches!(
        ops::permute(&x, &[0, 1, 1]),
        Err(Error::InvalidArgument { op: "permute", .. })
    ));
    assert!(matches!(
        ops::permute(&x, &[0, 2]),
        Err(Error::AxisOutOfRange {
            op: "permute",
            axis: 2,
            rank: 2,
            ..
        })
    ));
    assert!(matches!(
        ops::permute(&x, &[usize::MAX, 0]),
        Err(Error::AxisOutOfRange { op: "permute", .. })
    ));

    // Broadcasts NumPy would refuse, and one too large to hold.
    for to in [&[3usize, 3][..], &[3], &[2, 1], &[2, 3, 2], &[]] {
        match ops::broadcast_to(&x, to) {
            Err(Error::BroadcastMismatch { op, lhs, rhs }) => {
                assert_eq!((op, lhs, rhs), ("broadcast_to", vec![2, 3], to.to_vec()))
            }
            other => panic!("broadcast_to {to:?}: {other:?}"),
        }
    }
    let z = tape.var(Tensor::zeros(&[0]).unwrap());
    assert!(matches!(
        ops::broadcast_to(&z, &[1]),
        Err(Error::BroadcastMismatch { .. })
    ));
    assert!(matches!(
        ops::broadcast_to(&x, &[usize::MAX, 2, 3]),
        Err(Error::ShapeTooLarge {
            op: "broadcast_to",
            ..
        })
    ));

    // A failed call records nothing on the tape.
    assert_eq!(tape.len(), recorded + 1); // + z
}
