//! What the fused LayerNorm and RMSNorm share: [`record`], through which
//! every element type records their tape nodes (each norm's [`Nodes`],
//! built once per concrete type by [`nodes!`]), and the CPU row helpers of
//! both kernels ([`cpu_rows`]).

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

/// A fused norm's tape node for one concrete element type.
pub(crate) type NodeFn<U> = fn(NormSpec, &[&Var<U>]) -> Result<Var<U>>;

/// A fused norm's nodes, one plain (non-generic) function per element
/// type, which [`nodes!`] writes in the norm's own module. A plain fn is
/// compiled once, in this crate, with every SIMD build of its kernels;
/// called through generic code instead, the nodes would be compiled again
/// in every crate that runs an op (each test binary and example), since
/// optimized builds do not share generic instances across crates.
pub(crate) struct Nodes {
    pub(crate) f32: NodeFn<f32>,
    pub(crate) f64: NodeFn<f64>,
    pub(crate) f16: NodeFn<half::f16>,
    pub(crate) bf16: NodeFn<half::bf16>,
    #[cfg(feature = "probes")]
    pub(crate) counted: NodeFn<crate::probes::counted::Counted>,
}

/// The [`Nodes`] of the generic node function `$node`, instantiated here
/// for each concrete element type.
macro_rules! nodes {
    ($node:path) => {{
        use $crate::error::Result;
        use $crate::ops::norm::NormSpec;
        use $crate::tape::Var;
        #[inline(never)]
        fn f32_(s: NormSpec, i: &[&Var<f32>]) -> Result<Var<f32>> {
            $node(s, i)
        }
        #[inline(never)]
        fn f64_(s: NormSpec, i: &[&Var<f64>]) -> Result<Var<f64>> {
            $node(s, i)
        }
        #[inline(never)]
        fn f16_(s: NormSpec, i: &[&Var<half::f16>]) -> Result<Var<half::f16>> {
            $node(s, i)
        }
        #[inline(never)]
        fn bf16_(s: NormSpec, i: &[&Var<half::bf16>]) -> Result<Var<half::bf16>> {
            $node(s, i)
        }
        #[cfg(feature = "probes")]
        #[inline(never)]
        fn counted_(
            s: NormSpec,
            i: &[&Var<$crate::probes::counted::Counted>],
        ) -> Result<Var<$crate::probes::counted::Counted>> {
            $node(s, i)
        }
        $crate::ops::norm::Nodes {
            f32: f32_,
            f64: f64_,
            f16: f16_,
            bf16: bf16_,
            #[cfg(feature = "probes")]
            counted: counted_,
        }
    }};
}
pub(crate) use nodes;

/// Records the fused norm node of a checked `spec` through `nodes`: `T`'s
/// [`DType`] picks the concrete node, and the Vars pass through it
/// unchanged.
pub(crate) fn record<T: Element>(
    nodes: &Nodes,
    spec: NormSpec,
    inputs: &[&Var<T>],
) -> Result<Var<T>> {
    match T::DTYPE {
        DType::F32 => via(nodes.f32, spec, inputs),
        DType::F64 => via(nodes.f64, spec, inputs),
        DType::F16 => via(nodes.f16, spec, inputs),
        DType::BF16 => via(nodes.bf16, spec, inputs),
        #[cfg(feature = "probes")]
        DType::Probe => via(nodes.counted, spec, inputs),
        #[cfg(not(feature = "probes"))]
        DType::Probe => Err(unknown::<T>()),
    }
}

/// `node` on `inputs` seen as `Var<U>`, the type `T` is.
fn via<T: Element, U: Element>(
    node: NodeFn<U>,
    spec: NormSpec,
    inputs: &[&Var<T>],
) -> Result<Var<T>> {
    let mut same: Vec<&Var<U>> = Vec::with_capacity(inputs.len());
    for v in inputs {
        let any: &dyn Any = *v;
        same.push(any.downcast_ref::<Var<U>>().ok_or_else(unknown::<T>)?);
    }
    let out: Box<dyn Any> = Box::new(node(spec, &same)?);
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
