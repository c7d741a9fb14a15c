//! nn: layers, optimizers, the transformer and safetensors weights.

#[path = "../common/mod.rs"]
mod common;

mod layers;
mod transformer;
mod weights;
