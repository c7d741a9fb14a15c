//! Fused RMSNorm on a GPU (`kernels/rms_norm.cu`): the LayerNorm kernels'
//! structure without the mean and beta (see `ops/layer_norm/cuda.rs`).

use crate::device::cuda::{cfg, launch};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::ops::norm::cuda::{addr, backward_ranges, forward_range, grid, team};
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/rms_norm.cu`, after the norm core both
/// fused norms share).
pub(crate) static KERNELS: Family = Family {
    name: "rms_norm",
    source: concat!(
        include_str!("../../kernels/norm_core.cuh"),
        include_str!("../../kernels/rms_norm.cu")
    ),
};

/// `y` and `rstd` of `x` (`n` rows of `d`).
pub(crate) fn forward<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    d: usize,
    gamma: Option<&CudaBuf<T>>,
    eps: f64,
) -> Result<(Tensor<T>, Tensor<T::Acc>)> {
    let g = &x.gpu;
    let n = x.len / d;
    let mut y = g.uninit::<T>(x.len)?;
    let mut rstd = g.uninit::<T::Acc>(n)?;
    let (tpr, block) = team::<T>(d, 8);
    let r = forward_range(n);
    let ga = addr(gamma.map(|b| &b.data));
    launch!(g, "rms_norm forward", g.function::<T>(&KERNELS, "rms_norm_fwd")?,
        cfg(grid(n.div_ceil(r), block / tpr), block, 0);
        &x.data, &ga, &mut y, &mut rstd,
        &(n as i64), &(d as i64), &(tpr as i32), &(r as i64), &eps)?;
    Ok((
        Tensor::from_cuda(shape, g.clone(), y)?,
        Tensor::from_cuda(&[n], g.clone(), rstd)?,
    ))
}

/// dx and dgamma (each when wanted, `want = (dx, dgamma)`).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(crate) fn backward<T: Element>(
    x: &CudaBuf<T>,
    dy: &CudaBuf<T>,
    (shape, normalized): (&[usize], &[usize]),
    d: usize,
    gamma: Option<&CudaBuf<T>>,
    rstd: &CudaBuf<T::Acc>,
    eps: f64,
    want: (bool, bool),
) -> Result<(Option<Tensor<T>>, Option<Tensor<T>>)> {
    let g = &x.gpu;
    let n = x.len / d;
    let (r, parts) = backward_ranges(n);
    let mut dx = if want.0 {
        Some(g.uninit::<T>(x.len)?)
    } else {
        None
    };
    let mut part = if want.1 {
        Some(g.uninit::<T::Acc>(parts * d)?)
    } else {
        None
    };
    if n > 0 && (want.0 || want.1) {
        let (tpr, block) = team::<T>(d, 2);
        let ga = addr(gamma.map(|b| &b.data));
        let (dxa, pa) = (addr(dx.as_ref()), addr(part.as_ref()));
        launch!(g, "rms_norm backward", g.function::<T>(&KERNELS, "rms_norm_bwd")?,
            cfg(grid(parts, block / tpr), block, 0);
            &x.data, &dy.data, &ga, &rstd.data, &dxa, &pa,
            &(n as i64), &(d as i64), &(tpr as i32), &(r as i64), &eps)?;
    }
    let mut dgamma = None;
    if let Some(part) = part.as_mut() {
        let mut dg = g.uninit::<T>(d)?;
        let np = if n > 0 { parts } else { 0 };
        launch!(g, "rms_norm backward", g.function::<T>(&KERNELS, "rms_norm_bwd_finalize")?,
            cfg(d.div_ceil(32).clamp(1, 65_535) as u32, 256, 0);
            &*part, &mut dg, &(np as i64), &(d as i64))?;
        dgamma = Some(Tensor::from_cuda(normalized, g.clone(), dg)?);
    }
    let dx = dx
        .take()
        .map(|b| Tensor::from_cuda(shape, g.clone(), b))
        .transpose()?;
    Ok((dx, dgamma))
}
