//! What the fused LayerNorm and RMSNorm share: the [`NormOps`] entry point
//! through which each element type runs their tape nodes, and the CPU row
//! helpers of both kernels ([`cpu_rows`]).

pub(crate) mod cpu_rows;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod twin;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tape::Var;
use crate::tensor::{Storage, Tensor};

/// A fused norm node as the public fns checked it: inputs `[x, gamma?,
/// beta?]` normalized over `normalized` (`d` elements per row).
pub struct NormSpec {
    pub(crate) normalized: Vec<usize>,
    pub(crate) d: usize,
    pub(crate) eps: f64,
    pub(crate) has_gamma: bool,
    pub(crate) has_beta: bool,
}

/// The fused norms' tape nodes for one element type; a supertrait of
/// [`Element`], sealed (public, in a private module) so that it is not part
/// of the API and no other crate implements it.
///
/// Every impl is non-generic ([`norm_ops!`]): the nodes and every SIMD build
/// of their kernels are compiled once, in this crate, for the concrete
/// element type. Called through generic code instead, they would be
/// compiled again in every crate that runs an op (each test binary and
/// example), since optimized builds do not share generic instances across
/// crates.
pub trait NormOps: Sized {
    /// Records a fused LayerNorm node (`ops/layer_norm`).
    fn layer_norm_node(spec: NormSpec, inputs: &[&Var<Self>]) -> Result<Var<Self>>
    where
        Self: Element;
    /// Records a fused RMSNorm node (`ops/rms_norm`; `spec.has_beta` is
    /// false).
    fn rms_norm_node(spec: NormSpec, inputs: &[&Var<Self>]) -> Result<Var<Self>>
    where
        Self: Element;
}

/// [`NormOps`] for concrete element types (each with an [`Element`]
/// accumulation type), instantiating the generic nodes once, here.
macro_rules! norm_ops {
    ($($t:ty),*) => {$(
        impl $crate::ops::norm::NormOps for $t {
            #[inline(never)]
            fn layer_norm_node(
                spec: $crate::ops::norm::NormSpec,
                inputs: &[&$crate::tape::Var<Self>],
            ) -> $crate::error::Result<$crate::tape::Var<Self>> {
                $crate::ops::layer_norm::node(spec, inputs)
            }
            #[inline(never)]
            fn rms_norm_node(
                spec: $crate::ops::norm::NormSpec,
                inputs: &[&$crate::tape::Var<Self>],
            ) -> $crate::error::Result<$crate::tape::Var<Self>> {
                $crate::ops::rms_norm::node(spec, inputs)
            }
        }
    )*};
}
pub(crate) use norm_ops;

norm_ops!(f32, f64, half::f16, half::bf16);

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
