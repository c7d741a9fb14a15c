//! CPU work splitting. Chunk sizes depend only on the problem shape, never on
//! the number of threads, so reductions over chunks are bitwise reproducible.

/// Rows per chunk for a row-wise kernel over rows of `d` elements: about
/// `TARGET` elements per chunk, at least one row.
pub fn rows_per_chunk(d: usize) -> usize {
    const TARGET: usize = 64 * 1024;
    (TARGET / d.max(1)).max(1)
}
