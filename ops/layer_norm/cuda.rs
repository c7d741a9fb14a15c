//! Fused LayerNorm on a GPU (`kernels/layer_norm.cu`): one forward kernel
//! writing y and the statistics; a backward kernel writing dx and per-range
//! dgamma/dbeta partials, then a finalize kernel adding the partials in a
//! fixed order. The scaled fallback for extreme rows runs inside the
//! kernels, so no call waits on the host.

use crate::device::cuda::{cfg, launch};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::ops::norm::cuda::{addr, backward_ranges, forward_range, grid, team};
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/layer_norm.cu`, after the norm core both
/// fused norms share).
pub(crate) static KERNELS: Family = Family {
    name: "layer_norm",
    source: concat!(
        include_str!("../../kernels/norm_core.cuh"),
        include_str!("../../kernels/layer_norm.cu")
    ),
};

/// The output and the saved statistics (mean, rstd).
type Forward<T> = (
    Tensor<T>,
    Tensor<<T as Element>::Acc>,
    Tensor<<T as Element>::Acc>,
);

/// `y`, `mean` and `rstd` of `x` (`n` rows of `d`), shaped like `x` and
/// `[n]`.
pub(crate) fn forward<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    d: usize,
    gamma: Option<&CudaBuf<T>>,
    beta: Option<&CudaBuf<T>>,
    eps: f64,
) -> Result<Forward<T>> {
    let g = &x.gpu;
    let n = x.len / d;
    let mut y = g.uninit::<T>(x.len)?;
    let mut mean = g.uninit::<T::Acc>(n)?;
    let mut rstd = g.uninit::<T::Acc>(n)?;
    let (tpr, block) = team::<T>(d, 8);
    let r = forward_range(n);
    let (ga, ba) = (addr(gamma.map(|b| &b.data)), addr(beta.map(|b| &b.data)));
    launch!(g, "layer_norm forward", g.function::<T>(&KERNELS, "layer_norm_fwd")?,
        cfg(grid(n.div_ceil(r), block / tpr), block, 0);
        &x.data, &ga, &ba, &mut y, &mut mean, &mut rstd,
        &(n as i64), &(d as i64), &(tpr as i32), &(r as i64), &eps)?;
    Ok((
        Tensor::from_cuda(shape, g.clone(), y)?,
        Tensor::from_cuda(&[n], g.clone(), mean)?,
        Tensor::from_cuda(&[n], g.clone(), rstd)?,
    ))
}

/// dx, dgamma and dbeta (each when wanted).
pub(crate) struct Grads<T: Element> {
    pub(crate) dx: Option<Tensor<T>>,
    pub(crate) dgamma: Option<Tensor<T>>,
    pub(crate) dbeta: Option<Tensor<T>>,
}

/// The backward from `x`, `dy` and the saved statistics; `want` is
/// `(dx, dgamma, dbeta)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Element>(
    x: &CudaBuf<T>,
    dy: &CudaBuf<T>,
    (shape, normalized): (&[usize], &[usize]),
    d: usize,
    gamma: Option<&CudaBuf<T>>,
    (mean, rstd): (&CudaBuf<T::Acc>, &CudaBuf<T::Acc>),
    eps: f64,
    want: (bool, bool, bool),
) -> Result<Grads<T>> {
    let g = &x.gpu;
    let n = x.len / d;
    let (r, parts) = backward_ranges(n);
    let mut dx = if want.0 {
        Some(g.uninit::<T>(x.len)?)
    } else {
        None
    };
    let mut part = if want.1 || want.2 {
        Some(g.uninit::<T::Acc>(parts * 2 * d)?)
    } else {
        None
    };
    if n > 0 && (want.0 || part.is_some()) {
        let (tpr, block) = team::<T>(d, 2);
        let ga = addr(gamma.map(|b| &b.data));
        let (dxa, pa) = (addr(dx.as_ref()), addr(part.as_ref()));
        launch!(g, "layer_norm backward", g.function::<T>(&KERNELS, "layer_norm_bwd")?,
            cfg(grid(parts, block / tpr), block, 0);
            &x.data, &dy.data, &ga, &mean.data, &rstd.data, &dxa, &pa,
            &(n as i64), &(d as i64), &(tpr as i32), &(r as i64), &eps)?;
    }
    let (mut dgamma, mut dbeta) = (None, None);
    if let Some(part) = part.as_mut() {
        let mut dg = if want.1 {
            Some(g.uninit::<T>(d)?)
        } else {
            None
        };
        let mut db = if want.2 {
            Some(g.uninit::<T>(d)?)
        } else {
            None
        };
        let (dga, dba) = (addr(dg.as_ref()), addr(db.as_ref()));
        let np = if n > 0 { parts } else { 0 };
        launch!(g, "layer_norm backward", g.function::<T>(&KERNELS, "layer_norm_bwd_finalize")?,
            cfg((2 * d).div_ceil(32).clamp(1, 65_535) as u32, 256, 0);
            &*part, &dga, &dba, &(np as i64), &(d as i64))?;
        dgamma = dg
            .take()
            .map(|b| Tensor::from_cuda(normalized, g.clone(), b))
            .transpose()?;
        dbeta = db
            .take()
            .map(|b| Tensor::from_cuda(normalized, g.clone(), b))
            .transpose()?;
    }
    Ok(Grads {
        dx: dx
            .take()
            .map(|b| Tensor::from_cuda(shape, g.clone(), b))
            .transpose()?,
        dgamma,
        dbeta,
    })
}
