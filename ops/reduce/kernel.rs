//! The reduction kernel on tensors, below the tape: the ops' sums and
//! means, and the sweep's sums of broadcast gradients ([`sum_to_shape`]).

use super::cpu;
#[cfg(feature = "cuda")]
use super::cuda;
use crate::dtype::{Accum, Element};
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::tensor::{Storage, Tensor};

/// `x` summed over the axes where `red` is set (each sum divided by `div`
/// when given), shaped `out`: the device-level reduction kernel.
pub(crate) fn sum_kernel<T: Element>(
    x: &Tensor<T>,
    red: &[bool],
    div: Option<usize>,
    out: &[usize],
) -> Result<Tensor<T>> {
    match x.storage() {
        Storage::Cpu(xs) => {
            let div = div.map(|n| T::Acc::of(n as f64));
            Tensor::from_vec(out.to_vec(), cpu::sum(xs, x.shape(), red, div))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::sum(xs, x.shape(), red, div, out),
    }
}

/// Reduces `grad` (of a broadcast shape) to `target` by summing over the
/// broadcast dims. This is the only place broadcast gradients are reduced.
pub(crate) fn sum_to_shape<T: Element>(
    op: &'static str,
    grad: &Tensor<T>,
    target: &[usize],
) -> Result<Tensor<T>> {
    if grad.shape() == target {
        return Ok(grad.clone());
    }
    let bshape = broadcast_shapes(op, grad.shape(), target)?;
    if bshape != grad.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: grad.shape().to_vec(),
            rhs: target.to_vec(),
        });
    }
    // Leading dims the target lacks, and its size-1 dims where the
    // gradient's are wider, are summed over.
    let lead = grad.rank() - target.len();
    let red: Vec<bool> = (0..grad.rank())
        .map(|d| d < lead || (target[d - lead] == 1 && grad.shape()[d] != 1))
        .collect();
    crate::ops::reduce::sum_kernel(grad, &red, None, target)
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![sum_back_to_shape];

    fn sum_back_to_shape() {
        let g = Tensor::from_vec(vec![2, 3], vec![1.0f64, 2., 3., 4., 5., 6.]).unwrap();
        let r = sum_to_shape("t", &g, &[3]).unwrap();
        assert_eq!(r.as_slice().unwrap(), &[5.0, 7.0, 9.0]);
        let r = sum_to_shape("t", &g, &[2, 1]).unwrap();
        assert_eq!(r.as_slice().unwrap(), &[6.0, 15.0]);
        let r = sum_to_shape("t", &g, &[]).unwrap();
        assert_eq!(r.as_slice().unwrap(), &[21.0]);
    }
}
