//! A number type that counts its arithmetic, to measure FLOPs.
use crate::dtype::{Accum, Element};
use num_traits::{Float, FromPrimitive, Num, NumCast, One, ToPrimitive, Zero};
use std::cell::Cell;
use std::num::FpCategory;
use std::ops::*;

thread_local! {
    static FLOPS: Cell<u64> = const { Cell::new(0) };
}

fn tick(n: u64) {
    FLOPS.with(|c| c.set(c.get() + n));
}

/// Operations counted on this thread since the last [`take`].
pub fn take() -> u64 {
    FLOPS.with(|c| c.replace(0))
}

/// An f64 that counts the arithmetic done with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd)]
pub struct Counted(pub f64);

// SAFETY: one f64; all-zero bits are 0.0. (Never sent to a GPU; the
// bounds come with `Element`.)
#[cfg(feature = "cuda")]
unsafe impl cudarc::driver::DeviceRepr for Counted {}
#[cfg(feature = "cuda")]
unsafe impl cudarc::driver::ValidAsZeroBits for Counted {}

macro_rules! binop {
    ($($tr:ident $f:ident $atr:ident $af:ident $op:tt),*) => {$(
        impl $tr for Counted {
            type Output = Counted;
            #[inline(always)]
            fn $f(self, o: Counted) -> Counted { tick(1); Counted(self.0 $op o.0) }
        }
        impl $atr for Counted {
            #[inline(always)]
            fn $af(&mut self, o: Counted) { tick(1); self.0 = self.0 $op o.0 }
        }
    )*};
}
binop!(Add add AddAssign add_assign +, Sub sub SubAssign sub_assign -,
       Mul mul MulAssign mul_assign *, Div div DivAssign div_assign /,
       Rem rem RemAssign rem_assign %);

impl Neg for Counted {
    type Output = Counted;
    fn neg(self) -> Counted {
        Counted(-self.0)
    }
}

impl std::iter::Sum for Counted {
    fn sum<I: Iterator<Item = Counted>>(it: I) -> Counted {
        it.fold(Counted(0.0), |a, b| a + b)
    }
}

impl Zero for Counted {
    fn zero() -> Self {
        Counted(0.0)
    }
    fn is_zero(&self) -> bool {
        self.0 == 0.0
    }
}
impl One for Counted {
    fn one() -> Self {
        Counted(1.0)
    }
}
impl Num for Counted {
    type FromStrRadixErr = <f64 as Num>::FromStrRadixErr;
    fn from_str_radix(s: &str, r: u32) -> Result<Self, Self::FromStrRadixErr> {
        f64::from_str_radix(s, r).map(Counted)
    }
}
impl ToPrimitive for Counted {
    fn to_i64(&self) -> Option<i64> {
        self.0.to_i64()
    }
    fn to_u64(&self) -> Option<u64> {
        self.0.to_u64()
    }
    fn to_f64(&self) -> Option<f64> {
        Some(self.0)
    }
}
impl NumCast for Counted {
    fn from<N: ToPrimitive>(n: N) -> Option<Self> {
        n.to_f64().map(Counted)
    }
}
impl FromPrimitive for Counted {
    fn from_i64(n: i64) -> Option<Self> {
        Some(Counted(n as f64))
    }
    fn from_u64(n: u64) -> Option<Self> {
        Some(Counted(n as f64))
    }
    fn from_f64(n: f64) -> Option<Self> {
        Some(Counted(n))
    }
}

macro_rules! free {
    ($($f:ident),*) => {$( fn $f() -> Self { Counted(f64::$f()) } )*};
}
macro_rules! pred {
    ($($f:ident),*) => {$( fn $f(self) -> bool { self.0.$f() } )*};
}
macro_rules! unary {
    ($($f:ident),*) => {$( fn $f(self) -> Self { tick(1); Counted(self.0.$f()) } )*};
}
macro_rules! exact {
    ($($f:ident),*) => {$( fn $f(self) -> Self { Counted(self.0.$f()) } )*};
}
macro_rules! binary {
    ($($f:ident),*) => {$( fn $f(self, o: Self) -> Self { tick(1); Counted(self.0.$f(o.0)) } )*};
}

impl Float for Counted {
    free!(
        nan,
        infinity,
        neg_infinity,
        neg_zero,
        min_value,
        min_positive_value,
        max_value
    );
    pred!(
        is_nan,
        is_infinite,
        is_finite,
        is_normal,
        is_sign_positive,
        is_sign_negative
    );
    unary!(
        recip, sqrt, exp, exp2, ln, log2, log10, cbrt, sin, cos, tan, asin, acos, atan, exp_m1,
        ln_1p, sinh, cosh, tanh, asinh, acosh, atanh
    );
    exact!(floor, ceil, round, trunc, fract, abs, signum);
    binary!(powf, log, hypot, atan2);
    fn classify(self) -> FpCategory {
        self.0.classify()
    }
    fn mul_add(self, a: Self, b: Self) -> Self {
        tick(2);
        Counted(self.0.mul_add(a.0, b.0))
    }
    fn powi(self, n: i32) -> Self {
        tick(1);
        Counted(self.0.powi(n))
    }
    fn max(self, o: Self) -> Self {
        Counted(self.0.max(o.0))
    }
    fn min(self, o: Self) -> Self {
        Counted(self.0.min(o.0))
    }
    #[allow(deprecated)]
    fn abs_sub(self, o: Self) -> Self {
        tick(1);
        Counted((self.0 - o.0).max(0.0))
    }
    fn sin_cos(self) -> (Self, Self) {
        tick(2);
        (Counted(self.0.sin()), Counted(self.0.cos()))
    }
    fn integer_decode(self) -> (u64, i16, i8) {
        Float::integer_decode(self.0)
    }
}

impl Accum for Counted {
    fn f64(self) -> f64 {
        self.0
    }
    fn of(v: f64) -> Self {
        Counted(v)
    }
}

impl crate::dtype::sealed::Sealed for Counted {}

impl Element for Counted {
    type Acc = Counted;
    const DTYPE: crate::dtype::DType = crate::dtype::DType::Probe;
    const NAME: &'static str = "counted";
    const ZERO: Self = Counted(0.0);
    const ONE: Self = Counted(1.0);
    fn to_acc(self) -> Counted {
        self
    }
    fn from_acc(a: Counted) -> Self {
        a
    }
}
