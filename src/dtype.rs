//! Element types and their accumulation types: numbers only. What a device
//! or an op family needs of a type is found by its [`DType`] or its type,
//! in that layer (`device::pool`, `device::cpu`, `ops::norm`), so nothing
//! here names a layer above.

use num_traits::{Float, FromPrimitive};
use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

/// The arithmetic type sums and statistics are carried in.
pub trait Accum:
    Float
    + FromPrimitive
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
    + Debug
    + Default
    + Send
    + Sync
    + 'static
{
    /// Widen to f64.
    fn f64(self) -> f64;
    /// Narrow from f64 (rounding).
    fn of(v: f64) -> Self;
}

impl Accum for f32 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn of(v: f64) -> Self {
        v as f32
    }
}

impl Accum for f64 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn of(v: f64) -> Self {
        v
    }
}

/// Which element type a tensor holds.
// `Probe` is a real type's variant (the probes' FLOP counter), only hidden.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `half::f16`.
    F16,
    /// `half::bf16`.
    BF16,
    /// A type of the developer probes (a FLOP counter); never a user's.
    #[doc(hidden)]
    Probe,
}

/// Plain data that any device can hold: with the `cuda` feature, what
/// cudarc needs to copy a type to and from device memory.
#[cfg(feature = "cuda")]
pub trait Plain: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
#[cfg(feature = "cuda")]
impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> Plain for T {}
/// Plain data that any device can hold.
#[cfg(not(feature = "cuda"))]
pub trait Plain {}
#[cfg(not(feature = "cuda"))]
impl<T> Plain for T {}

pub(crate) mod sealed {
    /// Implemented for the element types this crate has kernels for.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A tensor element: f32, f64, `half::f16` or `half::bf16` (sealed: the
/// kernels exist for these).
///
/// Arithmetic runs in [`Element::Acc`]: the type itself for f32 and f64, and
/// f32 for the 16-bit types, which are only a storage format.
pub trait Element:
    sealed::Sealed + Plain + Copy + Debug + Default + PartialEq + Send + Sync + 'static
{
    /// Accumulation type: itself an element (its own accumulation type), so
    /// that statistics and optimizer state are tensors too.
    type Acc: Accum + Element<Acc = Self::Acc>;
    /// Which type this is.
    const DTYPE: DType;
    /// Short name: "f32", "f64", "f16", "bf16".
    const NAME: &'static str;
    /// Widen to the accumulation type.
    fn to_acc(self) -> Self::Acc;
    /// Round from the accumulation type.
    fn from_acc(a: Self::Acc) -> Self;
    /// Widen to f64.
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.to_acc().f64()
    }
    /// Round from f64.
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Self::from_acc(<Self::Acc as Accum>::of(v))
    }
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    type Acc = f32;
    const NAME: &'static str = "f32";
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_acc(a: f32) -> Self {
        a
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    type Acc = f64;
    const NAME: &'static str = "f64";
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline(always)]
    fn to_acc(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_acc(a: f64) -> Self {
        a
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    type Acc = f32;
    const NAME: &'static str = "f16";
    const ZERO: Self = half::f16::ZERO;
    const ONE: Self = half::f16::ONE;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(a: f32) -> Self {
        half::f16::from_f32(a)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    type Acc = f32;
    const NAME: &'static str = "bf16";
    const ZERO: Self = half::bf16::ZERO;
    const ONE: Self = half::bf16::ONE;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(a: f32) -> Self {
        half::bf16::from_f32(a)
    }
}
