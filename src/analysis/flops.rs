//! FLOPs, counted by running the real kernels on [`Counted`] numbers and
//! fitted exactly by `a*N*D + b*N + c*D + e`.

use super::*;

mod counted {
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

    crate::ops::norm::norm_ops!(Counted);
    impl crate::device::cpu::CpuBuilds for Counted {}

    impl Element for Counted {
        type Acc = Counted;
        const NAME: &'static str = "counted";
        const ZERO: Self = Counted(0.0);
        const ONE: Self = Counted(1.0);
        fn pool() -> &'static crate::device::pool::Pool<Self> {
            static P: crate::device::pool::Pool<Counted> = crate::device::pool::Pool::new();
            &P
        }
        fn to_acc(self) -> Counted {
            self
        }
        fn from_acc(a: Counted) -> Self {
            a
        }
    }
}

pub use counted::Counted;

/// FLOPs of one pass as `per_elem*N*D + per_row*N + per_col*D + fixed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlopFit {
    /// Per element of x.
    pub per_elem: f64,
    /// Per row.
    pub per_row: f64,
    /// Per column (element of gamma).
    pub per_col: f64,
    /// Per call.
    pub fixed: f64,
    /// Whether the fit predicts a fifth, held-out shape exactly.
    pub exact: bool,
}

/// Counted FLOPs of forward and backward of one path at `(n, d)`, on this
/// thread (a one-thread pool runs every task on the caller's pool thread).
fn count_flops(norm: Norm, fused: bool, n: usize, d: usize) -> Result<(u64, u64)> {
    let case = Case::new(norm, &[n, d], &[d]);
    let inputs = case.inputs::<Counted>()?;
    let tape = Tape::new();
    let vars: Vec<Var<Counted>> = inputs.iter().map(|t| tape.var(t.clone())).collect();
    let (x, p) = split_first(&vars)?;
    counted::take();
    let y = case.apply(fused, x, p)?;
    let fwd = counted::take();
    let c: Vec<Counted> = Rng::new(1).vec(n * d).into_iter().map(Counted).collect();
    let seed = Tensor::from_vec(vec![n, d], c)?;
    counted::take();
    y.backward_with(&seed)?;
    let bwd = counted::take();
    Ok((fwd, bwd))
}

/// Fits forward and backward FLOPs of one path (see [`FlopFit`]).
pub fn measure_flops(norm: Norm, fused: bool) -> Result<(FlopFit, FlopFit)> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| Error::InvalidArgument {
            op: "analysis::measure_flops",
            msg: e.to_string(),
        })?;
    pool.install(|| {
        let (n1, n2, d1, d2) = (4usize, 8usize, 256usize, 512usize);
        let f = |n, d| count_flops(norm, fused, n, d);
        let pts = [f(n1, d1)?, f(n2, d1)?, f(n1, d2)?, f(n2, d2)?, f(6, 384)?];
        let fit = |k: usize| -> FlopFit {
            let v = |i: usize| {
                let p: (u64, u64) = pts[i];
                (if k == 0 { p.0 } else { p.1 }) as f64
            };
            let (n1, n2, d1, d2) = (n1 as f64, n2 as f64, d1 as f64, d2 as f64);
            let a = (v(3) - v(1) - v(2) + v(0)) / ((n2 - n1) * (d2 - d1));
            let b = (v(1) - v(0)) / (n2 - n1) - a * d1;
            let c = (v(2) - v(0)) / (d2 - d1) - a * n1;
            let e = v(0) - a * n1 * d1 - b * n1 - c * d1;
            let predict = a * 6.0 * 384.0 + b * 6.0 + c * 384.0 + e;
            FlopFit {
                per_elem: a,
                per_row: b,
                per_col: c,
                fixed: e,
                exact: (predict - v(4)).abs() < 0.5,
            }
        };
        Ok((fit(0), fit(1)))
    })
}
