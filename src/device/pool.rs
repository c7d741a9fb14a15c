//! A cache of large host buffers.
//!
//! Fresh allocations above glibc's mmap threshold come back as new pages, and
//! touching each page costs a fault: on a 64 MB output that is slower than
//! the kernel itself. Large tensor buffers are therefore recycled: when a
//! tensor's storage drops, its vector goes back here, and the next request
//! for the same length reuses it. Small buffers go straight to the allocator.
//! The cache holds at most [`MAX_CACHED_BYTES`]; beyond that, buffers are
//! freed as usual.

use crate::dtype::Element;
use std::sync::Mutex;

/// Buffers smaller than this are never cached.
pub const MIN_POOLED_BYTES: usize = 1 << 20;
/// Upper bound on the bytes the cache keeps alive.
pub const MAX_CACHED_BYTES: usize = 1 << 30;
/// At most this many buffers are kept per element type.
const MAX_BUFFERS: usize = 32;

/// Free buffers of one element type.
pub struct Pool<T> {
    free: Mutex<(Vec<Vec<T>>, usize)>,
}

impl<T: Element> Pool<T> {
    /// An empty pool.
    pub const fn new() -> Self {
        Pool {
            free: Mutex::new((Vec::new(), 0)),
        }
    }

    /// A vector of length `n`. Its contents are unspecified (stale values of
    /// a recycled buffer, or zeros): callers overwrite every element.
    pub fn take(&self, n: usize) -> Vec<T> {
        if n * std::mem::size_of::<T>() >= MIN_POOLED_BYTES {
            if let Ok(mut g) = self.free.lock() {
                if let Some(i) = g.0.iter().position(|v| v.len() == n) {
                    let v = g.0.swap_remove(i);
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
        if bytes < MIN_POOLED_BYTES || v.len() != v.capacity() {
            return;
        }
        if let Ok(mut g) = self.free.lock() {
            if g.0.len() < MAX_BUFFERS && g.1 + bytes <= MAX_CACHED_BYTES {
                g.1 += bytes;
                g.0.push(v);
            }
        }
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
