//! masked_fill on a GPU (`kernels/masked_fill.cu`): a select between each
//! element and a constant, the mask read through broadcast strides.

use crate::device::cuda::{blocks_for, cfg, launch, strides};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/masked_fill.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "masked_fill",
    source: include_str!("../../kernels/masked_fill.cu"),
};

/// `fill` where the mask (broadcast to `shape`) is true, else `x`.
pub(crate) fn select<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    mask: &[bool],
    mask_shape: &[usize],
    fill: T,
) -> Result<Tensor<T>> {
    let g = &x.gpu;
    let n = x.len;
    let mut y = g.uninit::<T>(n)?;
    if n > 0 {
        let mut s = strides("masked_fill", shape, mask_shape, &[])?;
        s.b = [0; 8];
        let bytes: Vec<u8> = mask.iter().map(|&b| b as u8).collect();
        let m = g.upload_owned(bytes)?;
        launch!(g, "masked_fill", g.function::<T>(&KERNELS, "masked_fill")?,
            cfg(blocks_for(n, 256), 256, 0);
            &x.data, &m, &mut y, &(n as i64), &s, &fill.to_f64())?;
    }
    Tensor::from_cuda(shape, g.clone(), y)
}
