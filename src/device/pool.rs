//! A cache of large host buffers.
//!
//! Fresh allocations above glibc's mmap threshold come back as new pages, and
//! touching each page costs a fault: on a large output that is slower than
//! the kernel itself. Large tensor buffers are therefore recycled: when a
//! tensor's storage drops, its vector goes back here, and the next request
//! for the same length reuses it. Small buffers go straight to the allocator.
//! The cache holds at most [`MAX_CACHED_BYTES`] (and [`MAX_BUFFERS`]
//! buffers) per element type, not counting up to [`SLACK_BYTES`] per buffer
//! of alignment slack ([`Buffer`]); a buffer that does not fit evicts the
//! oldest small ones, then the oldest large ones that are no longer in use
//! ([`STALE_TAKES`]), then the oldest large ones ([`SMALL_PART`]), so the
//! cache follows the sizes in use now.
//!
//! Fresh large buffers ask Linux for transparent huge pages ([`fresh`]).

// The `probes` feature re-exports some items of this module, whose docs
// link to its crate-private ones.
#![allow(rustdoc::private_intra_doc_links)]

use crate::dtype::{DType, Element};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns buffer recycling on or off for every element type (on by default).
/// Off, [`Pool::take`] allocates and [`Pool::give`] frees: a process-wide
/// switch for benchmarks that measure what the pool is worth.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed)
}

/// Whether buffers are recycled (see [`set_enabled`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

static HUGE: AtomicBool = AtomicBool::new(true);

/// Turns [`fresh`]'s request for huge pages on or off (on by default; a
/// process-wide switch for benchmarks that measure what it is worth).
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_huge_pages(on: bool) {
    HUGE.store(on, Ordering::Relaxed)
}

/// Fresh buffers of at least this many bytes ask for transparent huge
/// pages ([`fresh`]).
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// `n` default values in a fresh allocation. From [`HUGE_PAGE_MIN_BYTES`]
/// on Linux, the allocation's whole 2 MiB pages are marked
/// `MADV_HUGEPAGE` before the first touch, so that where transparent huge
/// pages are `madvise` (the default of many distributions) the kernel
/// backs them with 2 MiB pages. Each 4 KiB page is otherwise a TLB entry
/// of its own, and the streams of a LayerNorm step cross a page every
/// 4 KiB. Where the kernel refuses (no THP), the pages stay as they are.
pub fn fresh<T: Element>(n: usize) -> Vec<T> {
    try_fresh(n).unwrap_or_else(|| vec![T::default(); n])
}

/// [`fresh`], or `None` where the allocator refuses the memory.
fn try_fresh<T: Element>(n: usize) -> Option<Vec<T>> {
    let mut v: Vec<T> = Vec::new();
    v.try_reserve_exact(n).ok()?;
    advise_unused(&mut v);
    v.resize(n, T::default());
    Some(v)
}

/// Asks for huge pages for the spare capacity of `v` (as [`fresh`]), which
/// nothing may have touched yet.
pub(crate) fn advise_unused<T>(v: &mut Vec<T>) {
    let bytes = std::mem::size_of::<T>() * (v.capacity() - v.len());
    if bytes >= HUGE_PAGE_MIN_BYTES && HUGE.load(Ordering::Relaxed) {
        advise_huge(v.spare_capacity_mut().as_mut_ptr().cast(), bytes);
    }
}

/// Marks the whole 2 MiB pages of `[ptr, ptr + bytes)` `MADV_HUGEPAGE`.
#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, bytes: usize) {
    const HUGE: usize = 2 << 20;
    const MADV_HUGEPAGE: i32 = 14;
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + bytes) / HUGE * HUGE;
    if end > start {
        // SAFETY: the range lies inside this allocation, which nothing has
        // touched yet; the advice changes how pages are backed, never their
        // contents, and a refusal (the return value) leaves them as they are.
        let _ = unsafe { madvise(start as *mut _, end - start, MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: *mut u8, _: usize) {}

/// Buffers smaller than this are never cached. It lies below glibc's
/// starting mmap threshold (128 KiB): blocks from there up come back as
/// fresh pages, and a call on outputs of that size would spend more time
/// in page faults than in the kernel.
pub const MIN_POOLED_BYTES: usize = 64 << 10;
/// Upper bound on the bytes the cache keeps alive.
pub const MAX_CACHED_BYTES: usize = 1 << 30;
/// At most this many buffers are kept per element type: enough for every
/// large tensor of a training step, so the next step finds each of them
/// here (docs/performance.md, "Training step").
pub const MAX_BUFFERS: usize = 512;
/// Buffers under `1 / SMALL_PART` of the cache's limit (64 MiB by default)
/// are evicted first, the oldest of them first; then the oldest of the
/// rest ([`STALE_TAKES`] first). A small buffer that could fit only by
/// evicting a large one still in use is not kept.
/// Faulting a small buffer in again costs little, and a training step
/// whose buffers overrun the limit by a little should lose a little, not
/// one of its large outputs.
pub const SMALL_PART: usize = 16;
/// A cached buffer is stale once this many requests for pooled buffers
/// have passed since it was given back or its length last asked for
/// (twice what the cache can hold: a step that uses a buffer asks for it
/// again well within that). A small buffer may evict a stale large one,
/// so that the large buffers of a finished workload do not stay for good.
pub const STALE_TAKES: u64 = 2 * MAX_BUFFERS as u64;
/// The slack a [`Buffer`] takes beyond its length to start 64-byte
/// aligned. The cache's byte limit allows it per buffer, so that outputs
/// that fill the limit exactly (two of half of it each) both stay.
pub const SLACK_BYTES: usize = 64;

/// The cached buffers, oldest first, each with the request count at which
/// it was given back or its length last asked for; their bytes; and the
/// number of requests for pooled buffers so far.
struct Free<T> {
    bufs: Vec<(Vec<T>, u64)>,
    bytes: usize,
    takes: u64,
}

/// The pool of `T`'s buffers (one per element type, found by its
/// [`DType`]); none for the probes' counting type.
fn pool_of<T: Element>() -> Option<&'static Pool<T>> {
    static F32: Pool<f32> = Pool::new();
    static F64: Pool<f64> = Pool::new();
    static F16: Pool<half::f16> = Pool::new();
    static BF16: Pool<half::bf16> = Pool::new();
    let any: &'static dyn Any = match T::DTYPE {
        DType::F32 => &F32,
        DType::F64 => &F64,
        DType::F16 => &F16,
        DType::BF16 => &BF16,
        DType::Probe => return None,
    };
    any.downcast_ref::<Pool<T>>()
}

/// A vector of length `n` from `T`'s pool (contents unspecified: callers
/// overwrite every element).
pub(crate) fn take<T: Element>(n: usize) -> Vec<T> {
    match pool_of::<T>() {
        Some(p) => p.take(n),
        None => fresh(n),
    }
}

/// Frees every buffer cached for `T`.
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub fn clear<T: Element>() {
    if let Some(p) = pool_of::<T>() {
        p.clear()
    }
}

/// Hands `v` back to `T`'s pool.
pub(crate) fn give<T: Element>(v: Vec<T>) {
    if let Some(p) = pool_of::<T>() {
        p.give(v)
    }
}

/// Free buffers of one element type.
pub struct Pool<T> {
    free: Mutex<Free<T>>,
    limit: usize,
}

impl<T: Element> Pool<T> {
    /// An empty pool that caches up to [`MAX_CACHED_BYTES`].
    pub const fn new() -> Self {
        Self::with_limit(MAX_CACHED_BYTES)
    }

    /// An empty pool that caches up to `limit` bytes.
    pub const fn with_limit(limit: usize) -> Self {
        Pool {
            free: Mutex::new(Free {
                bufs: Vec::new(),
                bytes: 0,
                takes: 0,
            }),
            limit,
        }
    }

    /// A vector of length `n`. Its contents are unspecified (stale values of
    /// a recycled buffer, or zeros): callers overwrite every element.
    pub fn take(&self, n: usize) -> Vec<T> {
        self.try_take(n).unwrap_or_else(|| fresh(n))
    }

    /// [`Pool::take`], or `None` where a fresh allocation is refused.
    fn try_take(&self, n: usize) -> Option<Vec<T>> {
        let t = crate::profile::alloc_start();
        let v = self.take_untimed(n);
        crate::profile::alloc_stop(t);
        v
    }

    fn take_untimed(&self, n: usize) -> Option<Vec<T>> {
        if n * std::mem::size_of::<T>() >= MIN_POOLED_BYTES && enabled() {
            if let Ok(mut g) = self.free.lock() {
                g.takes += 1;
                let now = g.takes;
                for (v, at) in g.bufs.iter_mut() {
                    if v.len() == n {
                        *at = now;
                    }
                }
                if let Some(i) = g.bufs.iter().rposition(|(v, _)| v.len() == n) {
                    let (v, _) = g.bufs.remove(i);
                    g.bytes -= n * std::mem::size_of::<T>();
                    return Some(v);
                }
            }
        }
        try_fresh(n)
    }

    /// Returns a buffer for reuse (kept only if large and the cache has room).
    pub fn give(&self, v: Vec<T>) {
        let t = crate::profile::alloc_start();
        self.give_untimed(v);
        crate::profile::alloc_stop(t);
    }

    fn give_untimed(&self, v: Vec<T>) {
        let size = |v: &Vec<T>| std::mem::size_of_val(v.as_slice());
        let bytes = size(&v);
        if bytes < MIN_POOLED_BYTES || v.len() != v.capacity() || !enabled() {
            return;
        }
        if bytes > self.limit + SLACK_BYTES {
            return;
        }
        let small = |b: usize| b < self.limit / SMALL_PART;
        // Whether `v` fits beside `count` cached buffers of `sum` bytes.
        let fits = |count: usize, sum: usize| {
            count < MAX_BUFFERS && sum + bytes <= self.limit + SLACK_BYTES * (count + 1)
        };
        let mut evicted = Vec::new();
        if let Ok(mut g) = self.free.lock() {
            let now = g.takes;
            let stale = |at: u64| now - at > STALE_TAKES;
            if small(bytes) {
                // A small buffer never pushes out a large one in use: if
                // the small and stale ones cannot make room, it is not kept.
                let large = g
                    .bufs
                    .iter()
                    .filter(|(v, at)| !small(size(v)) && !stale(*at));
                let (count, sum) = large.fold((0, 0), |(k, s), (v, _)| (k + 1, s + size(v)));
                if !fits(count, sum) {
                    return;
                }
            }
            while !g.bufs.is_empty() && !fits(g.bufs.len(), g.bytes) {
                let b = &g.bufs;
                let at = (b.iter().position(|(v, _)| small(size(v))))
                    .or_else(|| b.iter().position(|(_, at)| stale(*at)))
                    .unwrap_or(0);
                let (old, _) = g.bufs.remove(at);
                g.bytes -= size(&old);
                evicted.push(old);
            }
            g.bytes += bytes;
            g.bufs.push((v, now));
        }
        // Evicted buffers are freed here, outside the lock.
        drop(evicted);
    }

    /// Bytes currently cached.
    #[cfg_attr(not(feature = "selftest"), allow(dead_code))] // the unit tests read it
    pub fn cached_bytes(&self) -> usize {
        self.free.lock().map(|g| g.bytes).unwrap_or(0)
    }

    /// Frees every cached buffer.
    pub fn clear(&self) {
        if let Ok(mut g) = self.free.lock() {
            g.bufs.clear();
            g.bytes = 0;
        }
    }
}

impl<T: Element> Default for Pool<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Tensor storage: `len` elements of `v` from `off`, returned to its
/// element type's pool on drop. Buffers a kernel fills ([`Buffer::take`])
/// start 64-byte aligned: the allocator hands out large blocks 16 bytes
/// past a page, and rows that start off a cache line make the streamed
/// output pass write each row's first and last partial line with plain
/// scalar stores (at 128-wide f32 rows, one line in eight). A user's
/// vector ([`Buffer::from_vec`]) is kept as it is.
#[doc(hidden)]
pub struct Buffer<T: Element> {
    v: Vec<T>,
    off: usize,
    len: usize,
}

impl<T: Element> Buffer<T> {
    /// Elements of slack that let a buffer start 64-byte aligned.
    const PAD: usize = SLACK_BYTES.div_ceil(std::mem::size_of::<T>());

    /// A buffer of `n` elements, 64-byte aligned where the element size
    /// allows, recycled from the pool when one of that size is free
    /// (contents unspecified: callers overwrite every element).
    pub(crate) fn take(n: usize) -> Self {
        Self::within(take::<T>(n + Self::PAD), n)
    }

    /// [`Buffer::take`] for an output that may be far larger than any
    /// tensor in use: `None` where the allocator refuses the memory.
    pub(crate) fn try_take(n: usize) -> Option<Self> {
        let v = match pool_of::<T>() {
            Some(p) => p.try_take(n.checked_add(Self::PAD)?)?,
            None => try_fresh(n.checked_add(Self::PAD)?)?,
        };
        Some(Self::within(v, n))
    }

    /// `n` elements of `v` (which holds at least `n + PAD`), from its
    /// first 64-byte boundary.
    fn within(v: Vec<T>, n: usize) -> Self {
        let off = v.as_ptr().align_offset(64).min(Self::PAD);
        Buffer { v, off, len: n }
    }

    /// A copy of `s`, 64-byte aligned (see [`Buffer::take`]).
    pub(crate) fn copied(s: &[T]) -> Self {
        let mut b = Self::take(s.len());
        b.copy_from_slice(s);
        b
    }

    /// The first `n` items of `it` (which yields at least `n`), 64-byte
    /// aligned and from the pool when one of that size is free.
    pub(crate) fn collect(n: usize, it: impl Iterator<Item = T>) -> Self {
        let mut b = Self::take(n);
        for (o, v) in b.iter_mut().zip(it) {
            *o = v;
        }
        b
    }

    /// `n` copies of `x`, 64-byte aligned, or `None` if the allocator
    /// refuses the memory.
    pub(crate) fn try_filled(n: usize, x: T) -> Option<Self> {
        let t = crate::profile::alloc_start();
        let v = (|| {
            let mut v = Vec::new();
            v.try_reserve_exact(n.checked_add(Self::PAD)?).ok()?;
            advise_unused(&mut v);
            v.resize(n + Self::PAD, x);
            Some(v)
        })();
        crate::profile::alloc_stop(t);
        Some(Self::within(v?, n))
    }

    /// A user's vector, as it is.
    pub(crate) fn from_vec(v: Vec<T>) -> Self {
        let len = v.len();
        Buffer { v, off: 0, len }
    }

    /// The elements as a vector (moved to the front of the allocation if
    /// they start past it: a copy within, no new allocation).
    pub(crate) fn into_vec(mut self) -> Vec<T> {
        let mut v = std::mem::take(&mut self.v);
        if self.off > 0 {
            v.copy_within(self.off..self.off + self.len, 0);
        }
        v.truncate(self.len);
        v
    }
}

impl<T: Element> Default for Buffer<T> {
    fn default() -> Self {
        Buffer::from_vec(Vec::new())
    }
}

impl<T: Element> Drop for Buffer<T> {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.v));
    }
}

impl<T: Element> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[self.off..self.off + self.len]
    }
}

impl<T: Element> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[self.off..self.off + self.len]
    }
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        large_fresh_buffers_ask_for_huge_pages,
        large_buffers_are_reused_small_ones_are_not,
        kernel_buffers_start_on_a_cache_line_and_keep_their_values,
        a_cache_of_two_buffers_holds_two_kernel_outputs,
        small_buffers_are_evicted_before_large_ones,
        a_stale_large_buffer_makes_room_for_small_ones,
        large_buffers_in_use_outlast_small_requests,
        a_full_cache_evicts_its_oldest_buffers,
    ];

    /// The `VmFlags` of the mapping that holds `addr`, from
    /// `/proc/self/smaps`, or `None` where there is no such file.
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((a, b)) = range {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.to_string());
                }
            }
        }
        None
    }

    fn large_fresh_buffers_ask_for_huge_pages() {
        let n = (16 << 20) / 4;
        let v = fresh::<f32>(n);
        assert_eq!(v.len(), n);
        assert!(v.iter().all(|&x| x == 0.0));
        let inner = (v.as_ptr() as usize).next_multiple_of(2 << 20);
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled");
        let Some(flags) = vm_flags(inner).filter(|_| thp.exists()) else {
            eprintln!("skipped: no transparent huge pages, or no /proc/self/smaps");
            return;
        };
        let huge = |f: &str| f.split_whitespace().any(|f| f == "hg");
        assert!(huge(&flags), "{flags}");
        // A small one is left as the allocator gives it.
        let small = fresh::<f32>(1 << 10);
        if let Some(flags) = vm_flags(small.as_ptr() as usize) {
            assert!(!huge(&flags), "{flags}");
        }
    }

    const BIG: usize = MIN_POOLED_BYTES / 4;

    fn large_buffers_are_reused_small_ones_are_not() {
        let p = Pool::<f32>::new();
        let v = p.take(BIG);
        let ptr = v.as_ptr();
        p.give(v);
        assert_eq!(p.cached_bytes(), BIG * 4);
        let w = p.take(BIG);
        assert_eq!(w.as_ptr(), ptr, "the cached buffer comes back");
        assert_eq!(p.cached_bytes(), 0);
        p.give(vec![0.0f32; 16]);
        assert_eq!(p.cached_bytes(), 0);
        // Another length is a fresh buffer; the cached one stays.
        p.give(w);
        let other = p.take(BIG + 1);
        assert_eq!(other.len(), BIG + 1);
        assert_eq!(p.cached_bytes(), BIG * 4);
        p.clear();
        assert_eq!(p.cached_bytes(), 0);
    }

    fn kernel_buffers_start_on_a_cache_line_and_keep_their_values() {
        fn check<T: Element>(n: usize) {
            let mut b = Buffer::<T>::take(n);
            assert_eq!(b.len(), n);
            assert_eq!(b.as_ptr() as usize % 64, 0, "{} x {n}", T::NAME);
            for (i, v) in b.iter_mut().enumerate() {
                *v = T::from_f64((i % 1000) as f64);
            }
            let v = b.into_vec();
            assert_eq!(v.len(), n);
            assert!(v
                .iter()
                .enumerate()
                .all(|(i, &x)| x == T::from_f64((i % 1000) as f64)));
        }
        for n in [1, 15, 1000, BIG, BIG + 3] {
            check::<f32>(n);
            check::<f64>(n);
            check::<half::f16>(n);
            check::<half::bf16>(n);
        }
        // Recycled buffers are aligned too.
        let b = Buffer::<f32>::take(BIG);
        drop(b);
        assert_eq!(Buffer::<f32>::take(BIG).as_ptr() as usize % 64, 0);
    }

    fn a_cache_of_two_buffers_holds_two_kernel_outputs() {
        // Two outputs of half the limit each, with their alignment slack.
        let n = BIG + Buffer::<f32>::PAD;
        let p = Pool::<f32>::with_limit(2 * BIG * 4);
        let two = || [p.take(n), p.take(n)];
        let [a, b] = two();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        p.give(a);
        p.give(b);
        assert_eq!(p.cached_bytes(), 2 * (BIG * 4 + SLACK_BYTES));
        let got = two();
        assert_eq!([got[0].as_ptr(), got[1].as_ptr()], [pb, pa]);
        // A third evicts the oldest (`pb`, given back first).
        for v in got {
            p.give(v);
        }
        let third = vec![0.0f32; n];
        let pc = third.as_ptr();
        p.give(third);
        assert_eq!(p.cached_bytes(), 2 * (BIG * 4 + SLACK_BYTES));
        let got = two();
        assert_eq!([got[0].as_ptr(), got[1].as_ptr()], [pc, pa]);
        assert_eq!(p.cached_bytes(), 0);
    }

    fn small_buffers_are_evicted_before_large_ones() {
        // Two large buffers fill the limit; a small one given between them
        // goes when the second arrives, and both large ones stay.
        let (small, large) = (BIG, 16 * BIG);
        let p = Pool::<f32>::with_limit(2 * large * 4);
        assert!(small * 4 < 2 * large * 4 / SMALL_PART);
        let [a, s, b] = [p.take(large), p.take(small), p.take(large)];
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        p.give(a);
        p.give(s);
        assert_eq!(p.cached_bytes(), (large + small) * 4);
        p.give(b);
        assert_eq!(p.cached_bytes(), 2 * large * 4);
        let got = [p.take(large), p.take(large)];
        assert_eq!([got[0].as_ptr(), got[1].as_ptr()], [pb, pa]);
        // With only large buffers left, the oldest goes first.
        let [c, d] = got;
        let pc = c.as_ptr();
        p.give(c);
        p.give(d);
        p.give(vec![0.0f32; large]);
        assert_eq!(p.cached_bytes(), 2 * large * 4);
        let [e, f] = [p.take(large), p.take(large)];
        assert!(e.as_ptr() != pc && f.as_ptr() != pc);
        // A small buffer given to a cache full of large ones is dropped;
        // the large ones stay.
        let (pe, pf) = (e.as_ptr(), f.as_ptr());
        p.give(e);
        p.give(f);
        p.give(vec![0.0f32; small]);
        assert_eq!(p.cached_bytes(), 2 * large * 4);
        let got = [p.take(large), p.take(large)];
        assert_eq!([got[0].as_ptr(), got[1].as_ptr()], [pf, pe]);
    }

    fn a_stale_large_buffer_makes_room_for_small_ones() {
        // Two large buffers of a finished workload fill the cache. A small
        // buffer asked for and given back again and again is dropped while
        // they count as in use, and kept once they are stale, by evicting
        // the oldest of them.
        let (small, large) = (BIG, 16 * BIG);
        let p = Pool::<f32>::with_limit(2 * large * 4);
        let [a, b] = [p.take(large), p.take(large)];
        let pb = b.as_ptr();
        p.give(a);
        p.give(b);
        let mut kept_after = None;
        for k in 1..=2 * STALE_TAKES {
            let s = p.take(small);
            p.give(s);
            if p.cached_bytes() == (large + small) * 4 {
                kept_after.get_or_insert(k);
            } else {
                assert!(kept_after.is_none(), "dropped again at request {k}");
                assert_eq!(p.cached_bytes(), 2 * large * 4, "request {k}");
            }
        }
        // Stale after STALE_TAKES requests; the first small buffer given
        // back after that is kept.
        assert_eq!(kept_after, Some(STALE_TAKES + 1));
        let s = p.take(small);
        let ps = s.as_ptr();
        p.give(s);
        let (s, l) = (p.take(small), p.take(large));
        assert_eq!(s.as_ptr(), ps, "the small buffer is reused");
        // The newer large buffer stayed.
        assert_eq!(l.as_ptr(), pb);
    }

    fn large_buffers_in_use_outlast_small_requests() {
        // Each step takes two large buffers that fill the cache and gives
        // them back; between steps come small requests, fewer than
        // STALE_TAKES. The small buffers are given back while the large
        // ones are cached, and never push them out.
        let (small, large) = (BIG, 16 * BIG);
        let p = Pool::<f32>::with_limit(2 * large * 4);
        let [a, b] = [p.take(large), p.take(large)];
        let mut want = [a.as_ptr(), b.as_ptr()];
        want.sort();
        p.give(a);
        p.give(b);
        for step in 0..8 {
            let [a, b] = [p.take(large), p.take(large)];
            let mut got = [a.as_ptr(), b.as_ptr()];
            got.sort();
            assert_eq!(got, want, "step {step}");
            p.give(a);
            p.give(b);
            for _ in 0..STALE_TAKES - 2 {
                let s = p.take(small);
                p.give(s);
            }
            assert_eq!(p.cached_bytes(), 2 * large * 4, "step {step}");
        }
    }

    fn a_full_cache_evicts_its_oldest_buffers() {
        let n = BIG;
        let p = Pool::<f64>::with_limit(4 * n * 8);
        let bufs: Vec<Vec<f64>> = (0..5).map(|_| p.take(n)).collect();
        let first = bufs[0].as_ptr();
        let last = bufs[4].as_ptr();
        for b in bufs {
            p.give(b);
        }
        // Four fit; the fifth evicted the first.
        assert_eq!(p.cached_bytes(), 4 * n * 8);
        let got: Vec<Vec<f64>> = (0..4).map(|_| p.take(n)).collect();
        assert_eq!(got[0].as_ptr(), last, "newest first");
        assert!(got.iter().all(|v| v.as_ptr() != first));
        assert_eq!(p.cached_bytes(), 0);
    }
}
