//! What each piece of the LayerNorm backward costs on long rows: the
//! joined loop of rows taken one at a time (pass B of this row with pass A
//! of the next, as the kernel runs rows past 64 KiB), built up one piece at
//! a time, each timed against a streamed copy and the backward's bytes in
//! one pass (a triad), interleaved rep by rep, 2 threads, half the rows
//! each, in memory from `pool::fresh` as the kernels' is.
//!
//! `cargo bench --features probes --bench long_row_costs -- [--reps K]
//! [--one-thread] [N D ...]` (AVX-512 only; elsewhere it says so and
//! stops). Default shapes: 2048 x 65536, 4096 x 32768 and 8192 x 4096.
//! `--one-thread` runs only the first half of the rows, on one thread
//! with the other core idle, and counts that half's bytes: what one core
//! can draw through each loop.

mod common;

#[cfg(target_arch = "x86_64")]
mod pat {
    use std::arch::x86_64::*;

    /// `c = a`, streamed.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn copy(a: &[f32], _: &[f32], c: &mut [f32], _: &[f32], _: usize) {
        for i in (0..c.len() / 16 * 16).step_by(16) {
            _mm512_stream_ps(c.as_mut_ptr().add(i), _mm512_loadu_ps(a.as_ptr().add(i)));
        }
        _mm_sfence();
    }

    /// `c = 1.5 a + b`, streamed: the backward's bytes in one pass.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn triad(a: &[f32], b: &[f32], c: &mut [f32], _: &[f32], _: usize) {
        let s = _mm512_set1_ps(1.5);
        for i in (0..c.len() / 16 * 16).step_by(16) {
            let v = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(i)),
                s,
                _mm512_loadu_ps(b.as_ptr().add(i)),
            );
            _mm512_stream_ps(c.as_mut_ptr().add(i), v);
        }
        _mm_sfence();
    }

    /// The joined backward of rows one at a time over `x = a`, `dy = b`,
    /// `dx = c`. Always: pass A's loads of the next row and pass B's loads
    /// of this row and streamed store of `dx`. With `G`, `gamma` is read
    /// (`g = dy gamma`); with `AR`, the kernel's arithmetic (`xhat`, the
    /// two row sums, `dx = r (g - c1 - xhat c2)`); with `PF`, pass A
    /// prefetches 4 KiB ahead; with `P`, pass A adds `dy xhat` and `dy`
    /// into a partial row, at columns `i & W` (`W = usize::MAX`: the whole
    /// `2d`; smaller, a window that stays in L1/L2 whatever `d` is).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn bwd<
        const G: bool,
        const AR: bool,
        const PF: bool,
        const P: bool,
        const W: usize,
    >(
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
        gamma: &[f32],
        d: usize,
    ) {
        let rows = c.len() / d;
        let mut part = vec![0f32; 2 * d];
        let (pg, pb) = part.split_at_mut(d);
        let (pg, pb) = (pg.as_mut_ptr(), pb.as_mut_ptr());
        let (x, dy, dx, gp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), gamma.as_ptr());
        let (m, r, z) = (
            _mm512_set1_ps(0.5),
            _mm512_set1_ps(1.25),
            _mm512_setzero_ps(),
        );
        let (mut s1, mut s2) = (z, z);
        let pass_a = |o: usize, i: usize, s1: &mut __m512, s2: &mut __m512| {
            if PF {
                _mm_prefetch::<_MM_HINT_T0>(x.add(o + i).cast::<i8>().add(4096));
                _mm_prefetch::<_MM_HINT_T0>(dy.add(o + i).cast::<i8>().add(4096));
            }
            let (mut xh, dv) = (
                _mm512_loadu_ps(x.add(o + i)),
                _mm512_loadu_ps(dy.add(o + i)),
            );
            if AR {
                xh = _mm512_mul_ps(_mm512_sub_ps(xh, m), r);
            }
            let g = if G {
                _mm512_mul_ps(dv, _mm512_loadu_ps(gp.add(i)))
            } else {
                dv
            };
            *s1 = _mm512_add_ps(*s1, g);
            *s2 = _mm512_add_ps(*s2, _mm512_mul_ps(g, xh));
            if P {
                let k = i & W;
                let pgv = _mm512_add_ps(_mm512_loadu_ps(pg.add(k)), _mm512_mul_ps(dv, xh));
                _mm512_storeu_ps(pg.add(k), pgv);
                _mm512_storeu_ps(pb.add(k), _mm512_add_ps(_mm512_loadu_ps(pb.add(k)), dv));
            }
        };
        let pass_b = |o: usize, i: usize, c1: __m512, c2: __m512| {
            let (xv, dv) = (
                _mm512_loadu_ps(x.add(o + i)),
                _mm512_loadu_ps(dy.add(o + i)),
            );
            let g = if G {
                _mm512_mul_ps(dv, _mm512_loadu_ps(gp.add(i)))
            } else {
                dv
            };
            let v = if AR {
                let xh = _mm512_mul_ps(_mm512_sub_ps(xv, m), r);
                _mm512_mul_ps(
                    r,
                    _mm512_sub_ps(_mm512_sub_ps(g, c1), _mm512_mul_ps(xh, c2)),
                )
            } else {
                _mm512_add_ps(xv, g)
            };
            _mm512_stream_ps(dx.add(o + i), v);
        };
        for i in (0..d).step_by(16) {
            pass_a(0, i, &mut s1, &mut s2);
        }
        for row in 0..rows {
            let (c1, c2) = (
                _mm512_set1_ps(_mm512_reduce_add_ps(s1) * 1e-9),
                _mm512_set1_ps(_mm512_reduce_add_ps(s2) * 1e-9),
            );
            (s1, s2) = (z, z);
            for i in (0..d).step_by(16) {
                if row + 1 < rows {
                    pass_a((row + 1) * d, i, &mut s1, &mut s2);
                }
                pass_b(row * d, i, c1, c2);
            }
        }
        _mm_sfence();
        std::hint::black_box(&part);
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        println!("long_row_costs: skipped, this CPU has no AVX-512");
        return;
    }
    use pat::bwd;
    type Pattern = unsafe fn(&[f32], &[f32], &mut [f32], &[f32], usize);
    const ALL: usize = usize::MAX;
    const WIN: usize = (16 << 10) - 1;
    let pats: [(&str, f64, Pattern); 9] = [
        ("copy (1 read, 1 streamed write)", 8.0, pat::copy),
        ("triad: backward's bytes, 1 pass", 12.0, pat::triad),
        (
            "joined loop: loads and dx only",
            12.0,
            bwd::<false, false, false, false, ALL>,
        ),
        ("+ gamma", 12.0, bwd::<true, false, false, false, ALL>),
        ("+ arithmetic", 12.0, bwd::<true, true, false, false, ALL>),
        (
            "+ prefetch (no partials)",
            12.0,
            bwd::<true, true, true, false, ALL>,
        ),
        (
            "+ partials (the kernel's pieces)",
            12.0,
            bwd::<true, true, true, true, ALL>,
        ),
        (
            "  partials in a 64 KiB window",
            12.0,
            bwd::<true, true, true, true, WIN>,
        ),
        (
            "  no gamma, no arithmetic",
            12.0,
            bwd::<false, false, true, true, ALL>,
        ),
    ];
    let (reps, shapes) = common::reps_and_shapes(&[(2048, 65536), (4096, 32768), (8192, 4096)]);
    let one = common::args().iter().any(|a| a == "--one-thread");
    let threads = if one { 1 } else { 2 };
    for (n, d) in shapes {
        let (n, d) = (n / 2 * 2, (d / 16 * 16).max(16));
        let numel = n * d;
        let fresh = |v: f32| {
            let mut b = fusegrad::probes::fresh::<f32>(numel + 16);
            b.iter_mut().for_each(|e| *e = v);
            b
        };
        let (a, b, mut buf) = (fresh(1.0), fresh(2.0), fresh(0.0));
        let gamma = vec![0.75f32; d];
        // Streamed stores need 64-byte alignment; each half starts on one
        // (`h` is a multiple of 16).
        let off = buf.as_ptr().align_offset(64);
        let c = &mut buf[off..off + numel];
        let h = numel / 2;
        let mut rates = vec![Vec::new(); pats.len()];
        for _ in 0..reps {
            for (k, &(_, bytes, f)) in pats.iter().enumerate() {
                let secs = common::time_halves(c, threads, |k, cc| {
                    let (aa, bb) = (&a[k * h..(k + 1) * h], &b[k * h..(k + 1) * h]);
                    // SAFETY: AVX-512 was detected above; `cc` starts
                    // 64-byte aligned; every slice holds whole rows.
                    unsafe { f(aa, bb, cc, &gamma, d) }
                });
                rates[k].push(bytes * (h * threads) as f64 / secs / 1e9);
            }
        }
        let med = |v: &Vec<f64>| common::median(v);
        let (copy, triad) = (med(&rates[0]), med(&rates[1]));
        println!("{n} x {d} (f32, {threads} thread(s), medians of {reps}):");
        for (k, (name, _, _)) in pats.iter().enumerate() {
            let r = med(&rates[k]);
            println!(
                "  {name:<34} {r:6.1} GB/s  {:.2} of copy  {:.2} of triad",
                r / copy,
                r / triad
            );
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("long_row_costs: skipped, x86_64 only");
}
