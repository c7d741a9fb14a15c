//! Property tests for matmul, softmax, log_softmax, mse and cross_entropy.
//!
//! Every op gets a proptest over random shapes and value scales that checks:
//! (a) f64 analytic gradients against central finite differences
//!     (`gradcheck::check`, random cotangent) to `tolerance::F64_VS_FD`;
//! (b) the op run in f32 against the same op in f64 (output and every
//!     gradient, same random cotangent) to a named f32 tolerance;
//! (c) the f64 output against an independent textbook formula
//!     (`tolerance::F64_VS_REFERENCE`), since (a) and (b) alone would accept
//!     a forward that is consistently wrong.
//!
//! Inputs are rounded to f32 first, so the f32 and f64 runs see the same
//! numbers and (b) measures only the arithmetic.
//!
//! Scale-aware bars. `F64_VS_FD` and `F32_VS_F64` are stated for values of
//! order one. Matmul and mse take inputs from 1e-3 to 1e3, and both their
//! gradients and the rounding errors in them grow with the size of the terms
//! summed, while cancellation can leave an entry near zero. So for these two
//! the absolute part of every bar is multiplied by a magnitude:
//! - in (a), per input, by `G_i`, the largest gradient entry the input can
//!   have under a cotangent in [-1, 1] (the op run on absolute values with a
//!   cotangent of ones; for mse with `|pred|` and `-|target|`, so that
//!   nothing cancels). Each input is checked on its own, the others held as
//!   constants, so a tiny operand next to a huge one keeps its own bar.
//! - in (b) and (c), per entry, by that entry's magnitude `sum |term|`
//!   (the op on absolute values with `|cotangent|`), using
//!   `tolerance::f32_sum_vs_f64(terms)`, whose bar grows with the number of
//!   terms summed (k for a matmul entry, more for batch-summed gradients).
//!
//! Softmax, log-softmax and cross-entropy have gradients bounded by a small
//! constant times the cotangent, so their bars are used as they are. Their
//! logits have a moderate spread (1e-3 to 1e2) plus, in half the cases, an
//! offset up to ±1e3: without max subtraction `exp(1e3)` overflows, so the
//! offset cases show the kernels are stable. At such offsets the default
//! finite-difference step (relative to |x|) would be 1e-3, coarse next to the
//! spread that sets the curvature; the step is set so that h is about 1e-5.

use crate::common::max_abs;
use fusegrad::gradcheck::{self, Options, Report};
use fusegrad::rng::Rng;
use fusegrad::tolerance::{self, Tolerance, F32_VS_F64, F64_VS_FD, F64_VS_REFERENCE};
use fusegrad::{ops, Element, Error, Result, Tape, Tensor, Var};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

const CASES: u32 = 48;

type Prop<T = ()> = std::result::Result<T, TestCaseError>;

fn fail(e: Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// `n` values uniform in `offset + [-scale, scale)`, rounded to f32.
fn data(rng: &mut Rng, n: usize, scale: f64, offset: f64) -> Vec<f64> {
    (0..n)
        .map(|_| (offset + scale * rng.range(-1.0, 1.0)) as f32 as f64)
        .collect()
}

fn tensor(shape: &[usize], v: Vec<f64>) -> Tensor<f64> {
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

fn abs(t: &Tensor<f64>, sign: f64) -> Tensor<f64> {
    let v = t.to_f64_vec().unwrap();
    tensor(t.shape(), v.iter().map(|x| sign * x.abs()).collect())
}

/// Output and every input gradient of one run.
struct Run {
    y: Vec<f64>,
    grads: Vec<Vec<f64>>,
}

/// Runs `f` in precision `T` on `inputs` (all Vars) with cotangent `cot`.
fn run<T: Element>(
    f: impl Fn(&[Var<T>]) -> Result<Var<T>>,
    inputs: &[Tensor<f64>],
    cot: &[f64],
) -> Result<Run> {
    let tape = Tape::new();
    let vars = inputs
        .iter()
        .map(|t| Ok(tape.var(t.cast::<T>()?)))
        .collect::<Result<Vec<_>>>()?;
    let y = f(&vars)?;
    let seed = Tensor::from_vec(
        y.shape().to_vec(),
        cot.iter().map(|&c| T::from_f64(c)).collect(),
    )?;
    let g = y.backward_with(&seed)?;
    Ok(Run {
        y: y.value().to_f64_vec()?,
        grads: vars
            .iter()
            .map(|v| g.wrt(v)?.to_f64_vec())
            .collect::<Result<_>>()?,
    })
}

/// Entry by entry `|got - want| <= tol.atol * mag + tol.rtol * |want|`
/// (`mag` defaults to 1); NaN fails.
fn assert_close(
    what: &str,
    tol: Tolerance,
    got: &[f64],
    want: &[f64],
    mag: Option<&[f64]>,
) -> Prop {
    prop_assert_eq!(got.len(), want.len(), "{}: lengths differ", what);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let m = mag.map_or(1.0, |m| m[i].abs());
        let (err, bar) = ((g - w).abs(), tol.atol * m + tol.rtol * w.abs());
        prop_assert!(
            err <= bar,
            "{}[{}]: got {:e}, want {:e}: error {:.3e} > bar {:.3e} (magnitude {:.3e})",
            what,
            i,
            g,
            w,
            err,
            bar,
            m
        );
    }
    Ok(())
}

/// (a): f64 gradients against finite differences, one input at a time with
/// the others as constants; input `i` gets `atol = F64_VS_FD.atol * gscale[i]`.
fn fd_check(
    name: &str,
    f: impl Fn(&[Var<f64>]) -> Result<Var<f64>>,
    inputs: &[Tensor<f64>],
    gscale: &[f64],
    step: f64,
    seed: u64,
) -> Prop {
    for (i, &gs) in gscale.iter().enumerate() {
        let opts = Options {
            step,
            atol: F64_VS_FD.atol * gs,
            rtol: F64_VS_FD.rtol,
            max_checks: 64,
            seed: seed ^ (i as u64).wrapping_mul(0x9E37_79B9),
        };
        let one = |v: &[Var<f64>]| -> Result<Var<f64>> {
            let tape = v[0].tape();
            let all: Vec<Var<f64>> = inputs
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    if j == i {
                        v[0].clone()
                    } else {
                        tape.constant(t.clone())
                    }
                })
                .collect();
            f(&all)
        };
        let r = gradcheck::check(one, &inputs[i..=i], &opts).map_err(fail)?;
        prop_assert!(
            r.passed(),
            "{} d/d input {} (gradient scale {:.2e}, atol {:.2e}):\n{}\n{}",
            name,
            i,
            gs,
            opts.atol,
            Report::header(),
            r
        );
    }
    Ok(())
}

/// (b): the f32 run against the f64 run; `mags` are per-entry magnitudes
/// for output and gradients (None: values of order one).
fn f32_vs_f64(name: &str, tol: Tolerance, r32: &Run, r64: &Run, mags: Option<&Run>) -> Prop {
    assert_close(
        &format!("{name} f32 output"),
        tol,
        &r32.y,
        &r64.y,
        mags.map(|m| &m.y[..]),
    )?;
    for (i, (g32, g64)) in r32.grads.iter().zip(&r64.grads).enumerate() {
        assert_close(
            &format!("{name} f32 d/d input {i}"),
            tol,
            g32,
            g64,
            mags.map(|m| &m.grads[i][..]),
        )?;
    }
    Ok(())
}

/// Runs the same closure body as an f64 and an f32 closure.
macro_rules! both {
    (|$v:ident| $body:expr) => {
        (
            |$v: &[Var<f64>]| -> Result<Var<f64>> { $body },
            |$v: &[Var<f32>]| -> Result<Var<f32>> { $body },
        )
    };
}

// ---------------------------------------------------------------- matmul

/// Shapes `[..., m, k]` and `[..., k, n]` with a random batch of rank 0..=2
/// that each operand sees in full, with some dims set to 1, or with leading
/// dims dropped (down to a plain 2-D operand).
fn mm_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        vec(1usize..=3, 0..=2),
        vec(0u8..3, 4),
        0usize..=2,
        0usize..=2,
        1usize..=5,
        1usize..=5,
        1usize..=5,
    )
        .prop_map(|(batch, pat, drop_a, drop_b, m, k, n)| {
            let r = batch.len();
            let make = |off: usize, drop: usize, last: [usize; 2]| {
                let mut s: Vec<usize> = batch
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if pat[off + i] == 1 { 1 } else { d })
                    .collect();
                s.drain(..drop.min(r));
                s.extend(last);
                s
            };
            (make(0, drop_a, [m, k]), make(2, drop_b, [k, n]))
        })
}

/// Textbook batched matmul with NumPy broadcasting: shape, values, and each
/// entry's magnitude `sum_p |a_ip b_pj|`.
fn ref_matmul(
    sa: &[usize],
    a: &[f64],
    sb: &[usize],
    b: &[f64],
) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let r = (ra - 2).max(rb - 2);
    let pad = |s: &[usize]| {
        let mut v = vec![1; r - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(&sa[..ra - 2]), pad(&sb[..rb - 2]));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    let (mut y, mut mag) = (vec![], vec![]);
    for bi in 0..batch.iter().product::<usize>() {
        let (mut rem, mut ia, mut ib, mut sta, mut stb) = (bi, 0, 0, 1, 1);
        for d in (0..r).rev() {
            let idx = rem % batch[d];
            rem /= batch[d];
            if pa[d] > 1 {
                ia += idx * sta;
            }
            if pb[d] > 1 {
                ib += idx * stb;
            }
            sta *= pa[d];
            stb *= pb[d];
        }
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut mg) = (0.0, 0.0);
                for p in 0..k {
                    let t = a[ia * m * k + i * k + p] * b[ib * k * n + p * n + j];
                    s += t;
                    mg += t.abs();
                }
                y.push(s);
                mag.push(mg);
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    (shape, y, mag)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn matmul_grads_fd_f32_and_reference(
        (sa, sb) in mm_shapes(),
        ea in -3.0f64..3.0,
        eb in -3.0f64..3.0,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a = data(&mut rng, na, 10f64.powf(ea), 0.0);
        let b = data(&mut rng, nb, 10f64.powf(eb), 0.0);
        let (shape, want, mag) = ref_matmul(&sa, &a, &sb, &b);
        let cot = data(&mut rng, want.len(), 1.0, 0.0);
        let inputs = [tensor(&sa, a), tensor(&sb, b)];
        let (f64f, f32f) = both!(|v| ops::matmul(&v[0], &v[1]));

        let r64 = run(f64f, &inputs, &cot).map_err(fail)?;
        // (c)
        assert_close("matmul vs reference", F64_VS_REFERENCE, &r64.y, &want, Some(&mag))?;
        prop_assert_eq!(&r64.grads[0].len(), &na);
        prop_assert_eq!(&r64.grads[1].len(), &nb);

        // Magnitudes: the op on |A|, |B| (nothing cancels).
        let abs_in = [abs(&inputs[0], 1.0), abs(&inputs[1], 1.0)];
        let ones = vec![1.0; cot.len()];
        let bound = run(f64f, &abs_in, &ones).map_err(fail)?;
        let gscale: Vec<f64> = bound.grads.iter().map(|g| max_abs(g)).collect();
        // (a): matmul is linear in each operand, so central differences are
        // exact up to rounding at any step.
        fd_check("matmul", f64f, &inputs, &gscale, Options::default().step, seed)?;

        // (b): terms per entry: k for Y, n (resp. m) times the batch entries
        // summed into one gradient entry for dA (resp. dB).
        let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
        let batch: usize = shape[..shape.len() - 2].iter().product();
        let terms = k.max(n * batch).max(m * batch);
        let abs_cot: Vec<f64> = cot.iter().map(|c| c.abs()).collect();
        let mags = run(f64f, &abs_in, &abs_cot).map_err(fail)?;
        let r32 = run(f32f, &inputs, &cot).map_err(fail)?;
        f32_vs_f64("matmul", tolerance::f32_sum_vs_f64(terms), &r32, &r64, Some(&mags))?;
    }
}

// --------------------------------------------------------------- softmax

/// Textbook stable softmax / log-softmax along `axis`.
fn ref_softmax(shape: &[usize], x: &[f64], axis: usize, log: bool) -> Vec<f64> {
    let d = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |p: usize| (o * d + p) * inner + i;
            let shift = (0..d).map(|p| x[at(p)]).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = (0..d).map(|p| (x[at(p)] - shift).exp()).sum();
            for p in 0..d {
                let u = x[at(p)] - shift;
                y[at(p)] = if log { u - z.ln() } else { u.exp() / z };
            }
        }
    }
    y
}

/// Logit spread (log10) and offset: moderate spread, large offsets half
/// the time.
fn logit_scale() -> impl Strategy<Value = (f64, f64)> {
    (-3.0f64..2.0, prop_oneof![Just(0.0), -1e3f64..1e3])
}

/// FD step giving h = 1e-5 at the largest |x| (gradcheck uses
/// `h = step * max(1, |x|)`).
fn shift_step(x: &[f64]) -> f64 {
    1e-5 / max_abs(x).max(1.0)
}

fn softmax_case(
    log: bool,
    shape: Vec<usize>,
    axis: Index,
    (spread, offset): (f64, f64),
    seed: u64,
) -> Prop {
    let rank = shape.len();
    let axis = axis.index(2 * rank) as isize - rank as isize;
    let ax = if axis < 0 { axis + rank as isize } else { axis } as usize;
    let name = if log { "log_softmax" } else { "softmax" };
    let mut rng = Rng::new(seed);
    let n: usize = shape.iter().product();
    let x = data(&mut rng, n, 10f64.powf(spread), offset);
    let want = ref_softmax(&shape, &x, ax, log);
    let cot = data(&mut rng, n, 1.0, 0.0);
    let step = shift_step(&x);
    let inputs = [tensor(&shape, x)];
    let (f64f, f32f) = both!(|v| if log {
        ops::log_softmax(&v[0], axis)
    } else {
        ops::softmax(&v[0], axis)
    });
    let r64 = run(f64f, &inputs, &cot).map_err(fail)?;
    assert_close(
        &format!("{name} vs reference"),
        F64_VS_REFERENCE,
        &r64.y,
        &want,
        None,
    )?;
    fd_check(name, f64f, &inputs, &[1.0], step, seed)?;
    let r32 = run(f32f, &inputs, &cot).map_err(fail)?;
    f32_vs_f64(name, F32_VS_F64, &r32, &r64, None)
}

fn any_shape() -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..=4, 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn softmax_grads_fd_f32_and_reference(
        shape in any_shape(), axis in any::<Index>(), sc in logit_scale(), seed in any::<u64>(),
    ) {
        softmax_case(false, shape, axis, sc, seed)?;
    }

    #[test]
    fn log_softmax_grads_fd_f32_and_reference(
        shape in any_shape(), axis in any::<Index>(), sc in logit_scale(), seed in any::<u64>(),
    ) {
        softmax_case(true, shape, axis, sc, seed)?;
    }
}

// ------------------------------------------------------------------ mse

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn mse_grads_fd_f32_and_reference(
        shape in vec(1usize..=4, 0..=3),
        ep in -3.0f64..3.0,
        et in -3.0f64..3.0,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let n: usize = shape.iter().product();
        let p = data(&mut rng, n, 10f64.powf(ep), 0.0);
        let t = data(&mut rng, n, 10f64.powf(et), 0.0);
        let want: f64 = p.iter().zip(&t).map(|(a, b)| (a - b) * (a - b)).sum::<f64>() / n as f64;
        let mag: f64 = p.iter().zip(&t).map(|(a, b)| (a.abs() + b.abs()).powi(2)).sum::<f64>() / n as f64;
        let cot = data(&mut rng, 1, 1.0, 0.0);
        let inputs = [tensor(&shape, p), tensor(&shape, t)];
        let (f64f, f32f) = both!(|v| ops::mse(&v[0], &v[1]));

        let r64 = run(f64f, &inputs, &cot).map_err(fail)?;
        assert_close("mse vs reference", F64_VS_REFERENCE, &r64.y, &[want], Some(&[mag]))?;

        // |pred| against -|target|: the difference never cancels.
        let abs_in = [abs(&inputs[0], 1.0), abs(&inputs[1], -1.0)];
        let bound = run(f64f, &abs_in, &[1.0]).map_err(fail)?;
        let gscale: Vec<f64> = bound.grads.iter().map(|g| max_abs(g)).collect();
        // Quadratic: central differences are exact up to rounding.
        fd_check("mse", f64f, &inputs, &gscale, Options::default().step, seed)?;

        let mags = run(f64f, &abs_in, &[cot[0].abs()]).map_err(fail)?;
        let r32 = run(f32f, &inputs, &cot).map_err(fail)?;
        f32_vs_f64("mse", tolerance::f32_sum_vs_f64(n), &r32, &r64, Some(&mags))?;
    }
}

// --------------------------------------------------------- cross-entropy

fn ce_problem() -> impl Strategy<Value = (usize, usize, Vec<usize>)> {
    (1usize..=5, 1usize..=6).prop_flat_map(|(n, c)| (Just(n), Just(c), vec(0..c, n)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn cross_entropy_grads_fd_f32_and_reference(
        (n, c, targets) in ce_problem(),
        (spread, offset) in logit_scale(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let x = data(&mut rng, n * c, 10f64.powf(spread), offset);
        let logp = ref_softmax(&[n, c], &x, 1, true);
        let want = -targets.iter().enumerate().map(|(r, &t)| logp[r * c + t]).sum::<f64>() / n as f64;
        let cot = data(&mut rng, 1, 1.0, 0.0);
        let step = shift_step(&x);
        let inputs = [tensor(&[n, c], x)];
        let (f64f, f32f) = both!(|v| ops::cross_entropy(&v[0], &targets));

        let r64 = run(f64f, &inputs, &cot).map_err(fail)?;
        assert_close("cross_entropy vs reference", F64_VS_REFERENCE, &r64.y, &[want], None)?;
        fd_check("cross_entropy", f64f, &inputs, &[1.0], step, seed)?;
        let r32 = run(f32f, &inputs, &cot).map_err(fail)?;
        f32_vs_f64("cross_entropy", F32_VS_F64, &r32, &r64, None)?;
    }
}

// ------------------------------------------------- errors and edge cases

#[test]
fn matmul_errors() {
    let tape = Tape::<f64>::new();
    let z = |s: &[usize]| tape.var(Tensor::zeros(s).unwrap());
    assert_eq!(
        ops::matmul(&z(&[2, 3]), &z(&[4, 5])).unwrap_err(),
        Error::MatmulMismatch {
            op: "matmul",
            lhs: vec![2, 3],
            rhs: vec![4, 5],
            k_lhs: 3,
            k_rhs: 4
        }
    );
    assert_eq!(
        ops::matmul(&z(&[7, 2, 3]), &z(&[5, 3, 4])).unwrap_err(),
        Error::BroadcastMismatch {
            op: "matmul",
            lhs: vec![7, 2, 3],
            rhs: vec![5, 3, 4]
        }
    );
    let e = ops::matmul(&z(&[3]), &z(&[3, 4])).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { op: "matmul", msg } if msg.contains("[3]")),
        "{e}"
    );
}

#[test]
fn softmax_axis_out_of_range() {
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::zeros(&[2, 3]).unwrap());
    for axis in [2isize, -3, 100] {
        assert_eq!(
            ops::softmax(&x, axis).unwrap_err(),
            Error::AxisOutOfRange {
                op: "softmax",
                axis,
                rank: 2,
                shape: vec![2, 3]
            }
        );
        assert!(matches!(
            ops::log_softmax(&x, axis),
            Err(Error::AxisOutOfRange {
                op: "log_softmax",
                ..
            })
        ));
    }
    let s = tape.var(Tensor::scalar(1.0f32));
    assert!(matches!(
        ops::softmax(&s, 0),
        Err(Error::AxisOutOfRange { rank: 0, .. })
    ));
}

#[test]
fn cross_entropy_bad_targets() {
    let tape = Tape::<f64>::new();
    let x = tape.var(Tensor::zeros(&[2, 5]).unwrap());
    let e = ops::cross_entropy(&x, &[1, 5]).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { op: "cross_entropy", msg }
            if msg.contains("target 5") && msg.contains("row 1") && msg.contains("[2, 5]")),
        "{e}"
    );
    let e = ops::cross_entropy(&x, &[0, 1, 2]).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { op: "cross_entropy", msg }
            if msg.contains("3 targets") && msg.contains("[2, 5]")),
        "{e}"
    );
    let flat = tape.var(Tensor::zeros(&[5]).unwrap());
    assert!(matches!(
        ops::cross_entropy(&flat, &[0]),
        Err(Error::InvalidArgument {
            op: "cross_entropy",
            ..
        })
    ));
}

#[test]
fn mse_shape_mismatch() {
    let tape = Tape::<f32>::new();
    let p = tape.var(Tensor::zeros(&[2, 3]).unwrap());
    let t = tape.constant(Tensor::zeros(&[3, 2]).unwrap());
    assert_eq!(
        ops::mse(&p, &t).unwrap_err(),
        Error::ShapeMismatch {
            op: "mse",
            lhs: vec![2, 3],
            rhs: vec![3, 2]
        }
    );
}

#[test]
fn mse_constant_target_gets_no_gradient() {
    let tape = Tape::<f64>::new();
    let p = tape.var(Tensor::from_vec(vec![2], vec![1.0, 3.0]).unwrap());
    let t = tape.constant(Tensor::from_vec(vec![2], vec![0.0, 1.0]).unwrap());
    let l = ops::mse(&p, &t).unwrap();
    assert_eq!(l.value().to_f64_vec().unwrap(), vec![2.5]);
    let g = l.backward().unwrap();
    // d/dp mean((p-t)^2) = (p - t) for N = 2.
    assert_eq!(g.wrt(&p).unwrap().to_f64_vec().unwrap(), vec![1.0, 2.0]);
    assert!(matches!(g.wrt(&t), Err(Error::NoGradient { .. })));
}

#[test]
fn softmax_family_is_stable_at_huge_logits() {
    let tape = Tape::<f32>::new();
    let big = tape.var(Tensor::from_vec(vec![1, 3], vec![1e4f32, 1e4 + 1.0, 1e4 + 2.0]).unwrap());
    let small = tape.var(Tensor::from_vec(vec![1, 3], vec![0.0f32, 1.0, 2.0]).unwrap());
    let a = ops::softmax(&big, -1)
        .unwrap()
        .value()
        .to_f64_vec()
        .unwrap();
    let b = ops::softmax(&small, -1)
        .unwrap()
        .value()
        .to_f64_vec()
        .unwrap();
    assert!(F32_VS_F64.accepts_all(&a, &b), "{a:?} vs {b:?}");
    // log_softmax where softmax underflows to 0: finite, not -inf.
    let far = tape.var(Tensor::from_vec(vec![2], vec![0.0f32, -1e4]).unwrap());
    let l = ops::log_softmax(&far, 0)
        .unwrap()
        .value()
        .to_f64_vec()
        .unwrap();
    assert!(F32_VS_F64.accepts_all(&l, &[0.0, -1e4]), "{l:?}");
    let ce = ops::cross_entropy(&big, &[0])
        .unwrap()
        .value()
        .to_f64_vec()
        .unwrap();
    let want = (1.0 + (1f64).exp() + (2f64).exp()).ln();
    assert!(F32_VS_F64.accepts(ce[0], want), "{ce:?} vs {want}");
}

#[test]
fn nan_propagates_through_its_lane_only() {
    let tape = Tape::<f64>::new();
    let x = tape.var(Tensor::from_vec(vec![2, 2], vec![f64::NAN, 0.0, 1.0, 1.0]).unwrap());
    let y = ops::softmax(&x, 1).unwrap().value().to_f64_vec().unwrap();
    assert!(y[0].is_nan() && y[1].is_nan());
    assert_eq!(&y[2..], &[0.5, 0.5]);
}

#[test]
fn empty_shapes_do_not_panic() {
    let tape = Tape::<f64>::new();
    // k = 0: the product is all zeros; gradients have the operands' shapes.
    let a = tape.var(Tensor::zeros(&[2, 0]).unwrap());
    let b = tape.var(Tensor::zeros(&[0, 3]).unwrap());
    let y = ops::matmul(&a, &b).unwrap();
    assert_eq!(y.shape(), &[2, 3]);
    assert_eq!(y.value().to_f64_vec().unwrap(), vec![0.0; 6]);
    let g = y
        .backward_with(&Tensor::full(&[2, 3], 1.0).unwrap())
        .unwrap();
    assert_eq!(g.wrt(&a).unwrap().shape(), &[2, 0]);
    assert_eq!(g.wrt(&b).unwrap().shape(), &[0, 3]);
    // m = 0 with a batch.
    let a = tape.var(Tensor::zeros(&[4, 0, 2]).unwrap());
    let b = tape.var(Tensor::zeros(&[2, 3]).unwrap());
    let y = ops::matmul(&a, &b).unwrap();
    assert_eq!(y.shape(), &[4, 0, 3]);
    let g = y
        .backward_with(&Tensor::zeros(&[4, 0, 3]).unwrap())
        .unwrap();
    assert_eq!(g.wrt(&b).unwrap().to_f64_vec().unwrap(), vec![0.0; 6]);
    // softmax over an empty dim.
    let x = tape.var(Tensor::zeros(&[3, 0]).unwrap());
    assert_eq!(ops::softmax(&x, 1).unwrap().shape(), &[3, 0]);
    // cross-entropy over no rows: the mean of nothing is NaN, as in PyTorch.
    let z = tape.var(Tensor::zeros(&[0, 4]).unwrap());
    let l = ops::cross_entropy(&z, &[]).unwrap();
    assert!(l.value().to_f64_vec().unwrap()[0].is_nan());
    assert_eq!(l.backward().unwrap().wrt(&z).unwrap().shape(), &[0, 4]);
}

#[test]
fn large_batched_matmul_matches_reference() {
    // Big enough for the parallel and tiled paths, with a shared 2-D weight.
    let mut rng = Rng::new(7);
    let (sa, sb) = ([3usize, 37, 70], [70usize, 300]);
    let a = data(&mut rng, 3 * 37 * 70, 1.0, 0.0);
    let b = data(&mut rng, 70 * 300, 1.0, 0.0);
    let (shape, want, mag) = ref_matmul(&sa, &a, &sb, &b);
    let tape = Tape::<f64>::new();
    let y = ops::matmul(&tape.var(tensor(&sa, a)), &tape.var(tensor(&sb, b))).unwrap();
    assert_eq!(y.shape(), &shape[..]);
    let got = y.value().to_f64_vec().unwrap();
    for ((g, w), m) in got.iter().zip(&want).zip(&mag) {
        assert!(F64_VS_REFERENCE.atol * m + F64_VS_REFERENCE.rtol * w.abs() >= (g - w).abs());
    }
}

/// Throughput figure, not a check: `cargo test --release --test prims_linalg
/// -- --ignored --nocapture matmul_throughput`.
#[test]
#[ignore]
fn matmul_throughput() {
    for (m, k, n) in [
        (64usize, 784usize, 128usize),
        (256, 256, 256),
        (512, 512, 512),
    ] {
        let mut rng = Rng::new(1);
        let a = Tensor::from_vec(vec![m, k], data(&mut rng, m * k, 1.0, 0.0)).unwrap();
        let b = Tensor::from_vec(vec![k, n], data(&mut rng, k * n, 1.0, 0.0)).unwrap();
        let tape = Tape::<f32>::new();
        let (a, b) = (
            tape.constant(a.cast().unwrap()),
            tape.constant(b.cast().unwrap()),
        );
        let reps = (2e9 / (2 * m * k * n) as f64).max(1.0) as usize;
        let y = ops::matmul(&a, &b).unwrap();
        assert_eq!(y.shape(), &[m, n]);
        let t = std::time::Instant::now();
        for _ in 0..reps {
            std::hint::black_box(ops::matmul(&a, &b).unwrap());
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        let gflops = 2.0 * (m * k * n) as f64 / s / 1e9;
        println!(
            "f32 matmul {m}x{k} @ {k}x{n}: {:.3} ms, {gflops:.2} GFLOP/s",
            s * 1e3
        );
    }
}
