//! Primitive ops: gradients against finite differences, f32 against f64.

use fusegrad::{ops, Error, Tape, Tensor};
use ndarray::arr2;

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
    let seed = Tensor::full(&[2, 2], 1.0f64).unwrap();
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
        for ((&xv, &yv), &gv) in xs
            .iter()
            .zip(y.value().as_slice().unwrap())
            .zip(g.as_slice().unwrap())
        {
            let (wy, wg) = f(xv);
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
