//! nn: layers, optimizers, the transformer and safetensors weights.

mod checkpoint;
mod layers;
mod parallel;
mod transformer;
mod weights;
