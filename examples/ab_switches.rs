//! Interleaved A/B of the LayerNorm kernel switches, one shape at a time:
//! each rep times the fused forward and backward with a switch off, then
//! on, then a plain copy, so a slow spell on a shared machine hits both
//! sides alike. Prints medians and the on/off ratio of fwd+bwd time.
//!
//! ```sh
//! cargo run --release --example ab_switches -- [--reps R] [--shape NxD]...
//!     [--switch NAME]   # only the switches whose name contains NAME
//! ```
use fusegrad::device::cpu;
use fusegrad::ops;
use fusegrad::tape::Tape;
use fusegrad::tensor::Tensor;
use std::time::Instant;

type Switch = (&'static str, fn(bool));

const SWITCHES: [Switch; 4] = [
    ("lockstep rows", cpu::set_lockstep),
    ("runs of long rows", cpu::set_segmented),
    ("prefetch next row", cpu::set_prefetch_next),
    ("streaming stores", |on| {
        cpu::set_stream_threshold(if on {
            cpu::DEFAULT_STREAM_BYTES
        } else {
            usize::MAX
        })
    }),
];

fn secs(f: impl FnOnce()) -> f64 {
    let s = Instant::now();
    f();
    s.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> fusegrad::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut reps, mut shapes, mut only) = (15usize, Vec::new(), String::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().map(String::as_str).unwrap_or("");
        match a.as_str() {
            "--reps" => reps = v.parse().unwrap_or(reps),
            "--switch" => only = v.to_string(),
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
    println!("shape           switch               off ms    on ms   on/off");
    for (n, d) in shapes {
        let xs: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919) % 997) as f32 * 0.01)
            .collect();
        let dys: Vec<f32> = xs.iter().map(|v| 1.0 - v * 0.3).collect();
        let x = Tensor::from_vec(vec![n, d], xs)?;
        let dy = Tensor::from_vec(vec![n, d], dys)?;
        let g = Tensor::from_vec(vec![d], vec![1.5f32; d])?;
        let b = Tensor::from_vec(vec![d], vec![0.5f32; d])?;
        let step = || -> fusegrad::Result<()> {
            let tape = Tape::new();
            let (xv, gv, bv) = (
                tape.var(x.clone()),
                tape.var(g.clone()),
                tape.var(b.clone()),
            );
            let y = ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5)?;
            y.backward_with(&dy).map(|_| ())
        };
        for (name, set) in SWITCHES.into_iter().filter(|(n, _)| n.contains(&only)) {
            let mut t = [Vec::new(), Vec::new()];
            for _ in 0..reps {
                for on in [false, true] {
                    set(on);
                    let mut r = Ok(());
                    t[on as usize].push(secs(|| r = step()));
                    r?;
                }
            }
            set(true);
            let (off, on) = (median(t[0].clone()), median(t[1].clone()));
            println!(
                "{n:>6} x {d:<6} {name:<20} {:>8.3} {:>8.3} {:>8.3}",
                off * 1e3,
                on * 1e3,
                on / off
            );
        }
    }
    Ok(())
}
