//! `ops::linear` (`x @ w + b` as one op, the bias added as the product
//! finishes) against its twin `matmul` then `add`: the same bits, forward
//! and backward, in every dtype; finite differences in f64; errors.

use crate::common::{normal, tensor};
use fusegrad::gradcheck::{check, Options};
use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Error, Tape, Tensor, Var};

/// Output, then the gradients of `x`, `w`, `b` under a random cotangent,
/// as f64, for the fused op (`fused`) or its twin.
fn run<T: Element>(xs: &[Tensor<T>; 3], fused: bool) -> Vec<Vec<f64>> {
    let tape = Tape::<T>::new();
    let v: Vec<Var<T>> = xs.iter().map(|x| tape.var(x.clone())).collect();
    let y = if fused {
        ops::linear(&v[0], &v[1], &v[2])
    } else {
        ops::linear_composed(&v[0], &v[1], &v[2])
    }
    .unwrap();
    let c = normal(&mut Rng::new(7), y.value().numel(), 1.0, 0.0);
    let g = y.backward_with(&tensor(y.shape(), &c)).unwrap();
    let mut out = vec![y.value().to_f64_vec().unwrap()];
    out.extend(v.iter().map(|x| g.wrt(x).unwrap().to_f64_vec().unwrap()));
    out
}

/// Random `x: [.., k]`, `w: [k, n]`, `b: [n]`, with a NaN in `x`'s row 1.
fn inputs<T: Element>(xshape: &[usize], n: usize, seed: u64) -> [Tensor<T>; 3] {
    let mut rng = Rng::new(seed);
    let k = *xshape.last().unwrap();
    let mut xv = normal(&mut rng, xshape.iter().product(), 1.0, 0.0);
    if xv.len() > k + 1 && k > 1 {
        xv[k + 1] = f64::NAN;
    }
    [
        tensor(xshape, &xv),
        tensor(&[k, n], &normal(&mut rng, k * n, 0.5, 0.0)),
        tensor(&[n], &normal(&mut rng, n, 1.0, 0.0)),
    ]
}

fn same_bits<T: Element>() {
    // Past the kernel's tiles (12 x 32) and depth block (512), rank 2 and 3,
    // no rows, and an empty sum (k = 0).
    for (xshape, n) in [
        (vec![2, 5, 7], 3),
        (vec![33, 130], 45),
        (vec![3, 1100], 40),
        (vec![16, 64, 128], 384),
        (vec![4, 0], 6),
        (vec![0, 3, 4], 5),
    ] {
        let xs = inputs::<T>(&xshape, n, 3);
        let (f, c) = (run(&xs, true), run(&xs, false));
        for (part, (a, b)) in f.iter().zip(&c).enumerate() {
            assert_eq!(a.len(), b.len());
            for (i, (&p, &q)) in a.iter().zip(b).enumerate() {
                assert!(
                    p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                    "{:?} {xshape:?} x [_, {n}], part {part}, entry {i}: {p} vs {q}",
                    T::DTYPE
                );
            }
        }
        // The NaN in row 1 of `x` stays in row 1 of the output.
        let (k, y) = (xshape[xshape.len() - 1], &f[0]);
        if y.len() > 2 * n && k > 1 {
            assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
            assert!(y[..n].iter().chain(&y[2 * n..]).all(|v| v.is_finite()));
        }
    }
}

#[test]
fn linear_is_matmul_then_add_bit_for_bit() {
    same_bits::<f32>();
    same_bits::<f64>();
    same_bits::<half::bf16>();
}

#[test]
fn linear_gradients_match_finite_differences() {
    let xs = inputs::<f64>(&[2, 3, 5], 4, 9);
    let mut rng = Rng::new(2);
    let x = tensor(&[2, 3, 5], &normal(&mut rng, 30, 1.0, 0.0));
    let f = |v: &[Var<f64>]| ops::linear(&v[0], &v[1], &v[2]);
    let report = check(f, &[x, xs[1].clone(), xs[2].clone()], &Options::default()).unwrap();
    assert_eq!(report.inputs.len(), 3);
    assert!(report.passed(), "{report}");
}

#[test]
fn linear_errors_name_the_shapes_and_record_nothing() {
    let tape = Tape::<f32>::new();
    let var = |s: &[usize]| tape.var(Tensor::zeros(s).unwrap());
    let (x, w, b) = (var(&[2, 3, 4]), var(&[4, 5]), var(&[5]));
    let (w3, b4, x1, w1) = (var(&[3, 5]), var(&[4]), var(&[4]), var(&[20]));
    let before = tape.len();
    let e = ops::linear(&x, &w3, &b).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::MatmulMismatch {
                op: "linear",
                k_lhs: 4,
                k_rhs: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = ops::linear(&x, &w, &b4).unwrap_err();
    assert!(
        matches!(&e, Error::ShapeMismatch { op: "linear", lhs, rhs } if lhs == &[4] && rhs == &[5]),
        "{e}"
    );
    for (xv, wv) in [(&x1, &w), (&x, &w1)] {
        let e = ops::linear(xv, wv, &b).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { op: "linear", .. }),
            "{e}"
        );
        assert!(
            e.to_string().contains("[4]") || e.to_string().contains("[20]"),
            "{e}"
        );
    }
    assert_eq!(tape.len(), before);
    assert_eq!(ops::linear(&x, &w, &b).unwrap().shape(), [2, 3, 5]);
}
