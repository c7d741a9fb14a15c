//! Helpers the test groups share: a module of the library's test binary
//! (`tests/main.rs`), of the CUDA tests' and of the command's.
#![allow(dead_code)]

use fusegrad::rng::Rng;
use fusegrad::{Element, Tensor};

/// A tensor of `shape` holding `v`, rounded to `T`.
pub fn tensor<T: Element>(shape: &[usize], v: &[f64]) -> Tensor<T> {
    Tensor::from_vec(shape.to_vec(), v.iter().map(|&a| T::from_f64(a)).collect()).unwrap()
}

/// `n` draws of `offset + scale * N(0, 1)`.
pub fn normal(rng: &mut Rng, n: usize, scale: f64, offset: f64) -> Vec<f64> {
    (0..n).map(|_| offset + scale * rng.normal()).collect()
}

/// The largest magnitude in `v` (0 for an empty slice; NaN is skipped).
pub fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// The workspace's root: this package's folder, or the folder above it for
/// the command's package (`cli/`), whose tests share this module.
pub fn workspace_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    match here.parent() {
        Some(up) if !here.join("scripts").is_dir() => up.to_path_buf(),
        _ => here.to_path_buf(),
    }
}
