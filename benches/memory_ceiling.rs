//! The memory ceiling of the fused kernels' loop structures: the same loads
//! and streamed stores as the LayerNorm passes, with almost no arithmetic,
//! timed against a streamed copy in the same run (2 threads, half the rows
//! each). Shows how close to the copy rate each structure can get at all.
//! The last two patterns are the kernels for rows in lockstep (16-64 KiB)
//! as built, with their arithmetic and prefetches but without the tails,
//! the tasks and the saved statistics, and the fwd+bwd rate they imply.
//!
//! `cargo bench --features probes --bench memory_ceiling -- [--reps K] [N D ...]`
//! (AVX-512 only; elsewhere it says so and stops).

mod common;

/// The loop structures: name, bytes per element counted, and the pattern.
#[cfg(target_arch = "x86_64")]
mod pat {
    use std::arch::x86_64::*;

    /// `c = a` with streamed stores: the baseline.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn copy(a: &[f32], _: &[f32], c: &mut [f32], _: usize) -> f32 {
        for i in (0..c.len() / 16 * 16).step_by(16) {
            _mm512_stream_ps(c.as_mut_ptr().add(i), _mm512_loadu_ps(a.as_ptr().add(i)));
        }
        _mm_sfence();
        0.0
    }

    /// `c = 1.5 a + b`: the backward's traffic in one pass.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn triad(a: &[f32], b: &[f32], c: &mut [f32], _: usize) -> f32 {
        let s = _mm512_set1_ps(1.5);
        for i in (0..c.len() / 16 * 16).step_by(16) {
            let v = _mm512_loadu_ps(a.as_ptr().add(i));
            let v = _mm512_fmadd_ps(v, s, _mm512_loadu_ps(b.as_ptr().add(i)));
            _mm512_stream_ps(c.as_mut_ptr().add(i), v);
        }
        _mm_sfence();
        0.0
    }

    /// The backward, row by row: a pass that reads `a`, `b` (from memory)
    /// and, with `PART`, adds them into a `2d` partial row; then a pass
    /// that reads them again (from cache) and streams `c` out. With `JOIN`,
    /// the first pass of the next row runs inside this row's second pass.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn bwd<const JOIN: bool, const PART: bool>(
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
        d: usize,
    ) -> f32 {
        let rows = c.len() / d;
        let s = _mm512_set1_ps(1.5);
        let mut acc = _mm512_setzero_ps();
        let mut part = vec![0f32; 2 * d];
        let (pg, pb) = part.split_at_mut(d);
        let (pg, pb) = (pg.as_mut_ptr(), pb.as_mut_ptr());
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let first = |r: usize, i: usize, acc: __m512| {
            let (x, y) = (_mm512_loadu_ps(a.add(r + i)), _mm512_loadu_ps(b.add(r + i)));
            if PART {
                let g = _mm512_fmadd_ps(x, y, _mm512_loadu_ps(pg.add(i)));
                _mm512_storeu_ps(pg.add(i), g);
                _mm512_storeu_ps(pb.add(i), _mm512_add_ps(y, _mm512_loadu_ps(pb.add(i))));
            }
            _mm512_fmadd_ps(x, y, acc)
        };
        let second = |r: usize, i: usize| {
            let v = _mm512_loadu_ps(a.add(r + i));
            let v = _mm512_fmadd_ps(v, s, _mm512_loadu_ps(b.add(r + i)));
            _mm512_stream_ps(c.add(r + i), v);
        };
        if JOIN {
            for i in (0..d).step_by(16) {
                acc = first(0, i, acc);
            }
        }
        for r in 0..rows {
            if !JOIN {
                for i in (0..d).step_by(16) {
                    acc = first(r * d, i, acc);
                }
            }
            for i in (0..d).step_by(16) {
                if JOIN && r + 1 < rows {
                    acc = first((r + 1) * d, i, acc);
                }
                second(r * d, i);
            }
        }
        _mm_sfence();
        _mm512_reduce_add_ps(acc)
    }

    /// The forward, row by row: the mean pass of the next row inside this
    /// row's output pass, and the variance pass either on its own
    /// (`!JOIN`) or inside the output pass too (the next row's).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fwd<const JOIN: bool>(a: &[f32], _: &[f32], c: &mut [f32], d: usize) -> f32 {
        let rows = c.len() / d;
        let s = _mm512_set1_ps(1.5);
        let (mut m, mut q) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let (a, c) = (a.as_ptr(), c.as_mut_ptr());
        for r in 0..rows {
            let (cur, next) = (r * d, (r + 1).min(rows - 1) * d);
            if !JOIN {
                for i in (0..d).step_by(16) {
                    let e = _mm512_sub_ps(_mm512_loadu_ps(a.add(cur + i)), s);
                    q = _mm512_fmadd_ps(e, e, q);
                }
            }
            for i in (0..d).step_by(16) {
                m = _mm512_add_ps(m, _mm512_loadu_ps(a.add(next + i)));
                if JOIN {
                    let e = _mm512_sub_ps(_mm512_loadu_ps(a.add(next + i)), s);
                    q = _mm512_fmadd_ps(e, e, q);
                }
                let v = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(cur + i)), s, s);
                _mm512_stream_ps(c.add(cur + i), v);
            }
        }
        _mm_sfence();
        _mm512_reduce_add_ps(_mm512_add_ps(m, q))
    }

    /// The backward for rows in lockstep as built for the Intel profile
    /// (whose backward overlaps its passes): `R` rows at a time (four up to
    /// 16 KiB rows, else two, as `bwd_rows_in_step` there); for each chunk,
    /// pass A of the next `R` rows (from memory, prefetched 4 KiB ahead as
    /// `prefetch` does), then pass B of these rows (from cache, `dx`
    /// streamed); one read-modify-write of the partials per `R` rows. The
    /// kernel's operations, without FMA as in the kernel: pass A `xh = (x -
    /// m) r`, `g = dy gamma`, four accumulators per row sum, `pg += dy xh`,
    /// `pb += dy`; pass B `dx = r ((g - mg) - xh mgx)`. `gamma` is the
    /// first row of `b`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn bwd_step(a: &[f32], b: &[f32], c: &mut [f32], d: usize) -> f32 {
        if fusegrad::probes::backward_pairs(fusegrad::probes::Profile::Intel, d * 4) {
            bwd_rows::<2>(a, b, c, d)
        } else {
            bwd_rows::<4>(a, b, c, d)
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn bwd_rows<const R: usize>(a: &[f32], b: &[f32], c: &mut [f32], d: usize) -> f32 {
        const U: usize = 4;
        let z = _mm512_setzero_ps();
        let (mut s1, mut s2) = ([[z; U]; R], [[z; U]; R]);
        let mut part = vec![0f32; 2 * d];
        let (pg, pb) = part.split_at_mut(d);
        let (pg, pb) = (pg.as_mut_ptr(), pb.as_mut_ptr());
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let (m, r, k) = (
            _mm512_set1_ps(0.5),
            _mm512_set1_ps(1.25),
            _mm512_set1_ps(0.1),
        );
        let steps = c.len() / d / R;
        for t in 0..steps {
            let (o, next) = (t * R * d, t + 1 < steps);
            let mut i = 0;
            while i + 16 <= d {
                let j = i / 16 % U;
                let gam = _mm512_loadu_ps(bp.add(i));
                let (mut pgv, mut pbv) = (_mm512_loadu_ps(pg.add(i)), _mm512_loadu_ps(pb.add(i)));
                for s in 0..R {
                    let q = o + (R + s) * d + i;
                    if !next {
                        break;
                    }
                    _mm_prefetch::<_MM_HINT_T0>(ap.add(q).cast::<i8>().add(4096 / R));
                    _mm_prefetch::<_MM_HINT_T0>(bp.add(q).cast::<i8>().add(4096 / R));
                    let (x, dy) = (_mm512_loadu_ps(ap.add(q)), _mm512_loadu_ps(bp.add(q)));
                    let xh = _mm512_mul_ps(_mm512_sub_ps(x, m), r);
                    let g = _mm512_mul_ps(dy, gam);
                    s1[s][j] = _mm512_add_ps(s1[s][j], g);
                    s2[s][j] = _mm512_add_ps(s2[s][j], _mm512_mul_ps(g, xh));
                    pgv = _mm512_add_ps(pgv, _mm512_mul_ps(dy, xh));
                    pbv = _mm512_add_ps(pbv, dy);
                }
                _mm512_storeu_ps(pg.add(i), pgv);
                _mm512_storeu_ps(pb.add(i), pbv);
                for s in 0..R {
                    let q = o + s * d + i;
                    let (x, dy) = (_mm512_loadu_ps(ap.add(q)), _mm512_loadu_ps(bp.add(q)));
                    let xh = _mm512_mul_ps(_mm512_sub_ps(x, m), r);
                    let g = _mm512_mul_ps(dy, _mm512_loadu_ps(bp.add(i)));
                    let v =
                        _mm512_mul_ps(r, _mm512_sub_ps(_mm512_sub_ps(g, k), _mm512_mul_ps(xh, k)));
                    _mm512_stream_ps(cp.add(q), v);
                }
                i += 16;
            }
        }
        _mm_sfence();
        total(&s1, &s2)
    }

    /// The forward for rows in lockstep, four at a time, as built: the
    /// variance pass of these rows on its own (from cache), then their
    /// output pass `y = (x - m) r gamma + beta` (streamed) with the next
    /// rows' mean pass (from memory, prefetched) in the same loop; four
    /// accumulators per row sum. `gamma` and `beta` are rows of `b`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fwd_step(a: &[f32], b: &[f32], c: &mut [f32], d: usize) -> f32 {
        const R: usize = 4;
        const U: usize = 4;
        let z = _mm512_setzero_ps();
        let (mut sm, mut sq) = ([[z; U]; R], [[z; U]; R]);
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let (m, r) = (_mm512_set1_ps(0.5), _mm512_set1_ps(1.25));
        let steps = c.len() / d / R;
        for t in 0..steps {
            let (o, next) = (t * R * d, t + 1 < steps);
            // The variance pass, then the output pass with the next mean pass.
            for (k, i) in (0..d / 16 * 16).step_by(16).enumerate() {
                for (s, q) in sq.iter_mut().enumerate() {
                    let e = _mm512_sub_ps(_mm512_loadu_ps(ap.add(o + s * d + i)), m);
                    q[k % U] = _mm512_add_ps(q[k % U], _mm512_mul_ps(e, e));
                }
            }
            for (k, i) in (0..d / 16 * 16).step_by(16).enumerate() {
                let j = k % U;
                for (s, acc) in sm.iter_mut().enumerate() {
                    let q = o + (R + s) * d + i;
                    if !next {
                        break;
                    }
                    _mm_prefetch::<_MM_HINT_T0>(ap.add(q).cast::<i8>().add(4096 / R));
                    acc[j] = _mm512_add_ps(acc[j], _mm512_sub_ps(_mm512_loadu_ps(ap.add(q)), m));
                }
                let (g, be) = (_mm512_loadu_ps(bp.add(i)), _mm512_loadu_ps(bp.add(d + i)));
                for s in 0..R {
                    let q = o + s * d + i;
                    let xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(ap.add(q)), m), r);
                    _mm512_stream_ps(cp.add(q), _mm512_add_ps(_mm512_mul_ps(xh, g), be));
                }
            }
        }
        _mm_sfence();
        total(&sm, &sq)
    }

    /// The sum of every lane of two rows' worth of accumulators (returned
    /// so that the loops are not optimized away).
    #[target_feature(enable = "avx512f")]
    fn total<const R: usize, const U: usize>(a: &[[__m512; U]; R], b: &[[__m512; U]; R]) -> f32 {
        let mut t = _mm512_setzero_ps();
        for (a, b) in a.iter().flatten().zip(b.iter().flatten()) {
            t = _mm512_add_ps(t, _mm512_add_ps(*a, *b));
        }
        _mm512_reduce_add_ps(t)
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        println!("memory_ceiling: skipped, this CPU has no AVX-512");
        return;
    }
    type Pattern = unsafe fn(&[f32], &[f32], &mut [f32], usize) -> f32;
    let pats: [(&str, f64, Pattern); 10] = [
        ("copy (1 read, 1 streamed write)", 8.0, pat::copy),
        ("triad: backward traffic, 1 pass", 12.0, pat::triad),
        ("backward, joined passes", 12.0, pat::bwd::<true, false>),
        ("backward, joined + partials", 12.0, pat::bwd::<true, true>),
        ("backward, apart + partials", 12.0, pat::bwd::<false, true>),
        ("forward, variance pass apart", 8.0, pat::fwd::<false>),
        ("forward, one joined loop", 8.0, pat::fwd::<true>),
        ("backward as built (rows in step)", 12.0, pat::bwd_step),
        ("forward as built (rows in step)", 8.0, pat::fwd_step),
        (
            "backward, apart, no partials",
            12.0,
            pat::bwd::<false, false>,
        ),
    ];
    let (reps, shapes) = common::reps_and_shapes(&[(16384, 1024), (8192, 4096), (2048, 65536)]);
    for (n, d) in shapes {
        // Whole steps of four rows in each half.
        let (n, d) = (n / 8 * 8, d / 16 * 16);
        let numel = n * d;
        // Every array starts on a page, as the pool's buffers do: large
        // vectors from `vec!` start 16 bytes past one, so every 64-byte
        // load would straddle two cache lines (until 2026-12-02 `a` and
        // `b` did, which cost the two-pass loops a fifth of their rate).
        let page = |v: &[f32]| v.as_ptr().align_offset(4096);
        let (a0, b0) = (vec![1.0f32; numel + 1024], vec![2.0f32; numel + 1024]);
        let (oa, ob) = (page(&a0), page(&b0));
        let (a, b) = (&a0[oa..oa + numel], &b0[ob..ob + numel]);
        let mut buf = vec![0f32; numel + 1024];
        let off = page(&buf);
        let c = &mut buf[off..off + numel];
        let h = numel / 2;
        let mut rates = vec![Vec::new(); pats.len()];
        for _ in 0..reps {
            for (k, &(_, bytes, f)) in pats.iter().enumerate() {
                let secs = common::time_halves(c, 2, |k, cc| {
                    let (aa, bb) = (&a[k * h..(k + 1) * h], &b[k * h..(k + 1) * h]);
                    // SAFETY: AVX-512 was detected above; `cc` starts
                    // 64-byte aligned (`h` is a multiple of 16).
                    std::hint::black_box(unsafe { f(aa, bb, cc, d) });
                });
                rates[k].push(bytes * numel as f64 / secs / 1e9);
            }
        }
        let med = |v: &Vec<f64>| common::median(v);
        let copy = med(&rates[0]);
        println!("{n} x {d} (f32, 2 threads, medians of {reps}):");
        for (k, (name, _, _)) in pats.iter().enumerate() {
            let r = med(&rates[k]);
            println!("  {name:<34} {r:6.1} GB/s  {:.2} of copy", r / copy);
        }
        // Fwd+bwd moves 8 + 12 bytes per element: its rate is the
        // time-weighted mean of the two.
        let (f, b) = (med(&rates[8]) / copy, med(&rates[7]) / copy);
        println!(
            "  {:<34} {:>14.2} of copy",
            "fwd+bwd as built (rows in step)",
            20.0 / (8.0 / f + 12.0 / b)
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("memory_ceiling: skipped, x86_64 only");
}
