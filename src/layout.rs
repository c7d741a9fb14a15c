//! Shape arithmetic: checked element counts, NumPy broadcasting and axis
//! normalization. Nothing here touches a tensor.

use crate::error::{Error, Result};

/// Element count of `shape`, or `ShapeTooLarge` if it (or its byte size for
/// an element of `elem_bytes`) overflows. A shape with a zero dim has no
/// elements whatever its other dims are (`[0, usize::MAX, 2]` is empty).
pub fn checked_numel(op: &'static str, shape: &[usize], elem_bytes: usize) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
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

/// An empty vector with room for the elements of `shape`: `ShapeTooLarge`
/// if the count overflows, `OutOfMemory` if the allocator refuses the block
/// (never an abort). Used wherever an output can be larger than the inputs
/// (broadcasting, matmul, reductions of empty tensors, `Tensor::full`).
pub fn alloc<T>(op: &'static str, shape: &[usize]) -> Result<Vec<T>> {
    let n = checked_numel(op, shape, std::mem::size_of::<T>())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        op,
        shape: shape.to_vec(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    Ok(v)
}

/// [`alloc`] filled with `numel(shape)` copies of `v`.
pub(crate) fn alloc_filled<T: Clone>(op: &'static str, shape: &[usize], v: T) -> Result<Vec<T>> {
    let mut out = alloc(op, shape)?;
    let n = checked_numel(op, shape, std::mem::size_of::<T>())?;
    out.resize(n, v);
    Ok(out)
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
/// `out`: broadcast dims get stride 0. (If `shape` has more dims than `out`,
/// its extra leading dims are ignored.)
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = strides(shape);
    let lead = out.len().saturating_sub(shape.len());
    let skip = shape.len().saturating_sub(out.len());
    (0..out.len())
        .map(|i| {
            if i < lead || shape[i - lead + skip] == 1 {
                0
            } else {
                own[i - lead + skip]
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
///
/// Nothing is visited when `out` has a zero dim (its other dims may be
/// arbitrarily large). Missing strides count as 0.
pub fn for_each_offset(out: &[usize], src_strides: &[usize], mut f: impl FnMut(usize, usize)) {
    if out.contains(&0) {
        return;
    }
    let rank = out.len();
    if rank == 0 {
        f(0, 0);
        return;
    }
    let padded: Vec<usize>;
    let src_strides = if src_strides.len() >= rank {
        src_strides
    } else {
        padded = (0..rank)
            .map(|d| src_strides.get(d).copied().unwrap_or(0))
            .collect();
        &padded
    };
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

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        broadcast_rules,
        offsets_follow_broadcast,
        overflow_is_an_error,
        refused_allocation_is_an_error,
        helpers_are_total,
    ];

    fn broadcast_rules() {
        assert_eq!(broadcast_shapes("t", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert_eq!(broadcast_shapes("t", &[], &[2, 2]).unwrap(), vec![2, 2]);
        assert!(broadcast_shapes("t", &[3], &[4]).is_err());
        assert_eq!(broadcast_shapes("t", &[0, 1], &[1, 5]).unwrap(), vec![0, 5]);
    }

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

    fn overflow_is_an_error() {
        assert!(matches!(
            checked_numel("t", &[usize::MAX, 2], 4),
            Err(Error::ShapeTooLarge { .. })
        ));
        // A zero dim anywhere makes the shape empty, in any order.
        assert_eq!(checked_numel("t", &[usize::MAX, 2, 0], 4), Ok(0));
        assert_eq!(checked_numel("t", &[0, usize::MAX, 2], 4), Ok(0));
        // More bytes than isize::MAX.
        assert!(checked_numel("t", &[1 << 62], 4).is_err());
    }

    fn refused_allocation_is_an_error() {
        // 2^58 bytes: fits isize, but no machine maps it.
        assert!(matches!(
            alloc::<f32>("t", &[1 << 56]),
            Err(Error::OutOfMemory { .. })
        ));
        assert_eq!(alloc_filled("t", &[2, 3], 1.5f32).unwrap(), vec![1.5; 6]);
    }

    fn helpers_are_total() {
        // Zero-size outputs with huge dims visit nothing (no overflow).
        let mut k = 0;
        for_each_offset(&[usize::MAX, 2, 0], &[0, 0, 0], |_, _| k += 1);
        assert_eq!(k, 0);
        // Short stride lists read as 0; longer source shapes are trimmed.
        let mut seen = vec![];
        for_each_offset(&[2, 2], &[1], |_, o| seen.push(o));
        assert_eq!(seen, vec![0, 0, 1, 1]);
        assert_eq!(broadcast_strides(&[5, 2, 3], &[2, 3]), vec![3, 1]);
    }
}
