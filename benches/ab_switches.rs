//! Interleaved A/B of the LayerNorm kernel switches, one shape at a time:
//! each rep times the fused forward and backward with a switch off and
//! on (each side first in every other rep), so a slow spell on a shared
//! machine hits both sides alike. Prints
//! the medians of fwd+bwd time and the on/off ratios of fwd+bwd, of the
//! forward alone and of the backward alone.
//!
//! ```sh
//! cargo bench --features probes --bench ab_switches -- [--reps R] [--shape NxD]...
//!     [--switch NAME]   # only the switches whose name contains NAME
//!     [--with NAME=on|off]...  # hold another switch on or off meanwhile
//! ```
//!
//! "AMD profile" compares the two CPU profiles' defaults (on: AMD's, off:
//! Intel's); every switch goes back to the detected profile's default
//! after its turn.

mod common;

use fusegrad::ops;
use fusegrad::probes as cpu;
use fusegrad::tape::Tape;
use fusegrad::tensor::Tensor;
use std::time::Instant;

type Switch = (&'static str, fn(bool));

const SWITCHES: [Switch; 13] = [
    ("team of threads", cpu::set_team),
    ("statistics first", cpu::set_stats_first),
    ("long forward tasks", cpu::set_long_fwd_tasks),
    ("lockstep rows", cpu::set_lockstep),
    ("runs of long rows", cpu::set_segmented),
    ("prefetch next row", cpu::set_prefetch_next),
    ("overlap passes", cpu::set_overlap),
    ("paired partials", cpu::set_paired_partials),
    ("interleaved partials", cpu::set_interleaved_partials),
    ("narrow lanes", cpu::set_narrow_lanes),
    ("backward pairs", cpu::set_backward_pairs),
    ("AMD profile", |on| {
        cpu::set_profile(if on {
            cpu::Profile::Amd
        } else {
            cpu::Profile::Intel
        })
    }),
    ("streaming stores", |on| {
        cpu::set_stream_threshold(if on {
            cpu::DEFAULT_STREAM_BYTES
        } else {
            usize::MAX
        })
    }),
];

/// The one switch whose name contains `name`.
fn held(name: &str) -> Option<fn(bool)> {
    let mut hits = SWITCHES.iter().filter(|(n, _)| n.contains(name));
    match (hits.next(), hits.next()) {
        (Some(&(_, set)), None) => Some(set),
        _ => None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> fusegrad::Result<()> {
    let args = common::args();
    let (mut reps, mut shapes, mut only) = (15usize, Vec::new(), String::new());
    let mut with: Vec<(fn(bool), bool)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().map(String::as_str).unwrap_or("");
        match a.as_str() {
            "--reps" => reps = v.parse().unwrap_or(reps),
            "--switch" => only = v.to_string(),
            "--with" => match v.rsplit_once('=').map(|(n, o)| (held(n), o)) {
                Some((Some(set), "on" | "off")) => with.push((set, v.ends_with("on"))),
                _ => eprintln!("bad --with {v:?}, want NAME=on|off (one switch)"),
            },
            "--shape" => match v.split_once('x').map(|(n, d)| (n.parse(), d.parse())) {
                Some((Ok(n), Ok(d))) => shapes.push((n, d)),
                _ => eprintln!("bad --shape {v:?}, want NxD"),
            },
            other => eprintln!("unknown argument {other:?}"),
        }
    }
    if shapes.is_empty() {
        shapes = vec![(8192, 4096), (1024, 16384), (2048, 65536), (4096, 768)];
    }
    println!("shape           switch               off ms    on ms   on/off      fwd      bwd");
    for (n, d) in shapes {
        let xs: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919) % 997) as f32 * 0.01)
            .collect();
        let dys: Vec<f32> = xs.iter().map(|v| 1.0 - v * 0.3).collect();
        let x = Tensor::from_slice(&[n, d], &xs)?;
        let dy = Tensor::from_slice(&[n, d], &dys)?;
        drop((xs, dys));
        let g = Tensor::full(&[d], 1.5f32)?;
        let b = Tensor::full(&[d], 0.5f32)?;
        // One training step, timed as (forward, backward).
        let step = || -> fusegrad::Result<[f64; 2]> {
            let s = Instant::now();
            let tape = Tape::new();
            let (xv, gv, bv) = (
                tape.var(x.clone()),
                tape.var(g.clone()),
                tape.var(b.clone()),
            );
            let y = ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5)?;
            let f = s.elapsed().as_secs_f64();
            let s = Instant::now();
            y.backward_with(&dy)?;
            Ok([f, s.elapsed().as_secs_f64()])
        };
        for (name, set) in SWITCHES.into_iter().filter(|(n, _)| n.contains(&only)) {
            // t[on][0 fwd, 1 bwd, 2 both]
            let mut t: [[Vec<f64>; 3]; 2] = Default::default();
            for (hold, on) in &with {
                hold(*on);
            }
            for rep in 0..reps {
                // Alternate which side goes first, so neither always runs
                // after the other's step.
                for k in 0..2 {
                    let on = (rep + k) % 2 == 1;
                    set(on);
                    let [f, b] = step()?;
                    for (k, v) in [f, b, f + b].into_iter().enumerate() {
                        t[on as usize][k].push(v);
                    }
                }
            }
            set(true);
            cpu::reset_switches();
            cpu::set_profile(cpu::Profile::for_vendor(&cpu::cpu_vendor()));
            let m: [[f64; 3]; 2] =
                std::array::from_fn(|o| std::array::from_fn(|k| median(t[o][k].clone())));
            println!(
                "{n:>6} x {d:<6} {name:<20} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
                m[0][2] * 1e3,
                m[1][2] * 1e3,
                m[1][2] / m[0][2],
                m[1][0] / m[0][0],
                m[1][1] / m[0][1],
            );
        }
    }
    Ok(())
}
