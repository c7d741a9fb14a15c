//! Element types and their accumulation types.

use crate::device::cpu::CpuBuilds;
use crate::device::pool::Pool;
use crate::ops::norm::NormOps;
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

/// A tensor element: f32, f64, `half::f16` or `half::bf16`.
///
/// Arithmetic runs in [`Element::Acc`]: the type itself for f32 and f64, and
/// f32 for the 16-bit types, which are only a storage format.
///
/// `NormOps` and `CpuBuilds` are sealed supertraits: the fused norms'
/// per-type entry points, compiled once in this crate (see
/// `ops/norm/mod.rs`), and which CPU kernel builds the type has.
pub trait Element:
    NormOps
    + CpuBuilds
    + crate::device::DeviceElement
    + Copy
    + Debug
    + Default
    + PartialEq
    + Send
    + Sync
    + 'static
{
    /// Accumulation type: itself an element (its own accumulation type), so
    /// that statistics and optimizer state are tensors too.
    type Acc: Accum + Element<Acc = Self::Acc>;
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
    /// The cache of large buffers of this type (crate-private).
    #[doc(hidden)]
    fn pool() -> &'static Pool<Self>;
}

impl Element for f32 {
    fn pool() -> &'static Pool<Self> {
        static P: Pool<f32> = Pool::new();
        &P
    }
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
    fn pool() -> &'static Pool<Self> {
        static P: Pool<f64> = Pool::new();
        &P
    }
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
    fn pool() -> &'static Pool<Self> {
        static P: Pool<half::f16> = Pool::new();
        &P
    }
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
    fn pool() -> &'static Pool<Self> {
        static P: Pool<half::bf16> = Pool::new();
        &P
    }
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
