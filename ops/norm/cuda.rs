//! What the fused norms' GPU launchers share: the launch geometry of
//! `kernels/layer_norm.cu` and `kernels/rms_norm.cu` (the host's rule in
//! their headers), and reading gamma/beta as device buffers.

use crate::device::cuda::NULL;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{CudaBuf, Storage, Tensor};

/// Threads per row, threads per block, and rows per range for a launch
/// over `n` rows of `d` elements of `T`, holding `nv` 16-byte chunks per
/// thread (8 forward, 2 backward). Depends on the shape and type only, so
/// the summation order (and the bits) do too.
pub(crate) fn team<T: Element>(d: usize, nv: usize) -> (u32, u32) {
    let vec = 16 / std::mem::size_of::<T>();
    let chunks = d.div_ceil(vec);
    let m = chunks.div_ceil(nv).max(1);
    let tpr = if m <= 32 {
        m.next_power_of_two()
    } else {
        m.next_multiple_of(32).min(512)
    };
    let block = if tpr >= 256 { tpr } else { (256 / tpr) * tpr };
    (tpr as u32, block as u32)
}

/// Rows per range of the forward: a few rows per team once there are many.
pub(crate) fn forward_range(n: usize) -> usize {
    n.div_ceil(4096).clamp(1, 8)
}

/// Rows per range of the backward, and the number of ranges (partial rows
/// of dgamma/dbeta): at most 4096, a function of `n` only.
pub(crate) fn backward_ranges(n: usize) -> (usize, usize) {
    let r = n.div_ceil(128).clamp(1, 64).max(n.div_ceil(4096));
    (r, n.div_ceil(r))
}

/// Blocks covering `ranges` with `per_block` teams.
pub(crate) fn grid(ranges: usize, per_block: u32) -> u32 {
    ranges
        .div_ceil(per_block.max(1) as usize)
        .clamp(1, i32::MAX as usize) as u32
}

/// Gamma or beta as a device buffer beside `x`'s, or `None` when absent;
/// `DeviceMismatch` if it lives elsewhere.
pub(crate) fn gpu_side<'a, T: Element>(
    x: &Tensor<T>,
    t: Option<&'a Tensor<T>>,
) -> Result<Option<&'a CudaBuf<T>>> {
    let Some(t) = t else { return Ok(None) };
    match t.storage() {
        Storage::Cuda(b) if t.device() == x.device() => Ok(Some(b)),
        _ => Err(Error::DeviceMismatch {
            op: "norm",
            lhs: x.device().to_string(),
            rhs: t.device().to_string(),
        }),
    }
}

/// The device address of an optional buffer, 0 (null) when absent: how
/// the kernels take gamma, beta and outputs that are not wanted.
pub(crate) fn addr<T: Element>(b: Option<&cudarc::driver::CudaSlice<T>>) -> u64 {
    use cudarc::driver::DevicePtr;
    match b {
        // The stream's event tracking is off (one stream per device), so
        // the guard returned with the address does nothing.
        Some(b) => b.device_ptr(b.stream()).0,
        None => NULL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_follows_the_kernels_rule() {
        // d = 768 f32: 192 chunks, 24 per thread forward -> tpr 32, 8 rows
        // per block; backward 96 -> tpr 96, block 96 * 2.
        assert_eq!(team::<f32>(768, 8), (32, 256));
        assert_eq!(team::<f32>(768, 2), (96, 192));
        assert_eq!(team::<half::bf16>(65536, 8), (512, 512));
        assert_eq!(team::<f32>(1, 8), (1, 256));
        assert_eq!(backward_ranges(32768), (64, 512));
        assert_eq!(backward_ranges(100), (1, 100));
        assert!(backward_ranges(1 << 24).1 <= 4096);
    }
}
