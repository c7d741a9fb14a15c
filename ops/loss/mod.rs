//! Scalar losses: mean squared error and softmax cross-entropy.
//!
//! ```text
//! mse            L = (1/N) sum_i (p_i - t_i)^2
//!                dp_i = (2g/N) (p_i - t_i),  dt_i = -dp_i
//! cross-entropy  l_r = (m_r - x_{r,t_r}) + ln s_r,  L = (1/n) sum_r l_r
//!                dx_{r,j} = (g/n) (softmax(x_r)_j - [j = t_r])
//! ```
//!
//! with `g` the scalar output gradient, and per row `r` of the `[n, c]`
//! logits `m_r = max_j x_{r,j}` and `s_r = sum_j exp(x_{r,j} - m_r)`. The
//! data is reached only through the device-level kernels below; the class
//! targets are host metadata, given by the caller.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use super::elementwise::check_devices;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use num_traits::One;

/// `g` holds the single value of a scalar gradient.
fn check_scalar<T: Element>(op: &'static str, g: &Tensor<T>) -> Result<()> {
    if g.numel() == 1 {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            lhs: g.shape().to_vec(),
            rhs: vec![],
        })
    }
}

/// `(1/N) sum_i (p_i - t_i)^2` as a rank-0 tensor (shapes checked by the
/// caller): the device-level forward kernel of mse.
fn mse_kernel<T: Element>(p: &Tensor<T>, t: &Tensor<T>) -> Result<Tensor<T>> {
    check_devices("mse", p, t)?;
    match (p.storage(), t.storage()) {
        (Storage::Cpu(ps), Storage::Cpu(ts)) => Ok(Tensor::scalar(cpu::mse(ps, ts))),
        #[cfg(feature = "cuda")]
        (Storage::Cuda(ps), Storage::Cuda(ts)) => cuda::mse(ps, ts),
        // Unreachable after check_devices; an error, never a panic.
        #[cfg(feature = "cuda")]
        _ => Err(mixed("mse", p.device(), t.device())),
    }
}

/// `sign (2g/N) (p_i - t_i)` for the scalar gradient `g`: the device-level
/// backward kernel of mse.
fn mse_grad_kernel<T: Element>(
    g: &Tensor<T>,
    p: &Tensor<T>,
    t: &Tensor<T>,
    sign: T::Acc,
) -> Result<Tensor<T>> {
    check_devices("mse", g, p)?;
    check_devices("mse", p, t)?;
    match (g.storage(), p.storage(), t.storage()) {
        (Storage::Cpu(gs), Storage::Cpu(ps), Storage::Cpu(ts)) => {
            Tensor::from_vec(p.shape().to_vec(), cpu::mse_grad(gs, ps, ts, sign))
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(gs), Storage::Cuda(ps), Storage::Cuda(ts)) => {
            cuda::mse_grad(gs, ps, ts, p.shape(), crate::dtype::Accum::f64(sign))
        }
        // Unreachable after check_devices; an error, never a panic.
        #[cfg(feature = "cuda")]
        _ if g.device() != p.device() => Err(mixed("mse", g.device(), p.device())),
        #[cfg(feature = "cuda")]
        _ => Err(mixed("mse", p.device(), t.device())),
    }
}

struct Mse;

impl<T: Element> Op<T> for Mse {
    /// `pred` and `target` (inputs, so held by the graph anyway).
    type State = (Tensor<T>, Tensor<T>);

    fn name(&self) -> &'static str {
        "mse"
    }

    /// `L = (1/N) sum_i (p_i - t_i)^2`, a rank-0 tensor; NaN for `N = 0`.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let [p, t] = x else {
            return Err(Error::InvalidArgument {
                op: "mse",
                msg: format!("expects 2 inputs, got {}", x.len()),
            });
        };
        if p.shape() != t.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse",
                lhs: p.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
        let loss = mse_kernel(p, t)?;
        Ok((loss, ((*p).clone(), (*t).clone())))
    }

    /// With the scalar `g = dL_total/dL`: `dp_i = (2g/N)(p_i - t_i)`,
    /// `dt_i = -dp_i`.
    fn backward(
        &self,
        (p, t): &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        check_scalar("mse", g)?;
        let grad = |sign: T::Acc| mse_grad_kernel(g, p, t, sign);
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        let dp = need(0).then(|| grad(T::Acc::one())).transpose()?;
        let dt = need(1).then(|| grad(-T::Acc::one())).transpose()?;
        Ok(vec![dp, dt])
    }
}

/// Mean squared error `mean((pred - target)^2)` as a rank-0 tensor.
/// Gradients flow to both arguments (a `constant` target takes none).
///
/// Errors: `ShapeMismatch` unless the shapes are equal (no broadcasting).
pub fn mse<T: Element>(pred: &Var<T>, target: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Mse, &[pred, target])
}

struct CrossEntropy {
    targets: Vec<usize>,
}

/// Per row of the logits the max `m` and `ln s`, `s = sum_j exp(x_j - m)`
/// (2 numbers per row), held on the logits' device: only the kernels read
/// them.
enum CeStats<A> {
    Cpu(cpu::RowStats<A>),
    /// On the logits' GPU, so backward reads them without a copy.
    #[cfg(feature = "cuda")]
    Cuda(cuda::RowStats<A>),
}

impl<A> CeStats<A> {
    /// Numbers held (both statistics).
    fn len(&self) -> usize {
        match self {
            CeStats::Cpu(s) => s.max.len() + s.log_sum.len(),
            #[cfg(feature = "cuda")]
            CeStats::Cuda(s) => 2 * s.n,
        }
    }

    /// The device holding them.
    #[cfg(feature = "cuda")]
    fn device(&self) -> crate::Device {
        match self {
            CeStats::Cpu(_) => crate::Device::Cpu,
            CeStats::Cuda(s) => crate::Device::Cuda(s.gpu.ordinal),
        }
    }
}

/// The error for operands found on different devices.
#[cfg(feature = "cuda")]
fn mixed(op: &'static str, lhs: crate::Device, rhs: crate::Device) -> Error {
    Error::DeviceMismatch {
        op,
        lhs: lhs.to_string(),
        rhs: rhs.to_string(),
    }
}

/// The mean cross-entropy of `[n, c]` logits `x` against `targets` (checked
/// by the caller) as a rank-0 tensor, and the per-row statistics backward
/// reuses: the device-level forward kernel.
fn cross_entropy_kernel<T: Element>(
    x: &Tensor<T>,
    c: usize,
    targets: &[usize],
) -> Result<(Tensor<T>, CeStats<T::Acc>)> {
    match x.storage() {
        Storage::Cpu(xs) => {
            let (loss, stats) = cpu::cross_entropy(xs, x.shape(), c, targets)?;
            Ok((Tensor::scalar(loss), CeStats::Cpu(stats)))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => {
            let (loss, stats) = cuda::cross_entropy(xs, c, targets)?;
            Ok((loss, CeStats::Cuda(stats)))
        }
    }
}

/// `(g/n) (softmax(x_r)_j - [j = t_r])` from the saved statistics, for the
/// scalar gradient `g`: the device-level backward kernel.
fn cross_entropy_grad_kernel<T: Element>(
    g: &Tensor<T>,
    x: &Tensor<T>,
    c: usize,
    targets: &[usize],
    stats: &CeStats<T::Acc>,
) -> Result<Tensor<T>> {
    check_devices("cross_entropy", g, x)?;
    match (g.storage(), x.storage(), stats) {
        (Storage::Cpu(gs), Storage::Cpu(xs), CeStats::Cpu(st)) => Tensor::from_vec(
            x.shape().to_vec(),
            cpu::cross_entropy_grad(gs, xs, c, targets, st),
        ),
        #[cfg(feature = "cuda")]
        (Storage::Cuda(gs), Storage::Cuda(xs), CeStats::Cuda(st))
            if st.gpu.ordinal == xs.gpu.ordinal =>
        {
            cuda::cross_entropy_grad(gs, xs, x.shape(), c, targets, st)
        }
        // Unreachable after check_devices (the statistics come from these
        // logits); an error, never a panic.
        #[cfg(feature = "cuda")]
        _ if g.device() != x.device() => Err(mixed("cross_entropy", g.device(), x.device())),
        #[cfg(feature = "cuda")]
        _ => Err(mixed("cross_entropy", x.device(), stats.device())),
    }
}

/// What cross-entropy's backward needs: the logits (an input), and the
/// per-row statistics of the forward.
struct CeState<T: Element> {
    logits: Tensor<T>,
    stats: CeStats<T::Acc>,
    targets: Vec<usize>,
}

impl<T: Element> Saved for CeState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        self.logits.visit(f);
        let acc = std::mem::size_of::<T::Acc>();
        f(SavedItem::Raw(self.stats.len() * acc));
        f(SavedItem::Raw(
            self.targets.len() * std::mem::size_of::<usize>(),
        ));
    }
}

impl<T: Element> Op<T> for CrossEntropy {
    type State = CeState<T>;

    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    /// Per row `r` with target `t`: `l_r = -log softmax(x_r)_t
    /// = (m_r - x_{r,t}) + ln s_r`, written so that large offsets cancel
    /// exactly in `m_r - x_{r,t}`; `L = (1/n) sum_r l_r` (NaN for `n = 0`).
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let [x] = x else {
            return Err(Error::InvalidArgument {
                op: "cross_entropy",
                msg: format!("expects 1 input, got {}", x.len()),
            });
        };
        let (_, c) = check_ce(x.shape(), &self.targets)?;
        let (loss, stats) = cross_entropy_kernel(x, c, &self.targets)?;
        let state = CeState {
            logits: (*x).clone(),
            stats,
            targets: self.targets.clone(),
        };
        Ok((loss, state))
    }

    /// With the scalar `g`: `dx_{r,j} = (g/n) (softmax(x_r)_j - [j = t_r])`,
    /// where `softmax(x_r)_j = exp((x_{r,j} - m_r) - ln s_r)`.
    fn backward(
        &self,
        st: &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        if !needs.first().copied().unwrap_or(false) {
            return Ok(vec![None]);
        }
        let (_, c) = check_ce(st.logits.shape(), &st.targets)?;
        check_scalar("cross_entropy", g)?;
        let dx = cross_entropy_grad_kernel(g, &st.logits, c, &st.targets, &st.stats)?;
        Ok(vec![Some(dx)])
    }
}

fn bad_target(shape: &[usize], row: usize, t: usize) -> Error {
    Error::InvalidArgument {
        op: "cross_entropy",
        msg: format!(
            "target {t} at row {row} is not a class index for logits of shape {shape:?} \
             (need < {})",
            shape.get(1).copied().unwrap_or(0)
        ),
    }
}

/// `(n, c)` of valid `[n, c]` logits with one in-range target per row.
fn check_ce(shape: &[usize], targets: &[usize]) -> Result<(usize, usize)> {
    let &[n, c] = shape else {
        return Err(Error::InvalidArgument {
            op: "cross_entropy",
            msg: format!("logits must have shape [n, c], got {shape:?}"),
        });
    };
    if targets.len() != n {
        return Err(Error::InvalidArgument {
            op: "cross_entropy",
            msg: format!(
                "{} targets for logits of shape {shape:?} (need one per row, {n})",
                targets.len()
            ),
        });
    }
    if let Some((r, &t)) = targets.iter().enumerate().find(|(_, &t)| t >= c) {
        return Err(bad_target(shape, r, t));
    }
    Ok((n, c))
}

/// Mean softmax cross-entropy of `logits` `[n, c]` against integer class
/// `targets` (one per row, each `< c`), as a rank-0 tensor:
/// `mean_r (logsumexp(x_r) - x_{r, targets[r]})`, computed max-subtracted.
///
/// Errors (checked before any work): `InvalidArgument` naming the shape and
/// the offending value if `logits` is not 2-D, if `targets.len() != n`, or
/// if a target is `>= c`.
pub fn cross_entropy<T: Element>(logits: &Var<T>, targets: &[usize]) -> Result<Var<T>> {
    check_ce(logits.shape(), targets)?;
    Tape::apply(
        CrossEntropy {
            targets: targets.to_vec(),
        },
        &[logits],
    )
}
