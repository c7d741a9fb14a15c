//! Optimizers: SGD (with optional momentum) and Adam (bias-corrected).
//! Both replace a module's tensors with updated ones and keep their state
//! (momentum, moments) as tensors of the accumulation type on the
//! parameter's device. Each step is one fused kernel per parameter: the
//! update [`Rule`] says what it computes per element, and [`apply`] picks
//! the device's loops (`cpu.rs`).

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod state;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;
pub use state::OptimizerState;

use super::{clip_grad_norm, Bound, Parameters};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tape::Gradients;
use crate::tensor::{Storage, Tensor};

/// Something that turns gradients into parameter updates.
pub trait Optimizer<T: Element> {
    /// Updates `params[i]` with `grads[i]`. Everything is checked before
    /// anything changes: `InvalidArgument` if the counts differ or the
    /// optimizer's state was built for other parameters, `ShapeMismatch` if a
    /// gradient's shape is not its parameter's.
    fn update(&mut self, params: &mut [&mut Tensor<T>], grads: &[Tensor<T>]) -> Result<()>;

    /// Forgets the state (momentum, moments, step count).
    fn reset(&mut self);

    /// The state a checkpoint saves, as PyTorch's `state_dict()`. The
    /// default is an error: an optimizer says how if it can be resumed.
    fn state_dict(&self) -> Result<OptimizerState<T>> {
        Err(Error::InvalidArgument {
            op: "Optimizer::state_dict",
            msg: "this optimizer does not export its state".into(),
        })
    }

    /// Puts back a state from [`Optimizer::state_dict`]. Errors, changing
    /// nothing, for another kind of optimizer or other hyper-parameters
    /// (all but `lr`, which is restored).
    fn load_state_dict(&mut self, state: OptimizerState<T>) -> Result<()> {
        let _ = state;
        Err(Error::InvalidArgument {
            op: "Optimizer::load_state_dict",
            msg: "this optimizer does not import a state".into(),
        })
    }

    /// One step for `model`, whose parameters were bound as `bound` on the
    /// tape that `grads` came from.
    fn step(
        &mut self,
        model: &mut dyn Parameters<T>,
        bound: &Bound<T>,
        grads: &Gradients<T>,
    ) -> Result<()> {
        let g = bound.grads(grads)?;
        self.update(&mut model.params_mut(), &g)
    }

    /// [`Optimizer::step`] after scaling the gradients so that their
    /// global L2 norm is at most `max_norm` ([`clip_grad_norm`]). Returns
    /// the norm before clipping. A NaN or infinite norm skips the update
    /// and leaves `model` as it was (the caller sees the norm and can stop).
    fn step_clipped(
        &mut self,
        model: &mut dyn Parameters<T>,
        bound: &Bound<T>,
        grads: &Gradients<T>,
        max_norm: f64,
    ) -> Result<f64> {
        let g = bound.grads(grads)?;
        self.update_clipped(&mut model.params_mut(), g, max_norm)
    }

    /// [`Optimizer::update`] after clipping `grads` to the global norm
    /// `max_norm`, as [`Optimizer::step_clipped`] does: for a loop that
    /// drops the tape's gradients before updating, to keep its peak low.
    fn update_clipped(
        &mut self,
        params: &mut [&mut Tensor<T>],
        mut grads: Vec<Tensor<T>>,
        max_norm: f64,
    ) -> Result<f64> {
        let norm = clip_grad_norm(&mut grads, max_norm)?;
        if norm.is_finite() {
            self.update(params, &grads)?;
        }
        Ok(norm)
    }
}

/// Checks counts, shapes, devices and state sizes before any update.
fn check<T: Element>(
    op: &'static str,
    params: &[&mut Tensor<T>],
    grads: &[Tensor<T>],
    state: &[Vec<Tensor<T::Acc>>],
) -> Result<()> {
    if params.len() != grads.len() {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("{} parameters but {} gradients", params.len(), grads.len()),
        });
    }
    for (p, g) in params.iter().zip(grads) {
        if p.shape() != g.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: p.shape().to_vec(),
                rhs: g.shape().to_vec(),
            });
        }
        if p.device() != g.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: p.device().to_string(),
                rhs: g.device().to_string(),
            });
        }
    }
    let fits = |s: &Vec<Tensor<T::Acc>>, p: &&mut Tensor<T>| {
        s.iter()
            .all(|t| t.numel() == p.numel() && t.device() == p.device())
    };
    if !state.is_empty()
        && (state.len() != params.len() || state.iter().zip(params).any(|(s, p)| !fits(s, p)))
    {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "state was built for {} parameters of other sizes or devices; call reset() to reuse the optimizer",
                state.len()
            ),
        });
    }
    Ok(())
}

/// What one optimizer step computes per parameter element, in the
/// accumulation type (`w` the parameter, `g` its gradient; the
/// hyper-parameters as f64, rounded once to the accumulation type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rule {
    /// `w - lr (g + wd w)`.
    Sgd { lr: f64, wd: f64 },
    /// `g' = g + wd w`; `v = mu v + g'` (`v = g'` with no state yet);
    /// `w - lr v`. State: `[v]`.
    Momentum { lr: f64, mu: f64, wd: f64 },
    /// `g' = g + wd w`; `m = b1 m + (1 - b1) g'`; `v = b2 v + (1 - b2) g'^2`
    /// (state read as 0 when there is none yet);
    /// `w - lr (m / c1) / (sqrt(v / c2) + eps)`. State: `[m, v]`.
    /// `decoupled` (AdamW): `g' = g` and `w` is first scaled by
    /// `1 - lr wd`.
    Adam {
        decoupled: bool,
        lr: f64,
        b1: f64,
        b2: f64,
        c1: f64,
        c2: f64,
        eps: f64,
        wd: f64,
    },
}

impl Rule {
    /// How many state tensors the rule keeps per parameter.
    fn states(self) -> usize {
        match self {
            Rule::Sgd { .. } => 0,
            Rule::Momentum { .. } => 1,
            Rule::Adam { .. } => 2,
        }
    }
}

/// `rule` applied to `*p` with gradient `g` and state `state` (empty on the
/// first step; replaced by the new state): the device-level update kernel.
/// `*p` is replaced only when the update succeeded.
pub(crate) fn apply<T: Element>(
    rule: Rule,
    p: &mut Tensor<T>,
    g: &Tensor<T>,
    state: &mut Vec<Tensor<T::Acc>>,
) -> Result<()> {
    let shape = p.shape().to_vec();
    crate::ops::elementwise::check_devices("optimizer step", p, g)?;
    let (np, ns) = match (p.storage(), g.storage()) {
        (Storage::Cpu(ps), Storage::Cpu(gs)) => {
            let mut prev: Vec<&[T::Acc]> = Vec::with_capacity(state.len());
            for s in state.iter() {
                prev.push(s.as_slice()?);
            }
            let (np, ns) = cpu::update(rule, ps, gs, &prev);
            let ns = ns
                .into_iter()
                .map(|b| Tensor::from_buffer(&shape, b))
                .collect::<Result<Vec<_>>>()?;
            (Tensor::from_buffer(&shape, np)?, ns)
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(ps), Storage::Cuda(gs)) => cuda::update(rule, ps, gs, &shape, state)?,
        #[cfg(feature = "cuda")]
        _ => {
            return Err(Error::DeviceMismatch {
                op: "optimizer step",
                lhs: p.device().to_string(),
                rhs: g.device().to_string(),
            })
        }
    };
    *p = np;
    *state = ns;
    Ok(())
}

fn check_hyper(op: &'static str, name: &str, v: f64, lo: f64, hi_open: Option<f64>) -> Result<()> {
    let ok = v.is_finite() && v >= lo && hi_open.is_none_or(|h| v < h);
    if ok {
        Ok(())
    } else {
        let range = match hi_open {
            Some(h) => format!("[{lo}, {h})"),
            None => format!(">= {lo}"),
        };
        Err(Error::InvalidArgument {
            op,
            msg: format!("{name} must be finite and {range}, got {v}"),
        })
    }
}

/// SGD settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 = plain SGD).
    pub momentum: f64,
    /// L2 penalty added to the gradient: `g + weight_decay * p`.
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    /// `lr = 0.01`, no momentum, no weight decay.
    fn default() -> Self {
        SgdConfig {
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
        }
    }
}

/// Stochastic gradient descent, as PyTorch's `SGD` without dampening:
///
/// `g' = g + wd p`; with momentum `mu > 0`, `v = mu v + g'` (`v = g'` on
/// the first step) and `g' = v`; then `p = p - lr g'`.
#[derive(Debug, Clone)]
pub struct Sgd<T: Element> {
    config: SgdConfig,
    velocity: Vec<Vec<Tensor<T::Acc>>>,
}

impl<T: Element> Sgd<T> {
    /// An optimizer with `config`. Errors (`InvalidArgument`) unless `lr`,
    /// `momentum` and `weight_decay` are finite and `>= 0`.
    pub fn new(config: SgdConfig) -> Result<Self> {
        let op = "Sgd";
        check_hyper(op, "lr", config.lr, 0.0, None)?;
        check_hyper(op, "momentum", config.momentum, 0.0, None)?;
        check_hyper(op, "weight_decay", config.weight_decay, 0.0, None)?;
        Ok(Sgd {
            config,
            velocity: Vec::new(),
        })
    }

    /// Plain SGD with learning rate `lr`.
    pub fn with_lr(lr: f64) -> Result<Self> {
        Self::new(SgdConfig {
            lr,
            ..SgdConfig::default()
        })
    }

    /// The settings.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// Changes the learning rate (for schedules). Errors like [`Sgd::new`].
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_hyper("Sgd", "lr", lr, 0.0, None)?;
        self.config.lr = lr;
        Ok(())
    }
}

impl<T: Element> Optimizer<T> for Sgd<T> {
    fn update(&mut self, params: &mut [&mut Tensor<T>], grads: &[Tensor<T>]) -> Result<()> {
        check("Sgd::step", params, grads, &self.velocity)?;
        let c = &self.config;
        let rule = if c.momentum > 0.0 {
            Rule::Momentum {
                lr: c.lr,
                mu: c.momentum,
                wd: c.weight_decay,
            }
        } else {
            Rule::Sgd {
                lr: c.lr,
                wd: c.weight_decay,
            }
        };
        if self.velocity.is_empty() && rule.states() > 0 {
            self.velocity = vec![Vec::new(); params.len()];
        }
        for (k, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let mut none = Vec::new();
            let state = self.velocity.get_mut(k).unwrap_or(&mut none);
            apply(rule, p, g, state)?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.velocity.clear();
    }

    fn state_dict(&self) -> Result<OptimizerState<T>> {
        Ok(self.export())
    }

    fn load_state_dict(&mut self, state: OptimizerState<T>) -> Result<()> {
        self.import(state)
    }
}

/// Adam settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to `sqrt(v_hat)` in the denominator.
    pub eps: f64,
    /// L2 penalty added to the gradient (as PyTorch's `Adam`, not `AdamW`).
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    /// `lr = 1e-3`, betas `(0.9, 0.999)`, `eps = 1e-8`, no weight decay.
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Adam with bias correction, as PyTorch's `Adam`. At step `t` (from 1):
///
/// `g' = g + wd p`, `m = b1 m + (1 - b1) g'`, `v = b2 v + (1 - b2) g'^2`,
/// `p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`.
#[derive(Debug, Clone)]
pub struct Adam<T: Element> {
    config: AdamConfig,
    /// AdamW's decay: applied to the weights, not added to the gradient.
    decoupled: bool,
    t: u64,
    /// Per parameter, `[m, v]` (empty before the first step).
    moments: Vec<Vec<Tensor<T::Acc>>>,
}

impl<T: Element> Adam<T> {
    /// An optimizer with `config`. Errors (`InvalidArgument`) unless `lr`
    /// and `weight_decay` are finite and `>= 0`, the betas are in `[0, 1)`,
    /// and `eps` is finite and `> 0`.
    pub fn new(config: AdamConfig) -> Result<Self> {
        let op = "Adam";
        check_hyper(op, "lr", config.lr, 0.0, None)?;
        check_hyper(op, "beta1", config.beta1, 0.0, Some(1.0))?;
        check_hyper(op, "beta2", config.beta2, 0.0, Some(1.0))?;
        check_hyper(op, "weight_decay", config.weight_decay, 0.0, None)?;
        check_hyper(op, "eps", config.eps, 0.0, None)?;
        if config.eps <= 0.0 {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("eps must be > 0, got {}", config.eps),
            });
        }
        Ok(Adam {
            config,
            decoupled: false,
            t: 0,
            moments: Vec::new(),
        })
    }

    /// Adam with default betas and eps and learning rate `lr`.
    pub fn with_lr(lr: f64) -> Result<Self> {
        Self::new(AdamConfig {
            lr,
            ..AdamConfig::default()
        })
    }

    /// The settings.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// Steps taken since creation or [`Optimizer::reset`].
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// Changes the learning rate (for schedules). Errors like [`Adam::new`].
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_hyper("Adam", "lr", lr, 0.0, None)?;
        self.config.lr = lr;
        Ok(())
    }
}

impl<T: Element> Optimizer<T> for Adam<T> {
    fn update(&mut self, params: &mut [&mut Tensor<T>], grads: &[Tensor<T>]) -> Result<()> {
        let op = if self.decoupled {
            "AdamW::step"
        } else {
            "Adam::step"
        };
        check(op, params, grads, &self.moments)?;
        if self.moments.is_empty() {
            self.moments = vec![Vec::new(); params.len()];
        }
        self.t += 1;
        let c = &self.config;
        let t = i32::try_from(self.t).unwrap_or(i32::MAX);
        let rule = Rule::Adam {
            decoupled: self.decoupled,
            lr: c.lr,
            b1: c.beta1,
            b2: c.beta2,
            c1: 1.0 - c.beta1.powi(t),
            c2: 1.0 - c.beta2.powi(t),
            eps: c.eps,
            wd: c.weight_decay,
        };
        for ((p, g), state) in params.iter_mut().zip(grads).zip(self.moments.iter_mut()) {
            apply(rule, p, g, state)?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.t = 0;
        self.moments.clear();
    }

    fn state_dict(&self) -> Result<OptimizerState<T>> {
        Ok(self.export())
    }

    fn load_state_dict(&mut self, state: OptimizerState<T>) -> Result<()> {
        self.import(state)
    }
}

/// AdamW (Loshchilov and Hutter), as PyTorch's `AdamW`: Adam whose weight
/// decay is applied to the weights, not added to the gradient. At step `t`:
///
/// `p = p (1 - lr wd)`, then Adam's update with `g' = g`. The decay thus
/// does not pass through the moments, and a parameter with a large
/// gradient variance is decayed as much as any other.
#[derive(Debug, Clone)]
pub struct AdamW<T: Element>(Adam<T>);

impl<T: Element> AdamW<T> {
    /// An optimizer with `config`; errors as [`Adam::new`].
    pub fn new(config: AdamConfig) -> Result<Self> {
        let mut a = Adam::new(config)?;
        a.decoupled = true;
        Ok(AdamW(a))
    }

    /// PyTorch's defaults (betas `(0.9, 0.999)`, `eps = 1e-8`,
    /// `weight_decay = 0.01`) with learning rate `lr`.
    pub fn with_lr(lr: f64) -> Result<Self> {
        Self::new(AdamConfig {
            lr,
            weight_decay: 0.01,
            ..AdamConfig::default()
        })
    }

    /// The settings.
    pub fn config(&self) -> &AdamConfig {
        self.0.config()
    }

    /// Steps taken since creation or [`Optimizer::reset`].
    pub fn steps(&self) -> u64 {
        self.0.steps()
    }

    /// Changes the learning rate (for schedules). Errors like [`Adam::new`].
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.0.set_lr(lr)
    }
}

impl<T: Element> Optimizer<T> for AdamW<T> {
    fn update(&mut self, params: &mut [&mut Tensor<T>], grads: &[Tensor<T>]) -> Result<()> {
        self.0.update(params, grads)
    }

    fn reset(&mut self) {
        self.0.reset()
    }

    fn state_dict(&self) -> Result<OptimizerState<T>> {
        Ok(self.0.export())
    }

    fn load_state_dict(&mut self, state: OptimizerState<T>) -> Result<()> {
        self.0.import(state)
    }
}
