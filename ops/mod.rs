//! Every differentiable op. Each op's forward and local chain rule sit side
//! by side in its own file (or folder, for ops with device kernels).

pub(crate) mod elementwise;
mod loss;
mod matmul;
pub(crate) mod reduce;
mod shape_ops;
mod softmax;

pub mod layer_norm;
mod layer_norm_composed;
pub(crate) mod norm;
pub mod rms_norm;
mod rms_norm_composed;

pub use elementwise::*;
pub use layer_norm::*;
pub use layer_norm_composed::*;
pub use loss::*;
pub use matmul::*;
pub use reduce::*;
pub use rms_norm::*;
pub use rms_norm_composed::*;
pub use shape_ops::*;
pub use softmax::*;
