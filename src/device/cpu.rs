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
//!
//! Files: this one holds the chunking, the [`Kernel`] dispatch and the
//! prefetch hints; `lanes` the SIMD builds, `team` the threads that run
//! the tasks, `tuning` the speed switches and thresholds, `write` the row
//! writers, and `tests` their unit tests.

// The `probes` feature re-exports some items of this module, whose docs
// link to the kernels' crate-private helpers.
#![allow(rustdoc::private_intra_doc_links)]

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

type Acc<T> = <T as Element>::Acc;

/// A unit of kernel work, written once over any [`Lanes`] type. `run` must
/// be `#[inline(always)]`, and so must everything it calls that holds a hot
/// loop, so that each SIMD build really is built for its instruction set.
pub(crate) trait Kernel<T: Element> {
    /// What the work returns.
    type Output;
    /// Does the work in lanes of type `V`.
    fn run<V: Lanes<T>>(self) -> Self::Output;

    /// Whether the work runs in 256-bit lanes (the AVX2 build) even where
    /// AVX-512 is there (the LayerNorm kernels' narrow lanes).
    fn narrow(&self) -> bool {
        false
    }
}

/// The instruction set `k` runs with: [`simd`], but AVX2 where `k` asks
/// for [`Kernel::narrow`] lanes.
pub(crate) fn lanes_for<T: Element, K: Kernel<T>>(k: &K) -> Simd {
    match simd() {
        Simd::Avx512 if k.narrow() => Simd::Avx2,
        s => s,
    }
}

/// Runs `k` with the lanes of [`lanes_for`] when `T` is f32, else with
/// [`Portable`] lanes.
#[inline(always)]
pub(crate) fn dispatch<T: Element, K: Kernel<T>>(k: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    if <T as CpuBuilds>::SIMD {
        #[target_feature(enable = "avx2")]
        fn avx2<T: Element, K: Kernel<T>>(k: K) -> K::Output {
            k.run::<x86::Avx2>()
        }
        #[target_feature(enable = "avx512f")]
        fn avx512<T: Element, K: Kernel<T>>(k: K) -> K::Output {
            k.run::<x86::Avx512>()
        }
        match lanes_for(&k) {
            // SAFETY: `simd` reports only what the CPU supports, and a CPU
            // with AVX-512F has AVX2.
            Simd::Avx512 => return unsafe { avx512::<T, K>(k) },
            Simd::Avx2 => return unsafe { avx2::<T, K>(k) },
            Simd::Portable => {}
        }
    }
    k.run::<Portable<T>>()
}

/// Runs each job through [`dispatch`], in parallel when there are several
/// ([`run_each`]), and returns their outputs in job order.
pub(crate) fn dispatch_all<T: Element, K: Kernel<T> + Send>(jobs: Vec<K>) -> Vec<K::Output>
where
    K::Output: Send,
{
    run_each(jobs, dispatch)
}

/// How far ahead (in bytes) the first pass over a row prefetches. The
/// hardware prefetcher stops at 4 KiB page boundaries; asking for the line
/// a page ahead keeps a read stream going across them.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Hints that `s[i..]`'s line [`PREFETCH_AHEAD`]` / R` bytes ahead will be
/// read soon, for one of `R` rows read in lockstep: the bytes asked for
/// ahead of all the streams together stay the same whatever `R` is, so
/// the lines run ahead do not crowd L1 out. The address may lie past the
/// end of `s` (a prefetch never faults and the pointer is never
/// dereferenced).
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
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_prefetch_next(on: bool) {
    PREFETCH_NEXT.store(on, Ordering::Relaxed)
}

/// Whether [`prefetch_next`] is on. Kernels read it once per task, not in
/// their loops: in a loop, the atomic load and its branch keep LLVM from
/// taking the test out of the output pass.
#[inline(always)]
pub(crate) fn prefetch_next_on() -> bool {
    PREFETCH_NEXT.load(Ordering::Relaxed)
}

/// Hints that `s[stride + i..]`'s line will be read soon, into L2. The
/// output pass over a row calls it with `stride` = the row length, so that
/// the next row's reads go out alongside this row's writes instead of after
/// them. The address may lie past the end of `s` (a prefetch never faults
/// and the pointer is never dereferenced). Callers check
/// [`prefetch_next_on`] first.
#[inline(always)]
pub(crate) fn prefetch_next<T>(s: &[T], stride: usize, i: usize) {
    #[cfg(target_arch = "x86_64")]
    {
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

mod lanes;
mod profile;
mod team;
#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
#[cfg(target_arch = "x86_64")]
pub(crate) mod transpose;
mod write;

/// Held by the tests that flip [`set_simd_limit`], the narrow lanes or
/// [`set_profile`] (or read the profile),
/// or that check which build a kernel ran with.
#[cfg(feature = "selftest")]
pub(crate) static SIMD_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(feature = "selftest")]
pub(crate) use lanes::best_simd;
#[cfg(any(feature = "selftest", feature = "probes"))]
pub use lanes::set_simd_limit;
#[cfg(target_arch = "x86_64")]
use lanes::x86;
pub use lanes::CpuBuilds;
pub(crate) use lanes::{is_f32, Lanes, Portable};
pub use lanes::{simd, Simd};
pub use profile::profile;
pub use profile::Profile;
pub(crate) use profile::Switch;
#[cfg(any(feature = "selftest", feature = "probes"))]
pub use profile::{cpu_vendor, set_profile};
pub use team::run_each;
pub(crate) use team::run_tasks;
#[cfg(feature = "probes")]
pub use team::set_team;
#[cfg(feature = "selftest")]
use team::{SPIN, YIELD};
pub(crate) use write::should_stream;
#[cfg_attr(not(feature = "probes"), allow(unused_imports))] // read by `probes`
pub use write::stream_copy;
#[cfg_attr(not(feature = "probes"), allow(unused_imports))] // read by `probes` and tests
pub use write::{set_stream_threshold, stream_threshold, DEFAULT_STREAM_BYTES};
pub(crate) use write::{write_row, write_rows_ahead, write_rows_with};
