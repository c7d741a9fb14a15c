//! The primitive ops: values, gradients against finite differences and
//! broadcasting, for every dtype.

mod binary;
mod elementwise;
mod kernels;
mod linalg;
mod linear;
mod nn_ops;
