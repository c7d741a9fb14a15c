//! Fused RMSNorm: one op, one tape node, `rstd` per row as its only saved
//! statistic.
//!
//! For each row `x` of `D` elements (the trailing `normalized_shape` dims):
//!
//! ```text
//! rstd = 1 / sqrt(sum(x^2) / D + eps)
//! xhat = x * rstd
//! y    = xhat * gamma
//! ```
//!
//! Backward, with `g = dy * gamma` and `<.>` the mean over the row:
//! `dx = rstd * (g - xhat * <g * xhat>)`, `dgamma = sum over rows of dy * xhat`.
//! (From `d rstd / d x_k = -rstd^3 x_k / D`; docs/layernorm.md has the
//! derivation.) The state is `x`, `gamma` (shared handles) and `rstd`: a
//! tensor of N numbers in `T::Acc` on `x`'s device. NaN stays in its row, as
//! for LayerNorm. Finite rows whose squares overflow (|x| past ~1.8e19 in
//! f32) or underflow take the scaled fallback of `ops/layer_norm/scaled.rs`,
//! looked for only when the kernel flags a row, as for LayerNorm.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use crate::dtype::Accum;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Op, Saved, SavedItem};
use crate::ops::layer_norm::{check_eps, check_param, input, last_axis, no_stats, rows_and_len};
use crate::ops::norm::cpu_side;
#[cfg(feature = "cuda")]
use crate::ops::norm::cuda::gpu_side;
use crate::ops::norm::{nodes, record, Nodes, NormSpec};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};

/// The fused RMSNorm op; inputs `[x, gamma?]`.
struct RmsNorm<A> {
    normalized: Vec<usize>,
    d: usize,
    eps: A,
    has_gamma: bool,
}

/// What the fused backward keeps: N values of `rstd` (a tensor of `[N]`
/// on `x`'s device) plus handles to `x` and `gamma`.
pub(crate) struct RmsNormState<T: Element> {
    x: Tensor<T>,
    gamma: Option<Tensor<T>>,
    rstd: Tensor<T::Acc>,
    /// Some row took the scaled fallback: backward runs there.
    scaled: bool,
}

impl<T: Element> Saved for RmsNormState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        self.x.visit(f);
        self.gamma.visit(f);
        self.rstd.visit(f);
    }
}

impl<T: Element> Op<T> for RmsNorm<T::Acc> {
    type State = RmsNormState<T>;

    fn name(&self) -> &'static str {
        "rms_norm"
    }

    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let op = "rms_norm";
        let x = input(op, inputs, 0)?;
        let gamma = self.has_gamma.then(|| input(op, inputs, 1)).transpose()?;
        if let Some(g) = gamma {
            if g.shape() != self.normalized {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: g.shape().to_vec(),
                    rhs: self.normalized.clone(),
                });
            }
        }
        // No rows: nothing to compute (and `d` may be huge).
        if x.numel() == 0 {
            let state = RmsNormState {
                x: x.clone(),
                gamma: gamma.cloned(),
                rstd: no_stats()?.to_device(x.device())?,
                scaled: false,
            };
            return Ok((x.clone(), state));
        }
        let (y, rstd, scaled) = match x.storage() {
            Storage::Cpu(xs) => cpu::forward_checked(xs, self.d, cpu_side(x, gamma)?, self.eps),
            #[cfg(feature = "cuda")]
            Storage::Cuda(xs) => {
                let gs = gpu_side(x, gamma)?;
                let (y, rstd) = cuda::forward(xs, x.shape(), self.d, gs, self.eps.f64())?;
                let state = RmsNormState {
                    x: x.clone(),
                    gamma: gamma.cloned(),
                    rstd,
                    scaled: false,
                };
                return Ok((y, state));
            }
        };
        let state = RmsNormState {
            x: x.clone(),
            gamma: gamma.cloned(),
            rstd: Tensor::from_buffer(&[rstd.len()], rstd)?,
            scaled,
        };
        Ok((Tensor::from_buffer(x.shape(), y)?, state))
    }

    fn backward(
        &self,
        s: &Self::State,
        grad: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        if grad.shape() != s.x.shape() {
            return Err(Error::ShapeMismatch {
                op: "rms_norm backward",
                lhs: grad.shape().to_vec(),
                rhs: s.x.shape().to_vec(),
            });
        }
        let want = (need(0), self.has_gamma && need(1));
        let (dx, dgamma) = match (s.x.storage(), grad.storage(), s.rstd.storage()) {
            (Storage::Cpu(xs), Storage::Cpu(dy), Storage::Cpu(r)) => {
                let gs = cpu_side(&s.x, s.gamma.as_ref())?;
                cpu::backward_checked(xs, dy, self.d, gs, r, s.scaled, self.eps, want)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(xs), Storage::Cuda(dy), Storage::Cuda(r)) => {
                let gs = gpu_side(&s.x, s.gamma.as_ref())?;
                let shapes = (s.x.shape(), &self.normalized[..]);
                let (dx, dg) = cuda::backward(xs, dy, shapes, self.d, gs, r, self.eps.f64(), want)?;
                let mut grads = vec![dx];
                if self.has_gamma {
                    grads.push(dg);
                }
                return Ok(grads);
            }
            #[cfg(feature = "cuda")]
            _ => {
                return Err(Error::DeviceMismatch {
                    op: "rms_norm backward",
                    lhs: s.x.device().to_string(),
                    rhs: grad.device().to_string(),
                })
            }
        };
        let mut grads = vec![dx
            .map(|v| Tensor::from_buffer(s.x.shape(), v))
            .transpose()?];
        if self.has_gamma {
            grads.push(
                dgamma
                    .map(|v| Tensor::from_buffer(&self.normalized, v))
                    .transpose()?,
            );
        }
        Ok(grads)
    }
}

/// Fused RMSNorm over the last axis of `x`; `gamma` (optional) has shape
/// `[x.shape().last()]`. See [`rms_norm_nd`].
pub fn rms_norm<T: Element>(x: &Var<T>, gamma: Option<&Var<T>>, eps: f64) -> Result<Var<T>> {
    let normalized = last_axis("rms_norm", x.shape())?;
    rms_norm_nd(x, &normalized, gamma, eps)
}

/// Fused RMSNorm over the trailing dims `normalized_shape` of `x`; `gamma`
/// (optional) has shape `normalized_shape`. One tape node saving N values
/// in `T::Acc`. Errors as for [`crate::ops::layer_norm_nd`].
pub fn rms_norm_nd<T: Element>(
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let op = "rms_norm";
    let eps = check_eps::<T>(op, eps)?;
    let (_, d) = rows_and_len(op, x.shape(), normalized_shape)?;
    check_param("rms_norm: gamma", gamma, normalized_shape)?;
    let mut inputs = vec![x];
    inputs.extend(gamma);
    let spec = NormSpec {
        normalized: normalized_shape.to_vec(),
        d,
        eps: eps.f64(),
        has_gamma: gamma.is_some(),
        has_beta: false,
    };
    record(&NODES, spec, &inputs)
}

/// RMSNorm's nodes for each element type, compiled here.
static NODES: Nodes = nodes!(node);

/// The RMSNorm node of a checked `spec`, for one concrete `T` (through
/// [`NODES`], so that it is compiled once, in this crate).
pub(crate) fn node<T: Element>(spec: NormSpec, inputs: &[&Var<T>]) -> Result<Var<T>> {
    let op = RmsNorm {
        normalized: spec.normalized.clone(),
        d: spec.d,
        // Exact: `spec.eps` is `T::Acc`'s checked eps, widened.
        eps: <T::Acc as Accum>::of(spec.eps),
        has_gamma: spec.has_gamma,
    };
    Tape::apply_twinned(op, inputs, || crate::ops::norm::twin::twin(&spec, false))
}
