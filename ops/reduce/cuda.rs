//! Sums over axes on a GPU (`kernels/reduce.cu`). The reduced axes are
//! merged into `[outer, r, inner]` where they form one block (as the CPU
//! does), so rows and columns take the warp/column kernels, long ones a
//! two-launch split through a scratch of partial sums; any other axis set
//! takes the strided kernel. Every variant and its geometry is chosen from
//! the shape alone, so the bits do not depend on the device.

use crate::device::cuda::{cfg, launch, Strides, MAX_RANK};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::alloc_filled;
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/reduce.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "reduce",
    source: include_str!("../../kernels/reduce.cu"),
};

const BLOCK: u32 = 256;
/// Warps per block of the row kernels (`BLOCK / 32`).
const WARPS: usize = BLOCK as usize / 32;
/// Elements per partial sum of a long row (`sum_rows_part`).
const ROW_CHUNK: usize = 16_384;
/// Rows per partial sum of a long column (`sum_cols_part`).
const COL_CHUNK: usize = 256;

/// Blocks for `units` work items, one block each, capped at the kernels'
/// grid limit (their loops stride over the rest).
fn grid(units: usize) -> u32 {
    units.clamp(1, 65_535) as u32
}

/// The dims of `shape` other than size-1 ones, adjacent dims of the same
/// kind merged: `(reduced, size, stride in elements)`. Merging keeps the
/// row-major walk, since a run of dims of one kind is one contiguous index.
fn merged(shape: &[usize], red: &[bool]) -> Vec<(bool, usize, usize)> {
    let mut groups: Vec<(bool, usize, usize)> = Vec::new();
    let mut stride = 1usize;
    for (&n, &r) in shape.iter().zip(red).rev() {
        if n != 1 {
            match groups.last_mut() {
                // Walking backwards, a group's stride is its innermost dim's.
                Some((gr, gn, _)) if *gr == r => *gn *= n,
                _ => groups.push((r, n, stride)),
            }
        }
        stride *= n;
    }
    groups.reverse();
    groups
}

/// `(outer, r, inner)` when the reduced groups form one block.
fn blocks(groups: &[(bool, usize, usize)]) -> Option<(usize, usize, usize)> {
    match groups {
        [] => Some((1, 1, 1)),
        [(true, r, _)] => Some((1, *r, 1)),
        [(false, o, _)] => Some((*o, 1, 1)),
        [(true, r, _), (false, i, _)] => Some((1, *r, *i)),
        [(false, o, _), (true, r, _)] => Some((*o, *r, 1)),
        [(false, o, _), (true, r, _), (false, i, _)] => Some((*o, *r, *i)),
        _ => None,
    }
}

/// `x` (of `shape`) summed over the axes where `red` is set, each sum
/// divided by `div` when given, into a tensor of shape `out` (whose element
/// count is the product of the kept dims).
pub(crate) fn sum<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    red: &[bool],
    div: Option<usize>,
    out: &[usize],
) -> Result<Tensor<T>> {
    let g = &x.gpu;
    let nout: usize = out.iter().product();
    if x.len == 0 {
        // Sums over nothing are 0, as on the CPU: a fill, no launch.
        return Tensor::from_cuda(out, g.clone(), g.zeros::<T>(nout)?);
    }
    // A sum is divided by 1 exactly; a mean's count is rounded to the
    // accumulator inside the kernel, as the CPU's `Acc::of(n as f64)`.
    let div = div.map_or(1.0, |n| n as f64);
    let groups = merged(shape, red);
    let mut y = g.uninit::<T>(nout)?;
    match blocks(&groups) {
        Some((outer, r, 1)) if outer >= 2048 || r <= 32_768 => {
            launch!(g, "sum_rows", g.function::<T>(&KERNELS, "sum_rows")?,
                cfg(grid(outer.div_ceil(WARPS)), BLOCK, 0);
                &x.data, &mut y, &(outer as i64), &(r as i64), &div)?;
        }
        Some((outer, r, 1)) => {
            // Few long rows: per-chunk partials (in A), then their row sums.
            let nchunk = r.div_ceil(ROW_CHUNK);
            let mut part = g.uninit::<T::Acc>(outer * nchunk)?;
            launch!(g, "sum_rows_part", g.function::<T>(&KERNELS, "sum_rows_part")?,
                cfg(grid(outer * nchunk), BLOCK, 0);
                &x.data, &mut part, &(outer as i64), &(r as i64), &(ROW_CHUNK as i64))?;
            launch!(g, "sum_rows_final", g.function::<T>(&KERNELS, "sum_rows_final")?,
                cfg(grid(outer.div_ceil(WARPS)), BLOCK, 0);
                &part, &mut y, &(outer as i64), &(nchunk as i64), &div)?;
        }
        Some((outer, r, inner)) if outer * inner >= 16_384 || r <= 1024 => {
            launch!(g, "sum_cols", g.function::<T>(&KERNELS, "sum_cols")?,
                cfg(grid((outer * inner).div_ceil(BLOCK as usize)), BLOCK, 0);
                &x.data, &mut y, &(outer as i64), &(r as i64), &(inner as i64), &div)?;
        }
        Some((outer, r, inner)) => {
            // Few long columns: per-chunk partial columns, then their sums.
            let nchunk = r.div_ceil(COL_CHUNK);
            let mut part = g.uninit::<T::Acc>(outer * nchunk * inner)?;
            launch!(g, "sum_cols_part", g.function::<T>(&KERNELS, "sum_cols_part")?,
                cfg(grid((outer * nchunk * inner).div_ceil(BLOCK as usize)), BLOCK, 0);
                &x.data, &mut part, &(outer as i64), &(r as i64), &(inner as i64),
                &(COL_CHUNK as i64))?;
            launch!(g, "sum_cols_final", g.function::<T>(&KERNELS, "sum_cols_final")?,
                cfg(grid((outer * inner).div_ceil(BLOCK as usize)), BLOCK, 0);
                &part, &mut y, &(outer as i64), &(nchunk as i64), &(inner as i64), &div)?;
        }
        None => {
            if groups.len() > MAX_RANK {
                return Err(Error::InvalidArgument {
                    op: "reduce",
                    msg: format!(
                        "{} alternating runs of reduced and kept axes are above the CUDA \
                         kernels' limit of {MAX_RANK}",
                        groups.len()
                    ),
                });
            }
            // The kept groups first (the output's row-major order), then the
            // reduced ones, each with its stride in x.
            let mut s = Strides {
                rank: groups.len() as i32,
                ..Default::default()
            };
            let order = groups
                .iter()
                .filter(|g| !g.0)
                .chain(groups.iter().filter(|g| g.0));
            for (d, &(_, n, st)) in order.enumerate() {
                s.shape[d] = n as i64;
                s.a[d] = st as i64;
            }
            let nkeep = groups.iter().filter(|g| !g.0).count();
            let nred: usize = groups.iter().filter(|g| g.0).map(|g| g.1).product();
            // The summation order depends on the block size: from nred only.
            let block = match nred {
                0..=1024 => 32,
                1025..=16_384 => 128,
                _ => 512,
            };
            launch!(g, "sum_strided", g.function::<T>(&KERNELS, "sum_strided")?,
                cfg(grid(nout), block, 0);
                &x.data, &mut y, &s, &(nkeep as i32), &(nout as i64), &(nred as i64), &div)?;
        }
    }
    Tensor::from_cuda(out, g.clone(), y)
}

/// A tensor of `shape` on `x`'s GPU with every element `v` (a reduction
/// over zero elements; the output may be far larger than the empty input,
/// so the host copy is allocated fallibly).
pub(crate) fn filled<T: Element>(
    x: &CudaBuf<T>,
    op: &'static str,
    shape: &[usize],
    v: T,
) -> Result<Tensor<T>> {
    let host = alloc_filled(op, shape, v)?;
    Tensor::from_cuda(shape, x.gpu.clone(), x.gpu.upload(&host)?)
}
