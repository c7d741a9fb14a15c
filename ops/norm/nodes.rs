//! Records a fused norm node through a plain (non-generic) function per
//! element type, compiled once, in this crate, with every SIMD build of the
//! kernels. Called through generic code instead, the node (and so the
//! kernels) would be compiled again in every crate that runs a norm (each
//! test binary and example), since optimized builds do not share generic
//! instances across crates.

use super::{node, NormSpec};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tape::Var;
use std::any::Any;

/// The node of a checked `spec`: `T`'s [`DType`] picks the concrete
/// function, and the Vars pass through it unchanged.
pub(super) fn record<T: Element>(spec: NormSpec, inputs: &[&Var<T>]) -> Result<Var<T>> {
    match T::DTYPE {
        DType::F32 => via(node_f32, spec, inputs),
        DType::F64 => via(node_f64, spec, inputs),
        DType::F16 => via(node_f16, spec, inputs),
        DType::BF16 => via(node_bf16, spec, inputs),
        #[cfg(feature = "probes")]
        DType::Probe => via(node_counted, spec, inputs),
        #[cfg(not(feature = "probes"))]
        DType::Probe => Err(unknown::<T>()),
    }
}

#[cfg(feature = "probes")]
type Counted = crate::probes::counted::Counted;

#[inline(never)]
fn node_f32(s: NormSpec, i: &[&Var<f32>]) -> Result<Var<f32>> {
    node(s, i)
}

#[inline(never)]
fn node_f64(s: NormSpec, i: &[&Var<f64>]) -> Result<Var<f64>> {
    node(s, i)
}

#[inline(never)]
fn node_f16(s: NormSpec, i: &[&Var<half::f16>]) -> Result<Var<half::f16>> {
    node(s, i)
}

#[inline(never)]
fn node_bf16(s: NormSpec, i: &[&Var<half::bf16>]) -> Result<Var<half::bf16>> {
    node(s, i)
}

#[cfg(feature = "probes")]
#[inline(never)]
fn node_counted(s: NormSpec, i: &[&Var<Counted>]) -> Result<Var<Counted>> {
    node(s, i)
}

/// A norm node for one concrete element type.
type NodeFn<U> = fn(NormSpec, &[&Var<U>]) -> Result<Var<U>>;

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
