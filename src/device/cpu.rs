//! CPU work splitting, instruction-set dispatch and output stores.
//!
//! Chunk sizes depend only on the problem shape, never on the number of
//! threads, so reductions over chunks are bitwise reproducible.
//!
//! Row kernels compute in [`Lanes`] of [`LANES`] values, each step one IEEE
//! operation per lane. A row sum runs in [`UNROLL`] such accumulators
//! (chunk `k` of the row into accumulator `k % UNROLL`), which are added
//! lane-wise and then folded in a fixed pairwise order ([`fold_all`]). The
//! kernel code is written once, generically over the lane type, and
//! [`dispatch`] runs it with the best build this CPU has for f32: one
//! AVX-512 register, two AVX2 registers, or plain Rust (which the baseline
//! x86-64 target vectorizes with SSE2). Rust never contracts `a * b + c`
//! into a fused multiply-add on its own, so every build performs the same
//! operations in the same order and gives the same bits. Other element
//! types always run the plain-Rust build.
//!
//! Outputs of at least [`stream_threshold`] bytes (f32 only) are written
//! with non-temporal stores ([`write_row`]): the store does not first read
//! the line it overwrites, and the output does not evict the inputs still
//! being read.

use crate::dtype::Element;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Rows per chunk for a row-wise kernel over rows of `d` elements: about
/// `TARGET` elements per chunk, at least one row.
pub fn rows_per_chunk(d: usize) -> usize {
    const TARGET: usize = 64 * 1024;
    (TARGET / d.max(1)).max(1)
}

/// Accumulator lanes per row sum (64 bytes of f32: one AVX-512 register,
/// one cache line).
pub const LANES: usize = 16;

/// Independent accumulators per row sum. Chunk `k` of a row (the elements
/// `k * LANES ..`) goes to accumulator `k % UNROLL`, so the adds of a long
/// row form `UNROLL` dependency chains rather than one; the accumulators
/// are combined lane-wise, `(a0 + a1) + (a2 + a3)`, before the fold.
pub const UNROLL: usize = 4;

/// Calls `f(j, i)` for each whole chunk of a row of `n` elements, in row
/// order: `i = k * LANES` (so `i + LANES <= n`) and `j = k % UNROLL`, with
/// `j` a constant at every call site, so accumulators indexed by it stay in
/// registers.
#[inline(always)]
pub(crate) fn each_chunk(n: usize, mut f: impl FnMut(usize, usize)) {
    let nc = n / LANES;
    let mut k = 0;
    while k + UNROLL <= nc {
        f(0, k * LANES);
        f(1, (k + 1) * LANES);
        f(2, (k + 2) * LANES);
        f(3, (k + 3) * LANES);
        k += UNROLL;
    }
    let r = nc - k;
    if r > 0 {
        f(0, k * LANES);
    }
    if r > 1 {
        f(1, (k + 1) * LANES);
    }
    if r > 2 {
        f(2, (k + 2) * LANES);
    }
}

/// [`each_chunk`], or, with `seg`, the row cut into [`UNROLL`] equal runs
/// of whole chunks, walked in lockstep with run `j` going to accumulator
/// `j` (the up to `UNROLL - 1` chunks past the runs go to accumulators 0,
/// 1, 2, in order). One pass then reads `UNROLL` places of a long row at
/// once, which keeps more of its reads in flight.
#[inline(always)]
pub(crate) fn each_chunk_in(n: usize, seg: bool, mut f: impl FnMut(usize, usize)) {
    if !seg {
        return each_chunk(n, f);
    }
    let nc = n / LANES;
    let run = nc / UNROLL * LANES;
    let mut i = 0;
    while i < run {
        f(0, i);
        f(1, run + i);
        f(2, 2 * run + i);
        f(3, 3 * run + i);
        i += LANES;
    }
    let r = nc % UNROLL;
    let t = UNROLL * run;
    if r > 0 {
        f(0, t);
    }
    if r > 1 {
        f(1, t + LANES);
    }
    if r > 2 {
        f(2, t + 2 * LANES);
    }
}

/// Sums [`UNROLL`] accumulators: lane-wise `(a0 + a1) + (a2 + a3)`, then
/// [`Lanes::fold`].
#[inline(always)]
pub(crate) fn fold_all<T: Element, V: Lanes<T>>(a: [V; UNROLL]) -> Acc<T> {
    a[0].add(a[1]).add(a[2].add(a[3])).fold()
}

/// Rows a LayerNorm task advances in lockstep where that pays (see
/// [`rows_in_step`]).
pub const ROWS_IN_STEP: usize = 4;

/// The row sizes, in bytes, at which [`rows_in_step`] is [`ROWS_IN_STEP`].
/// Shorter rows are bound by their per-row arithmetic, which four rows at
/// once only slows (more live registers); longer ones would not fit in L2
/// four at a time between the passes. Measured here, same process, one row
/// against four: 4096-wide rows 0.66 -> 0.72 of a copy's rate, 16384-wide
/// 0.93 -> 1.00; 128- and 256-wide 1.18 -> 0.89 and 0.88 -> 0.68; 65536-wide
/// backward 90 -> 116 ms.
pub const STEP_ROW_BYTES: std::ops::RangeInclusive<usize> = (16 << 10)..=(64 << 10);

static LOCKSTEP: AtomicBool = AtomicBool::new(true);

/// Rows the LayerNorm kernels advance together for rows of `row_bytes`:
/// [`ROWS_IN_STEP`] within [`STEP_ROW_BYTES`] (unless turned off by
/// [`set_lockstep`]), else 1. Reading several rows at once keeps several
/// read and write streams in flight from one core.
pub fn rows_in_step(row_bytes: usize) -> usize {
    if LOCKSTEP.load(Ordering::Relaxed) && STEP_ROW_BYTES.contains(&row_bytes) {
        ROWS_IN_STEP
    } else {
        1
    }
}

static SEGMENTED: AtomicBool = AtomicBool::new(true);

/// Whether the LayerNorm kernels walk rows of `row_bytes` as [`UNROLL`]
/// runs in lockstep ([`each_chunk_in`]): for rows past [`STEP_ROW_BYTES`],
/// too long to take several at once. The runs decide which accumulator
/// each chunk of the row goes to, so this changes the order of the row
/// sums (still a function of the shape only).
pub fn segmented(row_bytes: usize) -> bool {
    SEGMENTED.load(Ordering::Relaxed) && row_bytes > *STEP_ROW_BYTES.end()
}

/// Turns [`segmented`] rows on or off (process-wide; for benchmarks that
/// measure what it is worth). Unlike the other switches it changes the
/// bits of the long-row results, within the usual rounding.
pub fn set_segmented(on: bool) {
    SEGMENTED.store(on, Ordering::Relaxed)
}

static LONG_FWD_TASKS: AtomicBool = AtomicBool::new(true);

/// Whether a LayerNorm forward task over rows in lockstep spans several
/// steps (on unless turned off by [`set_long_fwd_tasks`]).
pub fn long_fwd_tasks() -> bool {
    LONG_FWD_TASKS.load(Ordering::Relaxed)
}

/// Turns [`long_fwd_tasks`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed: forward rows are
/// independent, so how they are cut into tasks changes no bits.
pub fn set_long_fwd_tasks(on: bool) {
    LONG_FWD_TASKS.store(on, Ordering::Relaxed)
}

/// Turns lockstep rows on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed: every row's
/// arithmetic, and the order in which rows are added into dgamma/dbeta,
/// are the same either way.
pub fn set_lockstep(on: bool) {
    LOCKSTEP.store(on, Ordering::Relaxed)
}

/// Default for [`stream_threshold`]: outputs of at least this many bytes
/// are streamed past the cache. Twice one core's L2 here (2 MiB): an
/// output this large is not in the writer's L2 when the next op reads it.
/// Measured here with 4 MiB outputs (512 x 2048), LayerNorm, then a
/// `mul` that reads `y`, then the backward through both: 0.93-0.94 of the
/// time with 8 MiB as the threshold.
pub const DEFAULT_STREAM_BYTES: usize = 4 << 20;

static STREAM_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_STREAM_BYTES);

/// Outputs of at least this many bytes are written with non-temporal stores
/// (f32 only; other types always use ordinary stores).
pub fn stream_threshold() -> usize {
    STREAM_BYTES.load(Ordering::Relaxed)
}

/// Sets [`stream_threshold`]; `usize::MAX` turns streaming stores off. A
/// process-wide setting, for benchmarks that compare the two.
pub fn set_stream_threshold(bytes: usize) {
    STREAM_BYTES.store(bytes, Ordering::Relaxed)
}

/// Whether an output of `elems` elements of `T` should be streamed.
#[inline]
pub(crate) fn should_stream<T: Element>(elems: usize) -> bool {
    cfg!(target_arch = "x86_64") && is_f32::<T>() && elems.saturating_mul(4) >= stream_threshold()
}

/// True when `T` is `f32` (a compile-time constant after monomorphization).
#[inline(always)]
pub(crate) fn is_f32<T: 'static>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
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

type Acc<T> = <T as Element>::Acc;

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
mod x86 {
    //! The f32 lane types. Only [`super::dispatch`] creates them, for
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

/// A unit of kernel work, written once over any [`Lanes`] type. `run` must
/// be `#[inline(always)]`, and so must everything it calls that holds a hot
/// loop, so that each SIMD build really is built for its instruction set.
pub(crate) trait Kernel<T: Element> {
    /// What the work returns.
    type Output;
    /// Does the work in lanes of type `V`.
    fn run<V: Lanes<T>>(self) -> Self::Output;
}

/// Runs `k` with the lanes of [`simd`] when `T` is f32, else with
/// [`Portable`] lanes.
#[inline(always)]
pub(crate) fn dispatch<T: Element, K: Kernel<T>>(k: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    if is_f32::<T>() {
        #[target_feature(enable = "avx2")]
        fn avx2<T: Element, K: Kernel<T>>(k: K) -> K::Output {
            k.run::<x86::Avx2>()
        }
        #[target_feature(enable = "avx512f")]
        fn avx512<T: Element, K: Kernel<T>>(k: K) -> K::Output {
            k.run::<x86::Avx512>()
        }
        match simd() {
            // SAFETY: `simd` reports only what the CPU supports.
            Simd::Avx512 => return unsafe { avx512::<T, K>(k) },
            Simd::Avx2 => return unsafe { avx2::<T, K>(k) },
            Simd::Portable => {}
        }
    }
    k.run::<Portable<T>>()
}

/// Runs each job through [`dispatch`], in parallel when there are several,
/// and returns their outputs in job order.
pub(crate) fn dispatch_all<T: Element, K: Kernel<T> + Send>(jobs: Vec<K>) -> Vec<K::Output>
where
    K::Output: Send,
{
    use rayon::prelude::*;
    if jobs.len() <= 1 {
        jobs.into_iter().map(dispatch).collect()
    } else {
        jobs.into_par_iter().map(dispatch).collect()
    }
}

/// Writes one output row: each whole group of [`LANES`] from `v(i)` (the
/// group `dst[i..i + LANES]`), the rest one by one from `s(i)`, which must
/// compute the same formula in scalars, so the bits do not depend on where
/// the groups fall. `v` is only called with `i + LANES <= dst.len()`, and
/// may rely on that to load its inputs unchecked. With `NT` (f32), the
/// groups start at a 64-byte boundary and go out as non-temporal stores;
/// end the task with [`fence`].
#[inline(always)]
pub(crate) fn write_row<T: Element, V: Lanes<T>, const NT: bool>(
    dst: &mut [T],
    v: impl Fn(usize) -> V,
    s: impl Fn(usize) -> Acc<T>,
) {
    let n = dst.len();
    let stream = NT && is_f32::<T>();
    let h = if stream {
        dst.as_ptr().align_offset(64).min(n)
    } else {
        0
    };
    let (first, rest) = dst.split_at_mut(h);
    for (i, d) in first.iter_mut().enumerate() {
        *d = T::from_acc(s(i));
    }
    let (body, tail) = rest.as_chunks_mut::<LANES>();
    let t0 = h + LANES * body.len();
    // `align_offset` may give up (returning more than `n`); then `h == n`
    // and there is no body. Otherwise the body starts 64-byte aligned.
    if stream && (body.as_ptr() as usize).is_multiple_of(64) {
        for (k, d) in body.iter_mut().enumerate() {
            // SAFETY: every group of the body is 64-byte aligned.
            unsafe { v(h + LANES * k).stream(d) }
        }
    } else {
        for (k, d) in body.iter_mut().enumerate() {
            v(h + LANES * k).store(d)
        }
    }
    for (k, d) in tail.iter_mut().enumerate() {
        *d = T::from_acc(s(t0 + k));
    }
}

/// `dst.copy_from_slice(src)` (up to the shorter length) written with
/// non-temporal stores, as glibc's `memcpy` writes blocks past its own
/// threshold (`glibc.cpu.x86_non_temporal_threshold`, 114 MB here). The
/// benchmark's copy baseline uses it so that blocks under that threshold
/// are also timed at the streaming rate, the faster one for data that does
/// not fit in the caches.
pub fn stream_copy(dst: &mut [f32], src: &[f32]) {
    struct Copy<'a> {
        dst: &'a mut [f32],
        src: &'a [f32],
    }
    impl Kernel<f32> for Copy<'_> {
        type Output = ();
        #[inline(always)]
        fn run<V: Lanes<f32>>(self) {
            let n = self.dst.len().min(self.src.len());
            let (dst, src) = (&mut self.dst[..n], &self.src[..n]);
            write_row::<f32, V, true>(
                dst,
                // SAFETY: `write_row` keeps `i + LANES <= n = src.len()`.
                #[inline(always)]
                |i| unsafe { V::load_at(src, i) },
                #[inline(always)]
                |i| src.get(i).copied().unwrap_or_default(),
            );
            fence::<true>();
        }
    }
    dispatch(Copy { dst, src })
}

/// Writes `R` output rows of one length in lockstep: group `c` of row 0,
/// then group `c` of row 1, and so on, so that `R` write streams (and the
/// read streams `v` pulls from) are in flight at once rather than one. Each
/// row gets exactly what [`write_row`] would write (`v(k, i)` and `s(k, i)`
/// are row `k`'s formulas); rows of unequal length or, when streaming,
/// unequal alignment are written one after another by [`write_row`]. With
/// `seg`, a single row is written as its [`UNROLL`] runs (see
/// [`each_chunk_in`]) in lockstep.
#[inline(always)]
pub(crate) fn write_rows<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    seg: bool,
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    let n = dst.first().map_or(0, |r| r.len());
    let run = n / LANES / UNROLL * LANES;
    if R == 1 && seg && run > 0 {
        // One long row: its `UNROLL` runs in lockstep, then the rest.
        let Some(row) = dst.into_iter().next() else {
            return;
        };
        let (runs, rest) = row.split_at_mut(UNROLL * run);
        let mut parts = runs.chunks_exact_mut(run);
        let parts: [&mut [T]; UNROLL] = std::array::from_fn(|_| parts.next().unwrap_or_default());
        write_lockstep::<T, V, NT, UNROLL>(
            parts,
            #[inline(always)]
            |k, i| v(0, k * run + i),
            #[inline(always)]
            |k, i| s(0, k * run + i),
        );
        let t = UNROLL * run;
        return write_row::<T, V, NT>(
            rest,
            #[inline(always)]
            |i| v(0, t + i),
            #[inline(always)]
            |i| s(0, t + i),
        );
    }
    write_lockstep::<T, V, NT, R>(dst, v, s)
}

/// [`write_rows`] without runs: [`write_rows_with`] with nothing alongside
/// (one row goes straight to [`write_row`], the tighter loop).
#[inline(always)]
fn write_lockstep<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    if R == 1 {
        return write_each::<T, V, NT, R>(dst, v, s);
    }
    write_rows_with::<T, V, NT, R>(dst, v, s, 0, |_, _| {})
}

/// [`write_row`] for each row in turn.
#[inline(always)]
fn write_each<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    for (k, row) in dst.into_iter().enumerate() {
        write_row::<T, V, NT>(
            row,
            #[inline(always)]
            |i| v(k, i),
            #[inline(always)]
            |i| s(k, i),
        );
    }
}

static OVERLAP: AtomicBool = AtomicBool::new(true);

/// Turns [`overlap`] on or off (process-wide; for benchmarks that measure
/// what it is worth). It changes only the speed.
pub fn set_overlap(on: bool) {
    OVERLAP.store(on, Ordering::Relaxed)
}

static STATS_FIRST: AtomicBool = AtomicBool::new(true);

/// Rows a LayerNorm forward task takes [`stats_first`].
pub const STATS_FIRST_ROWS: usize = 8;

/// The longest row, in bytes, that goes [`stats_first`].
pub const STATS_FIRST_ROW_BYTES: usize = 1024;

/// Whether the LayerNorm forward runs the statistics passes of
/// [`STATS_FIRST_ROWS`] rows of `row_bytes` back to back, then their output
/// passes: for rows of at most [`STATS_FIRST_ROW_BYTES`] (unless turned off
/// by [`set_stats_first`]). Each row's statistics end in a chain of
/// dependent folds, a division and `1/sqrt`, and at 128 wide that chain is
/// as long as the row's loads; back to back, one row's chain overlaps the
/// next row's loads. Measured here, forward time on over off (31 reps,
/// interleaved): 0.84, 0.91 and 0.94 at 32768 x 128, 0.82 at 65536 x 64,
/// 0.89 at 131072 x 32; with 64-byte aligned inputs, 0.92-0.98 at
/// 65536 x 256 and 0.94-0.96 at 32768 x 256 and 16384 x 256 (1 KiB rows
/// had lost, 1.07, while the inputs started off a cache line). The
/// backward's pass A gained nothing this way (0.98-1.05).
#[inline(always)]
pub fn stats_first(row_bytes: usize) -> bool {
    STATS_FIRST.load(Ordering::Relaxed) && row_bytes <= STATS_FIRST_ROW_BYTES
}

/// Turns [`stats_first`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed.
pub fn set_stats_first(on: bool) {
    STATS_FIRST.store(on, Ordering::Relaxed)
}

static PAIRED: AtomicBool = AtomicBool::new(true);

/// Turns [`paired_partials`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed.
pub fn set_paired_partials(on: bool) {
    PAIRED.store(on, Ordering::Relaxed)
}

/// Whether the LayerNorm backward, where it [`overlap`]s rows of
/// `row_bytes` one at a time, adds two rows' dgamma/dbeta partials in one
/// read-modify-write of the partial row (the second row's pass A adds the
/// first row's terms, then its own): for rows past [`STEP_ROW_BYTES`],
/// whose partial row is read and written from L2, not L1, and unless
/// turned off by [`set_paired_partials`]. Measured here, backward time
/// with it on over off: 0.96-0.98 at 65536-wide f32 rows; but 1.00 at
/// 1024 and 1.01-1.06 at 768, whose partial rows sit in L1 anyway.
#[inline(always)]
pub fn paired_partials(row_bytes: usize) -> bool {
    PAIRED.load(Ordering::Relaxed) && row_bytes > *STEP_ROW_BYTES.end()
}

/// The shortest row, in bytes, whose kernels [`overlap`] one group of
/// rows' output pass with the next group's first pass. Measured here,
/// fwd+bwd with it on over off: 0.96 at 768-wide f32 rows, 0.98 at 1024,
/// 0.94-0.96 at 4096-65536; but 1.02 at 128 and 1.015 at 256, whose rows
/// are too short for the joined loop to pay for itself.
pub const OVERLAP_ROW_BYTES: usize = 2 << 10;

/// Whether the LayerNorm kernels run the next rows' first pass inside this
/// rows' output pass ([`write_rows_with`]) for rows of `row_bytes`: only
/// for outputs that are streamed (the caller checks), rows of at least
/// [`OVERLAP_ROW_BYTES`], and unless turned off by [`set_overlap`].
#[inline(always)]
pub fn overlap(row_bytes: usize) -> bool {
    OVERLAP.load(Ordering::Relaxed) && row_bytes >= OVERLAP_ROW_BYTES
}

/// Writes `R` rows in lockstep (see [`write_rows`]), and meanwhile `also(j, i)` for each
/// chunk of a row of `m` elements, as [`each_chunk`] would call it (same
/// order, same `j`). The two are interleaved chunk by chunk, so a kernel
/// can write one group of rows while it reads the next: the reads then go
/// out to memory alongside the writes instead of in a pass of their own
/// (the statistics pass of the next rows costs no extra time over the
/// data). What is written is what [`write_row`] writes for each row, and
/// the calls to `also` are those of `each_chunk`; for rows of unequal
/// length or alignment the two run one after the other, and the rows are
/// written one by one.
#[inline(always)]
pub(crate) fn write_rows_with<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
    m: usize,
    mut also: impl FnMut(usize, usize),
) {
    let n = dst.first().map_or(0, |r| r.len());
    let stream = NT && is_f32::<T>();
    let head = |r: &[T]| {
        if stream {
            r.as_ptr().align_offset(64).min(n)
        } else {
            0
        }
    };
    let h = dst.first().map_or(0, |r| head(r));
    let same = dst.iter().all(|r| r.len() == n && head(r) == h);
    if !same {
        each_chunk(m, also);
        return write_each::<T, V, NT, R>(dst, v, s);
    }
    let mut parts = dst.map(|r| r.split_at_mut(h));
    for (k, (first, _)) in parts.iter_mut().enumerate() {
        for (i, e) in first.iter_mut().enumerate() {
            *e = T::from_acc(s(k, i));
        }
    }
    let mut rows = parts.map(|(_, rest)| rest.as_chunks_mut::<LANES>());
    let groups = (n - h) / LANES;
    let nc = m / LANES;
    let nt = stream
        && rows
            .iter()
            .all(|(b, _)| (b.as_ptr() as usize).is_multiple_of(64));
    each_chunk(
        nc.max(groups) * LANES,
        #[inline(always)]
        |j, i| {
            let c = i / LANES;
            if c < nc {
                also(j, i);
            }
            for (k, (body, _)) in rows.iter_mut().enumerate() {
                if let Some(d) = body.get_mut(c) {
                    if nt {
                        // SAFETY: every group of every body is 64-byte
                        // aligned (checked above).
                        unsafe { v(k, h + i).stream(d) }
                    } else {
                        v(k, h + i).store(d)
                    }
                }
            }
        },
    );
    let t0 = h + LANES * groups;
    for (k, (_, tail)) in rows.iter_mut().enumerate() {
        for (i, e) in tail.iter_mut().enumerate() {
            *e = T::from_acc(s(k, t0 + i));
        }
    }
}

/// How far ahead (in bytes) the first pass over a row prefetches. The
/// hardware prefetcher stops at 4 KiB page boundaries; asking for the line
/// a page ahead keeps a read stream going across them. Measured here on
/// rows of 128 to 4096 f32: 0.59 to 0.72-0.81 of a memcpy's rate for a
/// bare forward kernel.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Hints that `s[i..]`'s line [`PREFETCH_AHEAD`]` / R` bytes ahead will be
/// read soon, for one of `R` rows read in lockstep: the bytes asked for
/// ahead of all the streams together stay the same whatever `R` is, so
/// the lines run ahead do not crowd L1 out. Measured here, lockstep rows
/// (`R` = 4) prefetching 1 KiB over 4 KiB ahead: backward time 0.89-0.92 at
/// 8192 x 4096 and 0.95-0.96 at 1024 x 16384, forward 0.98-0.99. The
/// address may lie past the end of `s` (a prefetch never faults and the
/// pointer is never dereferenced).
#[inline(always)]
pub(crate) fn prefetch<T, const R: usize>(s: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = (s.as_ptr() as *const i8)
            .wrapping_add(i.wrapping_mul(std::mem::size_of::<T>()))
            .wrapping_add(PREFETCH_AHEAD / R);
        // SAFETY: prefetch has no preconditions (any address; no access).
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, i);
}

static PREFETCH_NEXT: AtomicBool = AtomicBool::new(true);

/// Turns [`prefetch_next`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed.
pub fn set_prefetch_next(on: bool) {
    PREFETCH_NEXT.store(on, Ordering::Relaxed)
}

/// Hints that `s[stride + i..]`'s line will be read soon, into L2. The
/// output pass over a row calls it with `stride` = the row length, so that
/// the next row's reads go out alongside this row's writes instead of after
/// them (measured here: 0.6-0.7 of a copy's rate without it at rows of 1-16
/// KiB). The address may lie past the end of `s` (a prefetch never faults
/// and the pointer is never dereferenced).
#[inline(always)]
pub(crate) fn prefetch_next<T>(s: &[T], stride: usize, i: usize) {
    #[cfg(target_arch = "x86_64")]
    if PREFETCH_NEXT.load(Ordering::Relaxed) {
        let p = s.as_ptr().wrapping_add(stride.wrapping_add(i)) as *const i8;
        // SAFETY: prefetch has no preconditions (any address; no access).
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, stride, i);
}

/// Orders this thread's non-temporal stores before anything it does next
/// (such as signalling that its task is done).
#[inline(always)]
pub(crate) fn fence<const NT: bool>() {
    #[cfg(target_arch = "x86_64")]
    if NT {
        // SAFETY: sfence has no preconditions; SSE is baseline on x86-64.
        unsafe { std::arch::x86_64::_mm_sfence() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_depend_on_row_length_only() {
        assert_eq!(rows_per_chunk(1), 64 * 1024);
        assert_eq!(rows_per_chunk(1000), 65);
        assert_eq!(rows_per_chunk(1 << 20), 1);
        assert_eq!(rows_per_chunk(0), 64 * 1024);
    }

    /// `y = x * 3 - 1` with `write_row`, in lanes `V`.
    struct Affine<'a, const NT: bool> {
        x: &'a [f32],
        y: &'a mut [f32],
    }

    impl<const NT: bool> Kernel<f32> for Affine<'_, NT> {
        type Output = ();
        #[inline(always)]
        fn run<V: Lanes<f32>>(self) {
            let (x, y) = (self.x, self.y);
            let n = y.len().min(x.len());
            let (x, y) = (&x[..n], &mut y[..n]);
            let (a, b) = (V::splat(3.0), V::splat(1.0));
            write_row::<f32, V, NT>(
                y,
                // SAFETY: write_row keeps i + LANES <= n = x.len().
                #[inline(always)]
                |i| unsafe { V::load_at(x, i) }.mul(a).sub(b),
                #[inline(always)]
                |i| x.get(i).map_or(0.0, |v| v * 3.0 - 1.0),
            );
            fence::<NT>();
        }
    }

    #[test]
    fn stream_copy_copies_every_length_and_offset() {
        let src: Vec<f32> = (0..200).map(|i| i as f32 * 0.5 - 7.0).collect();
        for n in [0usize, 1, 15, 16, 17, 64, 100, 180] {
            for off in 0..4 {
                let mut dst = vec![f32::NAN; n + off + 3];
                stream_copy(&mut dst[off..off + n], &src[off..off + n]);
                assert_eq!(&dst[off..off + n], &src[off..off + n], "n {n} off {off}");
                assert!(dst[..off].iter().chain(&dst[off + n..]).all(|v| v.is_nan()));
            }
        }
        let mut short = vec![0.0f32; 3];
        stream_copy(&mut short, &src);
        assert_eq!(short, &src[..3]);
    }

    #[test]
    fn every_build_and_store_kind_writes_the_same_values() {
        let x: Vec<f32> = (0..300).map(|i| i as f32 * 0.37 - 20.0).collect();
        for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 250] {
            for off in 0..5 {
                let want: Vec<f32> = x[off..off + n].iter().map(|v| v * 3.0 - 1.0).collect();
                let mut y = vec![0.0f32; n + off];
                dispatch(Affine::<true> {
                    x: &x[off..off + n],
                    y: &mut y[off..],
                });
                assert_eq!(y[off..], want[..], "stream n={n} off={off}");
                let mut y = vec![0.0f32; n + off];
                dispatch(Affine::<false> {
                    x: &x[off..off + n],
                    y: &mut y[off..],
                });
                assert_eq!(y[off..], want[..], "store n={n} off={off}");
                let mut y = vec![0.0f32; n + off];
                Affine::<true> {
                    x: &x[off..off + n],
                    y: &mut y[off..],
                }
                .run::<Portable<f32>>();
                assert_eq!(y[off..], want[..], "portable n={n} off={off}");
            }
        }
    }

    #[test]
    fn fold_is_pairwise() {
        let a: [f32; LANES] = std::array::from_fn(|i| i as f32);
        assert_eq!(fold(a), 120.0);
        // Pairwise, not left to right: 2^24 + 1 + 1 in sequence loses both
        // ones, while the pairs keep them.
        let mut b = [0.0f32; LANES];
        b[0] = 16_777_216.0;
        b[2] = 1.0;
        b[3] = 1.0;
        assert_eq!(fold(b), 16_777_218.0);
    }

    /// Folds `x` (16 values) in lanes `V`.
    struct Fold<'a>(&'a [f32; LANES]);

    impl Kernel<f32> for Fold<'_> {
        type Output = f32;
        #[inline(always)]
        fn run<V: Lanes<f32>>(self) -> f32 {
            V::load(self.0).fold()
        }
    }

    #[test]
    fn every_build_folds_in_the_same_order() {
        // Values whose sum depends on the order of the additions.
        let x: [f32; LANES] = std::array::from_fn(|i| {
            let m = [1e8f32, 1.0, -3.5, 7e-3, 1.5e7, -1e8, 0.25, 3.0];
            m[i % 8] * (1.0 + i as f32 * 0.37)
        });
        let want = fold(x);
        assert_eq!(Fold(&x).run::<Portable<f32>>(), want);
        for limit in [Simd::Avx512, Simd::Avx2, Simd::Portable] {
            if limit <= best_simd() {
                set_simd_limit(limit);
                assert_eq!(dispatch(Fold(&x)).to_bits(), want.to_bits(), "{limit}");
            }
        }
        set_simd_limit(Simd::Avx512);
        let left_to_right = x.iter().fold(0.0f32, |a, &b| a + b);
        assert_ne!(
            want, left_to_right,
            "the test values must depend on the order"
        );
    }

    #[test]
    fn streaming_needs_f32_and_a_large_output() {
        assert!(!should_stream::<f64>(usize::MAX / 8));
        assert!(!should_stream::<f32>(16));
    }

    #[test]
    fn simd_is_within_what_the_cpu_has() {
        assert!(simd() <= best_simd());
        assert!(Simd::Portable < Simd::Avx2 && Simd::Avx2 < Simd::Avx512);
        assert_eq!(Simd::Avx512.to_string(), "AVX-512");
    }
}
