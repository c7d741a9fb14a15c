//! Every CUDA kernel family, as the op families and the optimizers declare
//! them beside their launchers, and the register and spill table of all of
//! them (`fusegrad kernels`).

use crate::device::kernel_cache::table_of;
use crate::device::{Family, KernelInfo};
use crate::error::Result;
use std::path::Path;

/// Every family: the ops', the optimizers', and the probes' bench kernels.
fn families() -> Vec<&'static Family> {
    let mut f = crate::ops::KERNELS.to_vec();
    f.push(&crate::nn::KERNELS);
    #[cfg(feature = "probes")]
    f.push(&crate::probes::cuda_bench::KERNELS);
    f
}

/// Compiles every kernel family for each of `archs` (or reads it from the
/// kernel cache: `cache`, else the process's) and reports every entry
/// point's registers, shared memory and spills. Families compile on as
/// many threads as the machine has cores (NVRTC is single-threaded). Any
/// compile error is returned with its log.
pub fn kernel_table(archs: &[u32], cache: Option<&Path>) -> Result<Vec<KernelInfo>> {
    table_of(&families(), archs, cache)
}

/// What fusegrad finds of CUDA on this machine, one line per part: the
/// GPU, the driver, NVRTC, cuBLAS, and how the kernel cache's entries
/// stand against this NVRTC (a warm cache needs none). With `load`, every
/// kernel family is loaded on cuda:0 first (from the cache, from PTX where
/// the driver refuses a CUBIN, compiled where missing), so a kernel that
/// cannot run shows up now rather than at its first op.
#[cfg(feature = "cuda")]
pub fn cuda_report(load: bool) -> crate::device::CudaReport {
    crate::device::report::cuda_report(&families(), load)
}
