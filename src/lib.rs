//! fusegrad: reverse-mode autodiff with a first-class, fused LayerNorm whose
//! gradients are checked against a twin built from primitive ops.
#![doc = include_str!("../README.md")]

pub mod analysis;
pub mod bench;
pub mod device;
pub mod dtype;
pub mod error;
pub mod gradcheck;
pub mod nn;
pub mod op;
pub mod report;
pub mod rng;
pub mod shape;
pub mod stability;
pub mod tape;
pub mod tensor;
pub mod tolerance;

#[path = "../ops/mod.rs"]
pub mod ops;

pub use device::Device;
pub use dtype::{Accum, Element};
pub use error::{Error, Result};
pub use op::{Op, Saved, SavedItem};
pub use tape::{Gradients, NodeInfo, NodeMemory, Tape, Var};
pub use tensor::Tensor;
