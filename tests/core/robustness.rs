//! Property-test fuzzer over the public API.
//!
//! Each case builds a few leaf tensors of random shapes (rank 0 to 5, zero
//! dims, dims so large that their product overflows `usize` or cannot be
//! allocated) and values (normal data at scales 1e-300..1e300, NaN, +-inf,
//! +-0, subnormals, +-MAX), then applies a random sequence of ops to random
//! operands, compatible or not, with random axes, shapes, permutations,
//! scalars and every eps edge. Every call runs under `catch_unwind`:
//!
//! - it must not panic;
//! - it must return `Ok` exactly when the documented rules (an independent
//!   model of shapes and errors, below) say the call is valid, and then with
//!   the documented shape and `requires_grad`;
//! - otherwise it must return one of the errors those rules name.
//!
//! Each case ends with a backward sweep from a random cotangent, which must
//! succeed and give every variable a gradient of its own shape.
//!
//! Cases: 10,000 by default, from a fixed seed; set `FUSEGRAD_FUZZ_CASES` for
//! more and `FUSEGRAD_FUZZ_SEED` for others, e.g.
//! `FUSEGRAD_FUZZ_CASES=100000 FUSEGRAD_FUZZ_SEED=7 cargo test --release --test robustness`.

use fusegrad::rng::Rng;
use fusegrad::{ops, Device, Element, Error, Tape, Tensor, Var};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestCaseError, TestRunner};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

// ---------------------------------------------------------------------------
// Configuration

fn cases() -> u32 {
    std::env::var("FUSEGRAD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// A fixed seed, so CI runs the same cases every time;
/// `FUSEGRAD_FUZZ_SEED=<u64>` explores others.
fn seed() -> RngSeed {
    RngSeed::Fixed(
        std::env::var("FUSEGRAD_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0x5eed_f00d),
    )
}

/// Outputs at least this many bytes cannot be allocated on any machine (more
/// than any virtual address space); the fuzzer's huge dims are 2^56 or more.
const UNALLOCATABLE: u128 = 1 << 57;

const HUGE: usize = 1 << 56;

// ---------------------------------------------------------------------------
// What a case is made of

#[derive(Debug, Clone, Copy)]
enum DType {
    F32,
    F64,
    F16,
    Bf16,
}

/// How a leaf's values are drawn.
#[derive(Debug, Clone, Copy)]
enum Fill {
    /// `scale * N(0, 1) + offset`.
    Normal { scale: f64, offset: f64 },
    /// Mostly normal data with special values sprinkled in.
    Specials,
    /// One value everywhere.
    Constant(f64),
}

#[derive(Debug, Clone)]
struct Leaf {
    shape: Vec<usize>,
    fill: Fill,
    var: bool,
}

/// One op call. Operand indices are taken modulo the number of values made
/// so far; `seed` drives the choices that depend on runtime shapes.
#[derive(Debug, Clone)]
enum Step {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Scalar(bool, usize, f64),
    Powi(usize, i32),
    Reduce {
        mean: bool,
        all: bool,
        x: usize,
        axes: Vec<isize>,
        keep: bool,
    },
    Reshape(usize, Vec<usize>, u64),
    Transpose(usize, isize, isize),
    Permute(usize, Vec<usize>, u64),
    BroadcastTo(usize, Vec<usize>, u64),
    Matmul(usize, usize, u64),
    Softmax {
        log: bool,
        x: usize,
        axis: isize,
    },
    Mse(usize, usize, u64),
    CrossEntropy(usize, u64),
    Norm(Box<NormStep>),
    Tensor(Vec<usize>, u64),
}

impl Step {
    /// A name for the statistics.
    fn family(&self) -> &'static str {
        match self {
            Step::Unary(..) | Step::Scalar(..) | Step::Powi(..) => "unary",
            Step::Binary(..) => "binary",
            Step::Reduce { .. } => "reduce",
            Step::Reshape(..) => "reshape",
            Step::Transpose(..) => "transpose",
            Step::Permute(..) => "permute",
            Step::BroadcastTo(..) => "broadcast_to",
            Step::Matmul(..) => "matmul",
            Step::Softmax { .. } => "softmax",
            Step::Mse(..) => "mse",
            Step::CrossEntropy(..) => "cross_entropy",
            Step::Norm(n) => match (n.rms, n.fused) {
                (false, true) => "layer_norm",
                (false, false) => "layer_norm_composed",
                (true, true) => "rms_norm",
                (true, false) => "rms_norm_composed",
            },
            Step::Tensor(..) => "tensor",
        }
    }

    /// The step's own seed for run-time choices (0 if it has none).
    fn seed(&self) -> u64 {
        match self {
            Step::Reshape(_, _, r)
            | Step::Permute(_, _, r)
            | Step::BroadcastTo(_, _, r)
            | Step::Matmul(_, _, r)
            | Step::Mse(_, _, r)
            | Step::CrossEntropy(_, r)
            | Step::Tensor(_, r) => *r,
            Step::Norm(n) => n.seed,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone)]
struct NormStep {
    rms: bool,
    fused: bool,
    /// Use the `_nd` form with this normalized shape choice.
    nd: Option<Vec<usize>>,
    x: usize,
    gamma: Param,
    beta: Param,
    eps: f64,
    seed: u64,
}

#[derive(Debug, Clone)]
enum Param {
    None,
    /// A fresh variable of exactly the normalized shape.
    Exact,
    /// A fresh variable of this shape.
    Shape(Vec<usize>),
    /// An existing value.
    Pool(usize),
}

#[derive(Debug, Clone)]
struct Case {
    dtype: DType,
    leaves: Vec<Leaf>,
    steps: Vec<Step>,
    seed: u64,
}

// ---------------------------------------------------------------------------
// Strategies

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        12 => 0usize..=4,
        1 => Just(HUGE),
        1 => Just(usize::MAX),
        1 => Just(HUGE + 3),
        1 => Just(1usize << 63),
    ]
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=5)
}

fn scalar() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => -3.0f64..3.0,
        1 => prop::sample::select(vec![
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
            -1e300,
            1e-300,
            f32::MAX as f64,
            1e-40,
        ]),
    ]
}

fn eps() -> impl Strategy<Value = f64> {
    prop::sample::select(vec![
        1e-5,
        1e-12,
        1.0,
        0.0,
        -0.0,
        -1e-5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-45,
        1e-46,
        1e-40,
        f32::MIN_POSITIVE as f64,
        f32::MAX as f64,
        1e39,
        5e-324,
        1e-310,
        f64::MIN_POSITIVE,
        f64::MAX,
        1e-300,
    ])
}

fn axis() -> impl Strategy<Value = isize> {
    prop_oneof![8 => -6isize..=6, 1 => Just(isize::MIN), 1 => Just(isize::MAX)]
}

fn fill() -> impl Strategy<Value = Fill> {
    let scale = prop::sample::select(vec![1.0, 1e-30, 1e30, 1e-300, 1e300, 1e19, 3e38]);
    let offset = prop::sample::select(vec![0.0, 0.0, 1e4, -1e30, 1e300]);
    prop_oneof![
        3 => (scale, offset).prop_map(|(scale, offset)| Fill::Normal { scale, offset }),
        2 => Just(Fill::Specials),
        1 => scalar().prop_map(Fill::Constant),
    ]
}

fn param() -> impl Strategy<Value = Param> {
    prop_oneof![
        2 => Just(Param::None),
        4 => Just(Param::Exact),
        1 => shape().prop_map(Param::Shape),
        1 => (0usize..8).prop_map(Param::Pool),
    ]
}

fn norm_step() -> impl Strategy<Value = NormStep> {
    (
        any::<(bool, bool)>(),
        prop::option::of(prop_oneof![
            Just(vec![]),
            shape(),
            // "the trailing k dims": encoded as [usize::MAX - k] and resolved
            // at run time.
            (0usize..=6).prop_map(|k| vec![usize::MAX - k]),
            (0usize..=6).prop_map(|k| vec![usize::MAX - k]),
        ]),
        0usize..8,
        param(),
        param(),
        prop_oneof![3 => Just(1e-5), 2 => eps()],
        any::<u64>(),
    )
        .prop_map(|((rms, fused), nd, x, gamma, beta, eps, seed)| NormStep {
            rms,
            fused,
            nd,
            x,
            gamma,
            beta,
            eps,
            seed,
        })
}

fn step() -> impl Strategy<Value = Step> {
    let i = || 0usize..8;
    prop_oneof![
        1 => (0u8..12, i()).prop_map(|(k, x)| Step::Unary(k, x)).boxed(),
        1 => (0u8..4, i(), i()).prop_map(|(k, a, b)| Step::Binary(k, a, b)).boxed(),
        1 => (any::<bool>(), i(), scalar()).prop_map(|(m, x, c)| Step::Scalar(m, x, c)).boxed(),
        1 => (
            i(),
            prop_oneof![4 => -3i32..=3, 1 => Just(i32::MIN), 1 => Just(i32::MAX)]
        )
            .prop_map(|(x, n)| Step::Powi(x, n))
            .boxed(),
        1 => (
            any::<(bool, bool, bool)>(),
            i(),
            prop::collection::vec(axis(), 0..=3)
        )
            .prop_map(|((mean, all, keep), x, axes)| Step::Reduce {
                mean,
                all,
                x,
                axes,
                keep
            })
            .boxed(),
        1 => (i(), shape(), any::<u64>()).prop_map(|(x, s, r)| Step::Reshape(x, s, r)).boxed(),
        1 => (i(), axis(), axis()).prop_map(|(x, a, b)| Step::Transpose(x, a, b)).boxed(),
        1 => (
            i(),
            prop::collection::vec(prop_oneof![9 => 0usize..6, 1 => Just(usize::MAX)], 0..=6),
            any::<u64>()
        )
            .prop_map(|(x, p, r)| Step::Permute(x, p, r))
            .boxed(),
        1 => (i(), shape(), any::<u64>()).prop_map(|(x, s, r)| Step::BroadcastTo(x, s, r)).boxed(),
        1 => (i(), i(), any::<u64>()).prop_map(|(a, b, r)| Step::Matmul(a, b, r)).boxed(),
        1 => (any::<bool>(), i(), axis()).prop_map(|(log, x, axis)| Step::Softmax { log, x, axis }).boxed(),
        1 => (i(), i(), any::<u64>()).prop_map(|(a, b, r)| Step::Mse(a, b, r)).boxed(),
        1 => (i(), any::<u64>()).prop_map(|(x, r)| Step::CrossEntropy(x, r)).boxed(),
        3 => norm_step().prop_map(|n| Step::Norm(Box::new(n))).boxed(),
        1 => (shape(), any::<u64>()).prop_map(|(s, r)| Step::Tensor(s, r)).boxed(),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let dtype = prop_oneof![
        3 => Just(DType::F32),
        3 => Just(DType::F64),
        1 => Just(DType::F16),
        1 => Just(DType::Bf16),
    ];
    let leaf =
        (shape(), fill(), any::<bool>()).prop_map(|(shape, fill, var)| Leaf { shape, fill, var });
    (
        dtype,
        prop::collection::vec(leaf, 1..=3),
        prop::collection::vec(step(), 1..=8),
        any::<u64>(),
    )
        .prop_map(|(dtype, leaves, steps, seed)| Case {
            dtype,
            leaves,
            steps,
            seed,
        })
}

// ---------------------------------------------------------------------------
// The model: documented shapes and errors, written independently of the
// library's shape code.

/// The error variants a call may return (its name only).
fn kind(e: &Error) -> &'static str {
    match e {
        Error::ShapeMismatch { .. } => "ShapeMismatch",
        Error::BroadcastMismatch { .. } => "BroadcastMismatch",
        Error::MatmulMismatch { .. } => "MatmulMismatch",
        Error::ElementCount { .. } => "ElementCount",
        Error::NonScalarLoss { .. } => "NonScalarLoss",
        Error::SeedShape { .. } => "SeedShape",
        Error::TapeMismatch { .. } => "TapeMismatch",
        Error::NotOnTape { .. } => "NotOnTape",
        Error::NoGradient { .. } => "NoGradient",
        Error::AxisOutOfRange { .. } => "AxisOutOfRange",
        Error::BadEps { .. } => "BadEps",
        Error::EmptyNormalized { .. } => "EmptyNormalized",
        Error::NormalizedShape { .. } => "NormalizedShape",
        Error::ShapeTooLarge { .. } => "ShapeTooLarge",
        Error::IndexOutOfRange { .. } => "IndexOutOfRange",
        Error::SliceOutOfRange { .. } => "SliceOutOfRange",
        Error::BadProbability { .. } => "BadProbability",
        Error::InvalidArgument { .. } => "InvalidArgument",
        Error::NoBackward { .. } => "NoBackward",
        Error::DeviceMismatch { .. } => "DeviceMismatch",
        Error::Weights { .. } => "Weights",
        Error::Checkpoint { .. } => "Checkpoint",
        Error::Collective { .. } => "Collective",
        Error::Plot { .. } => "Plot",
        Error::Replay { .. } => "Replay",
        Error::ShadowMismatch { .. } => "ShadowMismatch",
        Error::CudaUnavailable { .. } => "CudaUnavailable",
        Error::Cuda { .. } => "Cuda",
        Error::OutOfMemory { .. } => "OutOfMemory",
    }
}

/// The documented outcome of a call.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Shape(Vec<usize>),
    /// Any of these errors (when several rules are broken, any one may be
    /// reported).
    Err(Vec<&'static str>),
}

/// Exact element count (u128 cannot overflow for rank <= 5... or at least
/// saturates far above any limit).
fn numel(s: &[usize]) -> u128 {
    if s.contains(&0) {
        return 0;
    }
    s.iter().fold(1u128, |p, &d| p.saturating_mul(d as u128))
}

/// The size rule for a new buffer of shape `s`: too many elements or bytes
/// for `isize` is `ShapeTooLarge`; more than any machine can map is
/// `OutOfMemory`.
fn size_rule(s: &[usize], elem: usize) -> Expect {
    let n = numel(s);
    let bytes = n.saturating_mul(elem as u128);
    if n > usize::MAX as u128 || bytes > isize::MAX as u128 {
        Expect::Err(vec!["ShapeTooLarge"])
    } else if bytes >= UNALLOCATABLE {
        Expect::Err(vec!["OutOfMemory"])
    } else {
        Expect::Shape(s.to_vec())
    }
}

fn errs(v: Vec<&'static str>) -> Expect {
    Expect::Err(v)
}

/// NumPy broadcasting, or None.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= r {
            s[i + s.len() - r]
        } else {
            1
        }
    };
    (0..r)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            if x == y || y == 1 {
                Some(x)
            } else if x == 1 {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

/// Axis in `-rank..rank`, normalized.
fn norm_axis(a: isize, rank: usize) -> Option<usize> {
    let r = rank as i128;
    let a = a as i128;
    let n = if a < 0 { a + r } else { a };
    (0..r).contains(&n).then_some(n as usize)
}

fn eps_ok(eps: f64, dtype: DType) -> bool {
    let acc_ok = match dtype {
        DType::F64 => true,
        _ => {
            let a = eps as f32;
            a.is_finite() && a > 0.0
        }
    };
    eps.is_finite() && eps > 0.0 && acc_ok
}

fn reduce_rule(s: &[usize], axes: &[isize], keep: bool, elem: usize) -> Expect {
    let mut norm = Vec::new();
    let mut bad = Vec::new();
    for &a in axes {
        match norm_axis(a, s.len()) {
            None => bad.push("AxisOutOfRange"),
            Some(n) if norm.contains(&n) => bad.push("InvalidArgument"),
            Some(n) => norm.push(n),
        }
    }
    if !bad.is_empty() {
        return errs(bad);
    }
    let all = axes.is_empty();
    let mut out = Vec::new();
    for (d, &n) in s.iter().enumerate() {
        if all || norm.contains(&d) {
            if keep {
                out.push(1);
            }
        } else {
            out.push(n);
        }
    }
    size_rule(&out, elem)
}

fn matmul_rule(a: &[usize], b: &[usize], elem: usize) -> Expect {
    if a.len() < 2 || b.len() < 2 {
        return errs(vec!["InvalidArgument"]);
    }
    let (ra, rb) = (a.len(), b.len());
    let mut bad = Vec::new();
    if a[ra - 1] != b[rb - 2] {
        bad.push("MatmulMismatch");
    }
    let batch = broadcast(&a[..ra - 2], &b[..rb - 2]);
    if batch.is_none() {
        bad.push("BroadcastMismatch");
    }
    match batch {
        Some(mut out) if bad.is_empty() => {
            out.extend([a[ra - 2], b[rb - 1]]);
            size_rule(&out, elem)
        }
        _ => errs(bad),
    }
}

/// LayerNorm / RMSNorm over trailing dims `nd` (already resolved).
fn norm_rule(
    x: &[usize],
    nd: Option<&[usize]>,
    params: &[Option<&[usize]>],
    eps: f64,
    dtype: DType,
) -> Expect {
    let mut bad = Vec::new();
    if !eps_ok(eps, dtype) {
        bad.push("BadEps");
    }
    let normalized: Vec<usize> = match nd {
        Some(n) => n.to_vec(),
        None => match x.last() {
            Some(&d) => vec![d],
            None => {
                // The last-axis form of a rank-0 input.
                bad.push("EmptyNormalized");
                return errs(bad);
            }
        },
    };
    if normalized.is_empty() || normalized.contains(&0) {
        bad.push("EmptyNormalized");
    } else if !x.ends_with(&normalized) {
        bad.push("NormalizedShape");
    } else if numel(&normalized) > isize::MAX as u128 {
        // No row (and no gamma) of that many elements can exist.
        bad.push("ShapeTooLarge");
    }
    if params.iter().flatten().any(|p| *p != normalized.as_slice()) {
        bad.push("ShapeMismatch");
    }
    if bad.is_empty() {
        Expect::Shape(x.to_vec())
    } else {
        errs(bad)
    }
}

// ---------------------------------------------------------------------------
// The interpreter

/// Values for a leaf of `n` elements.
fn values(fill: Fill, n: usize, rng: &mut Rng) -> Vec<f64> {
    (0..n)
        .map(|_| match fill {
            Fill::Normal { scale, offset } => offset + scale * rng.normal(),
            Fill::Constant(c) => c,
            Fill::Specials => {
                if rng.uniform() < 0.6 {
                    rng.normal()
                } else {
                    let sp = [
                        f64::NAN,
                        f64::INFINITY,
                        f64::NEG_INFINITY,
                        0.0,
                        -0.0,
                        1e-40,
                        -1e-310,
                        f32::MAX as f64,
                        -(f32::MAX as f64),
                        f64::MAX,
                        f32::MIN_POSITIVE as f64,
                        1e30,
                        -1e-30,
                    ];
                    sp[rng.below(sp.len())]
                }
            }
        })
        .collect()
}

/// Runs `f` and turns a panic into a test failure naming `what`.
fn guarded<R>(what: &str, f: impl FnOnce() -> R) -> Result<R, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        TestCaseError::fail(format!("PANIC in {what}: {msg}"))
    })
}

/// Checks a result against the model.
fn judge<T: Element>(
    what: &str,
    got: &fusegrad::Result<Var<T>>,
    want: &Expect,
    inputs: &[&Var<T>],
) -> Result<(), TestCaseError> {
    match (got, want) {
        (Ok(v), Expect::Shape(s)) => {
            prop_assert_eq!(v.shape(), s.as_slice(), "{}: shape", what);
            prop_assert_eq!(v.value().numel() as u128, numel(s), "{}: numel", what);
            let rg = inputs.iter().any(|i| i.requires_grad());
            prop_assert_eq!(v.requires_grad(), rg, "{}: requires_grad", what);
        }
        (Err(e), Expect::Err(kinds)) => {
            prop_assert!(
                kinds.contains(&kind(e)),
                "{}: got {:?}, documented {:?}",
                what,
                e,
                kinds
            );
            // Messages render without panicking and name something.
            prop_assert!(!e.to_string().is_empty());
        }
        (got, want) => {
            return Err(TestCaseError::fail(format!(
                "{what}: got {:?}, documented {want:?}",
                got.as_ref().map(|v| v.shape().to_vec())
            )))
        }
    }
    Ok(())
}

fn elem_size(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 4,
        DType::F64 => 8,
        DType::F16 | DType::Bf16 => 2,
    }
}

/// A fresh leaf of `shape` (variable), or None if the shape cannot exist
/// (then the creation errors are checked).
fn fresh<T: Element>(
    tape: &Tape<T>,
    shape: &[usize],
    rng: &mut Rng,
    dtype: DType,
) -> Result<Option<Var<T>>, TestCaseError> {
    let rule = size_rule(shape, elem_size(dtype));
    let made = guarded("Tensor::zeros", || Tensor::<T>::zeros(shape))?;
    match (&rule, made) {
        (Expect::Shape(_), Ok(t)) => {
            prop_assert_eq!(t.shape(), shape);
            let v: Vec<T> = values(
                Fill::Normal {
                    scale: 1.0,
                    offset: 0.0,
                },
                t.numel(),
                rng,
            )
            .into_iter()
            .map(T::from_f64)
            .collect();
            let t = Tensor::from_vec(shape.to_vec(), v)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok(Some(tape.var(t)))
        }
        (Expect::Err(k), Err(e)) => {
            prop_assert!(k.contains(&kind(&e)), "zeros({:?}): {:?}", shape, e);
            // from_vec with the wrong data must fail the same way or on the
            // element count, never allocate.
            let e2 = guarded("Tensor::from_vec", || {
                Tensor::<T>::from_vec(shape.to_vec(), vec![])
            })?;
            prop_assert!(
                matches!(
                    e2,
                    Err(Error::ShapeTooLarge { .. } | Error::ElementCount { .. })
                ),
                "from_vec({:?}): {:?}",
                shape,
                e2
            );
            Ok(None)
        }
        (rule, got) => Err(TestCaseError::fail(format!(
            "zeros({shape:?}): {:?} vs {rule:?}",
            got.map(|t| t.shape().to_vec())
        ))),
    }
}

fn run_case<T: Element>(case: &Case) -> Result<(), TestCaseError> {
    let dtype = case.dtype;
    let elem = elem_size(dtype);
    let mut rng = Rng::new(case.seed);
    let tape = Tape::<T>::new();
    let mut pool: Vec<Var<T>> = Vec::new();
    let mut leaves: Vec<Var<T>> = Vec::new();

    // Leaves. A shape that cannot exist is checked to fail, then made empty.
    for leaf in &case.leaves {
        let mut shape = leaf.shape.clone();
        if let Expect::Err(k) = size_rule(&shape, elem) {
            let e = guarded("Tensor::full", || Tensor::<T>::full(&shape, T::ONE))?;
            prop_assert!(
                e.as_ref().is_err_and(|e| k.contains(&kind(e))),
                "full({:?}) = {:?}",
                shape,
                e.map(|t| t.shape().to_vec())
            );
            shape[0] = 0;
        }
        let n = numel(&shape) as usize;
        let data: Vec<T> = values(leaf.fill, n, &mut rng)
            .into_iter()
            .map(T::from_f64)
            .collect();
        let t = Tensor::from_vec(shape.clone(), data)
            .map_err(|e| TestCaseError::fail(format!("leaf {shape:?}: {e}")))?;
        let v = if leaf.var {
            tape.var(t)
        } else {
            tape.constant(t)
        };
        if leaf.var {
            leaves.push(v.clone());
        }
        pool.push(v);
    }

    for (si, step) in case.steps.iter().enumerate() {
        let at = |i: usize| pool[i % pool.len()].clone();
        let what = format!("step {si} {step:?}");
        let mut r = Rng::new(case.seed ^ (si as u64) ^ step.seed().rotate_left(17));
        let (got, want, inputs): (fusegrad::Result<Var<T>>, Expect, Vec<Var<T>>) = match step {
            Step::Unary(k, x) => {
                let x = at(*x);
                let f: fn(&Var<T>) -> fusegrad::Result<Var<T>> = match k % 12 {
                    0 => ops::neg,
                    1 => ops::sqrt,
                    2 => ops::rsqrt,
                    3 => ops::exp,
                    4 => ops::log,
                    5 => ops::tanh,
                    6 => ops::sigmoid,
                    7 => ops::relu,
                    8 => ops::gelu,
                    9 => ops::sum,
                    10 => ops::mean,
                    _ => |x| ops::scalar_mul(x, 2.0),
                };
                let want = if matches!(k % 12, 9 | 10) {
                    Expect::Shape(vec![])
                } else {
                    Expect::Shape(x.shape().to_vec())
                };
                (guarded(&what, || f(&x))?, want, vec![x])
            }
            Step::Binary(k, a, b) => {
                let a = at(*a);
                // Half the time a fresh operand of a broadcast-compatible shape.
                let b = if r.uniform() < 0.5 {
                    let mut s: Vec<usize> = a.shape().to_vec();
                    for d in s.iter_mut() {
                        if r.uniform() < 0.3 {
                            *d = 1;
                        }
                    }
                    let drop = r.below(s.len() + 1);
                    match fresh(&tape, &s[drop..], &mut r, dtype)? {
                        Some(v) => v,
                        None => at(*b),
                    }
                } else {
                    at(*b)
                };
                let (a, b) = if r.uniform() < 0.5 { (a, b) } else { (b, a) };
                let f: fn(&Var<T>, &Var<T>) -> fusegrad::Result<Var<T>> = match k % 4 {
                    0 => ops::add,
                    1 => ops::sub,
                    2 => ops::mul,
                    _ => ops::div,
                };
                let want = match broadcast(a.shape(), b.shape()) {
                    Some(s) => size_rule(&s, elem),
                    None => errs(vec!["BroadcastMismatch"]),
                };
                (guarded(&what, || f(&a, &b))?, want, vec![a, b])
            }
            Step::Scalar(mul, x, c) => {
                let x = at(*x);
                let got = guarded(&what, || {
                    if *mul {
                        ops::scalar_mul(&x, *c)
                    } else {
                        ops::scalar_add(&x, *c)
                    }
                })?;
                (got, Expect::Shape(x.shape().to_vec()), vec![x])
            }
            Step::Powi(x, n) => {
                let x = at(*x);
                let got = guarded(&what, || ops::powi(&x, *n))?;
                (got, Expect::Shape(x.shape().to_vec()), vec![x])
            }
            Step::Reduce {
                mean,
                all,
                x,
                axes,
                keep,
            } => {
                let x = at(*x);
                let (got, want) = if *all {
                    let f = if *mean { ops::mean } else { ops::sum };
                    (guarded(&what, || f(&x))?, Expect::Shape(vec![]))
                } else {
                    let f = if *mean { ops::mean_axes } else { ops::sum_axes };
                    let want = reduce_rule(x.shape(), axes, *keep, elem);
                    (guarded(&what, || f(&x, axes, *keep))?, want)
                };
                (got, want, vec![x])
            }
            Step::Reshape(x, s, _) => {
                let x = at(*x);
                let n = x.value().numel();
                // Half the time a valid target of the same count.
                let target = match r.below(4) {
                    0 => vec![n],
                    1 => {
                        let mut t: Vec<usize> = x.shape().iter().rev().copied().collect();
                        t.push(1);
                        t
                    }
                    _ => s.clone(),
                };
                let nt = numel(&target);
                let want = if nt > usize::MAX as u128 || nt * elem as u128 > isize::MAX as u128 {
                    errs(vec!["ShapeTooLarge"])
                } else if nt != n as u128 {
                    errs(vec!["ShapeMismatch"])
                } else {
                    Expect::Shape(target.clone())
                };
                (guarded(&what, || ops::reshape(&x, &target))?, want, vec![x])
            }
            Step::Transpose(x, a0, a1) => {
                let x = at(*x);
                let rank = x.shape().len();
                let want = match (norm_axis(*a0, rank), norm_axis(*a1, rank)) {
                    (Some(i), Some(j)) => {
                        let mut s = x.shape().to_vec();
                        s.swap(i, j);
                        Expect::Shape(s)
                    }
                    _ => errs(vec!["AxisOutOfRange"]),
                };
                (
                    guarded(&what, || ops::transpose(&x, *a0, *a1))?,
                    want,
                    vec![x],
                )
            }
            Step::Permute(x, p, _) => {
                let x = at(*x);
                let rank = x.shape().len();
                let perm: Vec<usize> = if r.uniform() < 0.5 {
                    // A true permutation (Fisher-Yates).
                    let mut v: Vec<usize> = (0..rank).collect();
                    for i in (1..rank).rev() {
                        v.swap(i, r.below(i + 1));
                    }
                    v
                } else {
                    p.clone()
                };
                let want = if perm.iter().any(|&q| q >= rank) {
                    errs(vec!["AxisOutOfRange"])
                } else {
                    let mut sorted = perm.clone();
                    sorted.sort_unstable();
                    if sorted != (0..rank).collect::<Vec<_>>() {
                        errs(vec!["InvalidArgument"])
                    } else {
                        Expect::Shape(perm.iter().map(|&q| x.shape()[q]).collect())
                    }
                };
                (guarded(&what, || ops::permute(&x, &perm))?, want, vec![x])
            }
            Step::BroadcastTo(x, s, _) => {
                let x = at(*x);
                // Half the time x's shape with size-1 dims grown and new
                // leading dims (possibly huge).
                let target: Vec<usize> = if r.uniform() < 0.5 {
                    let mut t: Vec<usize> = s.iter().take(r.below(3)).copied().collect();
                    t.extend(x.shape().iter().map(|&d| {
                        if d == 1 {
                            s.first().copied().unwrap_or(3)
                        } else {
                            d
                        }
                    }));
                    t
                } else {
                    s.clone()
                };
                let want = match broadcast(x.shape(), &target) {
                    Some(b) if b == target => {
                        if target == x.shape() {
                            Expect::Shape(target.clone())
                        } else {
                            size_rule(&target, elem)
                        }
                    }
                    _ => errs(vec!["BroadcastMismatch"]),
                };
                (
                    guarded(&what, || ops::broadcast_to(&x, &target))?,
                    want,
                    vec![x],
                )
            }
            Step::Matmul(a, b, _) => {
                let a = at(*a);
                // Often a fresh right operand with a matching inner dim.
                let b = if a.shape().len() >= 2 && r.uniform() < 0.6 {
                    let k = a.shape()[a.shape().len() - 2 + 1];
                    let n = [0, 1, 3, HUGE][r.below(4)];
                    let mut s: Vec<usize> = a.shape()[..a.shape().len() - 2]
                        .iter()
                        .copied()
                        .skip(r.below(2))
                        .collect();
                    s.extend([k, n]);
                    fresh(&tape, &s, &mut r, dtype)?.unwrap_or_else(|| at(*b))
                } else {
                    at(*b)
                };
                let want = matmul_rule(a.shape(), b.shape(), elem);
                (guarded(&what, || ops::matmul(&a, &b))?, want, vec![a, b])
            }
            Step::Softmax { log, x, axis } => {
                let x = at(*x);
                let want = match norm_axis(*axis, x.shape().len()) {
                    Some(_) => Expect::Shape(x.shape().to_vec()),
                    None => errs(vec!["AxisOutOfRange"]),
                };
                let f = if *log { ops::log_softmax } else { ops::softmax };
                (guarded(&what, || f(&x, *axis))?, want, vec![x])
            }
            Step::Mse(a, b, _) => {
                let a = at(*a);
                let b = if r.uniform() < 0.5 {
                    fresh(&tape, a.shape(), &mut r, dtype)?.unwrap_or_else(|| at(*b))
                } else {
                    at(*b)
                };
                let want = if a.shape() == b.shape() {
                    Expect::Shape(vec![])
                } else {
                    errs(vec!["ShapeMismatch"])
                };
                (guarded(&what, || ops::mse(&a, &b))?, want, vec![a, b])
            }
            Step::CrossEntropy(x, _) => {
                let x = at(*x);
                let s = x.shape().to_vec();
                let (n, c) = match s.as_slice() {
                    [n, c] => (*n, *c),
                    _ => (r.below(3), 3),
                };
                let len = match r.below(6) {
                    0 => n.saturating_add(1),
                    1 => n.saturating_sub(1),
                    _ => n,
                }
                .min(4096);
                let targets: Vec<usize> = (0..len)
                    .map(|_| match r.below(10) {
                        0 => c,
                        1 => usize::MAX,
                        _ => r.below(c.max(1)),
                    })
                    .collect();
                let ok = s.len() == 2 && targets.len() == n && targets.iter().all(|&t| t < c);
                let want = if ok {
                    Expect::Shape(vec![])
                } else {
                    errs(vec!["InvalidArgument"])
                };
                (
                    guarded(&what, || ops::cross_entropy(&x, &targets))?,
                    want,
                    vec![x],
                )
            }
            Step::Norm(ns) => {
                let x = at(ns.x);
                let mut r = Rng::new(ns.seed);
                let xs = x.shape().to_vec();
                let nd: Option<Vec<usize>> = ns.nd.as_ref().map(|v| match v.as_slice() {
                    [m] if *m >= usize::MAX - 6 => {
                        let k = usize::MAX - m;
                        xs[xs.len().saturating_sub(k)..].to_vec()
                    }
                    _ => v.clone(),
                });
                let normalized: Vec<usize> = match &nd {
                    Some(n) => n.clone(),
                    None => xs.last().map(|&d| vec![d]).unwrap_or_default(),
                };
                let mut param = |p: &Param| -> Result<Option<Var<T>>, TestCaseError> {
                    Ok(match p {
                        Param::None => None,
                        Param::Exact => fresh(&tape, &normalized, &mut r, dtype)?,
                        Param::Shape(s) => fresh(&tape, s, &mut r, dtype)?,
                        Param::Pool(i) => Some(at(*i)),
                    })
                };
                let gamma = param(&ns.gamma)?;
                let beta = if ns.rms { None } else { param(&ns.beta)? };
                let shapes: Vec<Option<&[usize]>> = vec![
                    gamma.as_ref().map(|g| g.shape()),
                    beta.as_ref().map(|b| b.shape()),
                ];
                let want = norm_rule(&xs, nd.as_deref(), &shapes, ns.eps, dtype);
                let (g, b, eps) = (gamma.as_ref(), beta.as_ref(), ns.eps);
                let got = guarded(&what, || match (ns.rms, ns.fused, &nd) {
                    (false, true, None) => ops::layer_norm(&x, g, b, eps),
                    (false, true, Some(n)) => ops::layer_norm_nd(&x, n, g, b, eps),
                    (false, false, None) => ops::layer_norm_composed(&x, g, b, eps),
                    (false, false, Some(n)) => ops::layer_norm_composed_nd(&x, n, g, b, eps),
                    (true, true, None) => ops::rms_norm(&x, g, eps),
                    (true, true, Some(n)) => ops::rms_norm_nd(&x, n, g, eps),
                    (true, false, None) => ops::rms_norm_composed(&x, g, eps),
                    (true, false, Some(n)) => ops::rms_norm_composed_nd(&x, n, g, eps),
                })?;
                let mut inputs = vec![x];
                inputs.extend(gamma);
                inputs.extend(beta);
                (got, want, inputs)
            }
            Step::Tensor(s, _) => {
                // The Tensor API on its own: creation, reshape, cast, devices.
                let x = at(r.below(pool.len()));
                let t = x.value();
                let cuda = guarded(&what, || t.to_device(Device::Cuda(r.below(4))))?;
                prop_assert!(
                    matches!(cuda, Err(Error::CudaUnavailable { .. })),
                    "to_device"
                );
                let h = guarded(&what, || t.cast::<half::f16>())?;
                prop_assert!(h.is_ok_and(|h| h.shape() == t.shape()));
                let rs = guarded(&what, || t.reshape(s))?;
                match (rs, size_rule(s, elem)) {
                    (Ok(v), _) => prop_assert!(numel(v.shape()) == t.numel() as u128),
                    (Err(Error::ShapeMismatch { .. }), Expect::Shape(_)) => {
                        prop_assert!(numel(s) != t.numel() as u128)
                    }
                    (Err(e), rule) => prop_assert!(
                        matches!(e, Error::ShapeTooLarge { .. } | Error::ShapeMismatch { .. }),
                        "reshape {:?}: {:?} vs {:?}",
                        s,
                        e,
                        rule
                    ),
                }
                fresh(&tape, s, &mut r, dtype)?;
                continue;
            }
        };
        let refs: Vec<&Var<T>> = inputs.iter().collect();
        judge(&what, &got, &want, &refs)?;
        count(step.family(), got.is_ok());
        if let Ok(v) = got {
            pool.push(v);
        }
    }

    // Backward from the newest value that takes a gradient, with a random
    // cotangent; every variable then has a gradient of its own shape.
    if let Some(y) = pool.iter().rev().find(|v| v.requires_grad()) {
        let n = y.value().numel();
        let c: Vec<T> = (0..n).map(|_| T::from_f64(rng.range(-1.0, 1.0))).collect();
        let seed = Tensor::from_vec(y.shape().to_vec(), c)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Ok(mut s) = STATS.lock() {
            s.1 += 1;
        }
        let grads = guarded("backward_with", || y.backward_with(&seed))?
            .map_err(|e| TestCaseError::fail(format!("backward: {e}")))?;
        for v in leaves.iter().chain(pool.iter()) {
            let g = guarded("wrt", || grads.wrt(v))?;
            if v.requires_grad() {
                let g = g.map_err(|e| TestCaseError::fail(format!("wrt: {e}")))?;
                prop_assert_eq!(g.shape(), v.shape());
            } else {
                prop_assert!(matches!(g, Err(Error::NoGradient { .. })), "constant wrt");
            }
        }
        // A seed of the wrong shape is an error, not a panic.
        let mut wrong = y.shape().to_vec();
        wrong.push(2);
        if let Ok(bad) = Tensor::<T>::zeros(&wrong) {
            let e = guarded("backward_with", || y.backward_with(&bad))?;
            prop_assert!(matches!(e, Err(Error::SeedShape { .. })), "seed shape");
        }
        let e = guarded("backward", || y.backward())?;
        prop_assert_eq!(e.is_ok(), n == 1, "backward() on {:?}", y.shape());
    }
    Ok(())
}

/// Outcome counts per op (`ok`, `err`), and backward sweeps run.
/// Per-op (ok, err) counts and the number of backward sweeps.
type Stats = (BTreeMap<&'static str, (usize, usize)>, usize);
static STATS: Mutex<Stats> = Mutex::new((BTreeMap::new(), 0));

fn count(op: &'static str, ok: bool) {
    if let Ok(mut s) = STATS.lock() {
        let e = s.0.entry(op).or_default();
        if ok {
            e.0 += 1
        } else {
            e.1 += 1
        }
    }
}

#[test]
fn public_api_never_panics_and_follows_its_docs() {
    // Its tensors' `to_device(Cuda)` must fail: a process where no test
    // has loaded the CUDA driver's emulation.
    crate::common::alone!(public_api_never_panics_and_follows_its_docs);
    let config = ProptestConfig {
        cases: cases(),
        rng_seed: seed(),
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let start = std::time::Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(), |case| match case.dtype {
        DType::F32 => run_case::<f32>(&case),
        DType::F64 => run_case::<f64>(&case),
        DType::F16 => run_case::<half::f16>(&case),
        DType::Bf16 => run_case::<half::bf16>(&case),
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Shown with --nocapture: how often each op was valid or rejected.
    if let Ok(s) = STATS.lock() {
        let (ok, err) = s.0.values().fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
        eprintln!(
            "fuzz: {} cases, {ok} Ok and {err} Err calls, {} backward sweeps, {:.2?}",
            cases(),
            s.1,
            start.elapsed()
        );
        for (op, (o, e)) in &s.0 {
            eprintln!("  {op:<22} ok {o:>7}  err {e:>7}");
        }
        // Every op family was reached with valid and with invalid input.
        for (op, &(o, e)) in &s.0 {
            assert!(o > 0 && e > 0 || *op == "unary", "{op}: ok {o}, err {e}");
        }
    }
}

// ---------------------------------------------------------------------------
// Every size error path, by hand.

fn var<T: Element>(tape: &Tape<T>, shape: &[usize]) -> Var<T> {
    tape.var(Tensor::zeros(shape).unwrap())
}

fn is_too_large<T>(r: &fusegrad::Result<T>) -> bool {
    matches!(r, Err(Error::ShapeTooLarge { .. }))
}

fn is_oom<T>(r: &fusegrad::Result<T>) -> bool {
    matches!(r, Err(Error::OutOfMemory { .. }))
}

#[test]
fn tensor_creation_overflow_and_oom_are_errors() {
    let m = usize::MAX;
    assert!(is_too_large(&Tensor::<f32>::zeros(&[m, 2])));
    assert!(is_too_large(&Tensor::<f32>::zeros(&[1 << 32, 1 << 32])));
    // Fits usize, but not isize bytes.
    assert!(is_too_large(&Tensor::<f64>::full(&[1 << 61], 1.0)));
    // Fits isize, but no machine maps it: an error, not an abort.
    assert!(is_oom(&Tensor::<f32>::zeros(&[HUGE])));
    assert!(is_too_large(&Tensor::<f32>::from_vec(vec![m, m], vec![])));
    assert!(matches!(
        Tensor::<f32>::from_vec(vec![2, 3], vec![0.0; 5]),
        Err(Error::ElementCount { len: 5, .. })
    ));
    assert!(matches!(
        Tensor::<f32>::from_slice(&[2, 3], &[0.0; 7]),
        Err(Error::ElementCount { len: 7, .. })
    ));
    assert!(is_too_large(&Tensor::<f32>::from_slice(&[m, m], &[])));
    // A zero dim makes any shape empty and valid.
    let e = Tensor::<f32>::zeros(&[m, m, 0]).unwrap();
    assert_eq!(e.numel(), 0);
    assert!(is_too_large(&e.reshape(&[m, 2])));
}

#[test]
fn op_output_overflow_is_shape_too_large() {
    let m = usize::MAX;
    let tape = Tape::<f32>::new();
    // Broadcasting two empty operands to an overflowing shape is fine when
    // the result is empty, an error otherwise.
    let a = var(&tape, &[m, 1, 0]);
    let b = var(&tape, &[1, 2, 1]);
    assert_eq!(ops::add(&a, &b).unwrap().shape(), &[m, 2, 0]);
    // matmul: [m, 0] @ [0, m] has m^2 elements.
    let a = var(&tape, &[m, 0]);
    let b = var(&tape, &[0, m]);
    assert!(is_too_large(&ops::matmul(&a, &b)));
    // ... and [2^56, 0] @ [0, 3] cannot be allocated.
    let a = var(&tape, &[HUGE, 0]);
    let b = var(&tape, &[0, 3]);
    assert!(is_oom(&ops::matmul(&a, &b)));
    // Batch dims overflow.
    let a = var(&tape, &[m, 1, 2, 0]);
    let b = var(&tape, &[1, m, 0, 3]);
    assert!(is_too_large(&ops::matmul(&a, &b)));
    // broadcast_to.
    let x = var(&tape, &[1]);
    assert!(is_too_large(&ops::broadcast_to(&x, &[m, 2])));
    assert!(is_oom(&ops::broadcast_to(&x, &[HUGE])));
    // Reductions of an empty tensor to an overflowing or huge output.
    let x = var(&tape, &[0, m, m]);
    assert!(is_too_large(&ops::sum_axes(&x, &[0], false)));
    assert!(is_too_large(&ops::mean_axes(&x, &[0], true)));
    let x = var(&tape, &[HUGE, 0]);
    assert!(is_oom(&ops::sum_axes(&x, &[1], false)));
    // ... while reducing over the huge dims themselves is fine.
    let x = var(&tape, &[0, m, 2]);
    let s = ops::mean_axes(&x, &[1, 2], false).unwrap();
    assert_eq!(s.shape(), &[0]);
    // reshape.
    let x = var(&tape, &[2, 3]);
    assert!(is_too_large(&ops::reshape(&x, &[m, m])));
    // permute / transpose / softmax of empty tensors with huge dims.
    let x = var(&tape, &[m, 0, m]);
    assert_eq!(ops::permute(&x, &[2, 0, 1]).unwrap().shape(), &[m, m, 0]);
    assert_eq!(ops::transpose(&x, 0, 1).unwrap().shape(), &[0, m, m]);
    assert_eq!(ops::softmax(&x, 0).unwrap().shape(), &[m, 0, m]);
    // Layer norms: the normalized row size overflows.
    let x = var(&tape, &[0, m, m]);
    for r in [
        ops::layer_norm_nd(&x, &[m, m], None, None, 1e-5),
        ops::layer_norm_composed_nd(&x, &[m, m], None, None, 1e-5),
        ops::rms_norm_nd(&x, &[m, m], None, 1e-5),
        ops::rms_norm_composed_nd(&x, &[m, m], None, 1e-5),
    ] {
        assert!(is_too_large(&r), "{r:?}");
    }
    // A row longer than isize::MAX cannot exist either.
    assert!(is_too_large(&ops::layer_norm(&x, None, None, 1e-5)));
    // ... while no rows of a huge length are fine, with gradients.
    let x = var(&tape, &[0, m, HUGE]);
    let y = ops::layer_norm(&x, None, None, 1e-5).unwrap();
    let g = y
        .backward_with(&Tensor::zeros(&[0, m, HUGE]).unwrap())
        .unwrap();
    assert_eq!(g.wrt(&x).unwrap().shape(), &[0, m, HUGE]);
    let y = ops::rms_norm(&x, None, 1e-5).unwrap();
    let g = y
        .backward_with(&Tensor::zeros(&[0, m, HUGE]).unwrap())
        .unwrap();
    assert_eq!(g.wrt(&x).unwrap().shape(), &[0, m, HUGE]);
}

#[test]
fn empty_tensors_with_huge_dims_flow_through_every_op() {
    let m = usize::MAX;
    let tape = Tape::<f64>::new();
    let x = var(&tape, &[m, 2, 0]);
    let ys = [
        ops::exp(&x).unwrap(),
        ops::relu(&x).unwrap(),
        ops::mul(&x, &x).unwrap(),
        ops::sum_axes(&x, &[0, 1], true).unwrap(),
        ops::softmax(&x, 1).unwrap(),
        ops::log_softmax(&x, 0).unwrap(),
        ops::transpose(&x, 0, 2).unwrap(),
        ops::matmul(&x, &var(&tape, &[0, 0])).unwrap(),
        ops::layer_norm_composed(&ops::transpose(&x, 1, 2).unwrap(), None, None, 1e-5).unwrap(),
        ops::rms_norm(&ops::transpose(&x, 1, 2).unwrap(), None, 1e-5).unwrap(),
    ];
    for y in ys {
        let seed = Tensor::zeros(y.shape()).unwrap();
        let g = y.backward_with(&seed).unwrap();
        assert_eq!(g.wrt(&x).unwrap().shape(), &[m, 2, 0]);
    }
}

// ---------------------------------------------------------------------------
// The public helper modules (gradcheck, analysis, stability, rng) on
// degenerate arguments: errors or sensible values, never a panic.
