//! Every differentiable op. Each op's forward and local chain rule sit side
//! by side in its own file (or folder, for ops with device kernels).

mod util;

mod activation;
mod binary;
mod loss;
mod matmul;
mod reduce;
mod shape_ops;
mod softmax;
mod unary;

pub mod layer_norm;
mod layer_norm_composed;
pub mod rms_norm;
mod rms_norm_composed;

pub use activation::*;
pub use binary::*;
pub use layer_norm::*;
pub use layer_norm_composed::*;
pub use loss::*;
pub use matmul::*;
pub use reduce::*;
pub use rms_norm::*;
pub use rms_norm_composed::*;
pub use shape_ops::*;
pub use softmax::*;
pub use unary::*;
