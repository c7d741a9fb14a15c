//! The memory ceiling of the fused kernels' loop structures: the same loads
//! and streamed stores as the LayerNorm passes, with almost no arithmetic,
//! timed against a streamed copy in the same run (2 threads, half the rows
//! each). Shows how close to the copy rate each structure can get at all.
//!
//! `cargo run --release --example memory_ceiling -- [--reps K] [N D ...]`
//! (AVX-512 only; elsewhere it says so and stops).

use std::time::Instant;

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
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        println!("memory_ceiling: skipped, this CPU has no AVX-512");
        return;
    }
    type Pattern = unsafe fn(&[f32], &[f32], &mut [f32], usize) -> f32;
    let pats: [(&str, f64, Pattern); 7] = [
        ("copy (1 read, 1 streamed write)", 8.0, pat::copy),
        ("triad: backward traffic, 1 pass", 12.0, pat::triad),
        ("backward, joined passes", 12.0, pat::bwd::<true, false>),
        ("backward, joined + partials", 12.0, pat::bwd::<true, true>),
        ("backward, apart + partials", 12.0, pat::bwd::<false, true>),
        ("forward, variance pass apart", 8.0, pat::fwd::<false>),
        ("forward, one joined loop", 8.0, pat::fwd::<true>),
    ];
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 11;
    if let Some(k) = args.iter().position(|a| a == "--reps") {
        reps = args.get(k + 1).and_then(|v| v.parse().ok()).unwrap_or(reps);
        args.drain(k..(k + 2).min(args.len()));
    }
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let shapes: Vec<(usize, usize)> = if nums.len() >= 2 {
        nums.chunks_exact(2).map(|p| (p[0], p[1])).collect()
    } else {
        vec![(16384, 1024), (8192, 4096), (2048, 65536)]
    };
    for (n, d) in shapes {
        let (n, d) = (n / 2 * 2, d / 16 * 16);
        let numel = n * d;
        let (a, b) = (vec![1.0f32; numel], vec![2.0f32; numel]);
        // Streamed stores need 64-byte alignment; each half starts on one.
        let mut buf = vec![0f32; numel + 16];
        let off = buf.as_ptr().align_offset(64);
        let c = &mut buf[off..off + numel];
        let h = numel / 2;
        let mut rates = vec![Vec::new(); pats.len()];
        for _ in 0..reps {
            for (k, &(_, bytes, f)) in pats.iter().enumerate() {
                let (c0, c1) = c.split_at_mut(h);
                let t = Instant::now();
                std::thread::scope(|s| {
                    for (k, cc) in [c0, c1].into_iter().enumerate() {
                        let (aa, bb) = (&a[k * h..(k + 1) * h], &b[k * h..(k + 1) * h]);
                        // SAFETY: AVX-512 was detected above; `cc` starts
                        // 64-byte aligned (`h` is a multiple of 16).
                        s.spawn(move || std::hint::black_box(unsafe { f(aa, bb, cc, d) }));
                    }
                });
                rates[k].push(bytes * numel as f64 / t.elapsed().as_secs_f64() / 1e9);
            }
        }
        let med = |v: &Vec<f64>| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let copy = med(&rates[0]);
        println!("{n} x {d} (f32, 2 threads, medians of {reps}):");
        for (k, (name, _, _)) in pats.iter().enumerate() {
            let r = med(&rates[k]);
            println!("  {name:<34} {r:6.1} GB/s  {:.2} of copy", r / copy);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("memory_ceiling: skipped, x86_64 only");
}
