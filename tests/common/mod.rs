//! Helpers the test groups share: a module of the library's test binary
//! (`tests/main.rs`) and of the command's.
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

/// Whether the calling test has just run in a process of its own and
/// passed there, so it returns: `false` inside that process, where its
/// body goes on. For the checks of "no GPU can be used": in the library's
/// test binary the `cuda` group loads the driver's emulation, for the
/// whole process. `module` is `module_path!()`, `name` the test's name.
pub fn ran_alone(module: &str, name: &str) -> bool {
    // The test's path as libtest names it: without the crate.
    let path = module.split_once("::").map_or("", |(_, m)| m);
    let full = format!("{path}::{name}");
    if std::env::var("FUSEGRAD_TEST_ALONE").is_ok_and(|v| v == full) {
        return false;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", &full, "--nocapture", "--test-threads=1"])
        .env("FUSEGRAD_TEST_ALONE", &full)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && so.contains("1 passed"),
        "{full}, in a process of its own:\n{so}\n{se}"
    );
    eprint!("{se}");
    true
}

/// Runs the rest of the calling test `$name` in a process of its own
/// ([`ran_alone`]).
#[allow(unused_macros)]
macro_rules! alone {
    ($name:ident) => {
        if $crate::common::ran_alone(module_path!(), stringify!($name)) {
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use alone;
