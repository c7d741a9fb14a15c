//! Broadcasting binary ops: `add`, `sub`, `mul`, `div`.
//!
//! A proptest per op over random NumPy broadcasting patterns (rank 0..=4,
//! dims of 1 on either side or both, missing leading dims, now and then a
//! zero-size dim), each input at its own scale from 1e-3 to 1e3, and a
//! random cotangent, checks:
//! (a) the f64 gradient of each input against central finite differences
//!     (`gradcheck::check`, the other input held constant) to `F64_VS_FD`;
//! (b) the f32 run against the f64 run (output and both gradients) to
//!     `F32_VS_F64_TERMS`, judged against the size of the terms;
//! (c) the f64 output against ndarray's own broadcasting arithmetic.
//!
//! Then exact hand-computed gradients of broadcast inputs, the error
//! variants, and denominators far from 1 in div's backward.

use crate::common::max_abs;
use fusegrad::gradcheck::{self, Options, Report};
use fusegrad::rng::Rng;
use fusegrad::tolerance::{F32_VS_F64_TERMS, F64_VS_FD};
use fusegrad::{ops, Element, Error, Result, Tape, Tensor, Var};
use ndarray::{arr0, arr1, arr2, ArrayD};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const CASES: u32 = 64;

/// Relative finite-difference step, scaled by `min(1, s)` for an input of
/// scale `s` (its values have `|x| >= s / 10`), so `h / |x| <= 1e-4`. Add,
/// sub and mul are linear in each input, so central differences are exact
/// up to rounding; div's `a / b` in `b` has relative truncation error
/// `(h / b)^2 <= 1e-8`.
const FD_STEP: f64 = 1e-5;

type Prop<T = ()> = std::result::Result<T, TestCaseError>;

fn tc(e: Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

impl Bin {
    fn apply<T: Element>(self, a: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
        match self {
            Bin::Add => ops::add(a, b),
            Bin::Sub => ops::sub(a, b),
            Bin::Mul => ops::mul(a, b),
            Bin::Div => ops::div(a, b),
        }
    }

    /// ndarray's co-broadcasting arithmetic.
    fn reference(self, a: &ArrayD<f64>, b: &ArrayD<f64>) -> ArrayD<f64> {
        match self {
            Bin::Add => a + b,
            Bin::Sub => a - b,
            Bin::Mul => a * b,
            Bin::Div => a / b,
        }
    }

    /// The op that, run on `|a|`, `|b|` and `|c|`, gives the magnitude of the
    /// terms behind each output and gradient entry (sub cancels; add does not).
    fn magnitude(self) -> Bin {
        match self {
            Bin::Sub => Bin::Add,
            op => op,
        }
    }
}

/// One random case: two shapes that broadcast together, raw values in
/// `±[0.1, 1]`, a scale per input, a seed for the cotangents.
#[derive(Debug, Clone)]
struct Case {
    sa: Vec<usize>,
    sb: Vec<usize>,
    ra: Vec<f64>,
    rb: Vec<f64>,
    scale: [f64; 2],
    seed: u64,
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![12 => 1usize..=4, 1 => Just(0usize)]
}

/// An input shape that broadcasts to `out`: some leading dims dropped, each
/// remaining dim set to 1 with probability 1/3.
fn side(out: &[usize], drop: usize, ones: &[u8]) -> Vec<usize> {
    out.iter()
        .zip(ones)
        .skip(drop)
        .map(|(&d, &o)| if o == 0 { 1 } else { d })
        .collect()
}

fn raw(n: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((any::<bool>(), 0.1f64..=1.0), n)
        .prop_map(|v| v.into_iter().map(|(s, m)| if s { -m } else { m }).collect())
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(dim(), 0..=4)
        .prop_flat_map(|out| {
            let r = out.len();
            (
                Just(out),
                (0..=r, 0..=r),
                prop::collection::vec(0u8..3, r),
                prop::collection::vec(0u8..3, r),
            )
        })
        .prop_flat_map(|(out, (da, db), oa, ob)| {
            let (sa, sb) = (side(&out, da, &oa), side(&out, db, &ob));
            let (na, nb) = (sa.iter().product(), sb.iter().product());
            (
                Just(sa),
                Just(sb),
                raw(na),
                raw(nb),
                (-3.0f64..=3.0, -3.0f64..=3.0),
                any::<u64>(),
            )
        })
        .prop_map(|(sa, sb, ra, rb, (ea, eb), seed)| Case {
            sa,
            sb,
            ra,
            rb,
            scale: [10f64.powf(ea), 10f64.powf(eb)],
            seed,
        })
}

/// The case's inputs, rounded to f32 so that the f32 run sees the same
/// numbers and only its arithmetic differs.
fn inputs(c: &Case) -> Result<[Tensor<f64>; 2]> {
    let t = |s: &[usize], r: &[f64], k: f64| {
        let v = r.iter().map(|&x| f64::from((x * k) as f32)).collect();
        Tensor::from_vec(s.to_vec(), v)
    };
    Ok([t(&c.sa, &c.ra, c.scale[0])?, t(&c.sb, &c.rb, c.scale[1])?])
}

fn abs(t: &Tensor<f64>) -> Result<Tensor<f64>> {
    let v = t.as_slice()?.iter().map(|x| x.abs()).collect();
    Tensor::from_vec(t.shape().to_vec(), v)
}

/// Output shape and values and both input gradients of one run.
struct Run {
    shape: Vec<usize>,
    y: Vec<f64>,
    grads: [Vec<f64>; 2],
}

/// `op(a, b)` in precision `T`, backward with cotangent `cot`.
fn run<T: Element>(op: Bin, x: &[Tensor<f64>; 2], cot: &[f64]) -> Result<Run> {
    let tape = Tape::new();
    let a = tape.var(x[0].cast::<T>()?);
    let b = tape.var(x[1].cast::<T>()?);
    let y = op.apply(&a, &b)?;
    let seed = Tensor::from_vec(
        y.shape().to_vec(),
        cot.iter().map(|&c| T::from_f64(c)).collect(),
    )?;
    let g = y.backward_with(&seed)?;
    Ok(Run {
        shape: y.shape().to_vec(),
        y: y.value().to_f64_vec()?,
        grads: [g.wrt(&a)?.to_f64_vec()?, g.wrt(&b)?.to_f64_vec()?],
    })
}

/// (a) One input at a time, the other a constant. `atol` is scale-aware:
/// `F64_VS_FD.atol` times `G`, the largest gradient entry any cotangent in
/// [-1, 1] can give (the magnitude op on `|a|, |b|` with ones), plus the
/// rounding noise of the probe `L = <c, y>`: each evaluation errs by about
/// `(n + 2) (eps sum |y| + MIN_POSITIVE)`, divided by the smallest `2h`.
fn fd_check(op: Bin, c: &Case, x: &[Tensor<f64>; 2], y: &[f64]) -> Prop {
    let ones = vec![1.0; y.len()];
    let bound = run::<f64>(
        op.magnitude(),
        &[abs(&x[0]).map_err(tc)?, abs(&x[1]).map_err(tc)?],
        &ones,
    )
    .map_err(tc)?;
    let sum_y: f64 = y.iter().map(|v| v.abs()).sum();
    for i in 0..2 {
        let step = FD_STEP * c.scale[i].min(1.0);
        let min_x = x[i]
            .as_slice()
            .map_err(tc)?
            .iter()
            .fold(f64::INFINITY, |m, v| m.min(v.abs()));
        let h_min = step * min_x.max(1.0);
        let noise = (y.len() + 2) as f64 * (f64::EPSILON * sum_y + f64::MIN_POSITIVE) / h_min;
        let opts = Options {
            step,
            atol: F64_VS_FD.atol * max_abs(&bound.grads[i]) + noise,
            rtol: F64_VS_FD.rtol,
            max_checks: 64,
            seed: c.seed,
        };
        let other = &x[1 - i];
        let one = |v: &[Var<f64>]| -> Result<Var<f64>> {
            let k = v[0].tape().constant(other.clone());
            if i == 0 {
                op.apply(&v[0], &k)
            } else {
                op.apply(&k, &v[0])
            }
        };
        let r = gradcheck::check(one, std::slice::from_ref(&x[i]), &opts).map_err(tc)?;
        prop_assert!(
            r.passed(),
            "{:?} d/d input {} (atol {:.3e}):\n{}\n{}",
            op,
            i,
            opts.atol,
            Report::header(),
            r
        );
    }
    Ok(())
}

/// `|got - want| <= atol + rtol * max(m, |want|)` entry by entry.
fn compare(what: &str, got: &[f64], want: &[f64], m: &[f64]) -> Prop {
    prop_assert_eq!(got.len(), want.len(), "{}: lengths", what);
    let t = F32_VS_F64_TERMS;
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(m).enumerate() {
        prop_assert!(
            (g - w).abs() <= t.atol + t.rtol * m.abs().max(w.abs()),
            "{}[{}]: f32 {:e} vs f64 {:e} (magnitude {:e})",
            what,
            i,
            g,
            w,
            m
        );
    }
    Ok(())
}

/// All three checks for one op on one case.
fn check_op(op: Bin, c: &Case) -> Prop {
    let x = inputs(c).map_err(tc)?;
    // A cotangent f32 holds exactly; its length is the output's.
    let probe = {
        let t = Tape::new();
        op.apply(&t.constant(x[0].clone()), &t.constant(x[1].clone()))
            .map_err(tc)?
    };
    let cot: Vec<f64> = Rng::new(c.seed ^ 0xC07A)
        .vec(probe.value().numel())
        .into_iter()
        .map(|v| f64::from(v as f32))
        .collect();
    let r64 = run::<f64>(op, &x, &cot).map_err(tc)?;
    prop_assert_eq!(r64.grads[0].len(), x[0].numel());
    prop_assert_eq!(r64.grads[1].len(), x[1].numel());

    // (c) Each entry is one correctly rounded IEEE operation on the same
    // operands, so the reference must agree exactly.
    let (xa, xb) = (x[0].to_array().map_err(tc)?, x[1].to_array().map_err(tc)?);
    let want = op.reference(&xa, &xb);
    prop_assert_eq!(&r64.shape[..], want.shape(), "{:?}: output shape", op);
    for (i, (&g, &w)) in r64.y.iter().zip(want.iter()).enumerate() {
        prop_assert!(g == w, "{:?}: y[{}] = {:e}, reference {:e}", op, i, g, w);
    }

    // (a)
    fd_check(op, c, &x, &r64.y)?;

    // (b)
    let r32 = run::<f32>(op, &x, &cot).map_err(tc)?;
    prop_assert_eq!(&r32.shape, &r64.shape);
    let c_abs: Vec<f64> = cot.iter().map(|v| v.abs()).collect();
    let mag = run::<f64>(
        op.magnitude(),
        &[abs(&x[0]).map_err(tc)?, abs(&x[1]).map_err(tc)?],
        &c_abs,
    )
    .map_err(tc)?;
    let name = format!("{op:?}");
    compare(&format!("{name} output"), &r32.y, &r64.y, &mag.y)?;
    for i in 0..2 {
        compare(
            &format!("{name} d/d input {i}"),
            &r32.grads[i],
            &r64.grads[i],
            &mag.grads[i],
        )?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn prop_add(c in case()) {
        check_op(Bin::Add, &c)?;
    }

    #[test]
    fn prop_sub(c in case()) {
        check_op(Bin::Sub, &c)?;
    }

    #[test]
    fn prop_mul(c in case()) {
        check_op(Bin::Mul, &c)?;
    }

    #[test]
    fn prop_div(c in case()) {
        check_op(Bin::Div, &c)?;
    }
}

// ------------------------------------------------------------ exact values

/// Output and gradients of `op(a, b)` under cotangent `c`, in f64.
fn exact(
    op: Bin,
    a: ArrayD<f64>,
    b: ArrayD<f64>,
    c: ArrayD<f64>,
) -> (ArrayD<f64>, ArrayD<f64>, ArrayD<f64>) {
    let tape = Tape::new();
    let (a, b) = (tape.var(a), tape.var(b));
    let y = op.apply(&a, &b).unwrap();
    let g = y.backward_with(&Tensor::from_array(c)).unwrap();
    (
        y.value().to_array().unwrap(),
        g.wrt(&a).unwrap().to_array().unwrap(),
        g.wrt(&b).unwrap().to_array().unwrap(),
    )
}

/// `a` of shape [2, 1] and `b` of shape [3] broadcast to [2, 3]; dyadic
/// values, so every sum is exact. With `c = [[1, -1, 2], [0.5, 1, -2]]`:
/// - add/sub: `da_i = sum_j c_ij = [2, -0.5]`, `db_j = ±sum_i c_ij = ±[1.5, 0, 0]`;
/// - mul: `da_i = sum_j c_ij b_j = [1 - 2 + 8, 0.5 + 2 - 8]`,
///   `db_j = sum_i c_ij a_i = [2 + 2, -2 + 4, 4 - 8]`;
/// - div: `da_i = sum_j c_ij / b_j = [1 - 0.5 + 0.5, 0.5 + 0.5 - 0.5]`,
///   `db_j = -sum_i c_ij a_i / b_j^2 = [-4 / 1, -2 / 4, 4 / 16]`.
#[test]
fn broadcast_gradients_are_summed_partials() {
    let a = arr2(&[[2.0], [4.0]]).into_dyn();
    let b = arr1(&[1.0, 2.0, 4.0]).into_dyn();
    let c = arr2(&[[1.0, -1.0, 2.0], [0.5, 1.0, -2.0]]).into_dyn();
    let cases = [
        (
            Bin::Add,
            [[3.0, 4.0, 6.0], [5.0, 6.0, 8.0]],
            [2.0, -0.5],
            [1.5, 0.0, 0.0],
        ),
        (
            Bin::Sub,
            [[1.0, 0.0, -2.0], [3.0, 2.0, 0.0]],
            [2.0, -0.5],
            [-1.5, 0.0, 0.0],
        ),
        (
            Bin::Mul,
            [[2.0, 4.0, 8.0], [4.0, 8.0, 16.0]],
            [7.0, -5.5],
            [4.0, 2.0, -4.0],
        ),
        (
            Bin::Div,
            [[2.0, 1.0, 0.5], [4.0, 2.0, 1.0]],
            [1.0, 0.5],
            [-4.0, -0.5, 0.25],
        ),
    ];
    for (op, y, da, db) in cases {
        let (gy, ga, gb) = exact(op, a.clone(), b.clone(), c.clone());
        assert_eq!(gy, arr2(&y).into_dyn(), "{op:?} y");
        assert_eq!(ga.shape(), &[2, 1], "{op:?} da shape");
        assert_eq!(ga.iter().copied().collect::<Vec<_>>(), da, "{op:?} da");
        assert_eq!(gb.shape(), &[3], "{op:?} db shape");
        assert_eq!(gb.iter().copied().collect::<Vec<_>>(), db, "{op:?} db");
    }
}

/// A rank-0 `b` against `[2, 2]`: its gradient sums over every element.
/// With `a = [[1, 2], [3, 4]]`, `b = 2`, `c = [[1, -1], [0.5, 2]]`:
/// `sum c = 2.5`, `sum c a = 1 - 2 + 1.5 + 8 = 8.5`.
#[test]
fn scalar_operand_gradient_sums_everything() {
    let a = arr2(&[[1.0, 2.0], [3.0, 4.0]]).into_dyn();
    let b = arr0(2.0).into_dyn();
    let c = arr2(&[[1.0, -1.0], [0.5, 2.0]]).into_dyn();
    let cases = [
        (Bin::Add, [[1.0, -1.0], [0.5, 2.0]], 2.5),
        (Bin::Sub, [[1.0, -1.0], [0.5, 2.0]], -2.5),
        (Bin::Mul, [[2.0, -2.0], [1.0, 4.0]], 8.5),
        (Bin::Div, [[0.5, -0.5], [0.25, 1.0]], -8.5 / 4.0),
    ];
    for (op, da, db) in cases {
        let (_, ga, gb) = exact(op, a.clone(), b.clone(), c.clone());
        assert_eq!(ga, arr2(&da).into_dyn(), "{op:?} da");
        assert_eq!(gb.shape(), &[] as &[usize], "{op:?} db shape");
        assert_eq!(gb.iter().copied().collect::<Vec<_>>(), [db], "{op:?} db");
    }
}

/// A zero-size dim broadcast against 1: empty output, zero gradient for
/// the size-1 side, an empty one for the other.
#[test]
fn zero_size_broadcast() {
    let a = ArrayD::<f64>::zeros(vec![0, 3]);
    let b = arr2(&[[1.0, 2.0, 3.0]]).into_dyn();
    for op in [Bin::Add, Bin::Sub, Bin::Mul, Bin::Div] {
        let c = ArrayD::<f64>::zeros(vec![0, 3]);
        let (y, ga, gb) = exact(op, a.clone(), b.clone(), c);
        assert_eq!(y.shape(), &[0, 3], "{op:?}");
        assert_eq!(ga.shape(), &[0, 3], "{op:?}");
        assert_eq!(gb, ArrayD::<f64>::zeros(vec![1, 3]), "{op:?}");
    }
}

/// div's `db = -(g / b) (a / b)` keeps its range: in f32, `b = 1e20` or
/// `b = 1e-23` would over- or underflow `b * b`, yet `a / b^2` is finite.
#[test]
fn div_gradient_with_extreme_denominators() {
    for (a, b) in [(1e30f32, 1e20f32), (1e-30, 1e-23), (-3e-15, 2e-20)] {
        let tape = Tape::new();
        let (av, bv) = (tape.var(arr1(&[a])), tape.var(arr1(&[b])));
        let y = ops::div(&av, &bv).unwrap();
        let g = y
            .backward_with(&Tensor::from_array(arr1(&[0.5f32])))
            .unwrap();
        let db = f64::from(g.wrt(&bv).unwrap().as_slice().unwrap()[0]);
        let want = -0.5 * f64::from(a) / (f64::from(b) * f64::from(b));
        assert!(
            (db - want).abs() <= 1e-6 * want.abs(),
            "d(a/b)/db at a={a:e}, b={b:e}: {db:e} vs {want:e}"
        );
    }
}

#[test]
fn nan_and_inf_propagate() {
    let tape = Tape::new();
    let a = tape.var(arr1(&[f64::NAN, 1.0, 0.0, 1.0]));
    let b = tape.var(arr1(&[1.0, f64::NAN, 0.0, 0.0]));
    for op in [Bin::Add, Bin::Sub, Bin::Mul, Bin::Div] {
        let y = op.apply(&a, &b).unwrap().value().to_f64_vec().unwrap();
        assert!(y[0].is_nan() && y[1].is_nan(), "{op:?}: {y:?}");
    }
    let y = ops::div(&a, &b).unwrap().value().to_f64_vec().unwrap();
    assert!(y[2].is_nan(), "0 / 0 = {}", y[2]);
    assert_eq!(y[3], f64::INFINITY);
}

// ------------------------------------------------------------------ errors

#[test]
fn broadcast_mismatch_is_an_error_and_records_nothing() {
    let tape = Tape::<f64>::new();
    let pairs: [(&[usize], &[usize]); 5] = [
        (&[2, 3], &[3, 2]),
        (&[3], &[4]),
        (&[2, 0], &[2, 3]),
        (&[2, 3, 4], &[5, 4]),
        (&[4, 1, 3], &[2, 2]),
    ];
    for (sa, sb) in pairs {
        let a = tape.var(Tensor::zeros(sa).unwrap());
        let b = tape.var(Tensor::zeros(sb).unwrap());
        let before = tape.len();
        for (op, name) in [
            (Bin::Add, "add"),
            (Bin::Sub, "sub"),
            (Bin::Mul, "mul"),
            (Bin::Div, "div"),
        ] {
            assert_eq!(
                op.apply(&a, &b).unwrap_err(),
                Error::BroadcastMismatch {
                    op: name,
                    lhs: sa.to_vec(),
                    rhs: sb.to_vec()
                },
                "{name} {sa:?} {sb:?}"
            );
        }
        assert_eq!(tape.len(), before, "a failed op recorded a node");
    }
}

#[test]
fn vars_of_two_tapes_are_an_error() {
    let (t1, t2) = (Tape::<f32>::new(), Tape::<f32>::new());
    let a = t1.var(arr1(&[1.0f32, 2.0]));
    let b = t2.var(arr1(&[3.0f32, 4.0]));
    let k = t2.constant(arr1(&[3.0f32, 4.0]));
    for (op, name) in [
        (Bin::Add, "add"),
        (Bin::Sub, "sub"),
        (Bin::Mul, "mul"),
        (Bin::Div, "div"),
    ] {
        for (x, y) in [(&a, &b), (&b, &a), (&a, &k)] {
            assert_eq!(
                op.apply(x, y).unwrap_err(),
                Error::TapeMismatch { op: name },
                "{name}"
            );
        }
    }
    assert_eq!((t1.len(), t2.len()), (1, 2));
}
