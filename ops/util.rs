//! Shared kernels for elementwise ops: unary maps and broadcasting binary
//! maps, computed in the element's accumulation type.

use crate::dtype::Element;
use crate::error::Result;
use crate::shape::{broadcast_shapes, broadcast_strides, checked_numel, for_each_offset};
use crate::tensor::Tensor;

type Acc<T> = <T as Element>::Acc;

/// `f` applied to every element.
pub fn map<T: Element>(x: &Tensor<T>, f: impl Fn(Acc<T>) -> Acc<T>) -> Result<Tensor<T>> {
    let v = x
        .as_slice()?
        .iter()
        .map(|&a| T::from_acc(f(a.to_acc())))
        .collect();
    Tensor::from_shape(x.shape(), v)
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
        let v = sa
            .iter()
            .zip(sb)
            .map(|(&x, &y)| T::from_acc(f(x.to_acc(), y.to_acc())))
            .collect();
        return Tensor::from_shape(a.shape(), v);
    }
    let out = broadcast_shapes(op, a.shape(), b.shape())?;
    let n = checked_numel(op, &out, std::mem::size_of::<T>())?;
    if b.numel() == 1 && out == a.shape() {
        let y = sb[0].to_acc();
        return Tensor::from_vec(
            out,
            sa.iter().map(|&x| T::from_acc(f(x.to_acc(), y))).collect(),
        );
    }
    // Offsets into `a` and `b` for each output element.
    let mut oa = Vec::with_capacity(n);
    for_each_offset(&out, &broadcast_strides(a.shape(), &out), |_, o| oa.push(o));
    let mut v = Vec::with_capacity(n);
    let mut k = 0;
    for_each_offset(&out, &broadcast_strides(b.shape(), &out), |_, o| {
        v.push(T::from_acc(f(sa[oa[k]].to_acc(), sb[o].to_acc())));
        k += 1;
    });
    Tensor::from_vec(out, v)
}

/// `f(a, b, c)` elementwise; all three share one shape.
pub fn zip3<T: Element>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    c: &Tensor<T>,
    f: impl Fn(Acc<T>, Acc<T>, Acc<T>) -> Acc<T>,
) -> Result<Tensor<T>> {
    let (sa, sb, sc) = (a.as_slice()?, b.as_slice()?, c.as_slice()?);
    let v = sa
        .iter()
        .zip(sb)
        .zip(sc)
        .map(|((&x, &y), &z)| T::from_acc(f(x.to_acc(), y.to_acc(), z.to_acc())))
        .collect();
    Tensor::from_shape(a.shape(), v)
}
