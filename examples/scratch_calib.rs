use fusegrad::analysis::*;
use fusegrad::rng::Rng;
fn main() {
    let iters: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(400);
    let mut rng = Rng::new(std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(7));
    let mut worst = [0.0f64; 6];
    let primes = [1usize, 2, 3, 5, 7, 13, 31, 127, 257, 509, 1021, 2039, 2048, 1024, 768, 64];
    let e64 = f64::EPSILON; let e32 = f32::EPSILON as f64;
    for it in 0..iters {
        let norm = if it % 2 == 0 { Norm::LayerNorm } else { Norm::RmsNorm };
        let d = if rng.uniform() < 0.5 { primes[rng.below(primes.len())] } else { 1 + rng.below(2048) };
        let n = rng.below(65);
        let scale = 10f64.powf(rng.range(-3.0, 6.0));
        let off64 = if rng.uniform() < 0.5 { 0.0 } else { 10f64.powf(rng.range(0.0, 8.0)) * if rng.uniform()<0.5 {-1.0} else {1.0} };
        let eps = 10f64.powf(rng.range(-12.0, -2.0));
        let mut c = Case { scale, offset: off64, eps, seed: it, ..Case::new(norm, &[n, d], &[d]) };
        let x = c.inputs::<f64>().unwrap()[0].to_f64_vec().unwrap();
        let k = condition(norm, &x, d, eps);
        let tag = format!("{} n={n} d={d} s={scale:.1e} o={off64:.1e} eps={eps:.0e} k={k:.1e}", norm.name());
        let cmp = fused_vs_composed::<f64>(&c).unwrap();
        let r = cmp.max() / (k * e64);
        if !(r <= worst[0]) { worst[0] = r; println!("f64 f-c: {tag} {cmp} ratio={r:.2}"); }
        if n * d <= 40000 {
            let fd = fd_error(&c, 8).unwrap();
            if !(fd.max_diff <= worst[1]) { worst[1] = fd.max_diff; println!("fd: {tag} numel={} fd={:.2e}", n*d, fd.max_diff); }
            let r = fd.max_diff / (k * e64).powf(2.0/3.0);
            if !(r <= worst[2]) { worst[2] = r; println!("fd ratio: {tag} fd={:.2e} ratio={r:.2}", fd.max_diff); }
        }
        c.offset = off64.signum() * off64.abs().min(1e4);
        let x = c.inputs::<f32>().unwrap()[0].to_f64_vec().unwrap();
        let k = condition(norm, &x, d, eps);
        let tag = format!("{} n={n} d={d} s={scale:.1e} o={:.1e} eps={eps:.0e} k={k:.1e}", norm.name(), c.offset);
        let cmp = fused_vs_composed::<f32>(&c).unwrap();
        let r = cmp.max() / (k * e32);
        if !(r <= worst[3]) { worst[3] = r; println!("f32 f-c: {tag} {cmp} ratio={r:.2}"); }
        let cmp = vs_f64::<f32>(&c).unwrap();
        let r = cmp.max() / (k * e32);
        if !(r <= worst[4]) { worst[4] = r; println!("f32 vs64: {tag} {cmp} ratio={r:.2}"); }
        }
    println!("WORST f64fc={:.2} fd={:.2e} fdratio={:.2} f32fc={:.2} f32vs64={:.2}", worst[0], worst[1], worst[2], worst[3], worst[4]);
}
