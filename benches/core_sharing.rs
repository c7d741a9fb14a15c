//! Whether the two threads' cores share their caches: each thread sums a
//! buffer of its own, over and over, alone and then with the other thread
//! doing the same at once. If the two vCPUs were SMT siblings of one core,
//! two buffers that each fit the L1 or L2 but not together would read
//! slower side by side than alone; with private caches both read as fast
//! as one alone until the buffers reach the shared L3 and memory.
//!
//! `cargo bench --features probes --bench core_sharing -- [--reps K]` (AVX-512
//! only; elsewhere it says so and stops). Prints GB/s per thread, medians
//! of K rounds (5 unless given) of about 0.1 s each.

mod common;

#[cfg(target_arch = "x86_64")]
mod read {
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Sums `buf` front to back (four accumulators) until `secs` have
    /// passed; returns the bytes read per second.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rate(buf: &[f32], secs: f64) -> f64 {
        let mut acc = [_mm512_setzero_ps(); 4];
        let (t0, mut bytes) = (Instant::now(), 0usize);
        let n = buf.len() / 64 * 64;
        loop {
            for _ in 0..4 {
                for i in (0..n).step_by(64) {
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_add_ps(*a, _mm512_loadu_ps(buf.as_ptr().add(i + 16 * k)));
                    }
                }
                bytes += n * 4;
            }
            let t = t0.elapsed().as_secs_f64();
            if t >= secs {
                let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
                std::hint::black_box(_mm512_reduce_add_ps(s));
                return bytes as f64 / t;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        println!("core_sharing: skipped, this CPU has no AVX-512");
        return;
    }
    let (reps, _) = common::reps_and_shapes(&[]);
    let reps = if common::args().iter().any(|a| a == "--reps") {
        reps
    } else {
        5
    };
    println!(
        "read rate per thread, GB/s (medians of {reps}): one thread alone | each of two at once"
    );
    for kib in [16usize, 32, 40, 64, 256, 512, 768, 1536, 4096, 65536] {
        let bufs: Vec<Vec<f32>> = (0..2).map(|_| vec![1.0f32; kib * 256]).collect();
        let (mut one, mut two) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            // SAFETY: AVX-512 was detected above.
            one.push(unsafe { read::rate(&bufs[0], 0.1) });
            let both: Vec<f64> = std::thread::scope(|s| {
                let h: Vec<_> = bufs
                    .iter()
                    .map(|b| s.spawn(move || unsafe { read::rate(b, 0.1) }))
                    .collect();
                h.into_iter().map(|h| h.join().unwrap_or(0.0)).collect()
            });
            two.push(both.iter().sum::<f64>() / 2.0);
        }
        println!(
            "  {kib:>6} KiB each   {:>7.1} | {:>7.1}",
            common::median(&one) / 1e9,
            common::median(&two) / 1e9
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("core_sharing: skipped, x86_64 only");
}
