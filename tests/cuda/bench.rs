//! The CUDA benchmark behind `fusegrad bench --device cuda` (the library's
//! `probes::cuda_bench`, feature `probes`), on the device (real or the
//! emulation of `tests/cuda_emu`).

use crate::cuda_emu::gpu;

/// `fusegrad bench --device cuda` on small shapes: every figure is a
/// positive time or rate, and each row's JSON line parses with every key
/// and a finite value (on the emulation the times are CPU times, and only
/// the bench's own code is checked, not its figures).
#[test]
fn the_cuda_bench_measures_every_figure() {
    use fusegrad::probes::cuda_bench::{cuda_json_header, measure_cuda, CudaInputs};
    if gpu().is_none() {
        return;
    }
    let mut a = CudaInputs::<f32>::new(16, 256, 7).unwrap();
    let mut b = CudaInputs::<half::bf16>::new(8, 130, 8).unwrap();
    let rows = [
        measure_cuda(&mut a, false, 2).unwrap(),
        measure_cuda(&mut a, true, 2).unwrap(),
        measure_cuda(&mut b, true, 2).unwrap(),
    ];
    for r in &rows {
        let figures = [
            r.fwd_us,
            r.bwd_us,
            r.copy_fwd_us,
            r.copy_bwd_us,
            r.composed_us,
            r.fwd_gbs,
            r.bwd_gbs,
        ];
        assert!(figures.iter().all(|v| v.is_finite() && *v > 0.0), "{r:?}");
        let line = r.json();
        assert!(!line.contains('\n'), "one line: {line}");
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line} does not parse: {e}"));
        assert_eq!(v["op"], r.op, "{line}");
        assert_eq!(v["dtype"], r.dtype, "{line}");
        assert_eq!(v["n"], r.n, "{line}");
        assert_eq!(v["d"], r.d, "{line}");
        for key in [
            "fwd_us",
            "bwd_us",
            "copy_fwd_us",
            "copy_bwd_us",
            "fwd_gbs",
            "bwd_gbs",
            "fwd_of_copy",
            "bwd_of_copy",
            "composed_us",
            "late_reps",
        ] {
            let x = v[key].as_f64();
            assert!(x.is_some_and(f64::is_finite), "{key} in {line}");
        }
    }
    let head: serde_json::Value = serde_json::from_str(&cuda_json_header(2).unwrap()).unwrap();
    for key in ["device", "name", "window"] {
        assert!(head[key].is_string(), "{key} in {head}");
    }
    assert!(head.get("op").is_none(), "the header is not a row: {head}");
}

/// The bench's inputs drawn on the device: standard normals (mean near 0,
/// variance near 1, all finite), the same bits for the same seed and
/// offset, other values for another seed, and an offset continuing the
/// same stream.
#[test]
fn device_normals_are_standard_and_seeded() {
    use fusegrad::probes::cuda_bench::cuda_normal;
    if gpu().is_none() {
        return;
    }
    let n = 100_000;
    let v = cuda_normal::<f32>(0, &[n], 11, 0)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(v.len(), n);
    assert!(v.iter().all(|x| x.is_finite()), "a non-finite normal");
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n as f64;
    // Standard errors at n = 1e5: 0.0032 for the mean, 0.0045 for the
    // variance; the bounds are five of them.
    assert!(mean.abs() < 0.016, "mean {mean}");
    assert!((var - 1.0).abs() < 0.023, "variance {var}");
    let tail = v.iter().filter(|x| x.abs() > 3.0).count() as f64 / n as f64;
    assert!((tail - 0.0027).abs() < 0.001, "P(|z| > 3) = {tail}");

    let bits = |t: &[f32]| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let again = cuda_normal::<f32>(0, &[n], 11, 0)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(bits(&v), bits(&again), "same seed, different bits");
    let other = cuda_normal::<f32>(0, &[n], 12, 0)
        .unwrap()
        .to_vec()
        .unwrap();
    let same = v.iter().zip(&other).filter(|(a, b)| a == b).count();
    assert!(same < 10, "seeds 11 and 12 agree on {same} of {n}");
    let shifted = cuda_normal::<f32>(0, &[1000], 11, 500)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(bits(&shifted), bits(&v[500..1500]), "offset 500");

    let h = cuda_normal::<half::bf16>(0, &[3, 1000], 11, 0)
        .unwrap()
        .to_vec()
        .unwrap();
    for (a, b) in h.iter().zip(&v) {
        assert_eq!(
            *a,
            half::bf16::from_f32(*b),
            "bf16 is the f32 value rounded"
        );
    }
}
