//! The optimizers' update on a GPU (`kernels/optim.cu`): one fused kernel
//! per rule and parameter, the new parameter and state in new buffers.

use super::Rule;
use crate::device::cuda::{blocks_for, cfg, launch, NULL};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{CudaBuf, Storage, Tensor};

/// This family's CUDA C (`kernels/optim.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "optim",
    source: include_str!("../../../kernels/optim.cu"),
};

/// A parameter and its optimizer state.
type Updated<T> = (Tensor<T>, Vec<Tensor<<T as Element>::Acc>>);

/// `rule` applied to parameter `p` with gradient `g` and state `prev`
/// (empty on the first step): the new parameter and state.
pub(crate) fn update<T: Element>(
    rule: Rule,
    p: &CudaBuf<T>,
    g: &CudaBuf<T>,
    shape: &[usize],
    prev: &[Tensor<T::Acc>],
) -> Result<Updated<T>> {
    let gpu = &p.gpu;
    let n = p.len;
    let mut prev_bufs = Vec::with_capacity(prev.len());
    for s in prev {
        match s.storage() {
            Storage::Cuda(b) => prev_bufs.push(&b.data),
            Storage::Cpu(_) => {
                return Err(Error::DeviceMismatch {
                    op: "optimizer step",
                    lhs: gpu.name(),
                    rhs: "cpu".into(),
                })
            }
        }
    }
    let first = prev_bufs.is_empty() as i32;
    let mut np = gpu.uninit::<T>(n)?;
    let blocks = cfg(blocks_for(n, 256), 256, 0);
    let mut state = Vec::new();
    if n > 0 {
        match rule {
            Rule::Sgd { lr, wd } => {
                launch!(gpu, "sgd", gpu.function::<T>(&KERNELS, "sgd")?, blocks;
                    &p.data, &g.data, &mut np, &(n as i64), &lr, &wd)?;
            }
            Rule::Momentum { lr, mu, wd } => {
                let mut v = gpu.uninit::<T::Acc>(n)?;
                let f = gpu.function::<T>(&KERNELS, "momentum")?;
                match prev_bufs.first() {
                    Some(v0) => launch!(gpu, "momentum", f, blocks;
                        &p.data, &g.data, *v0, &mut np, &mut v, &(n as i64), &lr, &mu, &wd, &first)?,
                    None => launch!(gpu, "momentum", f, blocks;
                        &p.data, &g.data, &NULL, &mut np, &mut v, &(n as i64), &lr, &mu, &wd, &first)?,
                }
                state.push(v);
            }
            Rule::Adam {
                decoupled,
                lr,
                b1,
                b2,
                c1,
                c2,
                eps,
                wd,
            } => {
                let name = if decoupled { "adamw" } else { "adam" };
                let f = gpu.function::<T>(&KERNELS, name)?;
                let (mut m, mut v) = (gpu.uninit::<T::Acc>(n)?, gpu.uninit::<T::Acc>(n)?);
                match (prev_bufs.first(), prev_bufs.get(1)) {
                    (Some(m0), Some(v0)) => launch!(gpu, name, f, blocks;
                        &p.data, &g.data, *m0, *v0, &mut np, &mut m, &mut v, &(n as i64),
                        &lr, &b1, &b2, &c1, &c2, &eps, &wd, &first)?,
                    _ => launch!(gpu, name, f, blocks;
                        &p.data, &g.data, &NULL, &NULL, &mut np, &mut m, &mut v, &(n as i64),
                        &lr, &b1, &b2, &c1, &c2, &eps, &wd, &1i32)?,
                }
                state.push(m);
                state.push(v);
            }
        }
    } else {
        for _ in 0..rule.states() {
            state.push(gpu.zeros::<T::Acc>(0)?);
        }
    }
    let state = state
        .into_iter()
        .map(|b| Tensor::from_cuda(shape, gpu.clone(), b))
        .collect::<Result<Vec<_>>>()?;
    Ok((Tensor::from_cuda(shape, gpu.clone(), np)?, state))
}
