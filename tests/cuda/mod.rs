//! The CUDA backend: every op and the fused norms on the device (or the
//! CPU emulation of `tests/cuda_emu`), and every kernel compiled by NVRTC.
//! The emulation, once loaded, stays loaded for the whole test binary: the
//! checks of "no GPU can be used" (`core::no_gpu`) run each in a process
//! of their own.

mod backend;
#[cfg(all(feature = "probes", feature = "cuda"))]
mod bench;
mod cache;
mod kernels;
mod nccl;
mod norms;
