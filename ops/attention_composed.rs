//! Attention built only from primitive ops, the fused op's twin and what
//! `MultiHeadAttention` ran before the fused op existed:
//!
//! ```text
//! s   = matmul(q, transpose(k)) * scale
//! s   = masked_fill(s, causal_mask(T), -inf)     (when causal)
//! out = matmul(softmax(s, -1), v)
//! ```
//!
//! Every step is its own tape node, so the chain rule is the tape's, and
//! the `T x T` scores and probabilities are saved per head. It shares the
//! fused op's argument checks (both reject the same inputs) and no
//! arithmetic.

use super::attention::{heads_geometry, packed_geometry};
use super::{masked_fill, matmul, narrow, permute, reshape, scalar_mul, softmax, transpose};
use crate::dtype::Element;
use crate::error::Result;
use crate::mask::causal_mask;
use crate::tape::Var;

/// The composed twin of [`super::attention()`]: same arguments, results (up
/// to rounding) and errors.
pub fn attention_composed<T: Element>(
    q: &Var<T>,
    k: &Var<T>,
    v: &Var<T>,
    causal: bool,
    scale: f64,
) -> Result<Var<T>> {
    let g = heads_geometry("attention_composed", q.shape(), k.shape(), v.shape(), scale)?;
    let s = scalar_mul(&matmul(q, &transpose(k, -2, -1)?)?, scale)?;
    let s = if causal {
        masked_fill(&s, &causal_mask(g.t)?, f64::NEG_INFINITY)?
    } else {
        s
    };
    matmul(&softmax(&s, -1)?, v)
}

/// The composed twin of [`super::attention_qkv`]: the packed projection is
/// reshaped to `[batch, T, 3, heads, d]`, permuted to `[3, batch, heads, T,
/// d]` and cut into `q`, `k`, `v`; the output is permuted back to
/// `[batch, T, heads * d]`.
pub fn attention_qkv_composed<T: Element>(
    qkv: &Var<T>,
    heads: usize,
    causal: bool,
    scale: f64,
) -> Result<Var<T>> {
    let g = packed_geometry("attention_qkv_composed", qkv.shape(), heads, scale)?;
    let (b, t, h, d) = (g.batch, g.t, g.heads, g.d);
    let qkv = permute(&reshape(qkv, &[b, t, 3, h, d])?, &[2, 0, 3, 1, 4])?;
    let part = |i: usize| reshape(&narrow(&qkv, 0, i, 1)?, &[b, h, t, d]);
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let y = attention_composed(&q, &k, &v, causal, scale)?;
    reshape(&permute(&y, &[0, 2, 1, 3])?, &[b, t, h * d])
}
