//! The CUDA backend: every op and the fused norms on the device (or the
//! CPU emulation of `tests/cuda_emu`), and every kernel compiled by NVRTC.
//! A binary of its own: the emulation is loaded before the library first
//! asks for CUDA, and stays loaded for the process, while the library's
//! other tests check what happens where no GPU can be used.

#[path = "../common/mod.rs"]
mod common;
#[path = "../cuda_emu/mod.rs"]
mod cuda_emu;

mod backend;
#[cfg(all(feature = "probes", feature = "cuda"))]
mod bench;
mod kernels;
mod norms;
