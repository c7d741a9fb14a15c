//! The fused norms against their composed twins, finite differences and
//! hand-worked values.

mod family;
mod layer_norm;
mod rms_norm;
