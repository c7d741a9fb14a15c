//! The fused norms on a GPU (`kernels/norm.cu`): one forward kernel
//! writing y and the statistics; a backward kernel writing dx and per-range
//! dgamma/dbeta partials, then a finalize kernel adding the partials in a
//! fixed order. The scaled fallback for extreme rows runs inside the
//! kernels, so no call waits on the host. LayerNorm and RMSNorm launch the
//! same core's two instantiations; RMSNorm's take no mean, beta or dbeta.

use super::Grads;
use crate::device::cuda::{addr, cfg, launch};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{CudaBuf, Storage, Tensor};

/// This family's CUDA C.
pub(crate) static KERNELS: Family = Family {
    name: "norm",
    source: include_str!("../../kernels/norm.cu"),
};

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

/// The output and the saved statistics (mean for LayerNorm, rstd).
type Forward<T> = (
    Tensor<T>,
    Option<Tensor<<T as Element>::Acc>>,
    Tensor<<T as Element>::Acc>,
);

/// `y`, `mean` (if `centre`) and `rstd` of `x` (`n` rows of `d`), shaped
/// like `x` and `[n]`.
pub(crate) fn forward<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    d: usize,
    (gamma, beta): (Option<&CudaBuf<T>>, Option<&CudaBuf<T>>),
    eps: f64,
    centre: bool,
) -> Result<Forward<T>> {
    let g = &x.gpu;
    let n = x.len / d;
    let mut y = g.uninit::<T>(x.len)?;
    let mut mean = if centre {
        Some(g.uninit::<T::Acc>(n)?)
    } else {
        None
    };
    let mut rstd = g.uninit::<T::Acc>(n)?;
    let (tpr, block) = team::<T>(d, 8);
    let r = forward_range(n);
    let lc = cfg(grid(n.div_ceil(r), block / tpr), block, 0);
    let ga = addr(gamma.map(|b| &b.data));
    let geo = (n as i64, d as i64, tpr as i32, r as i64);
    if let Some(mean) = mean.as_mut() {
        let ba = addr(beta.map(|b| &b.data));
        launch!(g, "layer_norm forward", g.function::<T>(&KERNELS, "layer_norm_fwd")?, lc;
            &x.data, &ga, &ba, &mut y, mean, &mut rstd,
            &geo.0, &geo.1, &geo.2, &geo.3, &eps)?;
    } else {
        launch!(g, "rms_norm forward", g.function::<T>(&KERNELS, "rms_norm_fwd")?, lc;
            &x.data, &ga, &mut y, &mut rstd,
            &geo.0, &geo.1, &geo.2, &geo.3, &eps)?;
    }
    let stat = |b| Tensor::from_cuda(&[n], g.clone(), b);
    Ok((
        Tensor::from_cuda(shape, g.clone(), y)?,
        mean.map(stat).transpose()?,
        stat(rstd)?,
    ))
}

/// The backward from `x`, `dy` and the saved statistics (`mean` is `None`
/// for RMSNorm); `want` is `(dx, dgamma, dbeta)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Element>(
    x: &CudaBuf<T>,
    dy: &CudaBuf<T>,
    (shape, normalized): (&[usize], &[usize]),
    d: usize,
    gamma: Option<&CudaBuf<T>>,
    (mean, rstd): (Option<&CudaBuf<T::Acc>>, &CudaBuf<T::Acc>),
    eps: f64,
    want: (bool, bool, bool),
) -> Result<Grads<T>> {
    let g = &x.gpu;
    let n = x.len / d;
    let centre = mean.is_some();
    // Partial rows hold dgamma then (LayerNorm) dbeta terms.
    let width = if centre { 2 * d } else { d };
    let want_db = centre && want.2;
    let (r, parts) = backward_ranges(n);
    let mut dx = if want.0 {
        Some(g.uninit::<T>(x.len)?)
    } else {
        None
    };
    let mut part = if want.1 || want_db {
        Some(g.uninit::<T::Acc>(parts * width)?)
    } else {
        None
    };
    if n > 0 && (want.0 || part.is_some()) {
        let (tpr, block) = team::<T>(d, 2);
        let lc = cfg(grid(parts, block / tpr), block, 0);
        let ga = addr(gamma.map(|b| &b.data));
        let (dxa, pa) = (addr(dx.as_ref()), addr(part.as_ref()));
        let geo = (n as i64, d as i64, tpr as i32, r as i64);
        if let Some(mean) = mean {
            launch!(g, "layer_norm backward", g.function::<T>(&KERNELS, "layer_norm_bwd")?, lc;
                &x.data, &dy.data, &ga, &mean.data, &rstd.data, &dxa, &pa,
                &geo.0, &geo.1, &geo.2, &geo.3, &eps)?;
        } else {
            launch!(g, "rms_norm backward", g.function::<T>(&KERNELS, "rms_norm_bwd")?, lc;
                &x.data, &dy.data, &ga, &rstd.data, &dxa, &pa,
                &geo.0, &geo.1, &geo.2, &geo.3, &eps)?;
        }
    }
    let (mut dgamma, mut dbeta) = (None, None);
    if let Some(part) = part.as_mut() {
        let mut dg = if want.1 {
            Some(g.uninit::<T>(d)?)
        } else {
            None
        };
        let mut db = if want_db {
            Some(g.uninit::<T>(d)?)
        } else {
            None
        };
        let (dga, dba) = (addr(dg.as_ref()), addr(db.as_ref()));
        let np = if n > 0 { parts } else { 0 };
        let lc = cfg(width.div_ceil(32).clamp(1, 65_535) as u32, 256, 0);
        if centre {
            launch!(g, "layer_norm backward",
                g.function::<T>(&KERNELS, "layer_norm_bwd_finalize")?, lc;
                &*part, &dga, &dba, &(np as i64), &(d as i64))?;
        } else {
            launch!(g, "rms_norm backward", g.function::<T>(&KERNELS, "rms_norm_bwd_finalize")?, lc;
                &*part, &dga, &(np as i64), &(d as i64))?;
        }
        let param = |b| Tensor::from_cuda(normalized, g.clone(), b);
        dgamma = dg.take().map(param).transpose()?;
        dbeta = db.take().map(param).transpose()?;
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

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![geometry_follows_the_kernels_rule];

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
