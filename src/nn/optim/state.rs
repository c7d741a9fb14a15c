//! An optimizer's state out and back in, as PyTorch's
//! `optimizer.state_dict()` / `load_state_dict()`: what a checkpoint
//! needs so that a resumed run takes the same steps.

use super::{Adam, Sgd};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// An optimizer's state: its kind, the step count, the hyper-parameters
/// and, per parameter, its named buffers in the accumulation type
/// (`exp_avg`, `exp_avg_sq` for Adam and AdamW; `momentum_buffer` for SGD
/// with momentum), PyTorch's names.
#[derive(Debug, Clone)]
pub struct OptimizerState<T: Element> {
    /// `"Adam"`, `"AdamW"` or `"SGD"`.
    pub kind: String,
    /// Steps taken (Adam's bias correction counts them).
    pub step: u64,
    /// Hyper-parameters by name (`lr`, `beta1`, `beta2`, `eps`,
    /// `weight_decay`, `momentum`).
    pub hyper: BTreeMap<String, f64>,
    /// Per parameter, in parameter order, its buffers by name; empty
    /// lists before the first step.
    pub buffers: Vec<Vec<(String, Tensor<T::Acc>)>>,
}

impl<T: Element> OptimizerState<T> {
    /// Errors unless `self` is a state of `kind` with the same
    /// hyper-parameters as `mine` (the learning rate may differ: a schedule
    /// moves it) and each parameter's buffers named `names`.
    fn check(&self, kind: &str, mine: &BTreeMap<String, f64>, names: &[&str]) -> Result<()> {
        let op = "Optimizer::load_state_dict";
        let bad = |msg: String| Err(Error::InvalidArgument { op, msg });
        if self.kind != kind {
            return bad(format!(
                "the state is {}'s, this optimizer is {kind}",
                self.kind
            ));
        }
        for (name, &v) in mine.iter().filter(|(n, _)| n.as_str() != "lr") {
            match self.hyper.get(name) {
                Some(&s) if s.to_bits() == v.to_bits() => {}
                Some(s) => return bad(format!("the state's {kind} has {name} {s}, this one {v}")),
                None => return bad(format!("the state's {kind} has no {name}")),
            }
        }
        for (i, b) in self.buffers.iter().enumerate() {
            let got: Vec<&str> = b.iter().map(|(n, _)| n.as_str()).collect();
            if !got.is_empty() && got != names {
                return bad(format!(
                    "parameter {i} has buffers {got:?}, {kind} keeps {names:?}"
                ));
            }
        }
        Ok(())
    }
}

/// The buffers of `state` (per parameter, in `names` order) as named pairs.
fn named<A: Element>(state: &[Vec<Tensor<A>>], names: &[&str]) -> Vec<Vec<(String, Tensor<A>)>> {
    state
        .iter()
        .map(|s| {
            names
                .iter()
                .map(|n| n.to_string())
                .zip(s.iter().cloned())
                .collect()
        })
        .collect()
}

/// `buffers` without their names; no parameters when none has a buffer.
fn unnamed<A: Element>(buffers: Vec<Vec<(String, Tensor<A>)>>) -> Vec<Vec<Tensor<A>>> {
    if buffers.iter().all(Vec::is_empty) {
        return Vec::new();
    }
    buffers
        .into_iter()
        .map(|b| b.into_iter().map(|(_, t)| t).collect())
        .collect()
}

const ADAM: [&str; 2] = ["exp_avg", "exp_avg_sq"];
const SGD: [&str; 1] = ["momentum_buffer"];

impl<T: Element> Adam<T> {
    fn hyper(&self) -> BTreeMap<String, f64> {
        let c = &self.config;
        [
            ("lr", c.lr),
            ("beta1", c.beta1),
            ("beta2", c.beta2),
            ("eps", c.eps),
            ("weight_decay", c.weight_decay),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect()
    }

    fn kind(&self) -> &'static str {
        if self.decoupled {
            "AdamW"
        } else {
            "Adam"
        }
    }

    /// The state: step count, hyper-parameters, `exp_avg` and `exp_avg_sq`
    /// per parameter.
    pub(super) fn export(&self) -> OptimizerState<T> {
        OptimizerState {
            kind: self.kind().into(),
            step: self.t,
            hyper: self.hyper(),
            buffers: named(&self.moments, &ADAM),
        }
    }

    /// Puts back a state from [`Adam::export`]. Errors, changing
    /// nothing, for another kind of optimizer or other hyper-parameters
    /// (all but `lr`, which is restored).
    pub(super) fn import(&mut self, state: OptimizerState<T>) -> Result<()> {
        state.check(self.kind(), &self.hyper(), &ADAM)?;
        if let Some(&lr) = state.hyper.get("lr") {
            self.set_lr(lr)?;
        }
        self.t = state.step;
        self.moments = unnamed(state.buffers);
        Ok(())
    }
}

impl<T: Element> Sgd<T> {
    fn hyper(&self) -> BTreeMap<String, f64> {
        let c = &self.config;
        [
            ("lr", c.lr),
            ("momentum", c.momentum),
            ("weight_decay", c.weight_decay),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect()
    }

    /// The state: hyper-parameters and, with momentum, `momentum_buffer`
    /// per parameter (SGD counts no steps).
    pub(super) fn export(&self) -> OptimizerState<T> {
        OptimizerState {
            kind: "SGD".into(),
            step: 0,
            hyper: self.hyper(),
            buffers: named(&self.velocity, &SGD),
        }
    }

    /// Puts back a state from [`Sgd::export`], as [`Adam::import`].
    pub(super) fn import(&mut self, state: OptimizerState<T>) -> Result<()> {
        state.check("SGD", &self.hyper(), &SGD)?;
        if let Some(&lr) = state.hyper.get("lr") {
            self.set_lr(lr)?;
        }
        self.velocity = unnamed(state.buffers);
        Ok(())
    }
}
