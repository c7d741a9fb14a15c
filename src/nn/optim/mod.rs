//! Optimizers: SGD (with optional momentum) and Adam (bias-corrected).
//! Both update a module's tensors in place of the old ones and keep their
//! state (momentum, moments) in the accumulation type.

use super::{Bound, Module};
use crate::dtype::{Accum, Element};
use crate::error::{Error, Result};
use crate::tape::Gradients;
use crate::tensor::Tensor;
use num_traits::Float;

/// Something that turns gradients into parameter updates.
pub trait Optimizer<T: Element> {
    /// Updates `params[i]` with `grads[i]`. Everything is checked before
    /// anything changes: `InvalidArgument` if the counts differ or the
    /// optimizer's state was built for other parameters, `ShapeMismatch` if a
    /// gradient's shape is not its parameter's.
    fn update(&mut self, params: &mut [&mut Tensor<T>], grads: &[Tensor<T>]) -> Result<()>;

    /// Forgets the state (momentum, moments, step count).
    fn reset(&mut self);

    /// One step for `model`, whose parameters were bound as `bound` on the
    /// tape that `grads` came from.
    fn step(
        &mut self,
        model: &mut dyn Module<T>,
        bound: &Bound<T>,
        grads: &Gradients<T>,
    ) -> Result<()> {
        let g = bound.grads(grads)?;
        self.update(&mut model.params_mut(), &g)
    }
}

/// Checks counts, shapes and state sizes before any update.
fn check<T: Element>(
    op: &'static str,
    params: &[&mut Tensor<T>],
    grads: &[Tensor<T>],
    state: &[Vec<T::Acc>],
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
        p.as_slice()?;
        g.as_slice()?;
    }
    if !state.is_empty()
        && (state.len() != params.len()
            || state.iter().zip(params).any(|(s, p)| s.len() != p.numel()))
    {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "state was built for {} parameters of other sizes; call reset() to reuse the optimizer",
                state.len()
            ),
        });
    }
    Ok(())
}

/// Replaces `*p` by `f` applied to each (index, value, gradient) element.
fn rewrite<T: Element>(
    p: &mut Tensor<T>,
    g: &Tensor<T>,
    mut f: impl FnMut(usize, T::Acc, T::Acc) -> T::Acc,
) -> Result<()> {
    let shape = p.shape().to_vec();
    // Host data only; checked before `p` is taken apart, so an error leaves
    // the parameter as it was.
    p.as_slice()?;
    let mut data = std::mem::replace(p, Tensor::scalar(T::zero())).into_vec()?;
    for (i, (w, &gi)) in data.iter_mut().zip(g.as_slice()?).enumerate() {
        *w = T::from_acc(f(i, w.to_acc(), gi.to_acc()));
    }
    *p = Tensor::from_vec(shape, data)?;
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
    velocity: Vec<Vec<T::Acc>>,
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
        let acc = <T::Acc as Accum>::of;
        let (lr, mu, wd) = (
            acc(self.config.lr),
            acc(self.config.momentum),
            acc(self.config.weight_decay),
        );
        let use_momentum = self.config.momentum > 0.0;
        let first = self.velocity.is_empty();
        if use_momentum && first {
            self.velocity = params.iter().map(|p| vec![acc(0.0); p.numel()]).collect();
        }
        for (k, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let vel = self.velocity.get_mut(k);
            match vel {
                Some(v) if use_momentum => rewrite(p, g, |i, w, gi| {
                    let gi = gi + wd * w;
                    v[i] = if first { gi } else { mu * v[i] + gi };
                    w - lr * v[i]
                })?,
                _ => rewrite(p, g, |_, w, gi| w - lr * (gi + wd * w))?,
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.velocity.clear();
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
    t: u64,
    m: Vec<Vec<T::Acc>>,
    v: Vec<Vec<T::Acc>>,
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
            t: 0,
            m: Vec::new(),
            v: Vec::new(),
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
        check("Adam::step", params, grads, &self.m)?;
        let acc = <T::Acc as Accum>::of;
        if self.m.is_empty() {
            self.m = params.iter().map(|p| vec![acc(0.0); p.numel()]).collect();
            self.v = self.m.clone();
        }
        self.t += 1;
        let c = &self.config;
        let t = i32::try_from(self.t).unwrap_or(i32::MAX);
        let (b1, b2) = (acc(c.beta1), acc(c.beta2));
        let (one_b1, one_b2) = (acc(1.0 - c.beta1), acc(1.0 - c.beta2));
        let c1 = acc(1.0 - c.beta1.powi(t));
        let c2 = acc(1.0 - c.beta2.powi(t));
        let (lr, eps, wd) = (acc(c.lr), acc(c.eps), acc(c.weight_decay));
        for ((p, g), (m, v)) in params
            .iter_mut()
            .zip(grads)
            .zip(self.m.iter_mut().zip(self.v.iter_mut()))
        {
            rewrite(p, g, |i, w, gi| {
                let gi = gi + wd * w;
                m[i] = b1 * m[i] + one_b1 * gi;
                v[i] = b2 * v[i] + one_b2 * gi * gi;
                w - lr * (m[i] / c1) / ((v[i] / c2).sqrt() + eps)
            })?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.t = 0;
        self.m.clear();
        self.v.clear();
    }
}
