//! Gradient clipping by global norm.

use crate::dtype::{Accum, Element};
use crate::error::{Error, Result};
use crate::ops::elementwise::{unary, Unary};
use crate::ops::reduce::kernel::sum_kernel;
use crate::tensor::Tensor;

/// Scales every gradient by `max_norm / norm` when the global L2 norm of
/// all of them together exceeds `max_norm` (as PyTorch's
/// `clip_grad_norm_`, without its `1e-6` in the denominator: the scaled
/// norm is `max_norm` to rounding). Returns the norm before clipping.
/// Squares are summed in f64, so no element type overflows on the way.
/// A NaN or infinite norm leaves the gradients as they are and is
/// returned, so the caller can skip the step.
pub fn clip_grad_norm<T: Element>(grads: &mut [Tensor<T>], max_norm: f64) -> Result<f64> {
    let span = crate::profile::start();
    let r = clip(grads, max_norm);
    crate::profile::stop(span, "clip_grad_norm", crate::profile::Phase::Step, 0);
    r
}

fn clip<T: Element>(grads: &mut [Tensor<T>], max_norm: f64) -> Result<f64> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::InvalidArgument {
            op: "clip_grad_norm",
            msg: format!("max_norm must be finite and > 0, got {max_norm}"),
        });
    }
    let mut sq = 0.0f64;
    for g in grads.iter() {
        // On the CPU: squares summed in f64 in place, four running sums.
        if let (crate::Device::Cpu, Ok(v)) = (g.device(), g.as_slice()) {
            let mut part = [0.0f64; 4];
            let mut quads = v.chunks_exact(4);
            for q in &mut quads {
                for (s, e) in part.iter_mut().zip(q) {
                    let x = e.to_acc().f64();
                    *s += x * x;
                }
            }
            for e in quads.remainder() {
                let x = e.to_acc().f64();
                part[0] += x * x;
            }
            sq += part.iter().sum::<f64>();
            continue;
        }
        let wide = g.cast::<f64>()?;
        let s = sum_kernel(
            &unary(Unary::Powi(2), &wide)?,
            &vec![true; g.shape().len()],
            None,
            &[],
        )?;
        sq += s
            .to_device(crate::Device::Cpu)?
            .as_slice()?
            .first()
            .copied()
            .unwrap_or(0.0);
    }
    let norm = sq.sqrt();
    if norm.is_finite() && norm > max_norm {
        let c = max_norm / norm;
        for g in grads.iter_mut() {
            *g = unary(Unary::MulScalar(c), g)?;
        }
    }
    Ok(norm)
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![scales_to_the_bound_only_past_it];

    fn scales_to_the_bound_only_past_it() {
        let mut g = vec![
            Tensor::from_vec(vec![2], vec![3.0f32, 0.0]).unwrap(),
            Tensor::from_vec(vec![1, 1], vec![4.0f32]).unwrap(),
        ];
        assert_eq!(clip_grad_norm(&mut g, 10.0).unwrap(), 5.0);
        assert_eq!(g[0].as_slice().unwrap(), &[3.0, 0.0]);
        assert_eq!(clip_grad_norm(&mut g, 1.0).unwrap(), 5.0);
        assert_eq!(g[0].as_slice().unwrap(), &[0.6, 0.0]);
        assert_eq!(g[1].as_slice().unwrap(), &[0.8]);
        assert!(clip_grad_norm(&mut g, 0.0).is_err());
        // f16 squares past its range still give the right norm.
        let mut h = vec![Tensor::from_vec(vec![2], vec![half::f16::from_f32(3000.0); 2]).unwrap()];
        let n = clip_grad_norm(&mut h, 1.0).unwrap();
        assert!((n - 3000.0 * 2f64.sqrt()).abs() < 1e-9);
    }
}
