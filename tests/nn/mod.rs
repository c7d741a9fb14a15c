//! nn: layers, optimizers, the transformer and safetensors weights.

mod layers;
mod transformer;
mod weights;
