//! Token embedding, causal multi-head attention, the pre-norm transformer
//! block and a GPT-style language model built from them.
//!
//! Shapes: activations are `[batch, time, width]`; attention splits the
//! width into `heads` of `width / heads` and works on `[batch, heads,
//! time, head_dim]`. The block is GPT-2's pre-norm form:
//!
//! ```text
//! x = x + proj(attention(ln1(x)))      attention = softmax(mask(q k^T / sqrt(d))) v
//! x = x + fc2(gelu(fc1(ln2(x))))
//! ```
//!
//! Its norms switch between the fused and the composed LayerNorm like
//! [`LayerNorm`], and its attention between `ops::attention_qkv` and its
//! composed twin, with the same [`NormImpl`] switch, so a whole model can
//! train through either and the two runs compared.

use super::{
    prefixed, Init, LayerNorm, Linear, Module, NormImpl, ParamCursor, ParamName, Parameters,
};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops;
use crate::rng::Rng;
use crate::tape::Var;
use crate::tensor::Tensor;

/// GPT-2's initial weights: normal with standard deviation 0.02.
const INIT_STD: f64 = 0.02;

fn normal() -> Init {
    Init::Normal {
        mean: 0.0,
        std: INIT_STD,
    }
}

fn linear<T: Element>(inp: usize, out: usize, rng: &mut Rng) -> Result<Linear<T>> {
    Linear::with_init(inp, out, true, normal(), Init::Zeros, rng)
}

/// A lookup table of `vocab` rows of `dim` values (PyTorch's
/// `nn.Embedding`): token `i` maps to row `i`.
#[derive(Debug, Clone)]
pub struct Embedding<T: Element> {
    weight: Tensor<T>,
}

impl<T: Element> Embedding<T> {
    /// A `[vocab, dim]` table, normal(0, 0.02) as GPT-2's.
    pub fn new(vocab: usize, dim: usize, rng: &mut Rng) -> Result<Self> {
        if vocab == 0 || dim == 0 {
            return Err(Error::InvalidArgument {
                op: "Embedding",
                msg: format!("vocab and dim must be > 0, got {vocab} x {dim}"),
            });
        }
        Ok(Embedding {
            weight: normal().tensor(&[vocab, dim], vocab, dim, rng)?,
        })
    }

    /// The `[vocab, dim]` table.
    pub fn weight(&self) -> &Tensor<T> {
        &self.weight
    }

    /// The rows of `ids` (of shape `ids_shape`): `ids_shape + [dim]`.
    pub fn lookup(
        &self,
        p: &mut ParamCursor<'_, T>,
        ids: &[usize],
        ids_shape: &[usize],
    ) -> Result<Var<T>> {
        let w = p.take("Embedding: weight", self.weight.shape())?;
        ops::embedding(w, ids, ids_shape)
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        vec![&self.weight]
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        vec![&mut self.weight]
    }
}

/// Causal multi-head self-attention over `[batch, time, width]`: one
/// `width -> 3 width` projection for queries, keys and values, `heads`
/// heads of `width / heads`, scores scaled by `1 / sqrt(head_dim)`, a
/// causal mask (a position sees itself and earlier ones), softmax, and an
/// output projection. The attention itself is the fused
/// `ops::attention_qkv` by default, or its composed twin
/// ([`MultiHeadAttention::set_impl`]); parameters are the same either way.
#[derive(Debug, Clone)]
pub struct MultiHeadAttention<T: Element> {
    heads: usize,
    qkv: Linear<T>,
    proj: Linear<T>,
    imp: NormImpl,
}

impl<T: Element> MultiHeadAttention<T> {
    /// Attention of `width` split into `heads`; `width % heads` must be 0.
    pub fn new(width: usize, heads: usize, rng: &mut Rng) -> Result<Self> {
        if heads == 0 || !width.is_multiple_of(heads) {
            return Err(Error::InvalidArgument {
                op: "MultiHeadAttention",
                msg: format!("width {width} must split into {heads} equal heads"),
            });
        }
        Ok(MultiHeadAttention {
            heads,
            qkv: linear(width, 3 * width, rng)?,
            proj: linear(width, width, rng)?,
            imp: NormImpl::Fused,
        })
    }

    /// Switches between the fused attention op and its composed twin
    /// (`ops::attention_qkv` or `ops::attention_qkv_composed`).
    pub fn set_impl(&mut self, imp: NormImpl) {
        self.imp = imp;
    }

    /// The implementation in use.
    pub fn imp(&self) -> NormImpl {
        self.imp
    }
}

impl<T: Element> Parameters<T> for MultiHeadAttention<T> {
    /// `qkv.*` (queries, keys and values in one), `proj.*`.
    fn param_names(&self) -> Vec<ParamName> {
        let mut n: Vec<_> = prefixed("qkv", self.qkv.param_names()).collect();
        n.extend(prefixed("proj", self.proj.param_names()));
        n
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        let mut p = self.qkv.params();
        p.extend(self.proj.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        let mut p = self.qkv.params_mut();
        p.extend(self.proj.params_mut());
        p
    }
}

impl<T: Element> Module<T> for MultiHeadAttention<T> {
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        let &[b, t, w] = x.shape() else {
            return Err(Error::InvalidArgument {
                op: "MultiHeadAttention",
                msg: format!("input must be [batch, time, width], got {:?}", x.shape()),
            });
        };
        let hd = w / self.heads;
        let scale = 1.0 / (hd as f64).sqrt();
        // The packed [b, t, 3w] projection goes in as it is, and the heads
        // come out side by side as [b, t, w]: no permute copies.
        let weight = p.peek();
        let qkv = self.qkv.forward_params(p, x)?;
        // On a watched tape the projection is named after its weight
        // (`blocks.2.attn.qkv`), so the shadow reports `blocks.2.attn`.
        if let Some(name) = weight.and_then(|w| x.tape().var_name(w)) {
            let layer = name.rsplit_once('.').map_or(name.as_str(), |(a, _)| a);
            x.tape().name_var(&qkv, layer);
        }
        let y = match self.imp {
            NormImpl::Fused => ops::attention_qkv(&qkv, self.heads, true, scale)?,
            NormImpl::Composed => ops::attention_qkv_composed(&qkv, self.heads, true, scale)?,
        };
        debug_assert_eq!(y.shape(), [b, t, w]);
        self.proj.forward_params(p, &y)
    }
}

/// A pre-norm transformer block: attention and a 4x GELU MLP, each behind
/// a LayerNorm and added back to its input.
#[derive(Debug, Clone)]
pub struct TransformerBlock<T: Element> {
    ln1: LayerNorm<T>,
    attn: MultiHeadAttention<T>,
    ln2: LayerNorm<T>,
    fc1: Linear<T>,
    fc2: Linear<T>,
}

impl<T: Element> TransformerBlock<T> {
    /// A block of `width` with `heads` attention heads.
    pub fn new(width: usize, heads: usize, rng: &mut Rng) -> Result<Self> {
        Ok(TransformerBlock {
            ln1: LayerNorm::new(width)?,
            attn: MultiHeadAttention::new(width, heads, rng)?,
            ln2: LayerNorm::new(width)?,
            fc1: linear(width, 4 * width, rng)?,
            fc2: linear(4 * width, width, rng)?,
        })
    }

    /// Switches both norms between the fused and the composed LayerNorm,
    /// and the attention between the fused op and its composed twin.
    pub fn set_norm_impl(&mut self, imp: NormImpl) {
        self.ln1.set_impl(imp);
        self.ln2.set_impl(imp);
        self.attn.set_impl(imp);
    }
}

impl<T: Element> Parameters<T> for TransformerBlock<T> {
    /// `ln1.*`, `attn.*`, `ln2.*`, `fc1.*`, `fc2.*`.
    fn param_names(&self) -> Vec<ParamName> {
        let mut n: Vec<_> = prefixed("ln1", self.ln1.param_names()).collect();
        n.extend(prefixed("attn", self.attn.param_names()));
        n.extend(prefixed("ln2", self.ln2.param_names()));
        n.extend(prefixed("fc1", self.fc1.param_names()));
        n.extend(prefixed("fc2", self.fc2.param_names()));
        n
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        let mut p = self.ln1.params();
        p.extend(self.attn.params());
        p.extend(self.ln2.params());
        p.extend(self.fc1.params());
        p.extend(self.fc2.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        let mut p = self.ln1.params_mut();
        p.extend(self.attn.params_mut());
        p.extend(self.ln2.params_mut());
        p.extend(self.fc1.params_mut());
        p.extend(self.fc2.params_mut());
        p
    }
}

impl<T: Element> Module<T> for TransformerBlock<T> {
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        let a = self.ln1.forward_params(p, x)?;
        let x = ops::add(x, &self.attn.forward_params(p, &a)?)?;
        let m = self.ln2.forward_params(p, &x)?;
        let m = ops::gelu(&self.fc1.forward_params(p, &m)?)?;
        ops::add(&x, &self.fc2.forward_params(p, &m)?)
    }
}

/// The shape of a [`Gpt`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptConfig {
    /// Number of distinct tokens.
    pub vocab: usize,
    /// Longest sequence (rows of the position table).
    pub context: usize,
    /// Width of every activation.
    pub width: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
}

/// A GPT-style language model: token plus position embeddings, `layers`
/// pre-norm blocks, a final LayerNorm and a linear head to `vocab` logits.
///
/// It takes token ids, not a `Var`, so it runs through
/// [`Gpt::forward_ids`]; [`Module::forward`] with a `Var` is an error. As a
/// [`Module`] it binds its parameters and takes optimizer steps like any
/// other.
#[derive(Debug, Clone)]
pub struct Gpt<T: Element> {
    config: GptConfig,
    tokens: Embedding<T>,
    positions: Embedding<T>,
    blocks: Vec<TransformerBlock<T>>,
    ln_f: LayerNorm<T>,
    head: Linear<T>,
}

impl<T: Element> Gpt<T> {
    /// A model of `config`, initialised from `rng`.
    pub fn new(config: GptConfig, rng: &mut Rng) -> Result<Self> {
        let GptConfig {
            vocab,
            context,
            width,
            heads,
            layers,
        } = config;
        Ok(Gpt {
            config,
            tokens: Embedding::new(vocab, width, rng)?,
            positions: Embedding::new(context, width, rng)?,
            blocks: (0..layers)
                .map(|_| TransformerBlock::new(width, heads, rng))
                .collect::<Result<_>>()?,
            ln_f: LayerNorm::new(width)?,
            head: linear(width, vocab, rng)?,
        })
    }

    /// The shape it was built with.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Switches every LayerNorm and every attention between fused and
    /// composed.
    pub fn set_norm_impl(&mut self, imp: NormImpl) {
        for b in &mut self.blocks {
            b.set_norm_impl(imp);
        }
        self.ln_f.set_impl(imp);
    }

    /// Logits `[batch, time, vocab]` for `ids` (`batch * time` tokens,
    /// row-major), with parameters from `bound` (see [`Parameters::bind`](super::Parameters::bind)).
    /// Errors if `time` exceeds the context or a token is out of the
    /// vocabulary.
    pub fn forward_ids(
        &self,
        bound: &super::Bound<T>,
        ids: &[usize],
        batch: usize,
        time: usize,
    ) -> Result<Var<T>> {
        if time == 0 || time > self.config.context || ids.len() != batch * time {
            return Err(Error::InvalidArgument {
                op: "Gpt",
                msg: format!(
                    "{} ids for batch {batch} x time {time} (context {})",
                    ids.len(),
                    self.config.context
                ),
            });
        }
        let mut p = ParamCursor {
            vars: bound.vars(),
            next: 0,
        };
        let tok = self.tokens.lookup(&mut p, ids, &[batch, time])?;
        let pos: Vec<usize> = (0..time).collect();
        let pos = self.positions.lookup(&mut p, &pos, &[time])?;
        let mut x = ops::add(&tok, &pos)?;
        for b in &self.blocks {
            x = b.forward_params(&mut p, &x)?;
        }
        let x = self.ln_f.forward_params(&mut p, &x)?;
        let y = self.head.forward_params(&mut p, &x)?;
        p.finish()?;
        Ok(y)
    }

    /// Mean cross-entropy of next-token prediction: the logits of `ids`
    /// against `targets` (each `ids[i]`'s successor), both `batch * time`.
    pub fn loss(
        &self,
        bound: &super::Bound<T>,
        ids: &[usize],
        targets: &[usize],
        batch: usize,
        time: usize,
    ) -> Result<Var<T>> {
        let logits = self.forward_ids(bound, ids, batch, time)?;
        let flat = ops::reshape(&logits, &[batch * time, self.config.vocab])?;
        ops::cross_entropy(&flat, targets)
    }
}

impl<T: Element> Parameters<T> for Gpt<T> {
    /// `wte.weight`, `wpe.weight`, `blocks.{i}.*`, `ln_f.*`, `head.*`.
    fn param_names(&self) -> Vec<ParamName> {
        let mut n = vec![ParamName::new("wte.weight"), ParamName::new("wpe.weight")];
        for (i, b) in self.blocks.iter().enumerate() {
            n.extend(prefixed(&format!("blocks.{i}"), b.param_names()));
        }
        n.extend(prefixed("ln_f", self.ln_f.param_names()));
        n.extend(prefixed("head", self.head.param_names()));
        n
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        let mut p = self.tokens.params();
        p.extend(self.positions.params());
        for b in &self.blocks {
            p.extend(b.params());
        }
        p.extend(self.ln_f.params());
        p.extend(self.head.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        let mut p = self.tokens.params_mut();
        p.extend(self.positions.params_mut());
        for b in &mut self.blocks {
            p.extend(b.params_mut());
        }
        p.extend(self.ln_f.params_mut());
        p.extend(self.head.params_mut());
        p
    }
}
