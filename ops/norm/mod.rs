//! The fused norms, LayerNorm and RMSNorm: one op, one saved state and one
//! chain rule, parameterised by `centre` (whether a row's mean is
//! subtracted and `beta` added). One tape node each, with per-row
//! statistics as the only saved state.
//!
//! For each row `x` of `D` elements (the trailing `normalized_shape` dims),
//! with `mean = 0` and no `beta` for RMSNorm:
//!
//! ```text
//! mean = sum(x) / D                       (LayerNorm: pass 1, shifted by x[0])
//! var  = sum((x - mean)^2) / D            (pass 2, never E[x^2] - E[x]^2)
//! rstd = 1 / sqrt(var + eps)
//! xhat = (x - mean) * rstd
//! y    = xhat * gamma + beta
//! ```
//!
//! Backward, with `g = dy * gamma` and row means `<.>` over the D elements
//! (no `<g>` term for RMSNorm, whose mean does not move with `x`):
//!
//! ```text
//! dx     = rstd * (g - <g> - xhat * <g * xhat>)
//! dgamma = sum over rows of dy * xhat
//! dbeta  = sum over rows of dy
//! ```
//!
//! (docs/layernorm.md derives this from the step-by-step chain rule.) The
//! state is `x` and `gamma` (shared handles to tensors the graph holds
//! anyway) plus `rstd` and, for LayerNorm, `mean`: N numbers each in
//! `T::Acc` on `x`'s device. `xhat` is recomputed in backward.
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
//!
//! Files: this one holds the argument checks, the op, its state and the
//! public fns, which build a node in one call to the tape; `cpu.rs` (and
//! `cpu/`) the host kernels, entered through one plain function per
//! element type (`cpu/typed.rs`) so that they compile once, in this crate; `cuda.rs` the
//! GPU launchers of `kernels/norm.cu`, `scaled.rs` the fallback,
//! `composed.rs` the twin built from primitive ops and `twin.rs` what the
//! shadow check runs beside a fused node.

mod composed;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod scaled;
pub(crate) mod twin;

pub use composed::*;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use crate::error::{Error, Result};
use crate::layout::checked_numel;
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use num_traits::{Float, Zero};

/// A fused norm node as the public fns checked it: inputs `[x, gamma?,
/// beta?]` normalized over `normalized` (`d` elements per row), centred
/// (LayerNorm) or not (RMSNorm, never with a beta); `eps` is the checked
/// eps in the accumulation type, widened.
#[derive(Clone)]
pub struct NormSpec {
    pub(crate) centre: bool,
    pub(crate) normalized: Vec<usize>,
    pub(crate) d: usize,
    pub(crate) eps: f64,
    pub(crate) has_gamma: bool,
    pub(crate) has_beta: bool,
}

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

/// The names a norm fn's errors give: the op, its gamma, its beta.
fn names(centre: bool, composed: bool) -> [&'static str; 3] {
    match (centre, composed) {
        (true, false) => ["layer_norm", "layer_norm: gamma", "layer_norm: beta"],
        (false, false) => ["rms_norm", "rms_norm: gamma", "rms_norm: beta"],
        (true, true) => [
            "layer_norm_composed",
            "layer_norm_composed: gamma",
            "layer_norm_composed: beta",
        ],
        (false, true) => [
            "rms_norm_composed",
            "rms_norm_composed: gamma",
            "rms_norm_composed: beta",
        ],
    }
}

/// A norm fn's arguments: `x`, the normalized shape, gamma, beta, eps.
type Args<'a, T> = (
    &'a Var<T>,
    &'a [usize],
    Option<&'a Var<T>>,
    Option<&'a Var<T>>,
    f64,
);

/// The checks every norm fn makes, fused or composed (so both reject the
/// same inputs), with the errors naming `names` ([`names`]): `eps` in
/// `T::Acc` and the row length `D`.
fn check_args<T: Element>(names: [&'static str; 3], a: Args<'_, T>) -> Result<(T::Acc, usize)> {
    let (x, normalized, gamma, beta, eps) = a;
    let eps = check_eps::<T>(names[0], eps)?;
    let (_, d) = rows_and_len(names[0], x.shape(), normalized)?;
    check_param(names[1], gamma, normalized)?;
    check_param(names[2], beta, normalized)?;
    Ok((eps, d))
}

/// The fused norm op of a checked spec; inputs `[x, gamma?, beta?]`.
struct FusedNorm(NormSpec);

/// What the fused backward keeps: N values of `rstd` and, for LayerNorm, N
/// of `mean` (tensors of `[N]` on `x`'s device), plus handles to `x` and
/// `gamma` (no copies).
pub(crate) struct NormState<T: Element> {
    x: Tensor<T>,
    gamma: Option<Tensor<T>>,
    mean: Option<Tensor<T::Acc>>,
    rstd: Tensor<T::Acc>,
    /// Some row took the scaled fallback: backward runs there.
    scaled: bool,
}

impl<T: Element> Saved for NormState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        self.x.visit(f);
        self.gamma.visit(f);
        self.mean.visit(f);
        self.rstd.visit(f);
    }
}

/// The gradients of a backward: dx, dgamma and dbeta, each where wanted.
pub(crate) struct Grads<T: Element> {
    pub(crate) dx: Option<Tensor<T>>,
    pub(crate) dgamma: Option<Tensor<T>>,
    pub(crate) dbeta: Option<Tensor<T>>,
}

/// Empty statistics for an input with no rows.
fn no_stats<A: Element>() -> Result<Tensor<A>> {
    Tensor::from_buffer(&[0], Buffer::default())
}

/// The input at `i` or an error (inputs are built by this module, so this
/// only guards against misuse of the op from inside the crate).
fn input<'a, T: Element>(
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

/// The host elements of a side input (gamma, beta) of a norm whose `x` is
/// on the CPU; `DeviceMismatch` if it lives elsewhere.
fn cpu_side<'a, T: Element>(
    x: &Tensor<T>,
    t: Option<&'a Tensor<T>>,
) -> Result<Option<&'a Buffer<T>>> {
    let Some(t) = t else { return Ok(None) };
    match t.storage() {
        Storage::Cpu(b) if t.device() == x.device() => Ok(Some(b)),
        _ => Err(Error::DeviceMismatch {
            op: "norm",
            lhs: x.device().to_string(),
            rhs: t.device().to_string(),
        }),
    }
}

impl<T: Element> Op<T> for FusedNorm {
    type State = NormState<T>;

    fn name(&self) -> &'static str {
        if self.0.centre {
            "layer_norm"
        } else {
            "rms_norm"
        }
    }

    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let op = Op::<T>::name(self);
        let x = input(op, inputs, 0)?;
        let gamma = self.0.has_gamma.then(|| input(op, inputs, 1)).transpose()?;
        let beta = self
            .0
            .has_beta
            .then(|| input(op, inputs, 1 + self.0.has_gamma as usize))
            .transpose()?;
        for p in gamma.iter().chain(beta.iter()) {
            if p.shape() != self.0.normalized {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: p.shape().to_vec(),
                    rhs: self.0.normalized.clone(),
                });
            }
        }
        let state = |mean, rstd, scaled| NormState {
            x: x.clone(),
            gamma: gamma.cloned(),
            mean,
            rstd,
            scaled,
        };
        // No rows: nothing to compute (and `d` may be huge).
        if x.numel() == 0 {
            let none = || no_stats()?.to_device(x.device());
            let mean = self.0.centre.then(none).transpose()?;
            return Ok((x.clone(), state(mean, none()?, false)));
        }
        match x.storage() {
            Storage::Cpu(xs) => {
                let p = (cpu_side(x, gamma)?, cpu_side(x, beta)?);
                let f = cpu::typed::forward(xs, self.0.d, p, self.0.eps, self.0.centre)?;
                let n = [f.rstd.len()];
                let mean = self
                    .0
                    .centre
                    .then(|| Tensor::from_buffer(&n, f.mean))
                    .transpose()?;
                let rstd = Tensor::from_buffer(&n, f.rstd)?;
                let y = Tensor::from_buffer(x.shape(), f.y)?;
                Ok((y, state(mean, rstd, f.scaled)))
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(xs) => {
                use cuda::gpu_side;
                let (gs, bs) = (gpu_side(x, gamma)?, gpu_side(x, beta)?);
                let eps = self.0.eps;
                let (y, mean, rstd) =
                    cuda::forward(xs, x.shape(), self.0.d, (gs, bs), eps, self.0.centre)?;
                // The scaled fallback runs inside the kernels, row by row.
                Ok((y, state(mean, rstd, false)))
            }
        }
    }

    /// See the module doc for the formulas; `needs` is `[x, gamma?, beta?]`.
    fn backward(
        &self,
        s: &Self::State,
        grad: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        let want_dg = self.0.has_gamma && need(1);
        let want_db = self.0.has_beta && need(1 + self.0.has_gamma as usize);
        let op = if self.0.centre {
            "layer_norm backward"
        } else {
            "rms_norm backward"
        };
        if grad.shape() != s.x.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: grad.shape().to_vec(),
                rhs: s.x.shape().to_vec(),
            });
        }
        let want = (need(0), want_dg, want_db);
        #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
        let mismatch = || Error::DeviceMismatch {
            op,
            lhs: s.x.device().to_string(),
            rhs: grad.device().to_string(),
        };
        let g = match (s.x.storage(), grad.storage(), s.rstd.storage()) {
            (Storage::Cpu(xs), Storage::Cpu(dy), Storage::Cpu(r)) => {
                let m = match s.mean.as_ref().map(Tensor::storage) {
                    Some(Storage::Cpu(m)) => Some(m),
                    None => None,
                    #[cfg(feature = "cuda")]
                    Some(_) => return Err(mismatch()),
                };
                let gs = cpu_side(&s.x, s.gamma.as_ref())?;
                let (d, eps) = (self.0.d, self.0.eps);
                let o = cpu::typed::backward(xs, dy, d, gs, (m, r), s.scaled, eps, want)?;
                let shaped = |v: Option<Buffer<T>>, shape: &[usize]| {
                    v.map(|v| Tensor::from_buffer(shape, v)).transpose()
                };
                Grads {
                    dx: shaped(o.dx, s.x.shape())?,
                    dgamma: shaped(o.dgamma, &self.0.normalized)?,
                    dbeta: shaped(o.dbeta, &self.0.normalized)?,
                }
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(xs), Storage::Cuda(dy), Storage::Cuda(r)) => {
                let m = match s.mean.as_ref().map(Tensor::storage) {
                    Some(Storage::Cuda(m)) => Some(m),
                    None => None,
                    Some(_) => return Err(mismatch()),
                };
                let gs = cuda::gpu_side(&s.x, s.gamma.as_ref())?;
                let shapes = (s.x.shape(), &self.0.normalized[..]);
                let eps = self.0.eps;
                cuda::backward(xs, dy, shapes, self.0.d, gs, (m, r), eps, want)?
            }
            #[cfg(feature = "cuda")]
            _ => return Err(mismatch()),
        };
        let mut grads = vec![g.dx];
        if self.0.has_gamma {
            grads.push(g.dgamma);
        }
        if self.0.has_beta {
            grads.push(g.dbeta);
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
    norm_nd(true, x, normalized_shape, gamma, beta, eps)
}

/// Fused RMSNorm over the last axis of `x`; `gamma` (optional) has shape
/// `[x.shape().last()]`. See [`rms_norm_nd`].
pub fn rms_norm<T: Element>(x: &Var<T>, gamma: Option<&Var<T>>, eps: f64) -> Result<Var<T>> {
    let normalized = last_axis("rms_norm", x.shape())?;
    rms_norm_nd(x, &normalized, gamma, eps)
}

/// Fused RMSNorm over the trailing dims `normalized_shape` of `x`; `gamma`
/// (optional) has shape `normalized_shape`. One tape node saving N values
/// in `T::Acc`. Errors as for [`layer_norm_nd`].
pub fn rms_norm_nd<T: Element>(
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    norm_nd(false, x, normalized_shape, gamma, None, eps)
}

/// The checks both public fns share, then the node.
fn norm_nd<T: Element>(
    centre: bool,
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let args = (x, normalized_shape, gamma, beta, eps);
    let (eps, d) = check_args(names(centre, false), args)?;
    let mut inputs = vec![x];
    inputs.extend(gamma);
    inputs.extend(beta);
    let spec = NormSpec {
        centre,
        normalized: normalized_shape.to_vec(),
        d,
        eps: eps.f64(),
        has_gamma: gamma.is_some(),
        has_beta: beta.is_some(),
    };
    Tape::apply_twinned(FusedNorm(spec.clone()), &inputs, || twin::twin(&spec))
}
