//! Every differentiable op. Each op family sits in its own folder: `mod.rs`
//! holds the argument checks, the saved state, the chain rule and the public
//! fns, and reaches data only through device-level kernels that match on the
//! tensor's storage; `cpu.rs` holds the host loops. The `*_composed` files
//! build an op from other ops and touch no data.

pub mod attention;
mod attention_composed;
mod dropout;
pub(crate) mod elementwise;
mod embedding;
mod loss;
mod masked_fill;
pub(crate) mod matmul;
#[cfg(feature = "probes")]
pub(crate) use matmul::kernel as matmul_kernel;
pub(crate) mod reduce;
mod shape;
mod softmax;

pub(crate) mod norm;

pub use attention::{attention, attention_qkv};
pub use attention_composed::*;
pub use dropout::*;
pub use elementwise::*;
pub use embedding::*;
pub use loss::*;
pub use masked_fill::*;
pub use matmul::*;
pub use norm::{layer_norm, layer_norm_nd, rms_norm, rms_norm_nd};
pub use norm::{
    layer_norm_composed, layer_norm_composed_nd, rms_norm_composed, rms_norm_composed_nd,
};
pub use reduce::*;
pub use shape::*;
pub use softmax::*;

/// The op families' CUDA kernels, each declared beside its launchers.
#[cfg(feature = "cuda")]
pub(crate) const KERNELS: [&crate::device::Family; 10] = [
    &norm::KERNELS,
    &elementwise::KERNELS,
    &reduce::KERNELS,
    &softmax::KERNELS,
    &attention::KERNELS,
    &loss::KERNELS,
    &shape::KERNELS,
    &embedding::KERNELS,
    &masked_fill::KERNELS,
    &dropout::KERNELS,
];
