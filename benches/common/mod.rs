//! What the probes in `benches/` share: their command line and the
//! median of their rates. Each uses a part of it.
#![allow(dead_code)]

/// The probe's arguments: those after `--` in `cargo bench --features
/// probes --bench NAME -- ARGS`, without the `--bench` that `cargo bench`
/// adds to every bench target's command line.
pub fn args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect()
}

/// `[--reps K] [N D ...]` from the command line: the reps (11 unless
/// given) and the shapes (`default` unless at least one pair is given).
pub fn reps_and_shapes(default: &[(usize, usize)]) -> (usize, Vec<(usize, usize)>) {
    let mut args = args();
    let mut reps = 11;
    if let Some(k) = args.iter().position(|a| a == "--reps") {
        reps = args.get(k + 1).and_then(|v| v.parse().ok()).unwrap_or(reps);
        args.drain(k..(k + 2).min(args.len()));
    }
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let shapes = if nums.len() >= 2 {
        nums.chunks_exact(2).map(|p| (p[0], p[1])).collect()
    } else {
        default.to_vec()
    };
    (reps, shapes)
}

/// Seconds for `run(k, half)` on the first `threads` (1 or 2) halves of
/// `c`, each on a thread of its own (half `k` is `c`'s `k`-th half).
pub fn time_halves(c: &mut [f32], threads: usize, run: impl Fn(usize, &mut [f32]) + Sync) -> f64 {
    let h = c.len() / 2;
    let (c0, c1) = c.split_at_mut(h);
    let t = std::time::Instant::now();
    std::thread::scope(|s| {
        for (k, cc) in [c0, c1].into_iter().enumerate().take(threads) {
            let run = &run;
            s.spawn(move || run(k, cc));
        }
    });
    t.elapsed().as_secs_f64()
}

/// The median of a non-empty list of rates.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
