//! Tape semantics: fan-out, repeated backward, constants, errors.

use fusegrad::{gradcheck, ops, Error, Tape, Tensor};
use ndarray::{arr1, arr2};

#[test]
fn fan_out_sums_gradients() {
    let tape = Tape::new();
    let x = tape.var(arr1(&[1.0f64, -2.0, 3.0]));
    let c = tape.constant(arr1(&[0.5f64, 0.25, -1.0]));
    // y = x*c + x*x + x  => dy/dx = c + 2x + 1, seeded with s.
    let y = ops::add(
        &ops::add(&ops::mul(&x, &c).unwrap(), &ops::mul(&x, &x).unwrap()).unwrap(),
        &x,
    )
    .unwrap();
    let seed = Tensor::from_array(arr1(&[0.3f64, -0.7, 1.1]));
    let g = y
        .backward_with(&seed)
        .unwrap()
        .wrt(&x)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let want = [
        0.3 * (0.5 + 2.0 + 1.0),
        -0.7 * (0.25 - 4.0 + 1.0),
        1.1 * (-1.0 + 6.0 + 1.0),
    ];
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn backward_twice_is_identical() {
    let tape = Tape::new();
    let a = tape.var(arr2(&[[1.0f32, 2.0], [3.0, 4.0]]));
    let b = tape.var(arr1(&[0.5f32, -1.5]));
    let y = ops::div(&ops::mul(&a, &b).unwrap(), &b).unwrap();
    let y = ops::sub(&y, &b).unwrap();
    let seed = Tensor::from_array(arr2(&[[0.1f32, -0.2], [0.3, 0.7]]));
    let g1 = y.backward_with(&seed).unwrap();
    let g2 = y.backward_with(&seed).unwrap();
    assert_eq!(
        g1.wrt(&a).unwrap().to_array().unwrap(),
        g2.wrt(&a).unwrap().to_array().unwrap()
    );
    assert_eq!(
        g1.wrt(&b).unwrap().to_array().unwrap(),
        g2.wrt(&b).unwrap().to_array().unwrap()
    );
    assert_eq!(g1.wrt(&b).unwrap().shape(), &[2]);
}

#[test]
fn errors_are_specific() {
    let tape = Tape::new();
    let other = Tape::new();
    let a = tape.var(arr1(&[1.0f64, 2.0]));
    let b = other.var(arr1(&[1.0f64, 2.0]));
    let c = tape.var(arr1(&[1.0f64, 2.0, 3.0]));
    assert!(matches!(ops::add(&a, &b), Err(Error::TapeMismatch { .. })));
    assert!(matches!(
        ops::mul(&a, &c),
        Err(Error::BroadcastMismatch { .. })
    ));
    let y = ops::add(&a, &a).unwrap();
    assert!(matches!(y.backward(), Err(Error::NonScalarLoss { .. })));
    let bad = Tensor::from_array(arr1(&[1.0f64]));
    assert!(matches!(
        y.backward_with(&bad),
        Err(Error::SeedShape { .. })
    ));
    let seed = Tensor::from_array(arr1(&[1.0f64, 1.0]));
    let g = y.backward_with(&seed).unwrap();
    assert!(matches!(g.wrt(&b), Err(Error::NotOnTape { .. })));
    let k = tape.constant(arr1(&[1.0f64]));
    assert!(matches!(g.wrt(&k), Err(Error::NoGradient { .. })));
}

#[test]
fn gradcheck_passes_for_mul_div() {
    let x = Tensor::from_array(arr2(&[[1.0f64, 2.0, -0.5], [0.3, -1.2, 2.2]]));
    let y = Tensor::from_array(arr1(&[0.7f64, -1.3, 2.1]));
    let r = gradcheck::check(
        |v| ops::div(&ops::mul(&v[0], &v[1])?, &ops::add(&v[1], &v[1])?),
        &[x, y],
        &gradcheck::Options::default(),
    )
    .unwrap();
    assert!(r.passed(), "{r}");
}

#[test]
fn gradcheck_detects_a_wrong_gradient() {
    // The analytic gradient of mul(x, x) is right; feeding a perturbed
    // function to the numeric side must fail: emulate by checking against
    // a function whose values differ from the one differentiated.
    let x = Tensor::from_array(arr1(&[1.0f64, 2.0, 3.0]));
    let counter = std::cell::Cell::new(0);
    let r = gradcheck::check(
        |v| {
            counter.set(counter.get() + 1);
            if counter.get() == 1 {
                ops::mul(&v[0], &v[0])
            } else {
                ops::add(&v[0], &v[0])
            }
        },
        &[x],
        &gradcheck::Options::default(),
    )
    .unwrap();
    assert!(!r.passed());
}

/// The engine's user-error checklist in one place: each is an `Err` of its
/// own variant naming the op and shapes (returned, not panicked: a panic
/// would fail this test), and a failed op records nothing on the tape.
#[test]
fn every_user_error_is_a_specific_err() {
    let tape = Tape::<f64>::new();
    let other = Tape::<f64>::new();
    let m = tape.var(arr2(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]));
    let v = tape.var(arr1(&[1.0, 2.0]));
    let w = other.var(arr1(&[1.0, 2.0]));
    let before = tape.len();

    assert_eq!(
        ops::reshape(&m, &[4]).unwrap_err(),
        Error::ShapeMismatch {
            op: "reshape",
            lhs: vec![2, 3],
            rhs: vec![4]
        }
    );
    assert_eq!(
        ops::add(&m, &v).unwrap_err(),
        Error::BroadcastMismatch {
            op: "add",
            lhs: vec![2, 3],
            rhs: vec![2]
        }
    );
    assert_eq!(
        ops::matmul(&m, &m).unwrap_err(),
        Error::MatmulMismatch {
            op: "matmul",
            lhs: vec![2, 3],
            rhs: vec![2, 3],
            k_lhs: 3,
            k_rhs: 2
        }
    );
    for axis in [2, -3] {
        assert_eq!(
            ops::sum_axes(&m, &[axis], false).unwrap_err(),
            Error::AxisOutOfRange {
                op: "sum_axes",
                axis,
                rank: 2,
                shape: vec![2, 3]
            }
        );
    }
    assert_eq!(
        ops::mul(&v, &w).unwrap_err(),
        Error::TapeMismatch { op: "mul" }
    );
    assert_eq!(tape.len(), before, "a failed op recorded a node");

    let y = ops::mul(&m, &m).unwrap();
    assert_eq!(
        y.backward().err(),
        Some(Error::NonScalarLoss { shape: vec![2, 3] })
    );
    assert_eq!(
        y.backward_with(&Tensor::zeros(&[3, 2]).unwrap()).err(),
        Some(Error::SeedShape {
            output: vec![2, 3],
            seed: vec![3, 2]
        })
    );
    let g = y
        .backward_with(&Tensor::full(&[2, 3], 1.0).unwrap())
        .unwrap();
    assert_eq!(
        g.wrt(&w).unwrap_err(),
        Error::NotOnTape {
            op: "Gradients::wrt",
            id: w.id()
        }
    );
}

/// A Var used by three ops (`y = (x k + x) - x^2`) gets the sum of the
/// three contributions: `dx = c (k + 1 - 2x)`.
#[test]
fn three_uses_sum_their_gradients() {
    let tape = Tape::new();
    let x = tape.var(arr1(&[1.5f64, -0.5, 2.0]));
    let k = tape.constant(arr1(&[0.25f64, 3.0, -1.0]));
    let y = ops::sub(
        &ops::add(&ops::mul(&x, &k).unwrap(), &x).unwrap(),
        &ops::powi(&x, 2).unwrap(),
    )
    .unwrap();
    let c = arr1(&[0.5f64, -2.0, 0.25]);
    let g = y
        .backward_with(&Tensor::from_array(c))
        .unwrap()
        .wrt(&x)
        .unwrap();
    // 0.5 (0.25 + 1 - 3), -2 (3 + 1 + 1), 0.25 (-1 + 1 - 4): dyadic, exact.
    assert_eq!(g.as_slice().unwrap(), &[-0.875, -10.0, -1.0]);
}

/// `Tape::no_grad`: the same values as a recording tape, nothing saved for
/// a backward pass, and `backward` is an error that names the tape kind.
#[test]
fn a_no_grad_tape_computes_values_and_saves_nothing() {
    let xs = arr2(&[[1.0f64, 2.0, 4.0], [-1.0, 0.5, 3.0]]);
    let run = |tape: &Tape<f64>| {
        let x = tape.var(xs.clone());
        let y = ops::layer_norm(&x, None, None, 1e-5).unwrap();
        let z = ops::sum(&ops::gelu(&y).unwrap()).unwrap();
        (x, z)
    };
    let (rec, quiet) = (Tape::new(), Tape::no_grad());
    let (xr, zr) = run(&rec);
    let (xq, zq) = run(&quiet);
    assert!(rec.grad_enabled() && !quiet.grad_enabled());
    assert_eq!(
        zr.value().to_f64_vec().unwrap(),
        zq.value().to_f64_vec().unwrap()
    );
    assert!(xr.requires_grad() && !xq.requires_grad() && !zq.requires_grad());
    assert!(rec.saved_bytes() > 0);
    assert_eq!(quiet.saved_bytes(), 0);
    for e in [
        zq.backward().err().unwrap(),
        zq.backward_with(&Tensor::scalar(1.0)).err().unwrap(),
    ] {
        assert!(
            matches!(&e, Error::InvalidArgument { msg, .. } if msg.contains("no_grad")),
            "{e}"
        );
    }
    assert!(zr.backward().is_ok());
}
