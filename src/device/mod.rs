//! Where tensors live. The CPU is always present; a CUDA GPU is used when
//! the `cuda` feature is on (the default) and the machine has one.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cuda")]
pub(crate) mod driver_lib;
#[cfg(feature = "cuda")]
pub(crate) mod kernel_cache;
#[cfg(feature = "cuda")]
pub(crate) mod nvrtc;
pub(crate) mod pool;

#[cfg(feature = "cuda")]
pub use kernel_cache::{kernel_stats, KernelStats};
#[cfg(feature = "cuda")]
pub use nvrtc::{nvrtc_info, Family, KernelInfo, NvrtcInfo, CHECKED_ARCHS};
#[cfg(feature = "cuda")]
pub(crate) mod report;
#[cfg(feature = "cuda")]
pub use report::CudaReport;

use crate::error::Result;

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, computed by the CPU kernels.
    #[default]
    Cpu,
    /// The n-th CUDA device.
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Device {
    /// Checks that the device can be used in this build and on this machine.
    pub fn ensure_available(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => cuda::gpu(n).map(|_| ()),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(n) => Err(crate::error::Error::CudaUnavailable {
                reason: format!(
                    "cuda:{n} requested, but this build has no CUDA backend \
                     (built without the `cuda` feature)"
                ),
            }),
        }
    }

    /// How many CUDA GPUs this machine has; an error says why none can be
    /// used (no driver, or a build without the CUDA backend).
    pub fn cuda_count() -> Result<usize> {
        #[cfg(feature = "cuda")]
        return cuda::count();
        #[cfg(not(feature = "cuda"))]
        Err(crate::error::Error::CudaUnavailable {
            reason: "this build has no CUDA backend (built without the `cuda` feature)".into(),
        })
    }

    /// Whether a first CUDA GPU can be used, and if not, why (for reports).
    /// Needs no NVRTC: kernels come from the cache until one is missing.
    pub fn cuda_status() -> std::result::Result<String, String> {
        #[cfg(feature = "cuda")]
        {
            let g = cuda::gpu(0).map_err(|e| e.to_string())?;
            let cache = match kernel_cache::kernel_stats().dir {
                Some(d) => d.display().to_string(),
                None => "off".into(),
            };
            let mut s = format!(
                "cuda:0, {}, sm_{}; memory: {}; kernel cache: {cache}",
                g.device_name, g.arch, g.alloc
            );
            let ptx = g.ptx_families();
            if let Some((_, why)) = ptx.first() {
                let names: Vec<&str> = ptx.iter().map(|(n, _)| *n).collect();
                s += &format!(
                    "; kernels run from PTX: {} (the driver refused {why})",
                    names.join(", ")
                );
            }
            Ok(s)
        }
        #[cfg(not(feature = "cuda"))]
        Err("built without the `cuda` feature".into())
    }
}
