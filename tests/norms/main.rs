//! The fused norms against their composed twins, finite differences and
//! hand-worked values.

#[path = "../common/mod.rs"]
mod common;

mod layer_norm;
mod rms_norm;
