//! Shared kernels for elementwise ops: unary maps and broadcasting binary
//! maps, computed in the element's accumulation type. Same-shape outputs
//! come from the buffer pool, 64-byte aligned ([`Buffer::collect`]).

use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::error::Result;
use crate::shape::{alloc, broadcast_shapes, broadcast_strides, for_each_offset};
use crate::tensor::Tensor;

type Acc<T> = <T as Element>::Acc;

/// `f` applied to every element.
pub fn map<T: Element>(x: &Tensor<T>, f: impl Fn(Acc<T>) -> Acc<T>) -> Result<Tensor<T>> {
    let src = x.as_slice()?;
    let out = src.iter().map(|&a| T::from_acc(f(a.to_acc())));
    Tensor::from_buffer(x.shape(), Buffer::collect(src.len(), out))
}

/// `f(a, b)` elementwise over two tensors of the same shape.
#[allow(dead_code)]
pub fn zip<T: Element>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    f: impl Fn(Acc<T>, Acc<T>) -> Acc<T>,
) -> Result<Tensor<T>> {
    broadcast_zip("zip", a, b, f)
}

/// `f(a, b)` elementwise with NumPy broadcasting.
pub fn broadcast_zip<T: Element>(
    op: &'static str,
    a: &Tensor<T>,
    b: &Tensor<T>,
    f: impl Fn(Acc<T>, Acc<T>) -> Acc<T>,
) -> Result<Tensor<T>> {
    let (sa, sb) = (a.as_slice()?, b.as_slice()?);
    if a.shape() == b.shape() {
        let out = sa.iter().zip(sb);
        let out = out.map(|(&x, &y)| T::from_acc(f(x.to_acc(), y.to_acc())));
        return Tensor::from_buffer(a.shape(), Buffer::collect(sa.len(), out));
    }
    let out = broadcast_shapes(op, a.shape(), b.shape())?;
    // The output can be far larger than either input: allocate fallibly.
    let mut v = alloc::<T>(op, &out)?;
    if b.numel() == 1 && out == a.shape() {
        let y = sb[0].to_acc();
        v.extend(sa.iter().map(|&x| T::from_acc(f(x.to_acc(), y))));
        return Tensor::from_vec(out, v);
    }
    // Offsets into `a` and `b` for each output element.
    let mut oa = alloc::<usize>(op, &out)?;
    for_each_offset(&out, &broadcast_strides(a.shape(), &out), |_, o| oa.push(o));
    let mut k = 0;
    for_each_offset(&out, &broadcast_strides(b.shape(), &out), |_, o| {
        v.push(T::from_acc(f(sa[oa[k]].to_acc(), sb[o].to_acc())));
        k += 1;
    });
    Tensor::from_vec(out, v)
}
