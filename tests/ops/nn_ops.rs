//! The network ops: embedding, narrow, concat, masked_fill (with the causal
//! mask), dropout and the two GELUs. Forward values against hand-computed
//! expectations, backward against the chain rule with random cotangents,
//! specific errors that record nothing, determinism, f32 and f64.

use crate::common::tensor;
use fusegrad::nn::Activation;
use fusegrad::rng::Rng;
use fusegrad::special::erf;
use fusegrad::{ops, Element, Error, Mask, Tape, Tensor, Var};

fn vals<T: Element>(v: &Var<T>) -> Vec<f64> {
    v.value().to_f64_vec().unwrap()
}

/// A random cotangent of `y`'s shape, exactly representable in `T`.
fn cotangent<T: Element>(y: &Var<T>, seed: u64) -> Tensor<T> {
    let c = Rng::new(seed).vec(y.value().numel());
    tensor(y.shape(), &c)
}

/// `dL/dx` for `L = <c, y>`, in f64.
fn grad<T: Element>(y: &Var<T>, c: &Tensor<T>, x: &Var<T>) -> Vec<f64> {
    let g = y.backward_with(c).unwrap().wrt(x).unwrap();
    g.to_f64_vec().unwrap()
}

// ---------------------------------------------------------------------------
// embedding

fn embedding_gathers_and_scatters<T: Element>() {
    let tape = Tape::new();
    // w[v][j] = 10 v + j.
    let w: Vec<f64> = (0..12).map(|i| (10 * (i / 3) + i % 3) as f64).collect();
    let wv = tape.var(tensor::<T>(&[4, 3], &w));
    let ids = [2, 0, 2, 3];
    let y = ops::embedding(&wv, &ids, &[2, 2]).unwrap();
    assert_eq!(y.shape(), &[2, 2, 3]);
    let want = [20., 21., 22., 0., 1., 2., 20., 21., 22., 30., 31., 32.];
    assert_eq!(vals(&y), want);
    // dW[v] sums the cotangent rows of v's positions; row 1 never occurs.
    let c = cotangent(&y, 3);
    let cv = c.to_f64_vec().unwrap();
    let dw = grad(&y, &c, &wv);
    let row = |p: usize, j: usize| cv[p * 3 + j];
    for j in 0..3 {
        let acc = |r: f64| T::from_f64(r).to_f64();
        assert_eq!(dw[j], acc(row(1, j)), "row 0");
        assert_eq!(dw[3 + j], 0.0, "row 1");
        // Two values of T sum exactly in the accumulation type; one rounding.
        assert_eq!(dw[6 + j], acc(row(0, j) + row(2, j)), "row 2");
        assert_eq!(dw[9 + j], acc(row(3, j)), "row 3");
    }
    // A scalar id shape gives one row.
    let y = ops::embedding(&wv, &[1], &[]).unwrap();
    assert_eq!((y.shape(), vals(&y)), (&[3usize][..], vec![10., 11., 12.]));
}

#[test]
fn embedding_values_and_gradient() {
    embedding_gathers_and_scatters::<f32>();
    embedding_gathers_and_scatters::<f64>();
    embedding_gathers_and_scatters::<half::bf16>();
}

#[test]
fn embedding_backward_sums_repeats_in_order_and_is_bitwise_stable() {
    // 70,000 rows of width 1 run as three parallel tasks; 200,000 ids repeat
    // every row about three times.
    let (vocab, n) = (70_000usize, 200_000usize);
    let mut r = Rng::new(9);
    let ids: Vec<usize> = (0..n).map(|_| r.below(vocab)).collect();
    let run = || {
        let tape = Tape::new();
        let w = tape.var(Tensor::<f32>::zeros(&[vocab, 1]).unwrap());
        let y = ops::embedding(&w, &ids, &[n]).unwrap();
        grad(&y, &cotangent(&y, 4), &w)
    };
    let (a, b) = (run(), run());
    assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    // Each row is the f32 sum of its positions' cotangents in position order.
    let c: Vec<f32> = Rng::new(4).vec(n).iter().map(|&v| v as f32).collect();
    let mut want = vec![0.0f32; vocab];
    for (&id, &cv) in ids.iter().zip(&c) {
        want[id] += cv;
    }
    assert!(a.iter().zip(&want).all(|(&g, &w)| g == f64::from(w)));
}

#[test]
fn embedding_errors_name_the_id_and_record_nothing() {
    let tape = Tape::<f64>::new();
    let w = tape.var(Tensor::zeros(&[4, 3]).unwrap());
    let before = tape.len();
    assert_eq!(
        ops::embedding(&w, &[1, 3, 4, 0], &[4]).unwrap_err(),
        Error::IndexOutOfRange {
            op: "embedding",
            index: 4,
            position: 2,
            bound: 4
        }
    );
    assert!(matches!(
        ops::embedding(&w, &[1, 2, 3], &[2, 2]),
        Err(Error::ElementCount {
            op: "embedding",
            len: 3,
            ..
        })
    ));
    let v = tape.var(Tensor::zeros(&[4]).unwrap());
    let before_v = tape.len();
    assert!(matches!(
        ops::embedding(&v, &[0], &[1]),
        Err(Error::InvalidArgument {
            op: "embedding",
            ..
        })
    ));
    assert_eq!((tape.len(), before_v), (before + 1, before + 1));
}

// ---------------------------------------------------------------------------
// narrow and concat

fn narrow_and_concat<T: Element>() {
    let tape = Tape::new();
    let xv: Vec<f64> = (0..10).map(f64::from).collect();
    let x = tape.var(tensor::<T>(&[2, 5], &xv));
    let y = ops::narrow(&x, -1, 1, 3).unwrap();
    assert_eq!(
        (y.shape(), vals(&y)),
        (&[2usize, 3][..], vec![1., 2., 3., 6., 7., 8.])
    );
    let c = cotangent(&y, 5);
    let cv = c.to_f64_vec().unwrap();
    let want = [0., cv[0], cv[1], cv[2], 0., 0., cv[3], cv[4], cv[5], 0.];
    assert_eq!(grad(&y, &c, &x), want);
    let rows = ops::narrow(&x, 0, 1, 1).unwrap();
    assert_eq!(vals(&rows), [5., 6., 7., 8., 9.]);
    assert_eq!(ops::narrow(&x, 1, 5, 0).unwrap().shape(), &[2, 0]);

    let a = tape.var(tensor::<T>(&[2, 2], &[1., 2., 3., 4.]));
    let b = tape.var(tensor::<T>(&[2, 1], &[5., 6.]));
    let y = ops::concat(&[&a, &b], 1).unwrap();
    assert_eq!(
        (y.shape(), vals(&y)),
        (&[2usize, 3][..], vec![1., 2., 5., 3., 4., 6.])
    );
    let c = cotangent(&y, 6);
    let cv = c.to_f64_vec().unwrap();
    let gs = y.backward_with(&c).unwrap();
    assert_eq!(
        gs.wrt(&a).unwrap().to_f64_vec().unwrap(),
        [cv[0], cv[1], cv[3], cv[4]]
    );
    assert_eq!(gs.wrt(&b).unwrap().to_f64_vec().unwrap(), [cv[2], cv[5]]);
    let y0 = ops::concat(&[&a, &a], -2).unwrap();
    assert_eq!(
        (y0.shape(), vals(&y0)),
        (&[4usize, 2][..], vec![1., 2., 3., 4., 1., 2., 3., 4.])
    );
    // Narrowed pieces concatenated give x back; so does the gradient.
    let parts = [
        ops::narrow(&x, 1, 0, 2).unwrap(),
        ops::narrow(&x, 1, 2, 3).unwrap(),
    ];
    let whole = ops::concat(&[&parts[0], &parts[1]], 1).unwrap();
    assert_eq!(vals(&whole), xv);
    let c = cotangent(&whole, 7);
    assert_eq!(grad(&whole, &c, &x), c.to_f64_vec().unwrap());
}

#[test]
fn narrow_and_concat_values_and_gradients() {
    narrow_and_concat::<f32>();
    narrow_and_concat::<f64>();
    narrow_and_concat::<half::f16>();
}

#[test]
fn narrow_and_concat_errors_are_specific_and_record_nothing() {
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::zeros(&[2, 5]).unwrap());
    let y = tape.var(Tensor::zeros(&[3, 1]).unwrap());
    let z = tape.var(Tensor::zeros(&[2]).unwrap());
    let before = tape.len();
    assert_eq!(
        ops::narrow(&x, 2, 0, 1).unwrap_err(),
        Error::AxisOutOfRange {
            op: "narrow",
            axis: 2,
            rank: 2,
            shape: vec![2, 5]
        }
    );
    assert_eq!(
        ops::narrow(&x, 1, 3, 3).unwrap_err(),
        Error::SliceOutOfRange {
            op: "narrow",
            axis: 1,
            start: 3,
            len: 3,
            size: 5,
            shape: vec![2, 5]
        }
    );
    assert!(matches!(
        ops::narrow(&x, 0, usize::MAX, 2),
        Err(Error::SliceOutOfRange {
            start: usize::MAX,
            ..
        })
    ));
    assert_eq!(
        ops::concat(&[&x, &y], 1).unwrap_err(),
        Error::ShapeMismatch {
            op: "concat",
            lhs: vec![2, 5],
            rhs: vec![3, 1]
        }
    );
    assert!(matches!(
        ops::concat(&[&x, &z], 0),
        Err(Error::ShapeMismatch { op: "concat", .. })
    ));
    assert!(matches!(
        ops::concat(&[&x, &x], -3),
        Err(Error::AxisOutOfRange {
            op: "concat",
            axis: -3,
            ..
        })
    ));
    assert!(matches!(
        ops::concat::<f32>(&[], 0),
        Err(Error::InvalidArgument { op: "concat", .. })
    ));
    let other = Tape::new();
    let w = other.var(Tensor::zeros(&[2, 5]).unwrap());
    assert_eq!(
        ops::concat(&[&x, &w], 0).unwrap_err(),
        Error::TapeMismatch { op: "concat" }
    );
    assert_eq!(tape.len(), before);
}

// ---------------------------------------------------------------------------
// masked_fill and the causal mask

#[test]
fn causal_mask_is_true_strictly_above_the_diagonal() {
    let m = ops::causal_mask(3).unwrap();
    assert_eq!(m.shape(), &[3, 3]);
    let t = true;
    let f = false;
    assert_eq!(m.values(), &[f, t, t, f, f, t, f, f, f]);
    assert_eq!(ops::causal_mask(0).unwrap().values(), &[] as &[bool]);
    assert!(matches!(
        ops::causal_mask(usize::MAX),
        Err(Error::ShapeTooLarge { .. })
    ));
}

fn causal_softmax<T: Element>() {
    // Scores [2 heads, 3, 3], masked causally, then softmax over keys.
    let tape = Tape::new();
    let s: Vec<f64> = Rng::new(1).vec(18);
    let x = tape.var(tensor::<T>(&[2, 3, 3], &s));
    let m = ops::causal_mask(3).unwrap();
    let filled = ops::masked_fill(&x, &m, f64::NEG_INFINITY).unwrap();
    let fv = vals(&filled);
    let xs = x.value().to_f64_vec().unwrap();
    for (i, (&fv, &xv)) in fv.iter().zip(&xs).enumerate() {
        let (q, k) = ((i / 3) % 3, i % 3);
        if k > q {
            assert_eq!(fv, f64::NEG_INFINITY, "element {i}");
        } else {
            assert_eq!(fv, xv, "element {i}");
        }
    }
    let p = ops::softmax(&filled, -1).unwrap();
    let pv = vals(&p);
    for h in 0..2 {
        let r = |q: usize| &pv[h * 9 + q * 3..h * 9 + q * 3 + 3];
        assert_eq!(r(0), [1.0, 0.0, 0.0]);
        assert_eq!(r(1)[2], 0.0);
        let (a, b) = (xs[h * 9 + 3], xs[h * 9 + 4]);
        let want = 1.0 / (1.0 + (b - a).exp());
        assert!((r(1)[0] - want).abs() <= 1e-6, "{} vs {want}", r(1)[0]);
    }
    // masked_fill's own gradient: g where unmasked, 0 where masked.
    let c = cotangent(&filled, 2);
    let cv = c.to_f64_vec().unwrap();
    let dx = grad(&filled, &c, &x);
    for (i, (&d, &g)) in dx.iter().zip(&cv).enumerate() {
        let masked = i % 3 > (i / 3) % 3;
        assert_eq!(d, if masked { 0.0 } else { g }, "element {i}");
    }
    // Through the softmax the masked scores get exactly 0 too.
    let c = cotangent(&p, 3);
    let dx = grad(&p, &c, &x);
    assert!(dx
        .iter()
        .enumerate()
        .all(|(i, &d)| i % 3 <= (i / 3) % 3 || d == 0.0));
    assert!(dx.iter().all(|d| d.is_finite()));
}

#[test]
fn masked_fill_causal_softmax() {
    causal_softmax::<f32>();
    causal_softmax::<f64>();
}

#[test]
fn masked_fill_broadcasts_the_mask_and_keeps_nan_where_unmasked() {
    let tape = Tape::new();
    let x = tape.var(tensor::<f64>(
        &[2, 3],
        &[1., f64::NAN, 3., f64::NAN, 5., 6.],
    ));
    // A [3] mask applies to every row.
    let m = Mask::new(&[3], vec![true, false, false]).unwrap();
    let y = ops::masked_fill(&x, &m, 7.5).unwrap();
    let v = vals(&y);
    assert_eq!((v[0], v[2], v[3], v[4], v[5]), (7.5, 3., 7.5, 5., 6.));
    assert!(v[1].is_nan());
    // A [2, 1] mask applies to whole rows.
    let m = Mask::new(&[2, 1], vec![false, true]).unwrap();
    let y = ops::masked_fill(&x, &m, -1.0).unwrap();
    assert_eq!(&vals(&y)[3..], &[-1., -1., -1.]);
    let c = cotangent(&y, 8);
    let cv = c.to_f64_vec().unwrap();
    assert_eq!(grad(&y, &c, &x), [cv[0], cv[1], cv[2], 0., 0., 0.]);
}

#[test]
fn masked_fill_errors_are_specific_and_record_nothing() {
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::zeros(&[2, 3]).unwrap());
    let before = tape.len();
    for bad in [&[2usize, 2][..], &[2, 2, 3], &[3, 1]] {
        let n = bad.iter().product();
        let m = Mask::new(bad, vec![false; n]).unwrap();
        assert_eq!(
            ops::masked_fill(&x, &m, 0.0).unwrap_err(),
            Error::BroadcastMismatch {
                op: "masked_fill",
                lhs: vec![2, 3],
                rhs: bad.to_vec()
            }
        );
    }
    assert_eq!(tape.len(), before);
    assert!(matches!(
        Mask::new(&[2, 2], vec![true; 3]),
        Err(Error::ElementCount { len: 3, .. })
    ));
}

// ---------------------------------------------------------------------------
// dropout

fn dropout_case<T: Element>() {
    let n = 100_000;
    let tape = Tape::new();
    let xs: Vec<f64> = Rng::new(10).vec(n);
    let x = tape.var(tensor::<T>(&[n], &xs));
    let p = 0.3;
    let y = ops::dropout(&x, p, &mut Rng::new(42), true).unwrap();
    let yv = vals(&y);
    // The scale, rounded to the accumulation type, times x, rounded to T.
    let s = <T::Acc as fusegrad::Accum>::of(1.0 / (1.0 - p));
    let xt = x.value().as_slice().unwrap();
    let mut kept = 0usize;
    for (&yi, &xi) in yv.iter().zip(xt) {
        if yi == 0.0 && xi.to_f64() != 0.0 {
            continue;
        }
        kept += 1;
        assert_eq!(yi, T::from_acc(xi.to_acc() * s).to_f64(), "x = {xi:?}");
    }
    let frac = kept as f64 / n as f64;
    // 1 - p within 7 standard deviations (0.0014 each).
    assert!((frac - 0.7).abs() < 0.01, "kept fraction {frac}");
    // The same seed gives the same mask; another seed another one.
    let y2 = ops::dropout(&x, p, &mut Rng::new(42), true).unwrap();
    assert_eq!(vals(&y2), yv);
    let y3 = ops::dropout(&x, p, &mut Rng::new(43), true).unwrap();
    assert_ne!(vals(&y3), yv);
    // The gradient is the cotangent through the same mask and scale.
    let c = cotangent(&y, 11);
    let ct = c.as_slice().unwrap();
    let dx = grad(&y, &c, &x);
    for ((&d, &g), &yi) in dx.iter().zip(ct).zip(&yv) {
        let want = if yi == 0.0 {
            0.0
        } else {
            T::from_acc(g.to_acc() * s).to_f64()
        };
        assert_eq!(d, want);
    }
    // One bit per element is saved.
    let node = tape.saved_bytes_per_node();
    let saved = node.iter().find(|m| m.id == y.id()).unwrap().bytes;
    assert_eq!(saved, n / 8);
}

#[test]
fn dropout_keeps_one_minus_p_scaled_exactly_and_is_seeded() {
    dropout_case::<f32>();
    dropout_case::<f64>();
}

#[test]
fn dropout_off_is_the_identity_and_bad_p_is_an_error() {
    let tape = Tape::<f64>::new();
    let x = tape.var(tensor(&[4], &[1., -2., 3., f64::NAN]));
    let before = tape.len();
    let mut r = Rng::new(1);
    let off = ops::dropout(&x, 0.5, &mut r, false).unwrap();
    let zero = ops::dropout(&x, 0.0, &mut r, true).unwrap();
    for y in [&off, &zero] {
        assert_eq!(y.id(), x.id(), "returns x itself");
    }
    assert_eq!(tape.len(), before, "no node");
    // No draw was taken from the generator either.
    assert_eq!(r.next_u64(), Rng::new(1).next_u64());
    for p in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        for training in [true, false] {
            let e = ops::dropout(&x, p, &mut r, training).unwrap_err();
            assert!(
                matches!(e, Error::BadProbability { op: "dropout", p: q } if q.to_bits() == p.to_bits()),
                "{p}: {e:?}"
            );
        }
    }
    assert_eq!(tape.len(), before);
    // NaN propagates where kept and where dropped (x * 0).
    let y = ops::dropout(&x, 0.5, &mut Rng::new(3), true).unwrap();
    assert!(vals(&y)[3].is_nan());
}

// ---------------------------------------------------------------------------
// GELU

#[test]
fn erf_matches_reference_values() {
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (-1.5, -0.966_105_146_475_310_8),
        (3.0, 0.999_977_909_503_001_4),
    ] {
        let got = erf(x);
        assert!(
            (got - want).abs() <= 1e-14 * want.abs(),
            "erf({x}) = {got} vs {want}"
        );
    }
}

/// (x, exact gelu, its slope), from `x Phi(x)` and `Phi(x) + x phi(x)` at 50
/// digits.
const GELU: [(f64, f64, f64); 9] = [
    (
        -10.0,
        -7.619_853_024_160_526e-23,
        -7.618_400_096_464_814e-22,
    ),
    (
        -3.0,
        -0.004_049_694_094_890_283_5,
        -0.011_945_647_204_183_927,
    ),
    (-1.0, -0.158_655_253_931_457_05, -0.083_315_470_587_686_3),
    (-0.5, -0.154_268_769_362_993_44, 0.132_504_875_343_837_15),
    (0.0, 0.0, 0.5),
    (0.5, 0.345_731_230_637_006_56, 0.867_495_124_656_162_9),
    (1.0, 0.841_344_746_068_542_9, 1.083_315_470_587_686_4),
    (2.0, 1.954_499_736_103_641_6, 1.085_231_801_078_197),
    (3.0, 2.995_950_305_905_11, 1.011_945_647_204_184),
];

#[test]
fn gelu_slope_at_infinities_is_its_limit() {
    let tape = Tape::new();
    let x = tape.var(Tensor::from_vec(vec![2], vec![f64::INFINITY, f64::NEG_INFINITY]).unwrap());
    let y = ops::gelu(&x).unwrap();
    let c = cotangent(&y, 5);
    let cv = c.to_f64_vec().unwrap();
    let dx = grad(&y, &c, &x);
    assert_eq!(vals(&y)[0], f64::INFINITY);
    assert_eq!(dx, vec![cv[0], 0.0], "slope 1 at +inf, 0 at -inf");
}

#[test]
fn gelu_is_the_exact_erf_form_and_gelu_tanh_the_approximation() {
    let xs: Vec<f64> = GELU.iter().map(|r| r.0).collect();
    let tape = Tape::new();
    let x = tape.var(Tensor::from_vec(vec![xs.len()], xs.clone()).unwrap());
    let y = ops::gelu(&x).unwrap();
    let c = cotangent(&y, 12);
    let cv = c.to_f64_vec().unwrap();
    let dx = grad(&y, &c, &x);
    for (i, &(xv, want, slope)) in GELU.iter().enumerate() {
        // For -2.1 < x < -0.7, Phi is 1 - erf(|x|/sqrt 2), whose relative
        // error stays below 2e-14 (see `fusegrad::special`).
        let tol = if (-2.2..-0.6).contains(&xv) {
            2e-14
        } else {
            1e-15
        };
        let got = vals(&y)[i];
        assert!(
            (got - want).abs() <= tol * want.abs(),
            "gelu({xv}) = {got} vs {want}"
        );
        let wg = cv[i] * slope;
        assert!(
            (dx[i] - wg).abs() <= tol * wg.abs(),
            "gelu'({xv}): {} vs {wg}",
            dx[i]
        );
    }
    // f32 runs the vectorized kernel: within its stated 2 ulp of the f64
    // value rounded once (`ops/elementwise/vmath.rs`).
    let x32 = tape_f32(&xs);
    let y32 = ops::gelu(&x32).unwrap();
    for (&g, r) in y32.value().as_slice().unwrap().iter().zip(&GELU) {
        let want = r.1 as f32;
        let ulps = (g.to_bits() as i64 - want.to_bits() as i64).abs();
        assert!(
            g.is_sign_negative() == want.is_sign_negative() && ulps <= 2,
            "gelu({}) in f32: {g} vs {want} ({ulps} ulp)",
            r.0
        );
    }
    // The tanh form at the same points, from its formula.
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let tanh_form = |v: f64| 0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh());
    let yt = vals(&ops::gelu_tanh(&x).unwrap());
    for (&v, &got) in xs.iter().zip(&yt).filter(|(v, _)| **v > -4.0) {
        let want = tanh_form(v);
        // The formula cancels in 1 + tanh for v < 0: its error is ~|v| ulps.
        assert!(
            (got - want).abs() <= 1e-15 * v.abs().max(1.0),
            "gelu_tanh({v})"
        );
    }
    assert!((yt[6] - 0.841_191_990_608_276_8).abs() <= 1e-15);
    // The two differ (by ~1.5e-4 at 1).
    let d = vals(&y)[6] - yt[6];
    assert!((1.5e-4..1.6e-4).contains(&d), "{d}");
}

fn tape_f32(xs: &[f64]) -> Var<f32> {
    Tape::new().var(tensor::<f32>(&[xs.len()], xs))
}

#[test]
fn activation_gelu_is_exact_and_gelu_tanh_is_the_approximation() {
    let tape = Tape::new();
    let x = tape.var(tensor::<f64>(&[3], &[-1.0, 0.5, 1.0]));
    let exact = vals(&Activation::Gelu.apply(&x).unwrap());
    let approx = vals(&Activation::GeluTanh.apply(&x).unwrap());
    assert_eq!(exact, vals(&ops::gelu(&x).unwrap()));
    assert_eq!(approx, vals(&ops::gelu_tanh(&x).unwrap()));
    assert!((exact[2] - 0.841_344_746_068_542_9).abs() <= 1e-15);
    assert!((approx[2] - 0.841_191_990_608_276_8).abs() <= 1e-15);
    assert_eq!(Activation::default(), Activation::Gelu);
}

// ---------------------------------------------------------------------------
// attention: the fused op against its composed twin and finite differences

/// Values in [-1.5, 1.5), scaled so scores are far from uniform.
fn attn_input<T: Element>(rng: &mut Rng, shape: &[usize]) -> Tensor<T> {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.range(-1.5, 1.5)).collect();
    tensor(shape, &v)
}

/// `attention` (or, `packed`, `attention_qkv`) and its twin on random
/// inputs of `[b, h, t, d]`: the largest output or gradient difference.
fn attention_vs_composed<T: Element>(
    [b, h, t, d]: [usize; 4],
    causal: bool,
    packed: bool,
    seed: u64,
) -> f64 {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (d.max(1) as f64).sqrt();
    let cmp = if packed {
        let x = attn_input::<T>(&mut rng, &[b, t, 3 * h * d]);
        fusegrad::gradcheck::fused_vs_composed(
            |v: &[Var<T>]| ops::attention_qkv(&v[0], h, causal, scale),
            |v: &[Var<T>]| ops::attention_qkv_composed(&v[0], h, causal, scale),
            &[x],
            seed,
        )
    } else {
        let shape = [b, h, t, d];
        let xs: Vec<Tensor<T>> = (0..3).map(|_| attn_input(&mut rng, &shape)).collect();
        fusegrad::gradcheck::fused_vs_composed(
            |v: &[Var<T>]| ops::attention(&v[0], &v[1], &v[2], causal, scale),
            |v: &[Var<T>]| ops::attention_composed(&v[0], &v[1], &v[2], causal, scale),
            &xs,
            seed,
        )
    };
    let cmp = cmp.unwrap();
    assert_eq!(cmp.grads.len(), if packed { 1 } else { 3 });
    cmp.max()
}

#[test]
fn attention_matches_its_composed_twin_in_f64() {
    // T past one and two row tiles, odd sizes, both layouts.
    for (shape, causal, packed) in [
        ([2, 3, 5, 4], true, false),
        ([2, 3, 5, 4], false, false),
        ([1, 2, 37, 8], true, false),
        ([1, 2, 37, 8], false, true),
        ([2, 4, 64, 32], true, true),
        ([3, 1, 1, 3], true, true),
    ] {
        let diff = attention_vs_composed::<f64>(shape, causal, packed, 11);
        assert!(
            diff < 1e-12,
            "{shape:?} causal {causal} packed {packed}: {diff:e}"
        );
    }
}

#[test]
fn attention_gradients_match_finite_differences() {
    use fusegrad::gradcheck::{check, Options};
    let mut rng = Rng::new(4);
    for causal in [true, false] {
        let shape = [2, 2, 19, 3];
        let xs: Vec<Tensor<f64>> = (0..3).map(|_| attn_input(&mut rng, &shape)).collect();
        let f = |v: &[Var<f64>]| ops::attention(&v[0], &v[1], &v[2], causal, 0.7);
        let report = check(f, &xs, &Options::default()).unwrap();
        assert_eq!(report.inputs.len(), 3);
        assert!(report.passed(), "causal {causal}\n{report}");
        let x = attn_input::<f64>(&mut rng, &[2, 18, 3 * 2 * 3]);
        let f = |v: &[Var<f64>]| ops::attention_qkv(&v[0], 2, causal, 0.6);
        let report = check(f, &[x], &Options::default()).unwrap();
        assert!(report.passed(), "packed, causal {causal}\n{report}");
    }
}

#[test]
fn attention_in_16_and_32_bits_follows_f64() {
    let (shape, seed) = ([2, 2, 40, 16], 21);
    for causal in [true, false] {
        for packed in [false, true] {
            let d32 = attention_vs_composed::<f32>(shape, causal, packed, seed);
            let d16 = attention_vs_composed::<half::f16>(shape, causal, packed, seed);
            let db16 = attention_vs_composed::<half::bf16>(shape, causal, packed, seed);
            assert!(d32 < 1e-5, "f32 {d32:e}");
            assert!(d16 < 1e-2, "f16 {d16:e}");
            assert!(db16 < 5e-2, "bf16 {db16:e}");
        }
    }
    // The fused f32 output against the fused f64 one on the same inputs.
    let mut rng = Rng::new(3);
    let x64 = attn_input::<f64>(&mut rng, &[2, 40, 3 * 2 * 16]);
    let x32: Tensor<f32> = x64.cast().unwrap();
    let y64 = ops::attention_qkv(&Tape::new().constant(x64), 2, true, 0.25).unwrap();
    let y32 = ops::attention_qkv(&Tape::new().constant(x32), 2, true, 0.25).unwrap();
    let diff = fusegrad::gradcheck::rel_diff(&vals(&y32), &vals(&y64));
    assert!(diff < 1e-6, "{diff:e}");
}

#[test]
fn attention_with_no_positions_or_no_head_dim_is_empty() {
    for shape in [[2, 3, 0, 4], [0, 3, 4, 4], [2, 3, 4, 0]] {
        let tape = Tape::<f64>::new();
        let xs: Vec<Var<f64>> = (0..3)
            .map(|_| tape.var(Tensor::zeros(&shape).unwrap()))
            .collect();
        let y = ops::attention(&xs[0], &xs[1], &xs[2], true, 1.0).unwrap();
        assert_eq!(y.shape(), shape);
        assert_eq!(y.value().numel(), 0);
        let g = y.backward_with(&Tensor::zeros(&shape).unwrap()).unwrap();
        for x in &xs {
            assert_eq!(g.wrt(x).unwrap().shape(), shape);
        }
        let c = ops::attention_composed(&xs[0], &xs[1], &xs[2], true, 1.0).unwrap();
        assert_eq!(c.shape(), shape);
    }
}

/// A NaN put in `q`, `k` or `v` at position `j` of one `[t, d]` head.
fn attention_nan_rows<T: Element>(t: usize, d: usize, js: &[usize]) {
    let mut rng = Rng::new(8);
    for which in 0..3 {
        for &j in js {
            let tape = Tape::<T>::new();
            let mut xs: Vec<Tensor<T>> = (0..3)
                .map(|_| attn_input(&mut rng, &[1, 1, t, d]))
                .collect();
            let mut data = xs[which].to_vec().unwrap();
            data[j * d + 1] = T::from_f64(f64::NAN);
            xs[which] = Tensor::from_vec(vec![1, 1, t, d], data).unwrap();
            let vs: Vec<Var<T>> = xs.iter().map(|x| tape.var(x.clone())).collect();
            let yv = ops::attention(&vs[0], &vs[1], &vs[2], true, 0.5).unwrap();
            let y = vals(&yv);
            // dq of the rows before j never sees the NaN either (dk and dv
            // of position p gather from every row that sees p).
            let grads = yv.backward_with(&cotangent(&yv, 5)).unwrap();
            let dq = grads.wrt(&vs[0]).unwrap().to_f64_vec().unwrap();
            assert!(
                dq[..j * d].iter().all(|x| x.is_finite()),
                "input {which}, NaN at {j}"
            );
            assert!(dq[j * d..(j + 1) * d].iter().any(|x| x.is_nan()));
            for i in 0..t {
                // q_j's NaN stays in row j; k_j's and v_j's reach rows
                // i >= j.
                let expect = if which == 0 { i == j } else { i >= j };
                let row = &y[i * d..(i + 1) * d];
                assert_eq!(
                    row.iter().any(|v| v.is_nan()),
                    expect,
                    "input {which}, NaN at {j}, row {i}: {row:?}"
                );
                // A NaN score spoils the whole row; a NaN in v_j only its
                // own column.
                if expect && which < 2 {
                    assert!(row.iter().all(|v| v.is_nan()));
                }
            }
        }
    }
}

#[test]
fn attention_nan_reaches_exactly_the_rows_that_see_it() {
    attention_nan_rows::<f64>(40, 4, &[0, 17, 39]);
    // f32 runs its own kernels: T past one row tile (64), d past one
    // register (16 lanes).
    attention_nan_rows::<f32>(70, 20, &[0, 17, 63, 64, 69]);
}

#[test]
fn attention_errors_are_specific_and_record_nothing() {
    let tape = Tape::<f32>::new();
    let var = |s: &[usize]| tape.var(Tensor::zeros(s).unwrap());
    let (q, k3) = (var(&[1, 2, 3, 4]), var(&[1, 2, 3]));
    let k5 = var(&[1, 2, 5, 4]);
    let before = tape.len();
    for op in [ops::attention::<f32>, ops::attention_composed::<f32>] {
        let e = op(&k3, &k3, &k3, true, 1.0).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { msg, .. } if msg.contains("[1, 2, 3]")),
            "{e}"
        );
        assert!(matches!(
            op(&q, &k5, &q, true, 1.0).unwrap_err(),
            Error::ShapeMismatch { lhs, rhs, .. } if lhs == [1, 2, 3, 4] && rhs == [1, 2, 5, 4]
        ));
        assert!(matches!(
            op(&q, &q, &k5, false, 1.0).unwrap_err(),
            Error::ShapeMismatch { .. }
        ));
        for bad in [f64::NAN, f64::INFINITY] {
            let e = op(&q, &q, &q, true, bad).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument { msg, .. } if msg.contains(&bad.to_string())),
                "{e}"
            );
        }
    }
    assert_eq!(
        ops::attention(&q, &q, &k5, true, 1.0)
            .unwrap_err()
            .to_string(),
        "attention: shape mismatch: [1, 2, 3, 4] vs [1, 2, 5, 4]"
    );
    let qkv = var(&[2, 3, 12]);
    let before = before + 1;
    for op in [
        ops::attention_qkv::<f32>,
        ops::attention_qkv_composed::<f32>,
    ] {
        for (x, heads) in [(&qkv, 0), (&qkv, 5), (&q, 1)] {
            let e = op(x, heads, true, 1.0).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
    }
    assert!(ops::attention_qkv(&qkv, 5, true, 1.0)
        .unwrap_err()
        .to_string()
        .starts_with("attention_qkv: qkv [2, 3, 12]"));
    assert_eq!(tape.len(), before);
    for op in [
        ops::attention_qkv::<f32>,
        ops::attention_qkv_composed::<f32>,
    ] {
        assert_eq!(op(&qkv, 2, true, 1.0).unwrap().shape(), [2, 3, 4]);
    }
}

/// The fused op saves the output and T log-sum-exps per head; its twin
/// saves the T x T scores and probabilities.
#[test]
fn attention_saves_less_than_its_twin() {
    let (b, t, h, d) = (2, 64, 4, 32);
    let saved = |fused: bool| {
        let tape = Tape::<f32>::new();
        let x = tape.var(Tensor::zeros(&[b, t, 3 * h * d]).unwrap());
        let before = tape.saved_bytes();
        let scale = 1.0 / (d as f64).sqrt();
        let y = if fused {
            ops::attention_qkv(&x, h, true, scale)
        } else {
            ops::attention_qkv_composed(&x, h, true, scale)
        };
        y.unwrap();
        tape.saved_bytes() - before
    };
    let (fused, composed) = (saved(true), saved(false));
    // Output [b, t, h d] f32 plus lse [b, h, t] f32 (the input is a leaf).
    assert_eq!(fused, 4 * (b * t * h * d + b * h * t));
    assert!(
        composed > fused + 2 * 4 * b * h * t * t,
        "{fused} vs {composed}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Fused against composed in f64 over batch, heads, T (past several
    /// row tiles), head_dim and the mask, in both layouts.
    #[test]
    fn attention_property_fused_matches_composed(
        b in 1usize..3,
        h in 1usize..4,
        t in 0usize..50,
        d in 1usize..10,
        causal: bool,
        packed: bool,
        seed in 0u64..1000,
    ) {
        let diff = attention_vs_composed::<f64>([b, h, t, d], causal, packed, seed);
        proptest::prop_assert!(diff < 1e-11, "{:?} causal {} packed {}: {:e}", [b, h, t, d], causal, packed, diff);
    }

    /// The same in f32 (its own kernels where the CPU has AVX-512), over T
    /// past two row tiles and head_dim past two 16-lane registers.
    #[test]
    fn attention_property_fused_matches_composed_f32(
        b in 1usize..3,
        h in 1usize..3,
        t in 0usize..150,
        d in 1usize..40,
        causal: bool,
        packed: bool,
        seed in 0u64..1000,
    ) {
        let diff = attention_vs_composed::<f32>([b, h, t, d], causal, packed, seed);
        proptest::prop_assert!(diff < 2e-5, "{:?} causal {} packed {}: {:e}", [b, h, t, d], causal, packed, diff);
    }
}
