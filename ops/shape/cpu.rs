//! CPU loops for the shape ops that copy: the axis permutation, one pass in
//! output order reading the input through permuted strides; and the row
//! copies of narrow and concat, which see a tensor as `[outer, d, inner]`
//! around their axis and move whole `inner`-wide rows.

use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::layout::for_each_offset;

/// The elements of `x` in the order of an output of shape `out` whose axis
/// `d` steps through `x` by `src[d]`.
pub(crate) fn permute<T: Element>(x: &[T], out: &[usize], src: &[usize]) -> Vec<T> {
    let mut v = Vec::with_capacity(x.len());
    for_each_offset(out, src, |_, o| v.push(x[o]));
    v
}

/// Rows `start..start + len` of each of the `outer` blocks of `x`, a block
/// being `d` rows of `inner` elements: `[outer, d, inner] -> [outer, len,
/// inner]`. The caller has checked `start + len <= d`.
pub(crate) fn take_rows<T: Element>(
    x: &[T],
    outer: usize,
    inner: usize,
    d: usize,
    start: usize,
    len: usize,
) -> Buffer<T> {
    let (n, src) = (len * inner, d * inner);
    let mut out = Buffer::take(outer * n);
    if n > 0 {
        for (b, o) in out.chunks_exact_mut(n).enumerate() {
            let at = b * src + start * inner;
            o.copy_from_slice(&x[at..at + n]);
        }
    }
    out
}

/// The adjoint of [`take_rows`]: `g` (`[outer, len, inner]`) placed at rows
/// `start..start + len` of `[outer, d, inner]` zeros.
pub(crate) fn pad_rows<T: Element>(
    g: &[T],
    outer: usize,
    inner: usize,
    d: usize,
    start: usize,
    len: usize,
) -> Vec<T> {
    let (n, dst) = (len * inner, d * inner);
    let mut out = vec![T::ZERO; outer * dst];
    if n > 0 {
        for (b, gb) in g.chunks_exact(n).enumerate() {
            let at = b * dst + start * inner;
            out[at..at + n].copy_from_slice(gb);
        }
    }
    out
}

/// The blocks of `parts` (each `(data, rows)`, data `[outer, rows, inner]`)
/// joined along the rows: `[outer, sum rows, inner]`.
pub(crate) fn concat_rows<T: Element>(
    parts: &[(&[T], usize)],
    outer: usize,
    inner: usize,
) -> Buffer<T> {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let mut out = Buffer::take(outer * total * inner);
    let mut at = 0;
    for b in 0..outer {
        for &(x, rows) in parts {
            let n = rows * inner;
            out[at..at + n].copy_from_slice(&x[b * n..(b + 1) * n]);
            at += n;
        }
    }
    out
}
