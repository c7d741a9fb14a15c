//! CPU loops for dropout: drawing the keep mask (one bit per element, bit
//! `i % 8` of byte `i / 8`) and multiplying by it.

use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use crate::ops::elementwise::cpu::par_chunks;
use crate::rng::Rng;

/// Keep bits for `n` elements: element `i` is kept when the `i`-th uniform
/// draw of `rng` is `>= p`, so with probability `1 - p`.
pub(crate) fn draw_keep(n: usize, p: f64, rng: &mut Rng) -> Vec<u8> {
    let mut bits = vec![0u8; n.div_ceil(8)];
    for i in 0..n {
        if rng.uniform() >= p {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    bits
}

/// `x_i * scale` where bit `i` is set, `x_i * 0` where it is not (so NaN
/// and infinities turn to NaN, as in PyTorch's `x * mask`).
pub(crate) fn apply<T: Element>(x: &[T], keep: &[u8], scale: f64) -> Buffer<T> {
    let (s, zero) = (<T::Acc as Accum>::of(scale), <T::Acc as Accum>::of(0.0));
    let mut out = Buffer::take(x.len());
    par_chunks(&mut out, |start, d| {
        for (k, y) in d.iter_mut().enumerate() {
            let i = start + k;
            let kept = keep[i / 8] & (1 << (i % 8)) != 0;
            *y = T::from_acc(x[i].to_acc() * if kept { s } else { zero });
        }
    });
    out
}
