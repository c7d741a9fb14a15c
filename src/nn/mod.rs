//! Layers, initialisation and optimizers on top of [`crate::ops`].
//!
//! # The design: modules own tensors, a tape borrows them per step
//!
//! Two traits. [`Parameters`] is what has parameters: a module ([`Linear`],
//! [`LayerNorm`], [`RmsNorm`], [`Mlp`], [`Gpt`]) owns them as plain
//! [`Tensor`]s, lists and names them, binds them to a tape, moves them
//! between devices, and [`save`] / [`load`] them. [`Module`] is what maps
//! a [`Var`] to a [`Var`] with them. A [`Gpt`] has parameters but takes
//! token ids, so it is not a `Module`. One training step is:
//!
//! 1. `let p = model.bind(&tape);` records every parameter on the tape as a
//!    leaf [`Var`] (cheap: tensors share storage) and returns them as a
//!    [`Bound`] list, in the module's fixed parameter order;
//! 2. `let y = model.forward(&p, &x)?;` runs the forward pass with those
//!    Vars, recording ops on the same tape;
//! 3. `let grads = loss.backward()?;` as for any Var;
//! 4. `opt.step_clipped(&mut model, &p, &grads, 1.0)?;` reads `grads.wrt(..)`
//!    for each bound Var, clips their global norm to 1.0 (as PyTorch's
//!    `clip_grad_norm_`) and replaces the module's tensors with the updated
//!    values; [`Optimizer::step`] is the same without the clip.
//!
//! This is the PyTorch loop (`forward`, `backward`, `step`) with the
//! parameter-to-Var link made explicit instead of hidden in the parameter
//! object, as in candle (`Var`s that are re-read each step). A new tape per
//! step keeps the graph from growing; gradients never accumulate across
//! steps, so there is no `zero_grad`. For evaluation, [`Module::predict`]
//! runs the forward pass on a [`Tape::no_grad`] tape, PyTorch's `no_grad`:
//! values only, nothing saved for a backward pass.
//!
//! ```
//! use fusegrad::nn::{AdamW, LayerNorm, Linear, Module, Optimizer, Parameters};
//! use fusegrad::{ops, rng::Rng, Tape, Tensor};
//!
//! # fn main() -> fusegrad::Result<()> {
//! let mut rng = Rng::new(7);
//! let mut model = (Linear::<f32>::new(3, 4, &mut rng)?, LayerNorm::new(4)?);
//! let mut opt = AdamW::with_lr(1e-2)?;
//! let x = Tensor::from_vec(vec![2, 3], vec![0.5, -1.0, 2.0, 1.5, 0.0, -0.5])?;
//! let target = Tensor::from_vec(vec![2, 4], vec![1.0, -1.0, 0.5, 0.0, 0.0, 0.5, -1.0, 1.0])?;
//! for _ in 0..3 {
//!     let tape = Tape::new();
//!     let p = model.bind(&tape);
//!     let y = model.forward(&p, &tape.constant(x.clone()))?;
//!     let loss = ops::mse(&y, &tape.constant(target.clone()))?;
//!     let grads = loss.backward()?;
//!     let norm = opt.step_clipped(&mut model, &p, &grads, 1.0)?;
//!     assert!(norm.is_finite());
//! }
//! let y = model.predict(&x)?; // no tape kept, nothing saved
//! assert_eq!(y.shape(), &[2, 4]);
//! # Ok(())
//! # }
//! ```
//!
//! Modules compose: a tuple of modules (2 to 6) is a module that runs them
//! in order, e.g. `(Linear, LayerNorm, Activation::Gelu, Linear)`, and
//! [`Mlp`] stacks `Linear -> norm -> activation` blocks.
//! A module implements [`Module::forward_params`], taking its parameters
//! from a [`ParamCursor`] in the same order as [`Parameters::params`]; a
//! [`Bound`] of the wrong length or with a wrongly shaped entry is an error,
//! never a panic.
//!
//! Layout: [`Linear`] stores its weight as `[in, out]` so that the forward
//! pass is `x @ W + b` without a transpose (PyTorch stores `[out, in]`).

mod checkpoint;
pub(crate) mod clip;
mod init;
mod linear;
mod mlp;
mod observe;
mod optim;
#[cfg(feature = "cuda")]
pub(crate) use optim::KERNELS;
mod norm;
pub(crate) mod schedule;
mod transformer;
mod weights;

pub use checkpoint::{load_checkpoint, Checkpoints, TrainState};
pub use clip::clip_grad_norm;
pub use init::Init;
pub use linear::Linear;
pub use mlp::{Activation, Mlp, MlpConfig, Norm};
pub use norm::{LayerNorm, NormImpl, RmsNorm};
pub use observe::{EvalPoint, Observer, Silent, Step};
pub use optim::{Adam, AdamConfig, AdamW, Optimizer, OptimizerState, Sgd, SgdConfig};
pub use schedule::WarmupCosine;
pub use transformer::{Embedding, Gpt, GptConfig, MultiHeadAttention, TransformerBlock};
pub use weights::{load, save};

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tape::{Gradients, Tape, Var};
use crate::tensor::Tensor;

/// What has parameters: a layer, a network, a tuple of them. The list,
/// the names, binding to a tape, moving between devices; [`save`], [`load`]
/// and the optimizers take any `Parameters`.
pub trait Parameters<T: Element> {
    /// The parameters, in a fixed order (the order of [`Parameters::bind`]).
    fn params(&self) -> Vec<&Tensor<T>>;

    /// The parameters, mutably, in the same order as [`Parameters::params`].
    fn params_mut(&mut self) -> Vec<&mut Tensor<T>>;

    /// Records every parameter on `tape` as a Var that takes a gradient.
    fn bind(&self, tape: &Tape<T>) -> Bound<T> {
        let vars: Vec<Var<T>> = self
            .params()
            .into_iter()
            .map(|t| tape.var(t.clone()))
            .collect();
        // Names for a shadow's report (see `crate::shadow`).
        if tape.is_watched() {
            for (v, n) in vars.iter().zip(self.param_names()) {
                tape.name_var(v, &n.name);
            }
        }
        Bound { vars }
    }

    /// Records every parameter on `tape` as a constant (no gradient): for
    /// evaluation, or to freeze a module inside a larger graph.
    fn bind_frozen(&self, tape: &Tape<T>) -> Bound<T> {
        Bound {
            vars: self
                .params()
                .into_iter()
                .map(|t| tape.constant(t.clone()))
                .collect(),
        }
    }

    /// The parameters' names, in [`Parameters::params`] order,
    /// PyTorch-style (`blocks.0.ln1.weight`), as [`save`] and [`load`] write
    /// and read them. Numbered (`0`, `1`, ...) unless the module names them.
    fn param_names(&self) -> Vec<ParamName> {
        (0..self.params().len())
            .map(|i| ParamName::new(i.to_string()))
            .collect()
    }

    /// Moves every parameter to `device`. All are copied before any is
    /// replaced, so on an error (`CudaUnavailable`, out of memory) the
    /// module is unchanged. Build the optimizer after moving (its state
    /// lives beside the parameters).
    fn to_device(&mut self, device: crate::Device) -> Result<()> {
        let moved = self
            .params()
            .iter()
            .map(|t| t.to_device(device))
            .collect::<Result<Vec<_>>>()?;
        for (p, m) in self.params_mut().into_iter().zip(moved) {
            *p = m;
        }
        Ok(())
    }

    /// Total number of scalar parameters.
    fn num_params(&self) -> usize {
        self.params().iter().map(|t| t.numel()).sum()
    }
}

/// What maps a [`Var`] to a [`Var`] with its parameters: a layer, or a
/// stack of them. (A [`Gpt`] takes token ids instead, so it has
/// [`Parameters`] and its own `forward_ids` and `loss`.)
pub trait Module<T: Element>: Parameters<T> {
    /// The forward pass, taking this module's parameters from `p` in
    /// [`Parameters::params`] order. Implement this; call
    /// [`Module::forward`].
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>>;

    /// The forward pass with parameters from `bound` (made by
    /// [`Parameters::bind`] on the tape `x` lives on). Errors if `bound`
    /// does not hold exactly this module's parameters (count and shapes).
    fn forward(&self, bound: &Bound<T>, x: &Var<T>) -> Result<Var<T>> {
        let mut cursor = ParamCursor {
            vars: &bound.vars,
            next: 0,
        };
        let y = self.forward_params(&mut cursor, x)?;
        cursor.finish()?;
        Ok(y)
    }

    /// Inference: the forward pass on a [`Tape::no_grad`] tape, so nothing
    /// is saved for a backward pass.
    fn predict(&self, x: &Tensor<T>) -> Result<Tensor<T>> {
        let tape = Tape::no_grad();
        let p = self.bind(&tape);
        Ok(self.forward(&p, &tape.var(x.clone()))?.value().clone())
    }
}

/// A parameter's name in a weights file, and whether the file holds it
/// transposed (PyTorch keeps a `Linear` weight as `[out, in]`; fusegrad as
/// `[in, out]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamName {
    /// Dotted name, e.g. `blocks.0.fc1.weight`.
    pub name: String,
    /// Stored with its two dims swapped.
    pub transposed: bool,
}

impl ParamName {
    /// A name stored as the tensor is.
    pub fn new(name: impl Into<String>) -> Self {
        ParamName {
            name: name.into(),
            transposed: false,
        }
    }

    /// A 2-D parameter stored with its dims swapped.
    pub fn transposed(name: impl Into<String>) -> Self {
        ParamName {
            name: name.into(),
            transposed: true,
        }
    }
}

/// `names` with `prefix.` in front of each.
pub(crate) fn prefixed(
    prefix: &str,
    names: Vec<ParamName>,
) -> impl Iterator<Item = ParamName> + '_ {
    names.into_iter().map(move |n| ParamName {
        name: format!("{prefix}.{}", n.name),
        transposed: n.transposed,
    })
}

/// A module's parameters recorded on a tape, in [`Parameters::params`] order.
#[derive(Clone, Debug)]
pub struct Bound<T: Element> {
    vars: Vec<Var<T>>,
}

impl<T: Element> Bound<T> {
    /// A parameter list from Vars made elsewhere (e.g. by
    /// [`crate::gradcheck::check`]), in the module's parameter order.
    pub fn from_vars(vars: Vec<Var<T>>) -> Self {
        Bound { vars }
    }

    /// The bound Vars, in parameter order.
    pub fn vars(&self) -> &[Var<T>] {
        &self.vars
    }

    /// Number of bound parameters.
    pub fn len(&self) -> usize {
        self.vars.len()
    }

    /// True when the module has no parameters.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The gradient of each bound parameter, in parameter order (zeros for a
    /// parameter the loss does not depend on). Errors for frozen parameters
    /// or gradients of another tape.
    pub fn grads(&self, grads: &Gradients<T>) -> Result<Vec<Tensor<T>>> {
        self.vars.iter().map(|v| grads.wrt(v)).collect()
    }
}

/// Hands a module its bound parameters one at a time, checking shapes.
pub struct ParamCursor<'a, T: Element> {
    vars: &'a [Var<T>],
    next: usize,
}

impl<'a, T: Element> ParamCursor<'a, T> {
    /// The next bound parameter, without taking it.
    pub(crate) fn peek(&self) -> Option<&'a Var<T>> {
        self.vars.get(self.next)
    }

    /// The next bound parameter, which must have `shape`; `op` names the
    /// layer in errors.
    pub fn take(&mut self, op: &'static str, shape: &[usize]) -> Result<&'a Var<T>> {
        let v = self
            .vars
            .get(self.next)
            .ok_or_else(|| Error::InvalidArgument {
                op,
                msg: format!(
                    "bound parameter list has {} entries, the module needs more",
                    self.vars.len()
                ),
            })?;
        if v.shape() != shape {
            return Err(Error::ShapeMismatch {
                op,
                lhs: v.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        self.next += 1;
        Ok(v)
    }

    /// Errors if parameters are left over.
    fn finish(&self) -> Result<()> {
        if self.next == self.vars.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                op: "Module::forward",
                msg: format!(
                    "bound parameter list has {} entries, the module used {}",
                    self.vars.len(),
                    self.next
                ),
            })
        }
    }
}

/// A tuple of modules runs them in order; its parameters are the first
/// module's, then the second's, and so on (tuples of 2 to 6).
macro_rules! tuple_module {
    ($($m:ident $i:tt),+) => {
        impl<T: Element, $($m: Parameters<T>),+> Parameters<T> for ($($m,)+) {
            fn params(&self) -> Vec<&Tensor<T>> {
                let mut p = Vec::new();
                $(p.extend(self.$i.params());)+
                p
            }
            fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
                let mut p = Vec::new();
                $(p.extend(self.$i.params_mut());)+
                p
            }
            fn param_names(&self) -> Vec<ParamName> {
                let mut n = Vec::new();
                $(n.extend(prefixed(stringify!($i), self.$i.param_names()));)+
                n
            }
        }

        impl<T: Element, $($m: Module<T>),+> Module<T> for ($($m,)+) {
            fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
                let h = x.clone();
                $(let h = self.$i.forward_params(p, &h)?;)+
                Ok(h)
            }
        }
    };
}

tuple_module!(A 0, B 1);
tuple_module!(A 0, B 1, C 2);
tuple_module!(A 0, B 1, C 2, D 3);
tuple_module!(A 0, B 1, C 2, D 3, E 4);
tuple_module!(A 0, B 1, C 2, D 3, E 4, F 5);

/// Checks that `x`'s last dim is `d`; `op` names the layer.
fn check_last_dim(op: &'static str, x: &[usize], d: usize) -> Result<()> {
    match x.last() {
        Some(&last) if last == d => Ok(()),
        _ => Err(Error::ShapeMismatch {
            op,
            lhs: x.to_vec(),
            rhs: vec![d],
        }),
    }
}
