//! Unit tests of the chunking, the row writers and the SIMD builds.

use super::lanes::fold;
use super::*;
use std::sync::Mutex;

// The tests, run by `tests/unit.rs`.
unit_tests![
    chunks_depend_on_row_length_only,
    stream_copy_copies_every_length_and_offset,
    every_build_and_store_kind_writes_the_same_values,
    fold_is_pairwise,
    every_build_folds_in_the_same_order,
    narrow_kernels_run_in_256_bit_lanes,
    each_vendor_gets_its_profile,
    the_profile_follows_the_cpu_it_runs_on,
    a_switch_follows_its_default_until_set,
    streaming_needs_f32_and_a_large_output,
    simd_is_within_what_the_cpu_has,
    the_team_runs_every_task_once,
    a_one_thread_pool_runs_the_tasks_on_the_caller,
    launches_from_several_threads_each_run_their_tasks_once,
    a_panicking_task_panics_the_launch_and_the_team_goes_on,
    a_launch_from_inside_a_task_runs_in_place_and_finishes,
    transpose_moves_every_entry_and_nothing_else,
];

fn chunks_depend_on_row_length_only() {
    assert_eq!(rows_per_chunk(1), 64 * 1024);
    assert_eq!(rows_per_chunk(1000), 65);
    assert_eq!(rows_per_chunk(1 << 20), 1);
    assert_eq!(rows_per_chunk(0), 64 * 1024);
}

/// `y = x * 3 - 1` with `write_row`, in lanes `V`.
struct Affine<'a, const NT: bool> {
    x: &'a [f32],
    y: &'a mut [f32],
}

impl<const NT: bool> Kernel<f32> for Affine<'_, NT> {
    type Output = ();
    #[inline(always)]
    fn run<V: Lanes<f32>>(self) {
        let (x, y) = (self.x, self.y);
        let n = y.len().min(x.len());
        let (x, y) = (&x[..n], &mut y[..n]);
        let (a, b) = (V::splat(3.0), V::splat(1.0));
        write_row::<f32, V, NT>(
            y,
            // SAFETY: write_row keeps i + LANES <= n = x.len().
            #[inline(always)]
            |i| unsafe { V::load_at(x, i) }.mul(a).sub(b),
            #[inline(always)]
            |i| x.get(i).map_or(0.0, |v| v * 3.0 - 1.0),
        );
        fence::<NT>();
    }
}

fn stream_copy_copies_every_length_and_offset() {
    let src: Vec<f32> = (0..200).map(|i| i as f32 * 0.5 - 7.0).collect();
    for n in [0usize, 1, 15, 16, 17, 64, 100, 180] {
        for off in 0..4 {
            let mut dst = vec![f32::NAN; n + off + 3];
            stream_copy(&mut dst[off..off + n], &src[off..off + n]);
            assert_eq!(&dst[off..off + n], &src[off..off + n], "n {n} off {off}");
            assert!(dst[..off].iter().chain(&dst[off + n..]).all(|v| v.is_nan()));
        }
    }
    let mut short = vec![0.0f32; 3];
    stream_copy(&mut short, &src);
    assert_eq!(short, &src[..3]);
}

fn every_build_and_store_kind_writes_the_same_values() {
    let x: Vec<f32> = (0..300).map(|i| i as f32 * 0.37 - 20.0).collect();
    for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 250] {
        for off in 0..5 {
            let want: Vec<f32> = x[off..off + n].iter().map(|v| v * 3.0 - 1.0).collect();
            let mut y = vec![0.0f32; n + off];
            dispatch(Affine::<true> {
                x: &x[off..off + n],
                y: &mut y[off..],
            });
            assert_eq!(y[off..], want[..], "stream n={n} off={off}");
            let mut y = vec![0.0f32; n + off];
            dispatch(Affine::<false> {
                x: &x[off..off + n],
                y: &mut y[off..],
            });
            assert_eq!(y[off..], want[..], "store n={n} off={off}");
            let mut y = vec![0.0f32; n + off];
            Affine::<true> {
                x: &x[off..off + n],
                y: &mut y[off..],
            }
            .run::<Portable<f32>>();
            assert_eq!(y[off..], want[..], "portable n={n} off={off}");
        }
    }
}

fn fold_is_pairwise() {
    let a: [f32; LANES] = std::array::from_fn(|i| i as f32);
    assert_eq!(fold(a), 120.0);
    // Pairwise, not left to right: 2^24 + 1 + 1 in sequence loses both
    // ones, while the pairs keep them.
    let mut b = [0.0f32; LANES];
    b[0] = 16_777_216.0;
    b[2] = 1.0;
    b[3] = 1.0;
    assert_eq!(fold(b), 16_777_218.0);
}

/// Folds `x` (16 values) in lanes `V`.
struct Fold<'a>(&'a [f32; LANES]);

impl Kernel<f32> for Fold<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<V: Lanes<f32>>(self) -> f32 {
        V::load(self.0).fold()
    }
}

fn every_build_folds_in_the_same_order() {
    let _hold = SIMD_TESTS.lock();
    // Values whose sum depends on the order of the additions.
    let x: [f32; LANES] = std::array::from_fn(|i| {
        let m = [1e8f32, 1.0, -3.5, 7e-3, 1.5e7, -1e8, 0.25, 3.0];
        m[i % 8] * (1.0 + i as f32 * 0.37)
    });
    let want = fold(x);
    assert_eq!(Fold(&x).run::<Portable<f32>>(), want);
    for limit in [Simd::Avx512, Simd::Avx2, Simd::Portable] {
        if limit <= best_simd() {
            set_simd_limit(limit);
            assert_eq!(dispatch(Fold(&x)).to_bits(), want.to_bits(), "{limit}");
        }
    }
    set_simd_limit(Simd::Avx512);
    let left_to_right = x.iter().fold(0.0f32, |a, &b| a + b);
    assert_ne!(
        want, left_to_right,
        "the test values must depend on the order"
    );
}

/// Names the lanes it runs with; asks for narrow lanes if `.0`.
struct WhichLanes(bool);

impl Kernel<f32> for WhichLanes {
    type Output = &'static str;
    #[inline(always)]
    fn run<V: Lanes<f32>>(self) -> &'static str {
        std::any::type_name::<V>()
    }
    fn narrow(&self) -> bool {
        self.0
    }
}

fn narrow_kernels_run_in_256_bit_lanes() {
    let _hold = SIMD_TESTS.lock();
    let ran = |narrow| dispatch(WhichLanes(narrow));
    if best_simd() == Simd::Avx512 {
        set_simd_limit(Simd::Avx512);
        assert!(ran(false).ends_with("Avx512"), "{}", ran(false));
        assert!(ran(true).ends_with("Avx2"), "{}", ran(true));
        assert_eq!(lanes_for(&WhichLanes(true)), Simd::Avx2);
        assert_eq!(lanes_for(&WhichLanes(false)), Simd::Avx512);
    }
    if best_simd() >= Simd::Avx2 {
        set_simd_limit(Simd::Avx2);
        assert!(ran(true).ends_with("Avx2"), "{}", ran(true));
    }
    set_simd_limit(Simd::Portable);
    assert!(ran(true).contains("Portable"), "{}", ran(true));
    set_simd_limit(Simd::Avx512);
}

fn each_vendor_gets_its_profile() {
    assert_eq!(Profile::for_vendor("GenuineIntel"), Profile::Intel);
    assert_eq!(Profile::for_vendor("AuthenticAMD"), Profile::Amd);
    assert_eq!(Profile::for_vendor("HygonGenuine"), Profile::Amd);
    assert_eq!(Profile::for_vendor(""), Profile::Intel);
}

fn the_profile_follows_the_cpu_it_runs_on() {
    // Tests that set the profile hold this lock.
    let _hold = SIMD_TESTS.lock();
    let vendor = cpu_vendor();
    if cfg!(target_arch = "x86_64") {
        assert_eq!(vendor.len(), 12, "{vendor:?}");
    }
    // Checked against the kernel's own reading where there is one.
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        let line = info.lines().find(|l| l.starts_with("vendor_id"));
        if let Some(id) = line.and_then(|l| l.split(':').nth(1)) {
            assert_eq!(vendor, id.trim());
        }
    }
    assert_eq!(profile(), Profile::for_vendor(&vendor));
}

fn a_switch_follows_its_default_until_set() {
    let s = Switch::new();
    assert!(s.on(|| true) && !s.on(|| false));
    s.set(false);
    assert!(!s.on(|| true));
    s.set(true);
    assert!(s.on(|| false));
    s.reset();
    assert!(!s.on(|| false) && s.on(|| true));
}

fn streaming_needs_f32_and_a_large_output() {
    assert!(!should_stream::<f64>(usize::MAX / 8));
    assert!(!should_stream::<f32>(16));
}

fn simd_is_within_what_the_cpu_has() {
    assert!(simd() <= best_simd());
    assert!(Simd::Portable < Simd::Avx2 && Simd::Avx2 < Simd::Avx512);
    assert_eq!(Simd::Avx512.to_string(), "AVX-512");
}

/// Runs `run_tasks(count, ..)` and returns how often each task ran.
fn task_runs(count: usize) -> Vec<usize> {
    let runs: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
    run_tasks(count, &|i| {
        runs[i].fetch_add(1, Ordering::SeqCst);
    });
    runs.into_iter().map(AtomicUsize::into_inner).collect()
}

fn the_team_runs_every_task_once() {
    for count in [0, 1, 2, 3, 5, 7, 64, 1000] {
        assert_eq!(task_runs(count), vec![1; count], "{count} tasks");
    }
    // Past the helpers' spinning and yielding they sleep; a launch wakes
    // them.
    std::thread::sleep(SPIN + YIELD + std::time::Duration::from_millis(5));
    assert_eq!(task_runs(9), vec![1; 9], "after the helpers slept");
}

fn a_one_thread_pool_runs_the_tasks_on_the_caller() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a rayon pool");
    let ids = pool.install(|| {
        let ids = Mutex::new(Vec::new());
        run_tasks(16, &|_| {
            if let Ok(mut v) = ids.lock() {
                v.push(std::thread::current().id());
            }
        });
        ids.into_inner().unwrap_or_default()
    });
    assert_eq!(ids.len(), 16);
    assert!(ids.iter().all(|&t| t == ids[0]), "all on one thread");
}

fn launches_from_several_threads_each_run_their_tasks_once() {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|k| {
                s.spawn(move || {
                    (0..200).all(|r| {
                        let count = 1 + (k * 7 + r) % 23;
                        task_runs(count) == vec![1; count]
                    })
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().ok(), Some(true));
        }
    });
}

fn a_panicking_task_panics_the_launch_and_the_team_goes_on() {
    let hit = std::panic::catch_unwind(|| {
        run_tasks(8, &|i| {
            if i == 5 {
                panic!("task 5");
            }
        })
    });
    assert!(hit.is_err());
    assert_eq!(task_runs(8), vec![1; 8]);
}

fn a_launch_from_inside_a_task_runs_in_place_and_finishes() {
    // Each outer task launches inner tasks (as a batched matmul's bands
    // do). A helper that published a nested job after the caller had
    // cleared the slot would wait for itself; run on a thread with a
    // deadline, so that a hang fails the test instead of stalling it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ok = (0..300).all(|r| {
            let outer = 2 + r % 5;
            let seen: Vec<AtomicUsize> = (0..outer * 7).map(|_| AtomicUsize::new(0)).collect();
            run_tasks(outer, &|o| {
                // Later tasks start their inner launch later, so that the
                // caller is done with its own and has cleared the slot.
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_micros(50 * o as u64) {
                    std::hint::spin_loop();
                }
                run_tasks(7, &|i| {
                    seen[o * 7 + i].fetch_add(1, Ordering::SeqCst);
                })
            });
            seen.iter().all(|s| s.load(Ordering::SeqCst) == 1)
        });
        let _ = tx.send(ok);
    });
    let done = rx.recv_timeout(std::time::Duration::from_secs(60));
    assert_eq!(done, Ok(true), "nested launches hung or lost tasks");
}

/// Every shape up to 16 x 16 and past it, at padded strides: each entry
/// lands at its transposed place and the padding around it is untouched.
fn transpose_moves_every_entry_and_nothing_else() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return;
    }
    for (rows, cols) in (0..=16)
        .flat_map(|r| (0..=16).map(move |c| (r, c)))
        .chain([(37, 21), (16, 48)])
    {
        let (lds, ldd) = (cols + 3, rows + 5);
        let src: Vec<f32> = (0..rows * lds).map(|i| i as f32).collect();
        let mut dst = vec![f32::NAN; cols.max(1) * ldd];
        // SAFETY: AVX-512F checked above; both buffers hold the shape.
        unsafe {
            super::transpose::transpose(src.as_ptr(), lds, [rows, cols], dst.as_mut_ptr(), ldd)
        };
        for c in 0..cols.max(1) {
            for r in 0..ldd {
                let got = dst[c * ldd + r];
                if r < rows && c < cols {
                    assert_eq!(got, src[r * lds + c], "{rows} x {cols} at ({r}, {c})");
                } else {
                    assert!(got.is_nan(), "{rows} x {cols}: wrote padding at ({c}, {r})");
                }
            }
        }
    }
}
