//! A cache of large host buffers.
//!
//! Fresh allocations above glibc's mmap threshold come back as new pages, and
//! touching each page costs a fault: on a 64 MB output that is slower than
//! the kernel itself. Large tensor buffers are therefore recycled: when a
//! tensor's storage drops, its vector goes back here, and the next request
//! for the same length reuses it. Small buffers go straight to the allocator.
//! The cache holds at most [`MAX_CACHED_BYTES`] (and [`MAX_BUFFERS`]
//! buffers) per element type; a buffer that does not fit evicts the oldest
//! ones, so the cache follows the sizes in use now.

use crate::dtype::Element;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns buffer recycling on or off for every element type (on by default).
/// Off, [`Pool::take`] allocates and [`Pool::give`] frees: a process-wide
/// switch for benchmarks that measure what the pool is worth.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed)
}

/// Whether buffers are recycled (see [`set_enabled`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Buffers smaller than this are never cached.
pub const MIN_POOLED_BYTES: usize = 1 << 20;
/// Upper bound on the bytes the cache keeps alive.
pub const MAX_CACHED_BYTES: usize = 1 << 30;
/// At most this many buffers are kept per element type.
pub const MAX_BUFFERS: usize = 32;

/// Free buffers of one element type.
pub struct Pool<T> {
    free: Mutex<(Vec<Vec<T>>, usize)>,
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
            free: Mutex::new((Vec::new(), 0)),
            limit,
        }
    }

    /// A vector of length `n`. Its contents are unspecified (stale values of
    /// a recycled buffer, or zeros): callers overwrite every element.
    pub fn take(&self, n: usize) -> Vec<T> {
        if n * std::mem::size_of::<T>() >= MIN_POOLED_BYTES && enabled() {
            if let Ok(mut g) = self.free.lock() {
                if let Some(i) = g.0.iter().rposition(|v| v.len() == n) {
                    let v = g.0.remove(i);
                    g.1 -= n * std::mem::size_of::<T>();
                    return v;
                }
            }
        }
        vec![T::default(); n]
    }

    /// Returns a buffer for reuse (kept only if large and the cache has room).
    pub fn give(&self, v: Vec<T>) {
        let bytes = v.len() * std::mem::size_of::<T>();
        if bytes < MIN_POOLED_BYTES || v.len() != v.capacity() || !enabled() {
            return;
        }
        if bytes > self.limit {
            return;
        }
        let mut evicted = Vec::new();
        if let Ok(mut g) = self.free.lock() {
            while !g.0.is_empty() && (g.0.len() >= MAX_BUFFERS || g.1 + bytes > self.limit) {
                let old = g.0.remove(0);
                g.1 -= old.len() * std::mem::size_of::<T>();
                evicted.push(old);
            }
            g.1 += bytes;
            g.0.push(v);
        }
        // Evicted buffers are freed here, outside the lock.
        drop(evicted);
    }

    /// Bytes currently cached.
    pub fn cached_bytes(&self) -> usize {
        self.free.lock().map(|g| g.1).unwrap_or(0)
    }

    /// Frees every cached buffer.
    pub fn clear(&self) {
        if let Ok(mut g) = self.free.lock() {
            *g = (Vec::new(), 0);
        }
    }
}

impl<T: Element> Default for Pool<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Storage that returns itself to its element type's pool on drop.
pub(crate) struct Buffer<T: Element>(pub(crate) Vec<T>);

impl<T: Element> Drop for Buffer<T> {
    fn drop(&mut self) {
        T::pool().give(std::mem::take(&mut self.0));
    }
}

impl<T: Element> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = MIN_POOLED_BYTES / 4;

    #[test]
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

    #[test]
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
