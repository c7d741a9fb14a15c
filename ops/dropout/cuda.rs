//! Dropout on a GPU (`kernels/dropout.cu`): the keep bits drawn on the
//! host by the CPU's seeded generator, so both devices drop the same
//! elements, applied with the scale.

use crate::device::cuda::{blocks_for, cfg, launch};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/dropout.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "dropout",
    source: include_str!("../../kernels/dropout.cu"),
};

/// `x * scale` where the keep bit is set, else `x * 0`.
pub(crate) fn apply<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    keep: &[u8],
    scale: f64,
) -> Result<Tensor<T>> {
    let g = &x.gpu;
    let n = x.len;
    let mut y = g.uninit::<T>(n)?;
    if n > 0 {
        let k = g.upload_owned(keep.to_vec())?;
        launch!(g, "dropout", g.function::<T>(&KERNELS, "dropout")?,
            cfg(blocks_for(n, 256), 256, 0);
            &x.data, &k, &mut y, &(n as i64), &scale)?;
    }
    Tensor::from_cuda(shape, g.clone(), y)
}
