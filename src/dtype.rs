//! Element types and their accumulation types.

use crate::device::pool::{Buffer, Pool};
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
pub trait Element: Copy + Debug + Default + PartialEq + Send + Sync + 'static {
    /// Accumulation type.
    type Acc: Accum;
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
    #[inline(always)]
    fn zero() -> Self {
        Self::from_f64(0.0)
    }
    /// One.
    #[inline(always)]
    fn one() -> Self {
        Self::from_f64(1.0)
    }
    /// The cache of large buffers of this type.
    fn pool() -> &'static Pool<Self>;

    // The fused CPU kernels for this type. They are generic over the
    // element type; called from generic code, every crate that runs an op
    // (each test binary and example) would compile its own copies of every
    // SIMD build, since optimized builds do not share generic instances
    // across crates. Each type's impl below is non-generic, so its kernels
    // are compiled once, in this crate. Not part of the public API.

    /// LayerNorm forward: `(y, mean, rstd)`.
    #[doc(hidden)]
    fn ln_forward(
        x: &[Self],
        d: usize,
        gamma: Option<&[Self]>,
        beta: Option<&[Self]>,
        eps: Self::Acc,
    ) -> (Buffer<Self>, Vec<Self::Acc>, Vec<Self::Acc>);
    /// LayerNorm backward: `[dx, dgamma, dbeta]`, each where `want` asks.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn ln_backward(
        x: &[Self],
        dy: &[Self],
        d: usize,
        gamma: Option<&[Self]>,
        mean: &[Self::Acc],
        rstd: &[Self::Acc],
        want: [bool; 3],
    ) -> [Option<Buffer<Self>>; 3];
    /// RMSNorm forward: `(y, rstd)`.
    #[doc(hidden)]
    fn rms_forward(
        x: &[Self],
        d: usize,
        gamma: Option<&[Self]>,
        eps: Self::Acc,
    ) -> (Buffer<Self>, Vec<Self::Acc>);
    /// RMSNorm backward: `[dx, dgamma]`, each where `want` asks.
    #[doc(hidden)]
    fn rms_backward(
        x: &[Self],
        dy: &[Self],
        d: usize,
        gamma: Option<&[Self]>,
        rstd: &[Self::Acc],
        want: [bool; 2],
    ) -> [Option<Buffer<Self>>; 2];
}

/// The kernel methods of [`Element`], for one concrete type (`$a` is its
/// accumulation type): each instantiates the generic kernel once, here.
macro_rules! kernels {
    ($a:ty) => {
        #[inline(never)]
        fn ln_forward(
            x: &[Self],
            d: usize,
            gamma: Option<&[Self]>,
            beta: Option<&[Self]>,
            eps: $a,
        ) -> (crate::device::pool::Buffer<Self>, Vec<$a>, Vec<$a>) {
            let f = crate::ops::layer_norm::cpu::forward(x, d, gamma, beta, eps);
            (f.y, f.mean, f.rstd)
        }
        #[inline(never)]
        fn ln_backward(
            x: &[Self],
            dy: &[Self],
            d: usize,
            gamma: Option<&[Self]>,
            mean: &[$a],
            rstd: &[$a],
            [dx, dg, db]: [bool; 3],
        ) -> [Option<crate::device::pool::Buffer<Self>>; 3] {
            use crate::ops::layer_norm::cpu;
            let b = cpu::backward(x, dy, d, gamma, mean, rstd, dx, dg, db);
            [b.dx, b.dgamma, b.dbeta]
        }
        #[inline(never)]
        fn rms_forward(
            x: &[Self],
            d: usize,
            gamma: Option<&[Self]>,
            eps: $a,
        ) -> (crate::device::pool::Buffer<Self>, Vec<$a>) {
            crate::ops::rms_norm::cpu::forward(x, d, gamma, eps)
        }
        #[inline(never)]
        fn rms_backward(
            x: &[Self],
            dy: &[Self],
            d: usize,
            gamma: Option<&[Self]>,
            rstd: &[$a],
            [dx, dg]: [bool; 2],
        ) -> [Option<crate::device::pool::Buffer<Self>>; 2] {
            let (dx, dg) = crate::ops::rms_norm::cpu::backward(x, dy, d, gamma, rstd, dx, dg);
            [dx, dg]
        }
    };
}
pub(crate) use kernels;

impl Element for f32 {
    kernels!(f32);
    fn pool() -> &'static Pool<Self> {
        static P: Pool<f32> = Pool::new();
        &P
    }
    type Acc = f32;
    const NAME: &'static str = "f32";
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
    kernels!(f64);
    fn pool() -> &'static Pool<Self> {
        static P: Pool<f64> = Pool::new();
        &P
    }
    type Acc = f64;
    const NAME: &'static str = "f64";
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
    kernels!(f32);
    fn pool() -> &'static Pool<Self> {
        static P: Pool<half::f16> = Pool::new();
        &P
    }
    type Acc = f32;
    const NAME: &'static str = "f16";
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
    kernels!(f32);
    fn pool() -> &'static Pool<Self> {
        static P: Pool<half::bf16> = Pool::new();
        &P
    }
    type Acc = f32;
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(a: f32) -> Self {
        half::bf16::from_f32(a)
    }
}
