//! A warm training step faults in no fresh pages: its large outputs come
//! from the buffer pool. Its own test binary, because the fault count is
//! the whole process's.

use fusegrad::{bench, device::pool};

/// 8192 x 1152 f32: 36 MiB outputs, past glibc's largest mmap threshold
/// (32 MiB), so without the pool every step maps them afresh.
const SHAPE: (usize, usize) = (8192, 1152);

#[test]
fn a_warm_step_faults_in_no_fresh_pages_and_one_without_the_pool_does() {
    let (n, d) = SHAPE;
    let pooled = bench::measure(n, d, 0.01, false).expect("bench");
    let Some(with) = pooled.faults_per_step else {
        eprintln!("skipped: this OS reports no page-fault counts (/proc/self/stat)");
        return;
    };
    pool::set_enabled(false);
    let fresh = bench::measure(n, d, 0.01, false).expect("bench");
    pool::set_enabled(true);
    let without = fresh.faults_per_step.expect("counted once, counted twice");
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
