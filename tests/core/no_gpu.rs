//! Where no GPU can be used (no driver, no device, or a build without the
//! `cuda` feature), every CUDA entry point returns `Err(CudaUnavailable)`
//! with a sentence saying what is missing, and nothing panics, whatever the
//! device index. On a machine with a GPU those checks skip; under
//! `FUSEGRAD_REQUIRE_GPU=1` (set by `scripts/gpu-check.sh`) a GPU must be
//! usable, so a broken device cannot pass them as "unavailable". Host
//! allocations that cannot succeed are errors too (`ShapeTooLarge` /
//! `OutOfMemory`), never aborts. Each test runs in a process of its own
//! (`alone!`): the `cuda` group loads the driver's emulation for the whole
//! test binary.

use crate::common::alone;
use fusegrad::{ops, Device, Error, Tape, Tensor};

fn unavailable<T: std::fmt::Debug>(r: fusegrad::Result<T>) {
    match r {
        Err(Error::CudaUnavailable { reason }) => assert!(reason.contains("cuda"), "{reason}"),
        other => panic!("expected CudaUnavailable, got {other:?}"),
    }
}

/// Whether a GPU is usable here (then the unavailability checks skip).
/// Under `FUSEGRAD_REQUIRE_GPU=1` one must be: an unusable device fails.
fn gpu_present() -> bool {
    let r = Device::Cuda(0).ensure_available();
    if std::env::var("FUSEGRAD_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        if let Err(e) = &r {
            panic!("FUSEGRAD_REQUIRE_GPU=1, but cuda:0 cannot be used: {e}");
        }
    }
    if r.is_ok() {
        eprintln!("skipped: a GPU is present, so CUDA is not unavailable");
    }
    r.is_ok()
}

#[test]
fn every_cuda_entry_point_is_an_error() {
    alone!(every_cuda_entry_point_is_an_error);
    if gpu_present() {
        return;
    }
    let t = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    for n in [0, 1, 7, usize::MAX] {
        let dev = Device::Cuda(n);
        assert_eq!(dev.to_string(), format!("cuda:{n}"));
        unavailable(dev.ensure_available());
        unavailable(t.to_device(dev));
        // Empty and scalar tensors too.
        unavailable(Tensor::<f64>::zeros(&[0, 3]).unwrap().to_device(dev));
        unavailable(Tensor::scalar(1.0f32).to_device(dev));
    }
    // The CPU is always there, and moving to it is a no-op.
    assert!(Device::Cpu.ensure_available().is_ok());
    let c = t.to_device(Device::Cpu).unwrap();
    assert_eq!(c.as_slice().unwrap(), t.as_slice().unwrap());
    assert_eq!(Device::default(), Device::Cpu);
}

#[test]
fn ops_run_on_the_cpu_and_never_reach_for_a_gpu() {
    alone!(ops_run_on_the_cpu_and_never_reach_for_a_gpu);
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::from_vec(vec![2, 2], vec![1.0, 2.0, 3.0, 5.0]).unwrap());
    let y = ops::layer_norm(&x, None, None, 1e-5).unwrap();
    assert_eq!(y.value().device(), Device::Cpu);
    if !gpu_present() {
        unavailable(y.value().to_device(Device::Cuda(0)));
    }
}

#[test]
fn host_allocation_failures_are_errors() {
    alone!(host_allocation_failures_are_errors);
    // Too many bytes for any address space: refused by the allocator.
    assert!(matches!(
        Tensor::<f32>::full(&[1 << 56], 0.0),
        Err(Error::OutOfMemory { bytes, .. }) if bytes == 1 << 58
    ));
    // Overflowing sizes never reach the allocator.
    assert!(matches!(
        Tensor::<f32>::zeros(&[usize::MAX, usize::MAX]),
        Err(Error::ShapeTooLarge { .. })
    ));
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::<f32>::zeros(&[1]).unwrap());
    assert!(matches!(
        ops::broadcast_to(&x, &[1 << 40, 1 << 20]),
        Err(Error::OutOfMemory { .. })
    ));
}

#[test]
fn a_module_that_cannot_move_is_left_unchanged() {
    alone!(a_module_that_cannot_move_is_left_unchanged);
    use fusegrad::nn::{Linear, Parameters};
    if gpu_present() {
        return;
    }
    let mut m = Linear::<f32>::new(3, 2, &mut fusegrad::rng::Rng::new(1)).unwrap();
    let before: Vec<Vec<f32>> = m.params().iter().map(|p| p.to_vec().unwrap()).collect();
    unavailable(m.to_device(Device::Cuda(0)));
    let after: Vec<Vec<f32>> = m.params().iter().map(|p| p.to_vec().unwrap()).collect();
    assert_eq!(before, after);
    assert!(m.params().iter().all(|p| p.device() == Device::Cpu));
}
