//! The `fusegrad bench` figures are a warm loop's: a shape that runs first
//! in its process is warmed up until its steps fault in no page. This
//! checks that at 2048 x 65536 f32, where `y` and `dx` (512 MiB each) fill
//! the buffer pool, so the dgamma/dbeta partial rows go back to the
//! allocator after the first step and a second step would map them afresh.
//! Its own process, because the fault count is the whole process's; a
//! benchmark property and OS-dependent, so not a test.
//!
//! `cargo bench --bench bench_warmup` (exit status 1 if the timed steps
//! still fault).

/// Faults per timed step allowed: a cold step faults in hundreds.
const MAX_FAULTS: f64 = 16.0;

fn main() {
    let (n, d) = (2048, 65536);
    let row = match fusegrad_cli::bench::measure(n, d, 0.01, false) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench_warmup: {e}");
            std::process::exit(2);
        }
    };
    let Some(faults) = row.faults_per_step else {
        println!("bench_warmup: this OS reports no page-fault counts (/proc/self/stat)");
        return;
    };
    println!(
        "bench_warmup: {n} x {d} f32, {faults:.1} page faults per timed step over {} reps (at most {MAX_FAULTS})",
        row.reps
    );
    if faults >= MAX_FAULTS {
        std::process::exit(1);
    }
}
