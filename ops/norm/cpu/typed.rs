//! The kernels' entry points: one plain (non-generic) function per element
//! type, picked by the type's [`DType`] and handed the tensors' buffers as
//! the type they are (an `Any` downcast). A plain fn is compiled once, in
//! this crate, with every SIMD build of the kernels under it; called
//! through generic code instead, the kernels would be compiled again in
//! every crate that runs a norm (each test binary and example), since
//! optimized builds do not share generic instances across crates.

use super::{backward_checked, forward_checked, Backward, Checked};
use crate::device::pool::Buffer;
use crate::dtype::{Accum, DType, Element};
use crate::error::{Error, Result};
use std::any::Any;

type Acc<T> = <T as Element>::Acc;

/// Gamma and beta, each if present.
type Params<'a, T> = (Option<&'a Buffer<T>>, Option<&'a Buffer<T>>);

/// Saved statistics: mean (LayerNorm only) and rstd.
type Stats<'a, T> = (Option<&'a Buffer<Acc<T>>>, &'a Buffer<Acc<T>>);

/// Which gradients are wanted: `(dx, dgamma, dbeta)`.
type Want = (bool, bool, bool);

/// The forward of one element type: `x`, `d`, the parameters, eps and
/// `centre`.
type FwdFn<U> = fn(&Buffer<U>, usize, Params<'_, U>, f64, bool) -> Checked<U>;

/// The backward of one element type: `x`, `dy`, `d`, gamma, the saved
/// statistics, whether the forward took the fallback, eps and `want`.
type BwdFn<U> = fn(
    &Buffer<U>,
    &Buffer<U>,
    usize,
    Option<&Buffer<U>>,
    Stats<'_, U>,
    bool,
    f64,
    Want,
) -> Backward<U>;

/// Writes the forward and backward entry points of element type `$t`.
macro_rules! entries {
    ($fwd:ident, $bwd:ident: $t:ty) => {
        #[inline(never)]
        fn $fwd(x: &Buffer<$t>, d: usize, p: Params<'_, $t>, eps: f64, c: bool) -> Checked<$t> {
            let (g, b) = (p.0.map(|v| &v[..]), p.1.map(|v| &v[..]));
            forward_checked(x, d, g, b, Accum::of(eps), c)
        }

        #[allow(clippy::too_many_arguments)]
        #[inline(never)]
        fn $bwd(
            x: &Buffer<$t>,
            dy: &Buffer<$t>,
            d: usize,
            g: Option<&Buffer<$t>>,
            (m, r): Stats<'_, $t>,
            scaled: bool,
            eps: f64,
            want: Want,
        ) -> Backward<$t> {
            let stats = (m.map(|v| &v[..]), &r[..]);
            let g = g.map(|v| &v[..]);
            backward_checked(x, dy, d, g, stats, scaled, Accum::of(eps), want)
        }
    };
}

entries!(fwd_f32, bwd_f32: f32);
entries!(fwd_f64, bwd_f64: f64);
entries!(fwd_f16, bwd_f16: half::f16);
entries!(fwd_bf16, bwd_bf16: half::bf16);
#[cfg(feature = "probes")]
entries!(fwd_counted, bwd_counted: crate::probes::counted::Counted);

/// The forward (with the scaled fallback) of `x`'s rows of `d`; `mean`
/// comes back empty unless `centre`. `eps` is `T::Acc`'s checked eps,
/// widened (so converting it back is exact).
pub(crate) fn forward<T: Element>(
    x: &Buffer<T>,
    d: usize,
    p: Params<'_, T>,
    eps: f64,
    centre: bool,
) -> Result<Checked<T>> {
    match T::DTYPE {
        DType::F32 => fwd_as(fwd_f32, x, d, p, eps, centre),
        DType::F64 => fwd_as(fwd_f64, x, d, p, eps, centre),
        DType::F16 => fwd_as(fwd_f16, x, d, p, eps, centre),
        DType::BF16 => fwd_as(fwd_bf16, x, d, p, eps, centre),
        #[cfg(feature = "probes")]
        DType::Probe => fwd_as(fwd_counted, x, d, p, eps, centre),
        #[cfg(not(feature = "probes"))]
        DType::Probe => Err(unknown::<T>()),
    }
}

/// The backward of a node (see [`backward_checked`]); `mean` is `None`
/// for RMSNorm, `eps` as for [`forward`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Element>(
    x: &Buffer<T>,
    dy: &Buffer<T>,
    d: usize,
    g: Option<&Buffer<T>>,
    stats: Stats<'_, T>,
    scaled: bool,
    eps: f64,
    want: Want,
) -> Result<Backward<T>> {
    let args = (x, dy, d, g, stats, scaled, eps, want);
    match T::DTYPE {
        DType::F32 => bwd_as(bwd_f32, args),
        DType::F64 => bwd_as(bwd_f64, args),
        DType::F16 => bwd_as(bwd_f16, args),
        DType::BF16 => bwd_as(bwd_bf16, args),
        #[cfg(feature = "probes")]
        DType::Probe => bwd_as(bwd_counted, args),
        #[cfg(not(feature = "probes"))]
        DType::Probe => Err(unknown::<T>()),
    }
}

/// `f` on the arguments seen as `U`'s, the type `T` is.
fn fwd_as<T: Element, U: Element>(
    f: FwdFn<U>,
    x: &Buffer<T>,
    d: usize,
    (g, b): Params<'_, T>,
    eps: f64,
    centre: bool,
) -> Result<Checked<T>> {
    let p = (opt::<T, U>(g)?, opt::<T, U>(b)?);
    back(f(same::<T, U>(x)?, d, p, eps, centre))
}

/// The backward's arguments, in [`BwdFn`]'s order.
type BwdArgs<'a, T> = (
    &'a Buffer<T>,
    &'a Buffer<T>,
    usize,
    Option<&'a Buffer<T>>,
    Stats<'a, T>,
    bool,
    f64,
    Want,
);

/// `f` on the arguments seen as `U`'s, the type `T` is.
fn bwd_as<T: Element, U: Element>(f: BwdFn<U>, a: BwdArgs<'_, T>) -> Result<Backward<T>> {
    let (x, dy, d, g, (m, r), scaled, eps, want) = a;
    let stats = (opt::<Acc<T>, Acc<U>>(m)?, same::<Acc<T>, Acc<U>>(r)?);
    let (x, dy, g) = (same::<T, U>(x)?, same::<T, U>(dy)?, opt::<T, U>(g)?);
    back(f(x, dy, d, g, stats, scaled, eps, want))
}

/// `b` as a buffer of `U`, the type `T` is.
fn same<T: Element, U: Element>(b: &Buffer<T>) -> Result<&Buffer<U>> {
    let any: &dyn Any = b;
    any.downcast_ref::<Buffer<U>>().ok_or_else(unknown::<T>)
}

/// [`same`] of an optional buffer.
fn opt<T: Element, U: Element>(b: Option<&Buffer<T>>) -> Result<Option<&Buffer<U>>> {
    b.map(same::<T, U>).transpose()
}

/// An output of `U`'s kernels as the type `R` it is.
fn back<R: 'static, S: 'static>(out: S) -> Result<R> {
    let any: Box<dyn Any> = Box::new(out);
    any.downcast::<R>()
        .map(|v| *v)
        .map_err(|_| Error::InvalidArgument {
            op: "fused norm",
            msg: "kernel output of another element type".into(),
        })
}

/// The error for an element type without fused norm kernels (none of the
/// public types: `Element` is sealed).
fn unknown<T: Element>() -> Error {
    Error::InvalidArgument {
        op: "fused norm",
        msg: format!("no fused norm kernels for element type {}", T::NAME),
    }
}
