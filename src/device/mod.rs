//! Where tensors live. The CPU is always present; CUDA is reported as
//! unavailable until the CUDA backend lands.

pub(crate) mod cpu;
pub(crate) mod pool;

use crate::error::{Error, Result};

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
            Device::Cuda(n) => Err(Error::CudaUnavailable {
                reason: format!("cuda:{n} requested, but this build has no CUDA backend yet"),
            }),
        }
    }
}
