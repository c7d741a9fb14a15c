//! `Mlp`: `Linear -> norm -> activation` blocks and a final `Linear`.

use super::{Init, LayerNorm, Linear, Module, NormImpl, ParamCursor, Parameters, RmsNorm};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops;
use crate::rng::Rng;
use crate::tape::Var;
use crate::tensor::Tensor;

/// A parameter-free elementwise activation; also a [`Module`], so it can sit
/// in a tuple of modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// `x`.
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// GELU, exact erf form ([`ops::gelu`], PyTorch's default).
    #[default]
    Gelu,
    /// GELU, tanh approximation ([`ops::gelu_tanh`]).
    GeluTanh,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
}

impl Activation {
    /// Applies the activation.
    pub fn apply<T: Element>(&self, x: &Var<T>) -> Result<Var<T>> {
        match self {
            Activation::Identity => Ok(x.clone()),
            Activation::Relu => ops::relu(x),
            Activation::Gelu => ops::gelu(x),
            Activation::GeluTanh => ops::gelu_tanh(x),
            Activation::Tanh => ops::tanh(x),
            Activation::Sigmoid => ops::sigmoid(x),
        }
    }
}

impl<T: Element> Parameters<T> for Activation {
    fn params(&self) -> Vec<&Tensor<T>> {
        Vec::new()
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        Vec::new()
    }
}

impl<T: Element> Module<T> for Activation {
    fn forward_params(&self, _: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        self.apply(x)
    }
}

/// The normalization inside each hidden block of an [`Mlp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Norm {
    /// No normalization.
    None,
    /// Affine [`LayerNorm`] (eps `1e-5`).
    #[default]
    LayerNorm,
    /// [`RmsNorm`] with gamma (eps `1e-6`).
    RmsNorm,
}

/// How to build an [`Mlp`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpConfig {
    /// Normalization after each hidden `Linear`.
    pub norm: Norm,
    /// Activation after each hidden normalization.
    pub activation: Activation,
    /// Weight init of every `Linear` (biases start at zero).
    pub weight_init: Init,
    /// Implementation of the normalization layers.
    pub norm_impl: NormImpl,
}

impl Default for MlpConfig {
    /// LayerNorm, GELU, Kaiming uniform (gain `sqrt(2)`), fused.
    fn default() -> Self {
        MlpConfig {
            norm: Norm::LayerNorm,
            activation: Activation::Gelu,
            weight_init: Init::kaiming_relu(),
            norm_impl: NormImpl::Fused,
        }
    }
}

#[derive(Debug, Clone)]
enum NormLayer<T: Element> {
    None,
    Layer(LayerNorm<T>),
    Rms(RmsNorm<T>),
}

#[derive(Debug, Clone)]
struct Block<T: Element> {
    linear: Linear<T>,
    norm: NormLayer<T>,
}

/// A multilayer perceptron: for sizes `[d0, d1, ..., dk]`, blocks
/// `Linear(d_i, d_{i+1}) -> norm -> activation` for every hidden size and a
/// final `Linear(d_{k-1}, d_k)` with no norm or activation (it outputs
/// logits or regression values).
///
/// Parameter order: block by block (`W`, `b`, then the norm's parameters),
/// then the head's `W`, `b`.
#[derive(Debug, Clone)]
pub struct Mlp<T: Element> {
    blocks: Vec<Block<T>>,
    head: Linear<T>,
    activation: Activation,
}

impl<T: Element> Mlp<T> {
    /// An MLP with layer sizes `sizes` (at least two, all `> 0`, else
    /// `InvalidArgument`).
    pub fn new(sizes: &[usize], config: &MlpConfig, rng: &mut Rng) -> Result<Self> {
        if sizes.contains(&0) {
            return Err(sizes_error(sizes));
        }
        let Some((&out, hidden)) = sizes.split_last() else {
            return Err(sizes_error(sizes));
        };
        let Some(&last_in) = hidden.last() else {
            return Err(sizes_error(sizes));
        };
        let linear = |i: usize, o: usize, rng: &mut Rng| {
            Linear::with_init(i, o, true, config.weight_init, Init::Zeros, rng)
        };
        let mut blocks = Vec::with_capacity(hidden.len().saturating_sub(1));
        for w in hidden.windows(2) {
            let (i, o) = (w[0], w[1]);
            let norm = match config.norm {
                Norm::None => NormLayer::None,
                Norm::LayerNorm => NormLayer::Layer(LayerNorm::new(o)?.with_impl(config.norm_impl)),
                Norm::RmsNorm => NormLayer::Rms(RmsNorm::new(o)?.with_impl(config.norm_impl)),
            };
            blocks.push(Block {
                linear: linear(i, o, rng)?,
                norm,
            });
        }
        let head = linear(last_in, out, rng)?;
        Ok(Mlp {
            blocks,
            head,
            activation: config.activation,
        })
    }

    /// Switches every normalization layer to `imp`.
    pub fn set_norm_impl(&mut self, imp: NormImpl) {
        for b in &mut self.blocks {
            match &mut b.norm {
                NormLayer::None => {}
                NormLayer::Layer(l) => l.set_impl(imp),
                NormLayer::Rms(l) => l.set_impl(imp),
            }
        }
    }

    /// The same network with every normalization layer running `imp`.
    pub fn with_norm_impl(mut self, imp: NormImpl) -> Self {
        self.set_norm_impl(imp);
        self
    }

    /// Number of hidden blocks.
    pub fn depth(&self) -> usize {
        self.blocks.len()
    }
}

fn sizes_error(sizes: &[usize]) -> Error {
    Error::InvalidArgument {
        op: "Mlp",
        msg: format!("need at least input and output sizes, all > 0, got {sizes:?}"),
    }
}

impl<T: Element> Parameters<T> for Mlp<T> {
    /// `blocks.{i}.linear.*`, `blocks.{i}.norm.*`, `head.*`.
    fn param_names(&self) -> Vec<super::ParamName> {
        use super::prefixed;
        let mut n = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            n.extend(prefixed(
                &format!("blocks.{i}.linear"),
                b.linear.param_names(),
            ));
            let norm = match &b.norm {
                NormLayer::None => Vec::new(),
                NormLayer::Layer(l) => l.param_names(),
                NormLayer::Rms(l) => l.param_names(),
            };
            n.extend(prefixed(&format!("blocks.{i}.norm"), norm));
        }
        n.extend(prefixed("head", self.head.param_names()));
        n
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        let mut p = Vec::new();
        for b in &self.blocks {
            p.extend(b.linear.params());
            match &b.norm {
                NormLayer::None => {}
                NormLayer::Layer(l) => p.extend(l.params()),
                NormLayer::Rms(l) => p.extend(l.params()),
            }
        }
        p.extend(self.head.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        let mut p = Vec::new();
        for b in &mut self.blocks {
            p.extend(b.linear.params_mut());
            match &mut b.norm {
                NormLayer::None => {}
                NormLayer::Layer(l) => p.extend(l.params_mut()),
                NormLayer::Rms(l) => p.extend(l.params_mut()),
            }
        }
        p.extend(self.head.params_mut());
        p
    }
}

impl<T: Element> Module<T> for Mlp<T> {
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        let mut h = x.clone();
        for b in &self.blocks {
            h = b.linear.forward_params(p, &h)?;
            h = match &b.norm {
                NormLayer::None => h,
                NormLayer::Layer(l) => l.forward_params(p, &h)?,
                NormLayer::Rms(l) => l.forward_params(p, &h)?,
            };
            h = self.activation.apply(&h)?;
        }
        self.head.forward_params(p, &h)
    }
}
