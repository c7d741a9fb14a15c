//! NCCL (`fusegrad::dist::Nccl`) over a world of one rank. Everywhere: a
//! CPU device and a missing NCCL are errors that say so. Where a GPU and
//! NCCL are present: a sum gives its input back, and data parallelism over
//! NCCL gives the sweep's own gradients bit for bit. NCCL drives the GPU
//! itself, so on the driver's emulation that part says it was not run.

#![cfg(feature = "cuda")]

use crate::cuda_emu::{emulated, gpu};
use fusegrad::dist::{nccl_version, Collective, DataParallel, Flat, Nccl, Single};
use fusegrad::nn::{Mlp, MlpConfig, Module, Parameters};
use fusegrad::rng::Rng;
use fusegrad::{ops, Device, Error, Tape, Tensor};
use std::time::Duration;

fn over(device: Device) -> fusegrad::Result<Nccl> {
    Nccl::over(Box::new(Single::new()), device, Duration::from_secs(20))
}

#[test]
fn nccl_on_one_rank_sums_on_the_gpu_or_says_why_not() {
    match over(Device::Cpu) {
        Err(e @ Error::Collective { .. }) => {
            assert!(e.to_string().contains("this rank's device is cpu"), "{e}")
        }
        other => panic!("{:?}", other.err()),
    }
    let Some(dev) = gpu() else { return };
    if let Err(why) = nccl_version() {
        match over(dev) {
            Err(e @ Error::Collective { .. }) => {
                let s = e.to_string();
                assert!(s.contains("rank 0") && s.contains("NCCL"), "{s}");
            }
            other => panic!("no NCCL ({why}), yet {:?}", other.err()),
        }
        eprintln!("not run: the sums on the GPU, since {why}");
        return;
    }
    if emulated() {
        eprintln!("not run: NCCL is loadable, but this is the driver's emulation");
        return;
    }
    eprintln!("{}", nccl_version().unwrap());
    let mut c = over(dev).unwrap();
    let a = Flat::F32((0..1000).map(|i| i as f32 * 0.5 - 3.0).collect());
    let b = Flat::F64((0..77).map(|i| (i as f64).sin()).collect());
    let (ta, tb) = (
        c.start_sum(a.clone()).unwrap(),
        c.start_sum(b.clone()).unwrap(),
    );
    let te = c.start_sum(Flat::F32(Vec::new())).unwrap();
    assert_eq!(c.finish(tb).unwrap(), b);
    assert_eq!(c.finish(ta).unwrap(), a);
    assert!(c.finish(te).unwrap().is_empty());
    // The model on the GPU, its buckets summed by NCCL.
    let mut m: Mlp<f32> =
        Mlp::new(&[6, 24, 24, 5], &MlpConfig::default(), &mut Rng::new(3)).unwrap();
    m.to_device(dev).unwrap();
    let mut r = Rng::new(9);
    let mut data = |n: usize| {
        let v: Vec<f32> = (0..n * 8).map(|_| r.normal() as f32).collect();
        Tensor::from_vec(vec![8, n], v)
            .unwrap()
            .to_device(dev)
            .unwrap()
    };
    let (x, y) = (data(6), data(5));
    let run = |dp: Option<&mut DataParallel<Nccl>>| {
        let tape = Tape::new();
        let p = m.bind(&tape);
        let out = m.forward(&p, &tape.constant(x.clone())).unwrap();
        let l = ops::mse(&out, &tape.constant(y.clone())).unwrap();
        let g = match dp {
            Some(dp) => dp.backward(&l, &p).unwrap(),
            None => p.grads(&l.backward().unwrap()).unwrap(),
        };
        g.iter()
            .map(|t| t.to_vec().unwrap())
            .collect::<Vec<Vec<f32>>>()
    };
    let mut dp = DataParallel::new(c).bucket_mb(0.001).unwrap();
    let want = run(None);
    let got = run(Some(&mut dp));
    assert_eq!(got.len(), m.params().len());
    for (g, w) in got.iter().zip(&want) {
        let (g, w): (Vec<u32>, Vec<u32>) = (
            g.iter().map(|v| v.to_bits()).collect(),
            w.iter().map(|v| v.to_bits()).collect(),
        );
        assert_eq!(g, w);
    }
    assert!(dp.stats().buckets > 1);
}
