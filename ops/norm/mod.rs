//! What the fused LayerNorm and RMSNorm share: [`record`], through which
//! every element type records their tape nodes (built once per concrete
//! type, here), and the CPU row helpers of both kernels ([`cpu_rows`]).

pub(crate) mod cpu_rows;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod twin;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tape::Var;
use crate::tensor::{Storage, Tensor};
use std::any::Any;

/// A fused norm node as the public fns checked it: inputs `[x, gamma?,
/// beta?]` normalized over `normalized` (`d` elements per row).
pub struct NormSpec {
    pub(crate) normalized: Vec<usize>,
    pub(crate) d: usize,
    pub(crate) eps: f64,
    pub(crate) has_gamma: bool,
    pub(crate) has_beta: bool,
}

/// Which fused norm a node is: LayerNorm subtracts the mean and adds beta,
/// RMSNorm does neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormKind {
    /// `ops/layer_norm`.
    Layer,
    /// `ops/rms_norm` (`spec.has_beta` is false).
    Rms,
}

/// A fused norm's tape node for one concrete element type.
type NodeFn<U> = fn(NormKind, NormSpec, &[&Var<U>]) -> Result<Var<U>>;

/// The nodes of a concrete type, built here and only here: a plain fn is
/// compiled once, in this crate, with every SIMD build of its kernels.
/// Called through generic code instead, they would be compiled again in
/// every crate that runs an op (each test binary and example), since
/// optimized builds do not share generic instances across crates.
macro_rules! concrete_nodes {
    ($($name:ident: $t:ty),*) => {$(
        #[inline(never)]
        fn $name(kind: NormKind, spec: NormSpec, inputs: &[&Var<$t>]) -> Result<Var<$t>> {
            match kind {
                NormKind::Layer => crate::ops::layer_norm::node(spec, inputs),
                NormKind::Rms => crate::ops::rms_norm::node(spec, inputs),
            }
        }
    )*};
}
concrete_nodes!(node_f32: f32, node_f64: f64, node_f16: half::f16, node_bf16: half::bf16);
#[cfg(feature = "probes")]
concrete_nodes!(node_counted: crate::probes::counted::Counted);

/// Records the fused norm node of a checked `spec`: `T`'s [`DType`] picks
/// the concrete node, and the Vars pass through it unchanged.
pub(crate) fn record<T: Element>(
    kind: NormKind,
    spec: NormSpec,
    inputs: &[&Var<T>],
) -> Result<Var<T>> {
    match T::DTYPE {
        DType::F32 => via(node_f32, kind, spec, inputs),
        DType::F64 => via(node_f64, kind, spec, inputs),
        DType::F16 => via(node_f16, kind, spec, inputs),
        DType::BF16 => via(node_bf16, kind, spec, inputs),
        #[cfg(feature = "probes")]
        DType::Probe => via(node_counted, kind, spec, inputs),
        #[cfg(not(feature = "probes"))]
        DType::Probe => Err(unknown::<T>()),
    }
}

/// `node` on `inputs` seen as `Var<U>`, the type `T` is.
fn via<T: Element, U: Element>(
    node: NodeFn<U>,
    kind: NormKind,
    spec: NormSpec,
    inputs: &[&Var<T>],
) -> Result<Var<T>> {
    let mut same: Vec<&Var<U>> = Vec::with_capacity(inputs.len());
    for v in inputs {
        let any: &dyn Any = *v;
        same.push(any.downcast_ref::<Var<U>>().ok_or_else(unknown::<T>)?);
    }
    let out: Box<dyn Any> = Box::new(node(kind, spec, &same)?);
    out.downcast::<Var<T>>()
        .map(|v| *v)
        .map_err(|_| unknown::<T>())
}

/// The error for an element type without fused norm kernels (none of the
/// public types: `Element` is sealed).
fn unknown<T: Element>() -> Error {
    Error::InvalidArgument {
        op: "fused norm",
        msg: format!("no fused norm kernels for element type {}", T::NAME),
    }
}

/// The host elements of a side input (gamma, beta) of a norm whose `x` is
/// on the CPU; `DeviceMismatch` if it lives elsewhere.
pub(crate) fn cpu_side<'a, T: Element>(
    x: &Tensor<T>,
    t: Option<&'a Tensor<T>>,
) -> Result<Option<&'a [T]>> {
    let Some(t) = t else { return Ok(None) };
    if t.device() != x.device() {
        return Err(Error::DeviceMismatch {
            op: "norm",
            lhs: x.device().to_string(),
            rhs: t.device().to_string(),
        });
    }
    match t.storage() {
        Storage::Cpu(b) => Ok(Some(&b[..])),
        #[cfg(feature = "cuda")]
        Storage::Cuda(_) => Err(Error::DeviceMismatch {
            op: "norm",
            lhs: x.device().to_string(),
            rhs: t.device().to_string(),
        }),
    }
}
