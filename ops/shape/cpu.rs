//! CPU loops for the shape ops that copy: the axis permutation, one pass in
//! output order reading the input through permuted strides.

use crate::dtype::Element;
use crate::shape::for_each_offset;

/// The elements of `x` in the order of an output of shape `out` whose axis
/// `d` steps through `x` by `src[d]`.
pub(crate) fn permute<T: Element>(x: &[T], out: &[usize], src: &[usize]) -> Vec<T> {
    let mut v = Vec::with_capacity(x.len());
    for_each_offset(out, src, |_, o| v.push(x[o]));
    v
}
