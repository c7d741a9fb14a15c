//! What the loop-structure examples (`memory_ceiling`, `long_row_costs`)
//! share: their command line and the median of their rates.

/// `[--reps K] [N D ...]` from the command line: the reps (11 unless
/// given) and the shapes (`default` unless at least one pair is given).
pub fn reps_and_shapes(default: &[(usize, usize)]) -> (usize, Vec<(usize, usize)>) {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
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

/// The median of a non-empty list of rates.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
