//! The CUDA backend: every op and the fused norms on the device (or the
//! CPU emulation of `tests/cuda_emu`), and every kernel compiled by NVRTC.

#[path = "../common/mod.rs"]
mod common;
#[path = "../cuda_emu/mod.rs"]
mod cuda_emu;

mod backend;
#[cfg(all(feature = "probes", feature = "cuda"))]
mod bench;
mod kernels;
mod norms;
