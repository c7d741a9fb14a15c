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
