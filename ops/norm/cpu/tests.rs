//! Bitwise and accuracy checks of the CPU kernels' speed switches.

use super::forward::{fwd_rows_per_task, FWD_TASK_STEPS};
use super::rows::groups;
use super::*;
use crate::device::cpu::{
    best_simd, profile, set_simd_limit, set_stream_threshold, stream_threshold, Simd, SIMD_TESTS,
};
use crate::rng::Rng;

// The tests, run by `tests/unit.rs`.
unit_tests![
    every_build_and_store_kind_gives_the_same_bits,
    lockstep_rows_give_the_same_bits_as_one_at_a_time,
    backward_pairs_change_no_bits_and_override_the_profile,
    paired_partials_change_no_bits,
    interleaved_partials_change_no_bits,
    partial_layouts_place_every_term_once,
    long_forward_tasks_change_no_bits,
    recycled_partial_rows_start_from_zero,
    statistics_first_changes_no_bits,
    outputs_start_on_a_cache_line,
    overlapped_passes_give_the_same_bits_as_separate_ones,
    long_rows_in_runs_match_the_f64_statistics,
    rows_at_mut_gives_whole_rows_and_empty_past_the_end,
    only_rows_past_64_kib_take_narrow_lanes,
    each_vendor_gets_its_measured_layer_norm_defaults,
];

/// Every output of LayerNorm and RMSNorm, forward and backward, as bits.
fn outputs(x: &[f32], dy: &[f32], g: &[f32], b: &[f32], d: usize) -> Vec<Vec<u32>> {
    let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<u32>>();
    let all = (true, true, true);
    let f = forward(x, d, Some(g), Some(b), 1e-5, true);
    let bw = backward(x, dy, d, Some(g), (Some(&f.mean), &f.rstd), all);
    let rf = forward(x, d, Some(g), None, 1e-5, false);
    let (ry, rr) = (rf.y, rf.rstd);
    let rb = backward(x, dy, d, Some(g), (None, &rr), all);
    let (rdx, rdg) = (rb.dx, rb.dgamma);
    let mut out = vec![
        bits(&f.y),
        bits(&f.mean),
        bits(&f.rstd),
        bits(&ry),
        bits(&rr),
    ];
    for v in [bw.dx, bw.dgamma, bw.dbeta, rdx, rdg] {
        out.push(bits(&v.unwrap_or_default()));
    }
    out
}

/// `x`, `dy`, `gamma`, `beta`.
type Case = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Random `x`, `dy` (`n * d` each), `gamma` and `beta` (`d` each), in
/// that order: normals times `a` plus `b`.
fn case(rng: &mut Rng, n: usize, d: usize, a: f64, b: f64) -> Case {
    let mut v = |k: usize| -> Vec<f32> { (0..k).map(|_| (rng.normal() * a + b) as f32).collect() };
    (v(n * d), v(n * d), v(d), v(d))
}

/// Asserts that every output is the same, streamed and not, with a
/// speed switch `set` off and on (left on).
fn same_bits_either_way(set: fn(bool), case: &Case, d: usize) {
    let (x, dy, g, b) = case;
    let old = stream_threshold();
    for stream in [usize::MAX, 0] {
        set_stream_threshold(stream);
        set(false);
        let want = outputs(x, dy, g, b, d);
        set(true);
        let got = outputs(x, dy, g, b, d);
        assert!(got == want, "n={} d={d} stream={stream}", x.len() / d);
    }
    set_stream_threshold(old);
}

/// Held by the tests that flip [`set_segmented`] or depend on it
/// staying put (it changes the bits of long rows; the other switches
/// do not).
static SEGMENTED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn every_build_and_store_kind_gives_the_same_bits() {
    let _hold = SEGMENTED.lock();
    let _simd = SIMD_TESTS.lock();
    let mut rng = Rng::new(5);
    // Row lengths around the lane and unroll boundaries, and rows that
    // start at every alignment.
    for (n, d) in [
        (3usize, 1usize),
        (5, 15),
        (4, 16),
        (7, 17),
        (3, 63),
        (2, 64),
        (9, 100),
        (6, 1000),
        (3, 4099),
        (2, 16_400),
        (2, 20_003),
    ] {
        let (x, dy, g, b) = case(&mut rng, n, d, 3.0, 1.0);
        set_simd_limit(Simd::Portable);
        let want = outputs(&x, &dy, &g, &b, d);
        for limit in [Simd::Avx2, Simd::Avx512] {
            if limit <= best_simd() {
                set_simd_limit(limit);
                assert!(outputs(&x, &dy, &g, &b, d) == want, "{limit} n={n} d={d}");
                // Rows past 64 KiB run in 256-bit lanes; the 512-bit
                // build must give the same bits there too.
                set_narrow_lanes(!narrow_default(profile()));
                assert!(
                    outputs(&x, &dy, &g, &b, d) == want,
                    "{limit} other lanes n={n} d={d}"
                );
                reset_switches();
            }
        }
        let old = stream_threshold();
        set_stream_threshold(0);
        assert!(outputs(&x, &dy, &g, &b, d) == want, "streamed n={n} d={d}");
        set_stream_threshold(old);
        set_simd_limit(Simd::Avx512);
    }
}

fn lockstep_rows_give_the_same_bits_as_one_at_a_time() {
    let _hold = SEGMENTED.lock();
    // The profile decides the backward's rows in step; both are run here.
    let _simd = SIMD_TESTS.lock();
    use crate::device::cpu::{set_profile, Profile};
    let mut rng = Rng::new(11);
    // Rows inside the lockstep range: whole steps plus a remainder, a
    // row length that is not a multiple of the lanes (unequal
    // alignment, so the write falls back to one row at a time) and one
    // whose rows all share an alignment.
    for p in [Profile::Intel, Profile::Amd] {
        set_profile(p);
        for (n, d) in [(9usize, 4096usize), (7, 4100), (6, 16384)] {
            assert_eq!(rows_in_step(d * 4), ROWS_IN_STEP, "d={d}");
            // The backward takes 16 KiB rows four at a time on Intel, two
            // on AMD; longer ones two on both.
            let four = p == Profile::Intel && d * 4 <= 16 << 10;
            let bwd = if four { ROWS_IN_STEP } else { 2 };
            assert_eq!(bwd_rows_in_step(d * 4), bwd, "{p} d={d}");
            same_bits_either_way(set_lockstep, &case(&mut rng, n, d, 2.0, -0.5), d);
        }
    }
    set_profile(Profile::for_vendor(&crate::device::cpu::cpu_vendor()));
}

fn backward_pairs_change_no_bits_and_override_the_profile() {
    let _hold = SEGMENTED.lock();
    // `reset_switches` also resets what the SIMD tests set.
    let _simd = SIMD_TESTS.lock();
    let mut rng = Rng::new(23);
    for (n, d) in [(9usize, 4096usize), (7, 4100), (6, 16384)] {
        set_backward_pairs(true);
        assert_eq!(bwd_rows_in_step(d * 4), 2, "d={d}");
        set_backward_pairs(false);
        assert_eq!(bwd_rows_in_step(d * 4), ROWS_IN_STEP, "d={d}");
        same_bits_either_way(set_backward_pairs, &case(&mut rng, n, d, 1.5, 0.25), d);
    }
    // Rows outside the lockstep range go one at a time either way.
    set_backward_pairs(true);
    assert_eq!(bwd_rows_in_step(1024 * 4), 1);
    reset_switches();
    let pairs = backward_pairs(profile(), 16 << 10);
    assert_eq!(bwd_rows_in_step(16 << 10) == 2, pairs);
}

fn paired_partials_change_no_bits() {
    let _hold = SEGMENTED.lock();
    let _simd = SIMD_TESTS.lock();
    // Pairing needs the joined loop, so the overlap is held on. Rows in
    // lockstep with odd and even numbers of steps, rows one at a time
    // past 64 KiB, aligned and not.
    set_overlap(true);
    let mut rng = Rng::new(31);
    for (n, d) in [
        (7usize, 4096usize),
        (9, 4096),
        (6, 16384),
        (7, 8200),
        (5, 16_400),
        (3, 20_003),
    ] {
        assert!(paired_partials(d * 4), "d={d}");
        same_bits_either_way(set_paired_partials, &case(&mut rng, n, d, 2.5, -1.0), d);
    }
    assert!(!paired_partials((16 << 10) - 4) && !paired_partials(3072));
    reset_switches();
}

fn interleaved_partials_change_no_bits() {
    let _hold = SEGMENTED.lock();
    let _simd = SIMD_TESTS.lock();
    // Rows with and without a tail past the last whole chunk, short, in
    // lockstep and past 64 KiB, with the partials paired and not.
    let mut rng = Rng::new(37);
    for paired in [true, false] {
        set_paired_partials(paired);
        for (n, d) in [
            (5usize, 1usize),
            (9, 15),
            (6, 17),
            (70, 100),
            (7, 4096),
            (6, 4100),
            (5, 16_400),
            (3, 20_003),
        ] {
            let c = case(&mut rng, n, d, 2.0, 0.5);
            same_bits_either_way(set_interleaved_partials, &c, d);
        }
    }
    reset_switches();
    set_paired_partials(true);
}

fn partial_layouts_place_every_term_once() {
    use super::backward::Layout;
    for d in [1usize, 15, 16, 17, 33, 64, 100, 4096, 4100] {
        for il in [false, true] {
            let lay = Layout::new(d, il);
            let mut seen = vec![0u8; 2 * d];
            for k in 0..d {
                seen[lay.g(k)] += 1;
                seen[lay.b(k)] += 1;
            }
            assert!(seen.iter().all(|&c| c == 1), "d={d} interleaved={il}");
            // A chunk's slots are its first column's, and its columns are
            // contiguous there.
            for i in (0..d / LANES * LANES).step_by(LANES) {
                assert_eq!(lay.chunk(i), (lay.g(i), lay.b(i)), "d={d}");
                assert_eq!(lay.g(i + LANES - 1), lay.g(i) + LANES - 1, "d={d}");
                assert_eq!(lay.b(i + LANES - 1), lay.b(i) + LANES - 1, "d={d}");
            }
        }
    }
}

fn long_forward_tasks_change_no_bits() {
    let _hold = SEGMENTED.lock();
    let mut rng = Rng::new(23);
    // Several tasks either way, the last one short.
    for (n, d) in [(150usize, 4096usize), (70, 16384)] {
        let rpc = rows_per_chunk(d);
        set_long_fwd_tasks(false);
        assert_eq!(fwd_rows_per_task(d * 4, rpc), rpc, "d={d}");
        set_long_fwd_tasks(true);
        let rows = fwd_rows_per_task(d * 4, rpc);
        assert_eq!(rows, FWD_TASK_STEPS * ROWS_IN_STEP, "d={d}");
        assert!(n > rows && n % rows != 0, "n={n} d={d}");
        same_bits_either_way(set_long_fwd_tasks, &case(&mut rng, n, d, 1.5, 3.0), d);
    }
}

fn recycled_partial_rows_start_from_zero() {
    // 64 groups of 4096-wide f32 partials (two rows each for LayerNorm,
    // one for RMSNorm): at least 1 MiB, so the partial rows come from
    // the pool, and each call gets the one before's.
    let (n, d) = (4096usize, 4096usize);
    assert!(groups(n, d) * d * 4 >= crate::device::pool::MIN_POOLED_BYTES);
    let mut rng = Rng::new(29);
    let (x, dy, g, b) = case(&mut rng, n, d, 1.0, 0.5);
    let f = forward(&x, d, Some(&g), Some(&b), 1e-5, true);
    let ones = vec![1.0f32; n * d];
    for dy in [&ones, &dy, &dy] {
        let stats = (Some(&f.mean[..]), &f.rstd[..]);
        let bw = backward(&x, dy, d, Some(&g), stats, (false, true, true));
        let (dg, db) = (bw.dgamma.unwrap_or_default(), bw.dbeta.unwrap_or_default());
        let rb = backward(&x, dy, d, Some(&g), (None, &f.rstd), (false, true, false));
        let rdg = rb.dgamma.unwrap_or_default();
        for j in (0..d).step_by(193) {
            let (mut wg, mut wb, mut wr) = (0f64, 0f64, 0f64);
            for i in 0..n {
                let (xv, dv) = (x[i * d + j] as f64, dy[i * d + j] as f64);
                wg += dv * (xv - f.mean[i] as f64) * f.rstd[i] as f64;
                wb += dv;
                wr += dv * xv * f.rstd[i] as f64;
            }
            let close =
                |got: f32, want: f64| (got as f64 - want).abs() <= 1e-3 * (1.0 + want.abs());
            assert!(close(dg[j], wg), "dgamma[{j}] {} vs {wg}", dg[j]);
            assert!(close(db[j], wb), "dbeta[{j}] {} vs {wb}", db[j]);
            assert!(close(rdg[j], wr), "rms dgamma[{j}] {} vs {wr}", rdg[j]);
        }
    }
}

fn statistics_first_changes_no_bits() {
    let _hold = SEGMENTED.lock();
    let mut rng = Rng::new(31);
    // Whole batches plus a remainder; rows of whole lanes, and rows
    // that are not (so their alignment varies and they have tails).
    for (n, d) in [
        (8 * 9 + 5, 128usize),
        (8 * 3 + 1, 256),
        (8 * 7 + 3, 100),
        (8 * 5, 64),
        (19, 7),
    ] {
        assert!(d * 4 <= STATS_FIRST_ROW_BYTES);
        same_bits_either_way(set_stats_first, &case(&mut rng, n, d, 3.0, 1.0), d);
    }
}

fn outputs_start_on_a_cache_line() {
    let mut rng = Rng::new(3);
    for (n, d) in [(3usize, 5usize), (600, 128)] {
        let (x, dy, g, b) = case(&mut rng, n, d, 1.0, 0.0);
        // `x` starts where the allocator put it, not on a line.
        let x = [vec![0.0f32; 3], x].concat();
        let x = &x[3..];
        let f = forward(x, d, Some(&g), Some(&b), 1e-5, true);
        let bw = backward(
            x,
            &dy,
            d,
            Some(&g),
            (Some(&f.mean), &f.rstd),
            (true, false, false),
        );
        let dx = bw.dx.unwrap_or_default();
        let ry = forward(x, d, Some(&g), None, 1e-5, false).y;
        for (name, p) in [
            ("y", f.y.as_ptr()),
            ("dx", dx.as_ptr()),
            ("rms y", ry.as_ptr()),
        ] {
            assert_eq!(p as usize % 64, 0, "{name} at n={n} d={d}");
        }
    }
}

fn overlapped_passes_give_the_same_bits_as_separate_ones() {
    let _hold = SEGMENTED.lock();
    // `reset_switches` also resets the lanes that SIMD tests set.
    let _simd = SIMD_TESTS.lock();
    use crate::device::cpu::{set_profile, Profile};
    let mut rng = Rng::new(17);
    // Streamed (the overlap needs it): short rows one at a time, rows
    // in lockstep with a remainder (two steps, and four, so that a
    // step carries both the next step's variance pass and the mean pass
    // of the one after), rows of unequal alignment (the joined loop
    // falls back to one pass after the other), long rows (the forward
    // keeps its runs apart; the backward overlaps), and rows too short
    // to overlap. Rows of 16 KiB and more pair their partials in the
    // backward (see `PassA`): odd and even numbers of steps end on an
    // unpaired step and on a pair, in lockstep (two or four rows a
    // step, by profile) and one at a time, aligned (16_400) and not
    // (20_003).
    for p in [Profile::Intel, Profile::Amd] {
        set_profile(p);
        for (n, d) in [
            (5usize, 1000usize),
            (4, 777),
            (9, 4096),
            (17, 4096),
            (7, 4096),
            (13, 4096),
            (7, 4100),
            (6, 16384),
            (3, 20_003),
            (4, 20_003),
            (2, 16_400),
            (5, 16_400),
            (6, 256),
        ] {
            set_overlap(true);
            assert_eq!(overlap(d * 4), d * 4 >= 2048, "d={d}");
            assert_eq!(overlap_backward(d * 4), d * 4 >= 2048, "d={d}");
            let (x, dy, g, b) = case(&mut rng, n, d, 1.5, 3.0);
            let old = stream_threshold();
            set_stream_threshold(0);
            set_overlap(false);
            assert!(!overlap(d * 4) && !overlap_backward(d * 4));
            let want = outputs(&x, &dy, &g, &b, d);
            set_overlap(true);
            let got = outputs(&x, &dy, &g, &b, d);
            set_stream_threshold(old);
            assert!(got == want, "{p} n={n} d={d}");
        }
    }
    reset_switches();
    set_profile(Profile::for_vendor(&crate::device::cpu::cpu_vendor()));
}

fn long_rows_in_runs_match_the_f64_statistics() {
    let _hold = SEGMENTED.lock();
    let mut rng = Rng::new(13);
    for d in [16_400usize, 20_003, 65_536] {
        assert!(segmented(d * 4), "d={d}");
        let x: Vec<f32> = (0..2 * d)
            .map(|_| (rng.normal() * 3.0 + 100.0) as f32)
            .collect();
        let dy: Vec<f32> = (0..2 * d).map(|_| rng.normal() as f32).collect();
        let g: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
        let run = |seg: bool| {
            set_segmented(seg);
            let f = forward(&x, d, Some(&g), None, 1e-5, true);
            let stats = (Some(&f.mean[..]), &f.rstd[..]);
            let b = backward(&x, &dy, d, Some(&g), stats, (true, true, true));
            set_segmented(true);
            (f, b.dx.unwrap_or_default())
        };
        let ((on, dx_on), (off, dx_off)) = (run(true), run(false));
        for (i, row) in x.chunks(d).enumerate() {
            let m = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / d as f64;
            let r = 1.0 / (var + 1e-5).sqrt();
            for f in [&on, &off] {
                assert!((f.mean[i] as f64 - m).abs() <= 1e-6 * m.abs(), "d={d} mean");
                assert!((f.rstd[i] as f64 - r).abs() <= 1e-5 * r, "d={d} rstd");
            }
        }
        let close = |a: &[f32], b: &[f32]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs()))
        };
        assert!(close(&on.y, &off.y), "d={d} y");
        assert!(close(&dx_on, &dx_off), "d={d} dx");
    }
}

fn rows_at_mut_gives_whole_rows_and_empty_past_the_end() {
    let mut v: Vec<u32> = (0..10).collect();
    let [a, b, c] = rows_at_mut::<u32, 3>(&mut v, 2, 3);
    assert_eq!((&*a, b.len(), c.len()), (&[6, 7, 8][..], 0, 0));
    a[0] = 60;
    let [a, b] = rows_at_mut::<u32, 2>(&mut v, 1, 4);
    assert_eq!((&*a, &*b), (&[4, 5, 60, 7][..], &[][..]));
    let [a, b] = rows_at_mut::<u32, 2>(&mut v, 0, 5);
    assert_eq!((&*a, &*b), (&[0, 1, 2, 3, 4][..], &[5, 60, 7, 8, 9][..]));
    let [a, b] = rows_at_mut::<u32, 2>(&mut v, 7, 0);
    assert_eq!((a.len(), b.len()), (0, 0));
    let [a] = rows_at_mut::<u32, 1>(&mut v, 9, 3);
    assert!(a.is_empty());
}

fn only_rows_past_64_kib_take_narrow_lanes() {
    let _hold = SIMD_TESTS.lock();
    set_narrow_lanes(true);
    for (bytes, want) in [(4096, false), (64 << 10, false), ((64 << 10) + 4, true)] {
        assert_eq!(narrow_lanes(bytes), want, "{bytes} bytes");
    }
    set_narrow_lanes(false);
    assert!(!narrow_lanes(1 << 20));
    reset_switches();
    assert_eq!(narrow_lanes(1 << 20), narrow_default(profile()));
}

fn each_vendor_gets_its_measured_layer_norm_defaults() {
    use crate::device::cpu::Profile;
    let intel = Profile::Intel;
    assert!(narrow_default(intel));
    assert!(backward_overlap(intel, 2 << 10) && backward_overlap(intel, 256 << 10));
    assert!(forward_overlap(intel, 4096) && forward_overlap(intel, 16 << 10));
    let amd = Profile::Amd;
    assert!(!narrow_default(amd));
    // On AMD the backward overlaps only rows in lockstep and longer.
    assert!(!backward_overlap(amd, 2 << 10) && !backward_overlap(amd, (16 << 10) - 4));
    assert!(backward_overlap(amd, 16 << 10) && backward_overlap(amd, 64 << 10));
    assert!(backward_overlap(amd, (64 << 10) + 4) && backward_overlap(amd, 256 << 10));
    // On AMD only rows in lockstep overlap their forward passes.
    assert!(!forward_overlap(amd, (16 << 10) - 4));
    assert!(forward_overlap(amd, 16 << 10) && forward_overlap(amd, 64 << 10));
    // The backward pairs 16 KiB rows on AMD only; longer ones on both.
    assert!(!backward_pairs(intel, 16 << 10) && backward_pairs(amd, 16 << 10));
    assert!(backward_pairs(intel, 32 << 10) && backward_pairs(amd, 32 << 10));
}
