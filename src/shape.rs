//! Shape arithmetic: checked element counts, NumPy broadcasting, axis
//! normalization, and the one place where gradients are summed back to an
//! input's shape ([`sum_to_shape`]).

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use num_traits::Zero;

/// Element count of `shape`, or `ShapeTooLarge` if it (or its byte size for
/// an element of `elem_bytes`) overflows.
pub fn checked_numel(op: &'static str, shape: &[usize], elem_bytes: usize) -> Result<usize> {
    let too_large = || Error::ShapeTooLarge {
        op,
        shape: shape.to_vec(),
    };
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    // Allocations are limited to isize::MAX bytes.
    match n.checked_mul(elem_bytes.max(1)) {
        Some(b) if b <= isize::MAX as usize => Ok(n),
        _ => Err(too_large()),
    }
}

/// Row-major strides (in elements).
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// NumPy broadcast of two shapes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0usize; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::BroadcastMismatch {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
            });
        };
    }
    Ok(out)
}

/// Strides that read an array of `shape` as if it had the (broadcast) shape
/// `out`: broadcast dims get stride 0.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = strides(shape);
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < lead || shape[i - lead] == 1 {
                0
            } else {
                own[i - lead]
            }
        })
        .collect()
}

/// Maps a possibly negative axis into `0..rank`.
pub fn normalize_axis(op: &'static str, axis: isize, shape: &[usize]) -> Result<usize> {
    let rank = shape.len() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return Err(Error::AxisOutOfRange {
            op,
            axis,
            rank: shape.len(),
            shape: shape.to_vec(),
        });
    }
    Ok(a as usize)
}

/// Normalizes a list of axes; duplicates are an error. An empty list means
/// every axis.
pub fn normalize_axes(op: &'static str, axes: &[isize], shape: &[usize]) -> Result<Vec<usize>> {
    if axes.is_empty() {
        return Ok((0..shape.len()).collect());
    }
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, shape)?;
        if out.contains(&n) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("axis {a} given twice for shape {shape:?}"),
            });
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// Visits, for every element of `out` in row-major order, the offset into a
/// source laid out with `src_strides` (already aligned to `out`'s rank).
#[inline]
pub fn for_each_offset(out: &[usize], src_strides: &[usize], mut f: impl FnMut(usize, usize)) {
    let n: usize = out.iter().product();
    if n == 0 {
        return;
    }
    let rank = out.len();
    if rank == 0 {
        f(0, 0);
        return;
    }
    let mut idx = vec![0usize; rank];
    let mut off = 0usize;
    let inner = out[rank - 1];
    let inner_stride = src_strides[rank - 1];
    let mut lin = 0usize;
    loop {
        for k in 0..inner {
            f(lin + k, off + k * inner_stride);
        }
        lin += inner;
        // Advance the odometer over all but the last dim.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += src_strides[d];
            if idx[d] < out[d] {
                break;
            }
            off -= src_strides[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/// Reduces `grad` (of a broadcast shape) to `target` by summing over the
/// broadcast dims. This is the only place broadcast gradients are reduced.
pub fn sum_to_shape<T: Element>(
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
    let n_out = checked_numel(op, target, std::mem::size_of::<T>())?;
    let mut acc = vec![T::Acc::zero(); n_out];
    let dst_strides = broadcast_strides(target, grad.shape());
    let g = grad.as_slice()?;
    for_each_offset(grad.shape(), &dst_strides, |i, o| acc[o] += g[i].to_acc());
    Tensor::from_vec(target.to_vec(), acc.into_iter().map(T::from_acc).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_shapes("t", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert_eq!(broadcast_shapes("t", &[], &[2, 2]).unwrap(), vec![2, 2]);
        assert!(broadcast_shapes("t", &[3], &[4]).is_err());
        assert_eq!(broadcast_shapes("t", &[0, 1], &[1, 5]).unwrap(), vec![0, 5]);
    }

    #[test]
    fn offsets_follow_broadcast() {
        let mut seen = vec![];
        for_each_offset(&[2, 3], &broadcast_strides(&[3], &[2, 3]), |i, o| {
            seen.push((i, o))
        });
        assert_eq!(seen, vec![(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2)]);
        let mut seen = vec![];
        for_each_offset(&[2, 3], &broadcast_strides(&[2, 1], &[2, 3]), |_, o| {
            seen.push(o)
        });
        assert_eq!(seen, vec![0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn sum_back_to_shape() {
        let g = Tensor::from_vec(vec![2, 3], vec![1.0f64, 2., 3., 4., 5., 6.]).unwrap();
        let r = sum_to_shape("t", &g, &[3]).unwrap();
        assert_eq!(r.as_slice().unwrap(), &[5.0, 7.0, 9.0]);
        let r = sum_to_shape("t", &g, &[2, 1]).unwrap();
        assert_eq!(r.as_slice().unwrap(), &[6.0, 15.0]);
        let r = sum_to_shape("t", &g, &[]).unwrap();
        assert_eq!(r.as_slice().unwrap(), &[21.0]);
    }

    #[test]
    fn overflow_is_an_error() {
        assert!(matches!(
            checked_numel("t", &[usize::MAX, 2], 4),
            Err(Error::ShapeTooLarge { .. })
        ));
    }
}
