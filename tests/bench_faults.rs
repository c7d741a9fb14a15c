//! A warm training step faults in no fresh pages: its large outputs come
//! from the buffer pool. Its own test binary, because the fault count is
//! the whole process's.

use fusegrad::device::pool;

include!("common/faults.rs");

/// 8192 x 1152 f32: 36 MiB outputs, past glibc's largest mmap threshold
/// (32 MiB), so without the pool every step maps them afresh.
const SHAPE: (usize, usize) = (8192, 1152);

#[test]
fn a_warm_step_faults_in_no_fresh_pages_and_one_without_the_pool_does() {
    let (n, d) = SHAPE;
    let Some((pooled, with)) = measure_faults(n, d) else {
        return;
    };
    pool::set_enabled(false);
    let (_, without) = measure_faults(n, d).expect("counted once, counted twice");
    pool::set_enabled(true);
    // Two 36 MiB outputs a step: 18432 faults in 4 KiB pages, 36 in 2 MiB
    // ones. A warm step may still touch a few fresh heap pages (small
    // vectors come from the allocator), but not an output's.
    assert!(without > 30.0, "unpooled: {without} faults per step");
    assert!(
        with < 64.0 && with * 20.0 < without,
        "pooled: {with} faults per step ({} reps), unpooled {without}",
        pooled.reps
    );
}
