//! CPU loop for masked_fill and its backward: a select between each
//! element and a constant, the mask read through broadcast strides.

use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::ops::elementwise::cpu::{par_chunks, Layout};

/// `fill` where `mask` (shape `ms`, broadcast to `shape`) is true, else the
/// element of `x` (shape `shape`). The caller has checked the shapes.
pub(crate) fn select<T: Element>(
    x: &[T],
    shape: &[usize],
    mask: &[bool],
    ms: &[usize],
    fill: T,
) -> Buffer<T> {
    let lay = Layout::of(shape, [ms]);
    let mut out = Buffer::take(x.len());
    par_chunks(&mut out, |start, d| {
        let mut i = start;
        lay.walk(start, d, |d, [om], [step]| {
            let xs = &x[i..i + d.len()];
            for (k, (y, &v)) in d.iter_mut().zip(xs).enumerate() {
                *y = if mask[om + k * step] { fill } else { v };
            }
            i += d.len();
        });
    });
    out
}
