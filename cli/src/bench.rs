//! `fusegrad bench`: fused against composed LayerNorm and a copy, shape
//! by shape, in one process and one run, so every figure is a same-run ratio.
//!
//! Per shape (f32, with gamma and beta): the median time of the fused
//! forward and of the fused backward (through the tape, as a user calls
//! them), the effective GB/s over the minimal bytes, and the rate of a
//! parallel copy of the same bytes (the fastest of three ways to copy, see
//! `best_copy`). The three are timed interleaved, rep by
//! rep, so that a slow spell on a shared machine hits all of them alike.
//! Then the composed twin's forward + backward, and the speed-up.
//!
//! Minimal bytes: the forward must read `x` and write `y` (8 bytes per
//! element); the backward must read `x` and `dy` and write `dx` (12 bytes);
//! add `gamma`/`beta` read by the forward, `gamma` read by the backward and
//! `dgamma`/`dbeta` written (5 rows of `D`). The copy moves the same number
//! of bytes: it copies a buffer of half the minimal bytes, so it reads one
//! half and writes the other, and its footprint matches the fused pair's
//! (a copy of only `N * D` elements would fit in a cache that `x`, `y`,
//! `dy` and `dx` together do not).

// The GPU timing harness launches the library's own kernels, so it lives
// in the library, behind the `probes` feature.
#[cfg(feature = "cuda")]
pub use fusegrad::probes::cuda_bench::{
    cuda_device_name, cuda_json_header, cuda_normal, measure_cuda, run_cuda, CudaInputs, CudaRow,
    CUDA_HEADER, CUDA_REPS, CUDA_SHAPES, CUDA_WINDOW,
};
mod prims;
pub use prims::{measure_prims, run_prims, PrimRow, PRIM_HEADER, PRIM_SHAPES};
mod train;
pub use train::{
    run_shadow_cost, run_train, Breakdown, FamilyRow, Memory, OpRow, ShadowCost, TrainBench,
    TrainBenchConfig, FAMILIES,
};

use fusegrad::error::Result;
use fusegrad::probes::cpu;
use fusegrad::rng::Rng;
use fusegrad::tape::{Tape, Var};
use fusegrad::tensor::Tensor;
use fusegrad::{ops, Error};
use std::time::Instant;

/// The shapes (N, D) the LayerNorm bench times: transformer widths, long
/// rows and many rows (`docs/performance.md` gives the figures).
pub const SHAPES: [(usize, usize); 8] = [
    (4096, 768),
    (16384, 1024),
    (8192, 4096),
    (65536, 256),
    (1024, 16384),
    (512, 2048),
    (32768, 128),
    (2048, 65536),
];

/// Minimal bytes per element moved by the fused f32 forward (read x, write y).
pub const FWD_BYTES_PER_ELEM: usize = 8;
/// ... and backward (read x and dy, write dx).
pub const BWD_BYTES_PER_ELEM: usize = 12;

/// Length of the op chain [`tape_overhead`] records in [`run`].
pub const TAPE_CHAIN: usize = 1000;

/// One shape's figures. Times are medians in seconds.
#[derive(Debug, Clone)]
pub struct Row {
    /// Rows.
    pub n: usize,
    /// Row length.
    pub d: usize,
    /// Timed repetitions of each of forward, backward and copy.
    pub reps: usize,
    /// Fused forward, median seconds.
    pub fwd_s: f64,
    /// Fused backward, median seconds.
    pub bwd_s: f64,
    /// Minimal bytes for forward + backward (per-element traffic plus the
    /// gamma/beta reads and dgamma/dbeta writes).
    pub min_bytes: f64,
    /// Effective GB/s of fwd+bwd over `min_bytes`.
    pub gbps: f64,
    /// Same-run copy rate of `min_bytes` (read half, written half), GB/s.
    pub copy_gbps: f64,
    /// `gbps / copy_gbps`.
    pub copy_fraction: f64,
    /// Composed fwd+bwd median time (None if skipped).
    pub composed_s: Option<f64>,
    /// composed time / fused time.
    pub speedup: Option<f64>,
    /// Minor page faults of the process per timed step (forward, backward
    /// and copy), where the OS reports them (Linux). A warm step should
    /// fault in no fresh pages: its large buffers come from the pool.
    pub faults_per_step: Option<f64>,
}

/// Median of `reps` timings of `f` after `warm` untimed calls.
pub fn median_time(warm: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warm {
        f()?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(median(&mut t))
}

fn median(t: &mut [f64]) -> f64 {
    t.sort_by(f64::total_cmp);
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
}

fn time(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let s = Instant::now();
    f()?;
    Ok(s.elapsed().as_secs_f64())
}

/// Minor page faults of this process so far, from `/proc/self/stat`
/// (`None` where there is none).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 10; the fields after the command name (in parentheses) start
    // at field 3.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(7)?
        .parse()
        .ok()
}

/// Repetitions so that one measurement takes about `budget_s` given one
/// timed call of `probe_s`.
fn reps_for(probe_s: f64, budget_s: f64, lo: usize, hi: usize) -> usize {
    ((budget_s / probe_s.max(1e-9)) as usize).clamp(lo, hi)
}

/// The ways [`best_copy`] copies: block length per task (`0`: one block
/// per thread) and whether it streams.
const COPY_WAYS: [(usize, bool); 3] = [(0, false), (64 * 1024, false), (0, true)];

/// Copies whose source and destination together take at most this many
/// bytes give each of the three ways of copying a pair of buffers of its own.
pub const OWN_PAIRS_MAX_BYTES: usize = 1 << 30;

/// How many source/destination pairs the copy of a shape uses, for a
/// pair of `pair_bytes`: one per way of copying up to
/// [`OWN_PAIRS_MAX_BYTES`], else one: copies run back to back on one pair
/// find their bytes in a cache that the kernels' inputs never get, which
/// would flatter the baseline (`docs/performance.md`, "Each way of copying
/// on its own buffers"). A larger pair stays in no cache anyway, and three
/// of them would cost gigabytes.
pub fn copy_pairs(pair_bytes: usize) -> usize {
    if pair_bytes <= OWN_PAIRS_MAX_BYTES {
        COPY_WAYS.len()
    } else {
        1
    }
}

/// The copy baseline: `dst.copy_from_slice(src)` split across the
/// threads, one contiguous block per thread or in 256 KiB blocks, and a
/// copy with streaming stores ([`cpu::stream_copy`]), one block per
/// thread; the fastest of the three in this rep. Way `k` copies pair
/// `k % pairs.len()` (see [`copy_pairs`]). The blocks go to the threads
/// as the kernels' tasks do ([`cpu::run_each`]). glibc's memcpy streams
/// only blocks past its own threshold (114 MB here), so without the third
/// a copy of 84 MB per thread (the 16M-element shapes) ran at the slower
/// cached rate, and LayerNorm was compared with a weaker baseline at those
/// shapes than at the others. Returns the seconds of the fastest.
fn best_copy(pairs: &mut [(Vec<f32>, Vec<f32>)]) -> f64 {
    let mut best = f64::INFINITY;
    let count = pairs.len().max(1);
    for (k, &(chunk, stream)) in COPY_WAYS.iter().enumerate() {
        let Some((src, dst)) = pairs.get_mut(k % count) else {
            break;
        };
        let per_thread = src.len().div_ceil(rayon::current_num_threads()).max(1);
        let chunk = if chunk == 0 { per_thread } else { chunk };
        let s = Instant::now();
        let blocks: Vec<_> = dst.chunks_mut(chunk).zip(src.chunks(chunk)).collect();
        cpu::run_each(blocks, |(d, s)| {
            if stream {
                cpu::stream_copy(d, s)
            } else {
                d.copy_from_slice(s)
            }
        });
        best = best.min(s.elapsed().as_secs_f64());
    }
    best
}

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Untimed steps at most before a shape's timed reps; fewer once a step
/// faults in no page. One was not enough when a shape ran first in its
/// process: at 2048 x 65536 the first step's `y` and `dx` fill the pool
/// and evict the 16 MiB of dgamma/dbeta partial rows to glibc, which then
/// raises its mmap threshold, so the second step takes them from a heap
/// that must grow: 519 faults in the first timed rep, none after, read as
/// 103.8 faults per step over five reps.
pub const WARM_STEPS_MAX: usize = 4;

/// Measures one shape: fused forward, backward and the copy interleaved,
/// about `budget_s` seconds of them, then (if `composed`) the composed twin.
pub fn measure(n: usize, d: usize, budget_s: f64, composed: bool) -> Result<Row> {
    let numel = n.checked_mul(d).ok_or(Error::ShapeTooLarge {
        op: "bench",
        shape: vec![n, d],
    })?;
    if numel == 0 {
        return Err(Error::InvalidArgument {
            op: "bench",
            msg: format!("empty shape {n} x {d}"),
        });
    }
    // Each shape starts from an empty buffer pool, as in a fresh process:
    // the previous shape's buffers (its composed twin's, up to the pool's
    // 1 GiB) would otherwise be in the cache until they go stale
    // (`pool::STALE_TAKES`), and the first steps here would fault.
    fusegrad::probes::pool::clear::<f32>();
    let mut rng = Rng::new(42);
    // Inputs as `from_slice` and the LayerNorm and elementwise outputs
    // hand them on: 64-byte aligned. A vector kept by `Tensor::from_vec` starts
    // where the allocator put it (see `docs/performance.md`).
    let x = Tensor::from_slice(&[n, d], &random(&mut rng, numel))?;
    let dy = Tensor::from_slice(&[n, d], &random(&mut rng, numel))?;
    let gamma = Tensor::from_slice(&[d], &random(&mut rng, d))?;
    let beta = Tensor::from_slice(&[d], &random(&mut rng, d))?;

    // Each forward records on a fresh tape, as a training step would.
    let fwd = || -> Result<Var<f32>> {
        let tape = Tape::new();
        let (xv, gv, bv) = (
            tape.var(x.clone()),
            tape.var(gamma.clone()),
            tape.var(beta.clone()),
        );
        ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5)
    };
    // One rep is a training step: the backward runs through the forward's
    // fresh output, so `y` and `dx` are alive together and the buffer pool
    // sees what a user's loop gives it (timing the backward on one `y`
    // kept across reps hid a pool that evicted `dx` on every step).
    let step = || -> Result<[f64; 2]> {
        let s = Instant::now();
        let y = fwd()?;
        let f = s.elapsed().as_secs_f64();
        let b = time(|| y.backward_with(&dy).map(|_| ()))?;
        Ok([f, b])
    };
    let elems = numel as f64;
    let min_bytes = elems * (FWD_BYTES_PER_ELEM + BWD_BYTES_PER_ELEM) as f64 + (d * 4 * 5) as f64;
    // The copy reads `copy_len` f32 and writes as many: `min_bytes` in all.
    let copy_len = (min_bytes / 8.0).round() as usize;
    // In memory allocated as the kernels' is (`pool::fresh`: huge pages
    // where the system gives them), so that neither side has pages the
    // other lacks.
    let mut pairs: Vec<(Vec<f32>, Vec<f32>)> = (0..copy_pairs(copy_len * 8))
        .map(|_| {
            let mut src = fusegrad::probes::pool::fresh::<f32>(copy_len);
            src.iter_mut().for_each(|v| *v = rng.normal() as f32);
            (src, fusegrad::probes::pool::fresh::<f32>(copy_len))
        })
        .collect();

    // Warm-up: fill the buffer pool and the copy target, fault in pages,
    // step by step until a step faults in none (see [`WARM_STEPS_MAX`]).
    let mut probe = f64::INFINITY;
    for _ in 0..WARM_STEPS_MAX {
        let before = minor_faults();
        probe = probe.min(step()?.iter().sum());
        best_copy(&mut pairs);
        if before.zip(minor_faults()).is_none_or(|(a, b)| a == b) {
            break;
        }
    }
    let reps = reps_for(probe, budget_s, 5, 200);
    let (mut tf, mut tb, mut tc) = (Vec::new(), Vec::new(), Vec::new());
    let faults_before = minor_faults();
    for _ in 0..reps {
        let [f, b] = step()?;
        tf.push(f);
        tb.push(b);
        tc.push(best_copy(&mut pairs));
    }
    let faults_per_step = faults_before
        .zip(minor_faults())
        .map(|(a, b)| b.saturating_sub(a) as f64 / reps as f64);
    let (fwd_s, bwd_s, copy_s) = (median(&mut tf), median(&mut tb), median(&mut tc));
    drop(pairs);
    let copy_gbps = (copy_len * 8) as f64 / copy_s / 1e9;
    let gbps = min_bytes / (fwd_s + bwd_s) / 1e9;

    let composed_s = if composed {
        let run = || -> Result<()> {
            let tape = Tape::new();
            let v: Vec<Var<f32>> = [&x, &gamma, &beta]
                .iter()
                .map(|t| tape.var((*t).clone()))
                .collect();
            let y = ops::layer_norm_composed(&v[0], Some(&v[1]), Some(&v[2]), 1e-5)?;
            y.backward_with(&dy).map(|_| ())
        };
        let probe = time(run)?;
        Some(median_time(0, reps_for(probe, budget_s, 1, 7), run)?)
    } else {
        None
    };
    let fused = fwd_s + bwd_s;
    Ok(Row {
        n,
        d,
        reps,
        fwd_s,
        bwd_s,
        min_bytes,
        gbps,
        copy_gbps,
        copy_fraction: gbps / copy_gbps,
        composed_s,
        speedup: composed_s.map(|c| c / fused),
        faults_per_step,
    })
}

/// Table header for [`Row`]'s Display.
pub const HEADER: &str =
    "      N x D        fwd ms   bwd ms    GB/s  copy GB/s  of copy  composed ms  speed-up  faults/step";

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7} x {:<6} {:>8.3} {:>8.3} {:>7.1} {:>10.1} {:>8.2}",
            self.n,
            self.d,
            self.fwd_s * 1e3,
            self.bwd_s * 1e3,
            self.gbps,
            self.copy_gbps,
            self.copy_fraction
        )?;
        match (self.composed_s, self.speedup) {
            (Some(c), Some(s)) => write!(f, " {:>12.2} {:>8.1}x", c * 1e3, s),
            _ => write!(f, " {:>12} {:>9}", "-", "-"),
        }?;
        match self.faults_per_step {
            Some(v) => write!(f, " {v:>12.1}"),
            None => write!(f, " {:>12}", "-"),
        }
    }
}

/// A finite number as JSON, `null` otherwise.
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:e}")
    } else {
        "null".into()
    }
}

impl Row {
    /// The row as a JSON object.
    pub fn json(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("null".to_string(), num);
        format!(
            "{{\"n\":{},\"d\":{},\"reps\":{},\"fwd_s\":{},\"bwd_s\":{},\"min_bytes\":{},\"gbps\":{},\"copy_gbps\":{},\"copy_fraction\":{},\"composed_s\":{},\"speedup\":{},\"faults_per_step\":{}}}",
            self.n,
            self.d,
            self.reps,
            num(self.fwd_s),
            num(self.bwd_s),
            num(self.min_bytes),
            num(self.gbps),
            num(self.copy_gbps),
            num(self.copy_fraction),
            opt(self.composed_s),
            opt(self.speedup),
            opt(self.faults_per_step)
        )
    }
}

/// Time per op of recording and sweeping a chain of `len` tiny ops
/// (`[4]`-element tensors, alternating `scalar_mul` and `add`): the median
/// over `reps` chains of (record + backward) / `len`, in seconds.
pub fn tape_overhead(len: usize, reps: usize) -> Result<f64> {
    let x0 = Tensor::from_vec(vec![4], vec![0.5f32, -0.25, 1.0, 2.0])?;
    let seed = Tensor::from_vec(vec![4], vec![1.0f32, -1.0, 0.5, 0.25])?;
    let t = median_time(3, reps, || {
        let tape = Tape::new();
        let c = tape.constant(x0.clone());
        let mut v = tape.var(x0.clone());
        for i in 0..len {
            v = if i % 2 == 0 {
                ops::scalar_mul(&v, 0.999)?
            } else {
                ops::add(&v, &c)?
            };
        }
        v.backward_with(&seed).map(|_| ())
    })?;
    Ok(t / len.max(1) as f64)
}

/// The whole benchmark: one [`Row`] per shape and the tape overhead.
#[derive(Debug, Clone)]
pub struct Report {
    /// Rayon threads the kernels ran on.
    pub threads: usize,
    /// The instruction set the f32 kernels ran with ("AVX-512", "AVX2" or
    /// "portable").
    pub simd: String,
    /// The CPU profile whose speed defaults the kernels ran with ("Intel"
    /// or "AMD").
    pub profile: String,
    /// Outputs of at least this many bytes were written with streaming stores.
    pub stream_bytes: usize,
    /// One row per shape, in the order asked for.
    pub rows: Vec<Row>,
    /// Length of the tape chain.
    pub tape_len: usize,
    /// Seconds per recorded op, forward plus backward.
    pub tape_s_per_op: f64,
}

/// Runs [`measure`] on every shape (about `budget_s` seconds of fused
/// timing each; `composed` adds the composed twin) and [`tape_overhead`]
/// on a [`TAPE_CHAIN`]-op chain.
pub fn run(shapes: &[(usize, usize)], budget_s: f64, composed: bool) -> Result<Report> {
    let rows = shapes
        .iter()
        .map(|&(n, d)| measure(n, d, budget_s, composed))
        .collect::<Result<Vec<_>>>()?;
    let tape_s_per_op = tape_overhead(TAPE_CHAIN, 51)?;
    Ok(Report {
        threads: rayon::current_num_threads(),
        simd: cpu::simd().to_string(),
        profile: cpu::profile().to_string(),
        stream_bytes: cpu::stream_threshold(),
        rows,
        tape_len: TAPE_CHAIN,
        tape_s_per_op,
    })
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "fused LayerNorm f32 fwd+bwd vs a same-run copy and the composed twin \
             ({} threads, {}, {} profile)",
            self.threads, self.simd, self.profile
        )?;
        writeln!(f, "{HEADER}")?;
        for r in &self.rows {
            writeln!(f, "{r}")?;
        }
        write!(
            f,
            "tape overhead: {:.0} ns per op, record + backward ({}-op chain of [4] tensors)",
            self.tape_s_per_op * 1e9,
            self.tape_len
        )
    }
}

impl Report {
    /// The report as one JSON object.
    pub fn json(&self) -> String {
        let rows: Vec<String> = self.rows.iter().map(Row::json).collect();
        format!(
            "{{\"threads\":{},\"simd\":\"{}\",\"profile\":\"{}\",\"stream_bytes\":{},\"shapes\":[{}],\"tape\":{{\"len\":{},\"s_per_op\":{}}}}}",
            self.threads,
            self.simd,
            self.profile,
            self.stream_bytes,
            rows.join(","),
            self.tape_len,
            num(self.tape_s_per_op)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_reports_consistent_figures() {
        let r = run(&[(64, 256), (3, 100)], 0.01, true).unwrap();
        assert_eq!(r.rows.len(), 2);
        for row in &r.rows {
            assert!(row.reps >= 5);
            assert!(row.fwd_s > 0.0 && row.bwd_s > 0.0 && row.copy_gbps > 0.0);
            let want = (row.n * row.d * 20 + row.d * 20) as f64;
            assert_eq!(row.min_bytes, want);
            let gbps = want / (row.fwd_s + row.bwd_s) / 1e9;
            assert!((row.gbps - gbps).abs() <= 1e-9 * gbps);
            assert!((row.copy_fraction - row.gbps / row.copy_gbps).abs() < 1e-12);
            assert!(row.speedup.unwrap() > 0.0);
        }
        assert!(r.tape_s_per_op > 0.0 && r.tape_len == TAPE_CHAIN);
        let j = r.json();
        assert!(j.starts_with('{') && j.ends_with('}'), "{j}");
        assert_eq!(j.matches("\"n\":").count(), 2, "{j}");
        assert!(!j.contains("NaN") && !j.contains("inf"), "{j}");
        let t = r.to_string();
        assert_eq!(t.lines().count(), 2 + 2 + 1, "{t}");
        assert!(t.contains("tape overhead"), "{t}");
    }

    #[test]
    fn each_way_of_copying_gets_its_own_pair_while_they_are_small() {
        assert_eq!(copy_pairs(64 << 20), COPY_WAYS.len());
        assert_eq!(copy_pairs(OWN_PAIRS_MAX_BYTES), COPY_WAYS.len());
        assert_eq!(copy_pairs(OWN_PAIRS_MAX_BYTES + 1), 1);
        // Every pair is copied, whole, by its way (three pairs), and one
        // shared pair is copied by all three.
        for count in [3, 1] {
            let mut pairs: Vec<(Vec<f32>, Vec<f32>)> = (0..count)
                .map(|k| {
                    let src = (0..100_003).map(|i| (i * (k + 2)) as f32).collect();
                    (src, vec![0.0; 100_003])
                })
                .collect();
            assert!(best_copy(&mut pairs) > 0.0);
            for (k, (src, dst)) in pairs.iter().enumerate() {
                assert_eq!(src, dst, "pair {k} of {count}");
            }
        }
    }

    /// Set in the process that [`in_own_process`] starts.
    const OWN_PROCESS: &str = "FUSEGRAD_TEST_OWN_PROCESS";

    /// Whether this is the process [`in_own_process`] started. If not,
    /// runs the test `name` (of this module) alone in a fresh process of
    /// this test binary and checks that it passed. For tests that count
    /// the whole process's page faults or flip process-wide switches,
    /// which the other tests of this binary, running alongside, would
    /// disturb or be disturbed by.
    fn in_own_process(name: &str) -> bool {
        if std::env::var_os(OWN_PROCESS).is_some() {
            return true;
        }
        let path = module_path!().split_once("::").map_or("", |(_, p)| p);
        let test = format!("{path}::{name}");
        let exe = std::env::current_exe().expect("this test binary");
        let out = std::process::Command::new(exe)
            .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(OWN_PROCESS, "1")
            .output()
            .expect("run the test in a process of its own");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{test}:\n{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{test} did not run:\n{stdout}");
        eprint!("{stderr}");
        false
    }

    /// [`measure`] of `n x d` (no composed twin, a short budget), with its
    /// faults per step; `None`, after saying so, where the OS counts no
    /// faults.
    fn measure_faults(n: usize, d: usize) -> Option<(Row, f64)> {
        let row = measure(n, d, 0.01, false).expect("bench");
        let Some(faults) = row.faults_per_step else {
            eprintln!("skipped: this OS reports no page-fault counts (/proc/self/stat)");
            return None;
        };
        Some((row, faults))
    }

    /// A warm training step faults in no fresh pages: its large outputs
    /// come from the buffer pool. In a process of its own, because the
    /// fault count is the whole process's and the pool's switch is
    /// process-wide. 8192 x 1152 f32: 36 MiB outputs, past glibc's largest
    /// mmap threshold (32 MiB), so without the pool every step maps them
    /// afresh.
    #[test]
    fn a_warm_step_faults_in_no_fresh_pages_and_one_without_the_pool_does() {
        if !in_own_process("a_warm_step_faults_in_no_fresh_pages_and_one_without_the_pool_does") {
            return;
        }
        let (n, d) = (8192, 1152);
        let Some((pooled, with)) = measure_faults(n, d) else {
            return;
        };
        fusegrad::probes::pool::set_enabled(false);
        let (_, without) = measure_faults(n, d).expect("counted once, counted twice");
        fusegrad::probes::pool::set_enabled(true);
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

    #[test]
    fn empty_or_huge_shapes_are_errors() {
        assert!(measure(0, 8, 0.01, false).is_err());
        assert!(measure(usize::MAX, 2, 0.01, false).is_err());
    }
}
