//! Fused scaled dot-product attention: one op, one tape node, saving the
//! output and one log-sum-exp per query row instead of the `T x T`
//! probabilities (FlashAttention's idea).
//!
//! Per (batch, head), with `q`, `k`, `v` of `[T, d]`, query row `i` and
//! the keys it sees (`j <= i` when causal, all `j` otherwise):
//!
//! ```text
//! s_ij = scale * <q_i, k_j>
//! lse_i = m_i + ln sum_j exp(s_ij - m_i)        m_i = max_j s_ij
//! p_ij = exp(s_ij - lse_i)                      (a softmax over j)
//! o_i  = sum_j p_ij v_j
//! ```
//!
//! Backward (FlashAttention-2), with `dO = dL/dO`, the probabilities
//! recomputed per row tile from `q`, `k` and the saved `lse`:
//!
//! ```text
//! D_i   = <dO_i, o_i>                      (= sum_j p_ij <dO_i, v_j>)
//! dv_j += p_ij dO_i
//! dp_ij = <dO_i, v_j>
//! ds_ij = p_ij (dp_ij - D_i)               (softmax's backward)
//! dq_i += scale ds_ij k_j
//! dk_j += scale ds_ij q_i
//! ```
//!
//! The readable reference is [`attention_composed`](crate::ops::attention_composed)
//! (`ops/attention_composed.rs`): the same math as `matmul`, `scalar_mul`,
//! `masked_fill`, `softmax`, `matmul` nodes, whose chain rule the tape
//! applies; the tests check the two against each other and against finite
//! differences in f64.
//!
//! # Layouts
//!
//! [`attention`] takes `q`, `k`, `v` as `[batch, heads, T, d]` and returns
//! that shape. [`attention_qkv`] takes the model's fused projection
//! `[batch, T, 3 * heads * d]` as it comes out of its `Linear` (queries,
//! then keys, then values, each head-major, i.e. `[batch, T, 3, heads,
//! d]`, PyTorch's `qkv.split` + `view` order) and returns `[batch, T,
//! heads * d]`, the heads side by side, ready for the output projection.
//! Tensors here are always contiguous, so reading the heads in place
//! through row strides (and writing the gradient back in the same layout)
//! is what saves `MultiHeadAttention` its three permute copies per step
//! and their backward copies; both entry points run the same kernels.
//!
//! # Edge cases
//!
//! `T = 0` (or any zero dim) is a valid empty attention: an empty output,
//! empty gradients. `d = 0` gives all-zero scores, so uniform weights over
//! an empty `v`: an empty output. Causal rows always see themselves, so no
//! row is fully masked.
//!
//! NaN propagates: a NaN in `q_i` makes row `i`'s output NaN; a NaN in
//! `k_j` or `v_j` makes NaN every row that sees `j` (all rows, or rows
//! `i >= j` when causal) and never a row that does not (the kernels never
//! multiply a masked entry). The composed twin differs only there: its
//! `att @ v` multiplies the masked zeros by `v_j`, so a NaN in `v_j` also
//! reaches earlier rows. In the backward, `dq_i` is NaN exactly when row
//! `i`'s output is; `dk_j` and `dv_j` gather from every row that sees `j`,
//! so a NaN row spreads to the key and value gradients of the positions
//! it sees, as the chain rule says.
//!
//! State: `q`, `k`, `v` (or `qkv`) and the output are handles to tensors
//! the graph holds anyway; the only new memory is `lse`, `batch * heads *
//! T` values in `T::Acc` (f32 for f16/bf16, which are widened on load and
//! rounded once on store).

#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;
#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
pub(crate) mod twin;

use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};

const OP: &str = "attention";
const OP_QKV: &str = "attention_qkv";

/// The sizes of one attention and where each head's rows lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) t: usize,
    pub(crate) d: usize,
    /// `[batch, T, 3, heads, d]` in one tensor (else three
    /// `[batch, heads, T, d]` tensors).
    pub(crate) packed: bool,
}

impl Geometry {
    /// `(offset of row 0, row stride)` of input `which` (0 `q`, 1 `k`,
    /// 2 `v`) for head `bh = b * heads + h`. Different heads, and `q`, `k`,
    /// `v` of one head, never share an element.
    pub(crate) fn input_rows(&self, which: usize, bh: usize) -> (usize, usize) {
        let (b, h) = (bh / self.heads, bh % self.heads);
        if self.packed {
            let w = self.heads * self.d;
            (b * self.t * 3 * w + which * w + h * self.d, 3 * w)
        } else {
            (bh * self.t * self.d, self.d)
        }
    }

    /// `(offset of row 0, row stride)` of head `bh`'s output rows.
    pub(crate) fn out_rows(&self, bh: usize) -> (usize, usize) {
        let (b, h) = (bh / self.heads, bh % self.heads);
        if self.packed {
            let w = self.heads * self.d;
            (b * self.t * w + h * self.d, w)
        } else {
            (bh * self.t * self.d, self.d)
        }
    }

    /// The output's shape.
    pub(crate) fn out_shape(&self) -> Vec<usize> {
        if self.packed {
            vec![self.batch, self.t, self.heads * self.d]
        } else {
            vec![self.batch, self.heads, self.t, self.d]
        }
    }

    /// One input's shape.
    fn input_shape(&self) -> Vec<usize> {
        if self.packed {
            vec![self.batch, self.t, 3 * self.heads * self.d]
        } else {
            vec![self.batch, self.heads, self.t, self.d]
        }
    }

    /// `[batch, heads, T]`: one log-sum-exp per query row.
    fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.heads, self.t]
    }
}

/// `scale` must be finite (0 and negative scales are fine: uniform or
/// reversed weights).
fn check_scale(op: &'static str, scale: f64) -> Result<()> {
    if scale.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op,
            msg: format!("scale must be finite, got {scale}"),
        })
    }
}

/// The geometry of `q`, `k`, `v` given as `[batch, heads, T, d]` each.
/// Errors: `InvalidArgument` for another rank or a non-finite `scale`,
/// `ShapeMismatch` when `k` or `v` differs from `q`.
pub(crate) fn heads_geometry(
    op: &'static str,
    q: &[usize],
    k: &[usize],
    v: &[usize],
    scale: f64,
) -> Result<Geometry> {
    let &[batch, heads, t, d] = q else {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("q must be [batch, heads, T, head_dim], got {q:?}"),
        });
    };
    for other in [k, v] {
        if other != q {
            return Err(Error::ShapeMismatch {
                op,
                lhs: q.to_vec(),
                rhs: other.to_vec(),
            });
        }
    }
    check_scale(op, scale)?;
    Ok(Geometry {
        batch,
        heads,
        t,
        d,
        packed: false,
    })
}

/// The geometry of a packed `[batch, T, 3 * heads * d]` projection.
/// Errors: `InvalidArgument` for another rank, `heads == 0`, a last dim
/// that is not a multiple of `3 * heads`, or a non-finite `scale`.
pub(crate) fn packed_geometry(
    op: &'static str,
    qkv: &[usize],
    heads: usize,
    scale: f64,
) -> Result<Geometry> {
    let &[batch, t, w3] = qkv else {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("qkv must be [batch, T, 3 * heads * head_dim], got {qkv:?}"),
        });
    };
    if heads == 0 || !w3.is_multiple_of(3 * heads) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("qkv {qkv:?}: last dim {w3} does not split into 3 x {heads} heads"),
        });
    }
    check_scale(op, scale)?;
    Ok(Geometry {
        batch,
        heads,
        t,
        d: w3 / (3 * heads),
        packed: true,
    })
}

struct Attention {
    g: Geometry,
    causal: bool,
    scale: f64,
}

/// What the backward keeps: handles to the inputs and the output (no
/// copies) and `lse`, one `T::Acc` per query row.
pub(crate) struct AttentionState<T: Element> {
    inputs: Vec<Tensor<T>>,
    out: Tensor<T>,
    lse: Tensor<T::Acc>,
}

impl<T: Element> Saved for AttentionState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        for x in &self.inputs {
            x.visit(f);
        }
        self.out.visit(f);
        self.lse.visit(f);
    }
}

impl Attention {
    fn name(&self) -> &'static str {
        if self.g.packed {
            OP_QKV
        } else {
            OP
        }
    }

    /// The inputs as `q`, `k`, `v` (the packed tensor three times over),
    /// each checked against the geometry.
    fn inputs<'a, T: Element>(&self, x: &[&'a Tensor<T>]) -> Result<[&'a Tensor<T>; 3]> {
        let op = self.name();
        let want = if self.g.packed { 1 } else { 3 };
        if x.len() != want {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("expects {want} inputs, got {}", x.len()),
            });
        }
        for t in x {
            if t.shape() != self.g.input_shape() {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: t.shape().to_vec(),
                    rhs: self.g.input_shape(),
                });
            }
        }
        Ok(if self.g.packed {
            [x[0], x[0], x[0]]
        } else {
            [x[0], x[1], x[2]]
        })
    }
}

/// The CPU slice of each of `xs`, or `DeviceMismatch` naming the first
/// tensor that lives elsewhere.
fn cpu_slices<'a, T: Element, const N: usize>(
    op: &'static str,
    xs: [&'a Tensor<T>; N],
) -> Result<[&'a [T]; N]> {
    let mut out: [&[T]; N] = [&[]; N];
    for (o, x) in out.iter_mut().zip(xs) {
        match x.storage() {
            Storage::Cpu(s) => *o = s,
            #[cfg(feature = "cuda")]
            _ => {
                return Err(Error::DeviceMismatch {
                    op,
                    lhs: "cpu".into(),
                    rhs: x.device().to_string(),
                })
            }
        }
    }
    let _ = op;
    Ok(out)
}

/// The CUDA buffer of each of `xs`, or `DeviceMismatch` naming the first
/// tensor that lives elsewhere.
#[cfg(feature = "cuda")]
fn cuda_bufs<'a, T: Element, const N: usize>(
    op: &'static str,
    xs: [&'a Tensor<T>; N],
) -> Result<[&'a crate::tensor::CudaBuf<T>; N]> {
    let mut out = Vec::with_capacity(N);
    for x in xs {
        match x.storage() {
            Storage::Cuda(b) => out.push(b),
            Storage::Cpu(_) => {
                return Err(Error::DeviceMismatch {
                    op,
                    lhs: xs[0].device().to_string(),
                    rhs: x.device().to_string(),
                })
            }
        }
    }
    out.try_into().map_err(|_| Error::InvalidArgument {
        op,
        msg: "buffer count".into(),
    })
}

impl<T: Element> Op<T> for Attention {
    type State = AttentionState<T>;

    fn name(&self) -> &'static str {
        Attention::name(self)
    }

    /// See the module doc: `o_i = sum_j softmax_j(scale <q_i, k_j>) v_j`
    /// over the keys row `i` sees, and `lse_i`.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let op = self.name();
        let qkv = self.inputs(x)?;
        let g = self.g;
        let (out, lse) = match qkv[0].storage() {
            Storage::Cpu(_) => {
                let srcs = cpu_slices(op, qkv)?;
                let n_out = g.batch * g.heads * g.t * g.d;
                let mut out = Tensor::<T>::scratch(n_out);
                let mut lse = Buffer::<T::Acc>::take(g.batch * g.heads * g.t);
                cpu::forward(&g, srcs, self.scale, self.causal, &mut out, &mut lse);
                (
                    Tensor::from_buffer(&g.out_shape(), out)?,
                    Tensor::from_buffer(&g.lse_shape(), lse)?,
                )
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => {
                cuda::forward(op, &g, cuda_bufs(op, qkv)?, self.scale, self.causal)?
            }
        };
        let inputs = x.iter().map(|t| (*t).clone()).collect();
        let state = AttentionState {
            inputs,
            out: out.clone(),
            lse,
        };
        Ok((out, state))
    }

    /// See the module doc for the formulas. `needs` is `[q, k, v]` or
    /// `[qkv]`; the kernel computes all three gradients in one sweep.
    fn backward(
        &self,
        s: &Self::State,
        grad: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let op = self.name();
        if !needs.iter().any(|&n| n) {
            return Ok(vec![None; needs.len()]);
        }
        if grad.shape() != s.out.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: grad.shape().to_vec(),
                rhs: s.out.shape().to_vec(),
            });
        }
        let ins: Vec<&Tensor<T>> = s.inputs.iter().collect();
        let qkv = self.inputs(&ins)?;
        let g = self.g;
        let n_in = g.batch * g.heads * g.t * g.d * if g.packed { 3 } else { 1 };
        let grads: Vec<Tensor<T>> = match (qkv[0].storage(), &s.lse.storage()) {
            (Storage::Cpu(_), Storage::Cpu(lse)) => {
                let srcs = cpu_slices(op, qkv)?;
                let [out, dout] = cpu_slices(op, [&s.out, grad])?;
                let mut bufs: Vec<Buffer<T>> = (0..s.inputs.len())
                    .map(|_| Tensor::<T>::scratch(n_in))
                    .collect();
                let shared: Vec<cpu::Shared<T>> =
                    bufs.iter_mut().map(|b| cpu::Shared::new(b)).collect();
                let dst = if g.packed {
                    [&shared[0], &shared[0], &shared[0]]
                } else {
                    [&shared[0], &shared[1], &shared[2]]
                };
                cpu::backward(&g, srcs, out, dout, lse, self.scale, self.causal, dst);
                drop(shared);
                bufs.into_iter()
                    .map(|b| Tensor::from_buffer(&g.input_shape(), b))
                    .collect::<Result<_>>()?
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(_), Storage::Cuda(lse)) => {
                let [out, dout] = cuda_bufs(op, [&s.out, grad])?;
                let ins = cuda_bufs(op, qkv)?;
                cuda::backward(op, &g, ins, out, dout, lse, self.scale, self.causal)?
            }
            #[cfg(feature = "cuda")]
            _ => {
                return Err(Error::DeviceMismatch {
                    op,
                    lhs: qkv[0].device().to_string(),
                    rhs: s.lse.device().to_string(),
                })
            }
        };
        Ok(grads
            .into_iter()
            .zip(needs)
            .map(|(g, &n)| n.then_some(g))
            .collect())
    }
}

/// Fused attention `softmax(mask(q k^T * scale)) v` of `q`, `k`, `v`, each
/// `[batch, heads, T, head_dim]`; returns `[batch, heads, T, head_dim]`.
/// With `causal`, query `i` sees keys `j <= i`; otherwise all. The usual
/// `scale` is `1 / sqrt(head_dim)`.
///
/// One tape node saving `batch * heads * T` log-sum-exps beside handles
/// to its inputs and output (see the module doc). Errors:
/// `InvalidArgument` for an input that is not rank 4 or a non-finite
/// `scale`; `ShapeMismatch` when `k` or `v` has another shape than `q`.
pub fn attention<T: Element>(
    q: &Var<T>,
    k: &Var<T>,
    v: &Var<T>,
    causal: bool,
    scale: f64,
) -> Result<Var<T>> {
    let g = heads_geometry(OP, q.shape(), k.shape(), v.shape(), scale)?;
    let op = Attention { g, causal, scale };
    Tape::apply_twinned(op, &[q, k, v], || twin::twin(g, causal, scale))
}

/// [`attention`] on the packed projection `qkv` of `[batch, T, 3 * heads *
/// head_dim]` (queries, keys, values, each head-major: the layout of one
/// `Linear(width, 3 * width)`), returning `[batch, T, heads * head_dim]`
/// with the heads side by side. No permute copies forward or backward.
///
/// Errors: `InvalidArgument` for an input that is not rank 3, `heads ==
/// 0`, a last dim that is not a multiple of `3 * heads`, or a non-finite
/// `scale`.
pub fn attention_qkv<T: Element>(
    qkv: &Var<T>,
    heads: usize,
    causal: bool,
    scale: f64,
) -> Result<Var<T>> {
    let g = packed_geometry(OP_QKV, qkv.shape(), heads, scale)?;
    let op = Attention { g, causal, scale };
    Tape::apply_twinned(op, &[qkv], || twin::twin(g, causal, scale))
}
