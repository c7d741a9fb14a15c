//! The fused norms against their composed twins, finite differences and
//! hand-worked values.

mod layer_norm;
mod rms_norm;
