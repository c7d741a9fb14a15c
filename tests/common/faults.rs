// Shared by the fault-counting test binaries (each its own process, since
// the count is the whole process's); pulled in with `include!`.

/// `bench::measure` of `n x d` (no composed twin, a short budget), with its
/// faults per step; `None`, after saying so, where the OS counts no faults.
fn measure_faults(n: usize, d: usize) -> Option<(fusegrad::bench::Row, f64)> {
    let row = fusegrad::bench::measure(n, d, 0.01, false).expect("bench");
    let Some(faults) = row.faults_per_step else {
        eprintln!("skipped: this OS reports no page-fault counts (/proc/self/stat)");
        return None;
    };
    Some((row, faults))
}
