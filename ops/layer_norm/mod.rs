//! Fused LayerNorm: one op, one tape node, per-row statistics as its only
//! saved state.
//!
//! For each row `x` of `D` elements (the trailing `normalized_shape` dims):
//!
//! ```text
//! mean = sum(x) / D                       (pass 1, shifted by x[0])
//! var  = sum((x - mean)^2) / D            (pass 2, never E[x^2] - E[x]^2)
//! rstd = 1 / sqrt(var + eps)
//! xhat = (x - mean) * rstd
//! y    = xhat * gamma + beta
//! ```
//!
//! Backward, with `g = dy * gamma` and row means `<.>` over the D elements:
//!
//! ```text
//! dx     = rstd * (g - <g> - xhat * <g * xhat>)
//! dgamma = sum over rows of dy * xhat
//! dbeta  = sum over rows of dy
//! ```
//!
//! (docs/layernorm.md derives this from the step-by-step chain rule.) The
//! state is `x` and `gamma` (shared handles to tensors the graph holds
//! anyway) plus `mean` and `rstd`: two tensors of N numbers in `T::Acc` on
//! `x`'s device. `xhat` is recomputed in backward from `x`, `mean` and
//! `rstd`.
//!
//! NaN follows IEEE arithmetic row by row: a NaN (or infinity) in one row
//! makes that row's `y` and `dx` NaN and leaves every other row alone;
//! `dgamma` sums `dy * xhat` over rows, so it becomes NaN, while `dbeta`
//! (a sum of `dy` only) stays finite, as in PyTorch.
//!
//! Finite rows of any magnitude stay finite and accurate: rows the kernel's
//! arithmetic cannot represent (spread past ~1.8e19 in f32, or statistics
//! lost to subnormals) are recomputed by the scaled fallback in
//! `scaled.rs`, and then the node's backward runs there too. The kernel
//! raises a flag when some row's statistics are out of its trusted range,
//! and only then are rows looked for (so a device kernel's statistics need
//! not come back to the host on the common path).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;
pub(crate) mod scaled;

use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use crate::error::{Error, Result};
use crate::layout::checked_numel;
use crate::op::{Op, Saved, SavedItem};
#[cfg(feature = "cuda")]
use crate::ops::norm::cuda::gpu_side;
use crate::ops::norm::{cpu_side, nodes, record, Nodes, NormSpec};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use num_traits::{Float, Zero};

/// `eps` checked and converted to the accumulation type: it must be finite
/// and `> 0`, and stay so when rounded to `T::Acc` (e.g. `1e-50` is 0 in f32).
pub(crate) fn check_eps<T: Element>(op: &'static str, eps: f64) -> Result<T::Acc> {
    let a = <T::Acc as Accum>::of(eps);
    if eps.is_finite() && eps > 0.0 && a.is_finite() && a > T::Acc::zero() {
        Ok(a)
    } else {
        Err(Error::BadEps { op, eps })
    }
}

/// Rows and row length `(N, D)` of normalizing `x_shape` over its trailing
/// `normalized` dims. Errors: `EmptyNormalized` for an empty list or a zero
/// dim, `NormalizedShape` when they are not `x_shape`'s trailing dims,
/// `ShapeTooLarge` when `D` exceeds `isize::MAX` (no such row can exist).
pub(crate) fn rows_and_len(
    op: &'static str,
    x_shape: &[usize],
    normalized: &[usize],
) -> Result<(usize, usize)> {
    if normalized.is_empty() || normalized.contains(&0) {
        return Err(Error::EmptyNormalized {
            op,
            input: x_shape.to_vec(),
            normalized: normalized.to_vec(),
        });
    }
    if normalized.len() > x_shape.len() || !x_shape.ends_with(normalized) {
        return Err(Error::NormalizedShape {
            op,
            input: x_shape.to_vec(),
            normalized: normalized.to_vec(),
        });
    }
    let too_large = |_| Error::ShapeTooLarge {
        op,
        shape: x_shape.to_vec(),
    };
    // A zero leading dim means no rows, whatever the other dims are.
    let d = checked_numel(op, normalized, 1).map_err(too_large)?;
    let lead = &x_shape[..x_shape.len() - normalized.len()];
    let n = checked_numel(op, lead, 1).map_err(too_large)?;
    Ok((n, d))
}

/// The normalized shape of the last-axis variants: `[x_shape.last()]`, or
/// `EmptyNormalized` for a rank-0 input.
pub(crate) fn last_axis(op: &'static str, x_shape: &[usize]) -> Result<Vec<usize>> {
    match x_shape.last() {
        Some(&d) => Ok(vec![d]),
        None => Err(Error::EmptyNormalized {
            op,
            input: vec![],
            normalized: vec![],
        }),
    }
}

/// A gamma or beta must have exactly the normalized shape. `what` names the
/// parameter in the error, e.g. `"layer_norm: gamma"`.
pub(crate) fn check_param<T: Element>(
    what: &'static str,
    p: Option<&Var<T>>,
    normalized: &[usize],
) -> Result<()> {
    match p {
        Some(p) if p.shape() != normalized => Err(Error::ShapeMismatch {
            op: what,
            lhs: p.shape().to_vec(),
            rhs: normalized.to_vec(),
        }),
        _ => Ok(()),
    }
}

/// The fused LayerNorm op; inputs `[x, gamma?, beta?]`.
struct LayerNorm<A> {
    normalized: Vec<usize>,
    d: usize,
    eps: A,
    has_gamma: bool,
    has_beta: bool,
}

/// What the fused backward keeps: 2N statistics (tensors of `[N]` on
/// `x`'s device) plus handles to `x` and `gamma` (no copies).
pub(crate) struct LayerNormState<T: Element> {
    x: Tensor<T>,
    gamma: Option<Tensor<T>>,
    mean: Tensor<T::Acc>,
    rstd: Tensor<T::Acc>,
    /// Some row took the scaled fallback: backward runs there.
    scaled: bool,
}

impl<T: Element> Saved for LayerNormState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        self.x.visit(f);
        self.gamma.visit(f);
        self.mean.visit(f);
        self.rstd.visit(f);
    }
}

/// Empty statistics for an input with no rows.
pub(crate) fn no_stats<A: Element>() -> Result<Tensor<A>> {
    Tensor::from_buffer(&[0], Buffer::default())
}

/// The input at `i` or an error (inputs are built by this module, so this
/// only guards against misuse of the op from inside the crate).
pub(crate) fn input<'a, T: Element>(
    op: &'static str,
    inputs: &[&'a Tensor<T>],
    i: usize,
) -> Result<&'a Tensor<T>> {
    inputs
        .get(i)
        .copied()
        .ok_or_else(|| Error::InvalidArgument {
            op,
            msg: format!("expected input {i}, got {} inputs", inputs.len()),
        })
}

impl<T: Element> Op<T> for LayerNorm<T::Acc> {
    type State = LayerNormState<T>;

    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let op = "layer_norm";
        let x = input(op, inputs, 0)?;
        let gamma = self.has_gamma.then(|| input(op, inputs, 1)).transpose()?;
        let beta = self
            .has_beta
            .then(|| input(op, inputs, 1 + self.has_gamma as usize))
            .transpose()?;
        for p in gamma.iter().chain(beta.iter()) {
            if p.shape() != self.normalized {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: p.shape().to_vec(),
                    rhs: self.normalized.clone(),
                });
            }
        }
        // No rows: nothing to compute (and `d` may be huge).
        if x.numel() == 0 {
            let state = LayerNormState {
                x: x.clone(),
                gamma: gamma.cloned(),
                mean: no_stats()?.to_device(x.device())?,
                rstd: no_stats()?.to_device(x.device())?,
                scaled: false,
            };
            return Ok((x.clone(), state));
        }
        let (y, mean, rstd, scaled) = match x.storage() {
            Storage::Cpu(xs) => {
                let (gs, bs) = (cpu_side(x, gamma)?, cpu_side(x, beta)?);
                cpu::forward_checked(xs, self.d, gs, bs, self.eps)
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(xs) => {
                let (gs, bs) = (gpu_side(x, gamma)?, gpu_side(x, beta)?);
                let (y, mean, rstd) = cuda::forward(xs, x.shape(), self.d, gs, bs, self.eps.f64())?;
                // The scaled fallback runs inside the kernels, row by row.
                let state = LayerNormState {
                    x: x.clone(),
                    gamma: gamma.cloned(),
                    mean,
                    rstd,
                    scaled: false,
                };
                return Ok((y, state));
            }
        };
        let n = [mean.len()];
        let state = LayerNormState {
            x: x.clone(),
            gamma: gamma.cloned(),
            mean: Tensor::from_buffer(&n, mean)?,
            rstd: Tensor::from_buffer(&n, rstd)?,
            scaled,
        };
        Ok((Tensor::from_buffer(x.shape(), y)?, state))
    }

    /// See the module doc for the formulas; `needs` is `[x, gamma?, beta?]`.
    fn backward(
        &self,
        s: &Self::State,
        grad: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        let gi = 1;
        let bi = 1 + self.has_gamma as usize;
        let want_dg = self.has_gamma && need(gi);
        let want_db = self.has_beta && need(bi);
        if grad.shape() != s.x.shape() {
            return Err(Error::ShapeMismatch {
                op: "layer_norm backward",
                lhs: grad.shape().to_vec(),
                rhs: s.x.shape().to_vec(),
            });
        }
        let want = (need(0), want_dg, want_db);
        let out = match (
            s.x.storage(),
            grad.storage(),
            s.mean.storage(),
            s.rstd.storage(),
        ) {
            (Storage::Cpu(xs), Storage::Cpu(dy), Storage::Cpu(m), Storage::Cpu(r)) => {
                let gs = cpu_side(&s.x, s.gamma.as_ref())?;
                cpu::backward_checked(xs, dy, self.d, gs, (m, r), s.scaled, self.eps, want)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(xs), Storage::Cuda(dy), Storage::Cuda(m), Storage::Cuda(r)) => {
                let gs = gpu_side(&s.x, s.gamma.as_ref())?;
                let shapes = (s.x.shape(), &self.normalized[..]);
                let o = cuda::backward(xs, dy, shapes, self.d, gs, (m, r), self.eps.f64(), want)?;
                let mut grads = vec![o.dx];
                if self.has_gamma {
                    grads.push(o.dgamma);
                }
                if self.has_beta {
                    grads.push(o.dbeta);
                }
                return Ok(grads);
            }
            #[cfg(feature = "cuda")]
            _ => {
                return Err(Error::DeviceMismatch {
                    op: "layer_norm backward",
                    lhs: s.x.device().to_string(),
                    rhs: grad.device().to_string(),
                })
            }
        };
        let shaped = |v: Option<Buffer<T>>, shape: &[usize]| {
            v.map(|v| Tensor::from_buffer(shape, v)).transpose()
        };
        let mut grads = vec![shaped(out.dx, s.x.shape())?];
        if self.has_gamma {
            grads.push(shaped(out.dgamma, &self.normalized)?);
        }
        if self.has_beta {
            grads.push(shaped(out.dbeta, &self.normalized)?);
        }
        Ok(grads)
    }
}

/// Fused LayerNorm over the last axis of `x`; `gamma` and `beta` (optional)
/// have shape `[x.shape().last()]`. See [`layer_norm_nd`].
pub fn layer_norm<T: Element>(
    x: &Var<T>,
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let normalized = last_axis("layer_norm", x.shape())?;
    layer_norm_nd(x, &normalized, gamma, beta, eps)
}

/// Fused LayerNorm over the trailing dims `normalized_shape` of `x` (as in
/// PyTorch); `gamma` and `beta` (optional) have shape `normalized_shape`.
///
/// One tape node that saves 2N statistics in `T::Acc` (f32 for f16/bf16).
/// Errors: `BadEps` unless `eps` is finite and `> 0`; `EmptyNormalized` for
/// an empty `normalized_shape` or a zero in it; `NormalizedShape` if it is
/// not the trailing dims of `x`; `ShapeTooLarge` if it has more than
/// `isize::MAX` elements; `ShapeMismatch` for a gamma/beta of another
/// shape. Zero rows (`N = 0`) are fine: an empty output, zero dgamma/dbeta.
pub fn layer_norm_nd<T: Element>(
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let op = "layer_norm";
    let eps = check_eps::<T>(op, eps)?;
    let (_, d) = rows_and_len(op, x.shape(), normalized_shape)?;
    check_param("layer_norm: gamma", gamma, normalized_shape)?;
    check_param("layer_norm: beta", beta, normalized_shape)?;
    let mut inputs = vec![x];
    inputs.extend(gamma);
    inputs.extend(beta);
    let spec = NormSpec {
        normalized: normalized_shape.to_vec(),
        d,
        eps: eps.f64(),
        has_gamma: gamma.is_some(),
        has_beta: beta.is_some(),
    };
    record(&NODES, spec, &inputs)
}

/// LayerNorm's nodes for each element type, compiled here.
static NODES: Nodes = nodes!(node);

/// The LayerNorm node of a checked `spec`, for one concrete `T` (through
/// [`NODES`], so that it is compiled once, in this crate).
pub(crate) fn node<T: Element>(spec: NormSpec, inputs: &[&Var<T>]) -> Result<Var<T>> {
    let ln = LayerNorm {
        normalized: spec.normalized.clone(),
        d: spec.d,
        // Exact: `spec.eps` is `T::Acc`'s checked eps, widened.
        eps: <T::Acc as Accum>::of(spec.eps),
        has_gamma: spec.has_gamma,
        has_beta: spec.has_beta,
    };
    Tape::apply_twinned(ln, inputs, || crate::ops::norm::twin::twin(&spec, true))
}
