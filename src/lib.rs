//! fusegrad: reverse-mode autodiff with a first-class, fused LayerNorm whose
//! gradients are checked against a twin built from primitive ops.
#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// Names a module's unit tests: `unit_tests![a, b]` is the module's
/// `TESTS` (each test's path and function), which `selftest` runs. Defined before the modules, so they
/// name it without a path (and import nothing from `selftest`). A test
/// function left out is dead code, which the build denies.
#[cfg(feature = "selftest")]
macro_rules! unit_tests {
    ($($t:ident),* $(,)?) => {
        pub(crate) const TESTS: &[(&str, fn())] =
            &[$((concat!(module_path!(), "::", stringify!($t)), $t)),*];
    };
}

pub mod device;
pub mod dist;
pub mod dtype;
pub mod error;
pub(crate) mod file;
pub mod gradcheck;
#[cfg(feature = "cuda")]
mod kernels;
pub(crate) mod layout;
pub mod mask;
pub mod nn;
pub mod op;
pub(crate) mod profile;
pub mod rng;
#[cfg(feature = "selftest")]
#[doc(hidden)]
pub mod selftest;
pub mod shadow;
pub mod special;
pub mod tape;
pub mod tensor;
pub mod tolerance;

#[path = "../ops/mod.rs"]
pub mod ops;

/// What the `fusegrad` command's benchmarks and analysis read from inside
/// the library: the CPU kernels' speed switches, the buffer pool, the op
/// timers, a FLOP-counting element type and the GPU timing harness. Not
/// part of the API: only with the non-default `probes` feature, and free to
/// change with the kernels.
#[cfg(feature = "probes")]
pub mod probes;

pub use device::Device;
pub use dtype::{Accum, DType, Element};
pub use error::{Error, Result};
pub use file::write_atomic;
#[cfg(feature = "cuda")]
pub use kernels::{cuda_report, kernel_table};
pub use mask::Mask;
pub use op::{Op, Saved, SavedItem};
pub use shadow::{Shadow, ShadowConfig};
pub use tape::{GradReady, Gradients, NodeInfo, NodeMemory, Tape, Var};
pub use tensor::Tensor;
