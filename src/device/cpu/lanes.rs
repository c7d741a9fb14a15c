//! The SIMD builds: the [`Lanes`] trait, its plain-Rust and x86 (AVX2,
//! AVX-512) implementations, and which instruction set this CPU offers.

use super::*;

/// True when `T` is `f32` (a compile-time constant after monomorphization).
#[inline(always)]
pub(crate) fn is_f32<T: 'static>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

/// Whether the CPU kernels have SIMD and streaming-store builds for an
/// element type (f32 only), for every [`Element`]. An associated const
/// rather than [`is_f32`]: code under `if <T as CpuBuilds>::SIMD` is not
/// compiled at all for the other types, which keeps their kernel instances
/// to one plain build each.
pub trait CpuBuilds {
    /// Whether the SIMD and streaming-store builds exist.
    const SIMD: bool;
}

impl<T: Element> CpuBuilds for T {
    const SIMD: bool = matches!(T::DTYPE, crate::dtype::DType::F32);
}

/// Instruction sets the f32 kernels are built for, in rising order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// Plain Rust (whatever the baseline target vectorizes it to).
    Portable,
    /// Two 256-bit AVX2 registers per [`Lanes`].
    Avx2,
    /// One 512-bit AVX-512F register per [`Lanes`].
    Avx512,
}

impl std::fmt::Display for Simd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Simd::Portable => "portable",
            Simd::Avx2 => "AVX2",
            Simd::Avx512 => "AVX-512",
        })
    }
}

/// The best instruction set this CPU offers the kernels.
pub fn best_simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Simd::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Simd::Avx2;
        }
    }
    Simd::Portable
}

static SIMD_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Caps the instruction set the kernels use (process-wide; for tests and
/// benchmarks that compare builds). Every build gives the same bits.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_simd_limit(limit: Simd) {
    SIMD_LIMIT.store(limit as usize, Ordering::Relaxed)
}

/// The instruction set the f32 kernels run with: [`best_simd`], capped by
/// [`set_simd_limit`].
pub fn simd() -> Simd {
    let best = best_simd();
    match SIMD_LIMIT.load(Ordering::Relaxed) {
        l if l >= best as usize => best,
        l if l >= Simd::Avx2 as usize => Simd::Avx2,
        _ => Simd::Portable,
    }
}

/// [`LANES`] accumulator lanes: the unit the kernels compute in. Every
/// operation is one IEEE operation per lane, so all implementations give
/// the same bits.
///
/// [`Portable`] is plain Rust for every element type; `Avx2` and `Avx512`
/// hold f32 in vector registers and are used only for f32 on CPUs that
/// have them (see [`dispatch`]).
pub(crate) trait Lanes<T: Element>: Copy {
    /// All lanes `a`.
    fn splat(a: Acc<T>) -> Self;
    /// [`LANES`] elements, widened.
    fn load(s: &[T; LANES]) -> Self;
    /// [`LANES`] accumulator values.
    fn load_acc(s: &[Acc<T>; LANES]) -> Self;
    /// Lane-wise `+`.
    fn add(self, o: Self) -> Self;
    /// Lane-wise `-`.
    fn sub(self, o: Self) -> Self;
    /// Lane-wise `*`.
    fn mul(self, o: Self) -> Self;
    /// The lanes as an array.
    fn lanes(self) -> [Acc<T>; LANES];
    /// The lanes summed in [`fold`]'s order.
    #[inline(always)]
    fn fold(self) -> Acc<T> {
        fold(self.lanes())
    }
    /// Narrows and stores.
    fn store(self, d: &mut [T; LANES]);
    /// Stores accumulator values.
    fn store_acc(self, d: &mut [Acc<T>; LANES]);
    /// Narrows and stores past the cache: non-temporal stores for f32 on
    /// x86-64, ordinary stores otherwise.
    ///
    /// # Safety
    /// When `T` is f32, `d` must be 64-byte aligned.
    unsafe fn stream(self, d: &mut [T; LANES]);

    /// The elements `s[i..i + LANES]`.
    ///
    /// # Safety
    /// `i + LANES <= s.len()`.
    #[inline(always)]
    unsafe fn load_at(s: &[T], i: usize) -> Self {
        // SAFETY: in bounds by the caller's contract; arrays of T have T's
        // alignment.
        Self::load(unsafe { &*(s.as_ptr().add(i) as *const [T; LANES]) })
    }

    /// Stores accumulator values to `s[i..i + LANES]`.
    ///
    /// # Safety
    /// `i + LANES <= s.len()`.
    #[inline(always)]
    unsafe fn store_acc_at(self, s: &mut [Acc<T>], i: usize) {
        // SAFETY: as for `load_at`.
        self.store_acc(unsafe { &mut *(s.as_mut_ptr().add(i) as *mut [Acc<T>; LANES]) })
    }

    /// The accumulator values `s[i..i + LANES]`.
    ///
    /// # Safety
    /// `i + LANES <= s.len()`.
    #[inline(always)]
    unsafe fn load_acc_at(s: &[Acc<T>], i: usize) -> Self {
        // SAFETY: as for `load_at`.
        Self::load_acc(unsafe { &*(s.as_ptr().add(i) as *const [Acc<T>; LANES]) })
    }
}

/// Folds lanes in a fixed pairwise order.
#[inline(always)]
pub(crate) fn fold<A: Copy + std::ops::Add<Output = A>>(a: [A; LANES]) -> A {
    let q = |i: usize| (a[i] + a[i + 1]) + (a[i + 2] + a[i + 3]);
    (q(0) + q(4)) + (q(8) + q(12))
}

/// [`Lanes`] in plain Rust.
#[derive(Clone, Copy)]
pub(crate) struct Portable<T: Element>([Acc<T>; LANES]);

impl<T: Element> Lanes<T> for Portable<T> {
    #[inline(always)]
    fn splat(a: Acc<T>) -> Self {
        Portable([a; LANES])
    }
    #[inline(always)]
    fn load(s: &[T; LANES]) -> Self {
        Portable(s.map(|v| v.to_acc()))
    }
    #[inline(always)]
    fn load_acc(s: &[Acc<T>; LANES]) -> Self {
        Portable(*s)
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] + o.0[l]))
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] - o.0[l]))
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] * o.0[l]))
    }
    #[inline(always)]
    fn lanes(self) -> [Acc<T>; LANES] {
        self.0
    }
    #[inline(always)]
    fn store(self, d: &mut [T; LANES]) {
        *d = self.0.map(T::from_acc);
    }
    #[inline(always)]
    fn store_acc(self, d: &mut [Acc<T>; LANES]) {
        *d = self.0;
    }
    #[inline(always)]
    unsafe fn stream(self, d: &mut [T; LANES]) {
        #[cfg(target_arch = "x86_64")]
        if is_f32::<T>() {
            let v: [T; LANES] = self.0.map(T::from_acc);
            // SAFETY: T is f32, so `v` and `d` are LANES f32 values; `d` is
            // 64-byte aligned (caller), so every 16-byte store is aligned.
            // SSE is baseline on x86-64.
            unsafe {
                use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
                let (s, p) = (v.as_ptr() as *const f32, d.as_mut_ptr() as *mut f32);
                for k in (0..LANES).step_by(4) {
                    _mm_stream_ps(p.add(k), _mm_loadu_ps(s.add(k)));
                }
            }
            return;
        }
        self.store(d)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    //! The f32 lane types. Only [`crate::device::cpu::dispatch`] creates them, for
    //! `T = f32` on a CPU with the instruction set, inside a function
    //! compiled for it. They implement `Lanes<T>` for every `T` only so
    //! that generic kernels type-check: for another `T` the values would
    //! pass through f32 (still memory-safe), and no caller does that.
    //!
    //! SAFETY (every `unsafe` block in this module): the intrinsics need
    //! the instruction set, which `dispatch` has checked before any value
    //! of these types exists; loads and stores touch exactly the LANES f32
    //! of a `[f32; LANES]` (T is f32 on those branches), unaligned except
    //! the streaming stores, whose 64-byte alignment the caller guarantees.

    use super::{is_f32, Acc, Lanes, LANES};
    use crate::dtype::{Accum, Element};
    use std::arch::x86_64::*;

    #[inline(always)]
    fn to_f32<T: Element>(s: &[T; LANES]) -> [f32; LANES] {
        s.map(|e| e.to_f64() as f32)
    }

    #[inline(always)]
    fn acc_to_f32<A: Accum>(s: &[A; LANES]) -> [f32; LANES] {
        s.map(|e| e.f64() as f32)
    }

    /// Two 256-bit registers.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(__m256, __m256);

    impl Avx2 {
        #[inline(always)]
        fn from_ptr(p: *const f32) -> Self {
            unsafe { Avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
        }
        #[inline(always)]
        fn to_ptr(self, p: *mut f32) {
            unsafe {
                _mm256_storeu_ps(p, self.0);
                _mm256_storeu_ps(p.add(8), self.1);
            }
        }
        #[inline(always)]
        fn f32s(self) -> [f32; LANES] {
            let mut v = [0f32; LANES];
            self.to_ptr(v.as_mut_ptr());
            v
        }
    }

    impl<T: Element> Lanes<T> for Avx2 {
        #[inline(always)]
        fn splat(a: Acc<T>) -> Self {
            let a = a.f64() as f32;
            unsafe { Avx2(_mm256_set1_ps(a), _mm256_set1_ps(a)) }
        }
        #[inline(always)]
        fn load(s: &[T; LANES]) -> Self {
            if is_f32::<T>() {
                Avx2::from_ptr(s.as_ptr() as *const f32)
            } else {
                Avx2::from_ptr(to_f32(s).as_ptr())
            }
        }
        #[inline(always)]
        fn load_acc(s: &[Acc<T>; LANES]) -> Self {
            if is_f32::<Acc<T>>() {
                Avx2::from_ptr(s.as_ptr() as *const f32)
            } else {
                Avx2::from_ptr(acc_to_f32(s).as_ptr())
            }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            unsafe { Avx2(_mm256_add_ps(self.0, o.0), _mm256_add_ps(self.1, o.1)) }
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            unsafe { Avx2(_mm256_sub_ps(self.0, o.0), _mm256_sub_ps(self.1, o.1)) }
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            unsafe { Avx2(_mm256_mul_ps(self.0, o.0), _mm256_mul_ps(self.1, o.1)) }
        }
        #[inline(always)]
        fn lanes(self) -> [Acc<T>; LANES] {
            self.f32s().map(|e| <Acc<T> as Accum>::of(e as f64))
        }
        /// [`super::fold`]'s tree with in-register shuffles: adjacent
        /// pairs, then pairs of pairs (`q(0)`, `q(4)` in one register,
        /// `q(8)`, `q(12)` in the other), then the two halves.
        #[inline(always)]
        fn fold(self) -> Acc<T> {
            #[inline(always)]
            fn quads(v: __m256) -> __m256 {
                unsafe {
                    let v = _mm256_add_ps(v, _mm256_permute_ps::<0b10_11_00_01>(v));
                    let v = _mm256_add_ps(v, _mm256_permute_ps::<0b01_00_11_10>(v));
                    _mm256_add_ps(v, _mm256_permute2f128_ps::<1>(v, v))
                }
            }
            let (a, b) = (quads(self.0), quads(self.1));
            let s = unsafe {
                _mm_cvtss_f32(_mm256_castps256_ps128(a)) + _mm_cvtss_f32(_mm256_castps256_ps128(b))
            };
            <Acc<T> as Accum>::of(s as f64)
        }
        #[inline(always)]
        fn store(self, d: &mut [T; LANES]) {
            if is_f32::<T>() {
                self.to_ptr(d.as_mut_ptr() as *mut f32)
            } else {
                *d = self.f32s().map(|e| T::from_f64(e as f64));
            }
        }
        #[inline(always)]
        fn store_acc(self, d: &mut [Acc<T>; LANES]) {
            if is_f32::<Acc<T>>() {
                self.to_ptr(d.as_mut_ptr() as *mut f32)
            } else {
                *d = Lanes::<T>::lanes(self);
            }
        }
        #[inline(always)]
        unsafe fn stream(self, d: &mut [T; LANES]) {
            if is_f32::<T>() {
                let p = d.as_mut_ptr() as *mut f32;
                unsafe {
                    _mm256_stream_ps(p, self.0);
                    _mm256_stream_ps(p.add(8), self.1);
                }
            } else {
                Lanes::<T>::store(self, d)
            }
        }
    }

    /// One 512-bit register.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(__m512);

    impl Avx512 {
        #[inline(always)]
        fn f32s(self) -> [f32; LANES] {
            let mut v = [0f32; LANES];
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), self.0) };
            v
        }
    }

    impl<T: Element> Lanes<T> for Avx512 {
        #[inline(always)]
        fn splat(a: Acc<T>) -> Self {
            unsafe { Avx512(_mm512_set1_ps(a.f64() as f32)) }
        }
        #[inline(always)]
        fn load(s: &[T; LANES]) -> Self {
            if is_f32::<T>() {
                unsafe { Avx512(_mm512_loadu_ps(s.as_ptr() as *const f32)) }
            } else {
                unsafe { Avx512(_mm512_loadu_ps(to_f32(s).as_ptr())) }
            }
        }
        #[inline(always)]
        fn load_acc(s: &[Acc<T>; LANES]) -> Self {
            if is_f32::<Acc<T>>() {
                unsafe { Avx512(_mm512_loadu_ps(s.as_ptr() as *const f32)) }
            } else {
                unsafe { Avx512(_mm512_loadu_ps(acc_to_f32(s).as_ptr())) }
            }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            unsafe { Avx512(_mm512_add_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            unsafe { Avx512(_mm512_sub_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            unsafe { Avx512(_mm512_mul_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn lanes(self) -> [Acc<T>; LANES] {
            self.f32s().map(|e| <Acc<T> as Accum>::of(e as f64))
        }
        /// [`super::fold`]'s tree with in-register shuffles: adjacent
        /// pairs, pairs of pairs (`q(4k)` in lane `4k`), 128-bit blocks
        /// 0+1 and 2+3, then the two 256-bit halves.
        #[inline(always)]
        fn fold(self) -> Acc<T> {
            let s = unsafe {
                let v = self.0;
                let v = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
                let v = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
                let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
                let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
                _mm512_cvtss_f32(v)
            };
            <Acc<T> as Accum>::of(s as f64)
        }
        #[inline(always)]
        fn store(self, d: &mut [T; LANES]) {
            if is_f32::<T>() {
                unsafe { _mm512_storeu_ps(d.as_mut_ptr() as *mut f32, self.0) }
            } else {
                *d = self.f32s().map(|e| T::from_f64(e as f64));
            }
        }
        #[inline(always)]
        fn store_acc(self, d: &mut [Acc<T>; LANES]) {
            if is_f32::<Acc<T>>() {
                unsafe { _mm512_storeu_ps(d.as_mut_ptr() as *mut f32, self.0) }
            } else {
                *d = Lanes::<T>::lanes(self);
            }
        }
        #[inline(always)]
        unsafe fn stream(self, d: &mut [T; LANES]) {
            if is_f32::<T>() {
                unsafe { _mm512_stream_ps(d.as_mut_ptr() as *mut f32, self.0) }
            } else {
                Lanes::<T>::store(self, d)
            }
        }
    }
}
