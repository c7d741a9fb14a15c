//! `fusegrad bench --device cuda`: the fused LayerNorm and RMSNorm on a GPU
//! against a same-run device-to-device copy of the same bytes and against
//! the composed twin, timed with CUDA events (median of many reps after
//! warm-up).
//!
//! Minimal bytes per element: the forward reads `x` and writes `y`; the
//! backward reads `x` and `dy` and writes `dx` (gamma, beta and their
//! gradients are rows of `D`, counted too). The copy moves a buffer of half
//! those bytes (it reads it and writes another), so a fraction of 1.0 means
//! the op ran at the copy's rate.

use crate::device::cuda::{self, Gpu};
use crate::dtype::Element;
use crate::error::Result;
use crate::rng::Rng;
use crate::tape::Tape;
use crate::tape::Var;
use crate::tensor::Tensor;
use crate::{ops, Device};
use cudarc::driver::sys::CUevent_flags;

/// The shapes of the GPU targets (issue 32).
pub const CUDA_SHAPES: [(usize, usize); 5] = [
    (32768, 4096),
    (8192, 8192),
    (16384, 1024),
    (4096, 768),
    (2048, 65536),
];

/// One shape, one dtype, one norm.
#[derive(Clone, Debug)]
pub struct CudaRow {
    /// "layer_norm" or "rms_norm".
    pub op: &'static str,
    /// "f32", "bf16", ...
    pub dtype: &'static str,
    /// Rows.
    pub n: usize,
    /// Row length.
    pub d: usize,
    /// Median forward and backward times, microseconds.
    pub fwd_us: f64,
    /// See `fwd_us`.
    pub bwd_us: f64,
    /// Median time of a device-to-device copy of the forward's and the
    /// backward's minimal bytes, microseconds.
    pub copy_fwd_us: f64,
    /// See `copy_fwd_us`.
    pub copy_bwd_us: f64,
    /// Composed forward + backward on the same device, microseconds.
    pub composed_us: f64,
    /// Effective bandwidth over minimal bytes, GB/s.
    pub fwd_gbs: f64,
    /// See `fwd_gbs`.
    pub bwd_gbs: f64,
}

impl CudaRow {
    /// Fraction of the same-run copy rate, forward and backward.
    pub fn fractions(&self) -> (f64, f64) {
        (
            self.copy_fwd_us / self.fwd_us,
            self.copy_bwd_us / self.bwd_us,
        )
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        let (ff, fb) = self.fractions();
        format!(
            "{{\"op\":\"{}\",\"dtype\":\"{}\",\"n\":{},\"d\":{},\"fwd_us\":{:.2},\"bwd_us\":{:.2},\
             \"copy_fwd_us\":{:.2},\"copy_bwd_us\":{:.2},\"fwd_gbs\":{:.1},\"bwd_gbs\":{:.1},\
             \"fwd_of_copy\":{:.3},\"bwd_of_copy\":{:.3},\"composed_us\":{:.2}}}",
            self.op,
            self.dtype,
            self.n,
            self.d,
            self.fwd_us,
            self.bwd_us,
            self.copy_fwd_us,
            self.copy_bwd_us,
            self.fwd_gbs,
            self.bwd_gbs,
            ff,
            fb,
            self.composed_us
        )
    }
}

/// Header of [`CudaRow`]'s table line.
pub const CUDA_HEADER: &str = "op          dtype  N x D           fwd us  (of copy)   bwd us  (of copy)  fwd GB/s  bwd GB/s  composed us  speed-up";

impl std::fmt::Display for CudaRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ff, fb) = self.fractions();
        write!(
            f,
            "{:<11} {:<6} {:<14} {:>8.1}  ({:>5.2})  {:>8.1}  ({:>5.2})  {:>8.0}  {:>8.0}  {:>11.1}  {:>7.2}x",
            self.op,
            self.dtype,
            format!("{}x{}", self.n, self.d),
            self.fwd_us,
            ff,
            self.bwd_us,
            fb,
            self.fwd_gbs,
            self.bwd_gbs,
            self.composed_us,
            self.composed_us / (self.fwd_us + self.bwd_us)
        )
    }
}

/// Median time (µs) of `f` over `reps` runs after `warm`, each bracketed
/// by events on the GPU's stream; `setup` runs before the first event
/// (its launches queue ahead of it, so they are not timed).
fn timed_after<S>(
    gpu: &Gpu,
    warm: usize,
    reps: usize,
    mut setup: impl FnMut() -> Result<S>,
    mut f: impl FnMut(S) -> Result<()>,
) -> Result<f64> {
    let ctx = gpu.stream.context();
    let ev = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu.err("cuEventCreate", e))
    };
    for _ in 0..warm {
        f(setup()?)?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let s = setup()?;
        let (a, b) = (ev()?, ev()?);
        a.record(&gpu.stream)
            .map_err(|e| gpu.err("cuEventRecord", e))?;
        f(s)?;
        b.record(&gpu.stream)
            .map_err(|e| gpu.err("cuEventRecord", e))?;
        b.synchronize()
            .map_err(|e| gpu.err("cuEventSynchronize", e))?;
        t.push(
            a.elapsed_ms(&b)
                .map_err(|e| gpu.err("cuEventElapsedTime", e))? as f64
                * 1e3,
        );
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// [`timed_after`] with nothing before the first event.
fn timed(gpu: &Gpu, warm: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    timed_after(gpu, warm, reps, || Ok(()), |()| f())
}

fn random<T: Element>(rng: &mut Rng, shape: &[usize], dev: Device) -> Result<Tensor<T>> {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|_| T::from_f64(rng.normal())).collect();
    Tensor::from_vec(shape.to_vec(), v)?.to_device(dev)
}

/// Times a copy of `elems` elements of `T` from one device buffer to
/// another.
fn copy_time<T: Element>(gpu: &Gpu, elems: usize, reps: usize) -> Result<f64> {
    let src = gpu.zeros::<T>(elems)?;
    let mut dst = gpu.zeros::<T>(elems)?;
    timed(gpu, 3, reps, || {
        gpu.stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| gpu.err("cuMemcpyDtoD", e))
    })
}

/// One row: `rms` picks RMSNorm.
pub fn measure_cuda<T: Element>(n: usize, d: usize, rms: bool, reps: usize) -> Result<CudaRow> {
    let dev = Device::Cuda(0);
    let gpu = cuda::gpu(0)?;
    // Timing calls the event entry points, which `gpu` did not check.
    crate::device::driver_lib::driver_events()
        .map_err(|reason| crate::error::Error::CudaUnavailable { reason })?;
    let mut rng = Rng::new(7);
    let x = random::<T>(&mut rng, &[n, d], dev)?;
    let dy = random::<T>(&mut rng, &[n, d], dev)?;
    let g = random::<T>(&mut rng, &[d], dev)?;
    let b = random::<T>(&mut rng, &[d], dev)?;
    let size = std::mem::size_of::<T>();
    let nd = n * d;
    let forward = |composed: bool| -> Result<(Tape<T>, Var<T>)> {
        let tape = Tape::new();
        let (xv, gv, bv) = (
            tape.var(x.clone()),
            tape.var(g.clone()),
            tape.var(b.clone()),
        );
        let y = match (rms, composed) {
            (false, false) => ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5)?,
            (false, true) => ops::layer_norm_composed(&xv, Some(&gv), Some(&bv), 1e-5)?,
            (true, false) => ops::rms_norm(&xv, Some(&gv), 1e-6)?,
            (true, true) => ops::rms_norm_composed(&xv, Some(&gv), 1e-6)?,
        };
        Ok((tape, y))
    };
    let fwd = timed(&gpu, 3, reps, || forward(false).map(|_| ()))?;
    let bwd = timed_after(
        &gpu,
        3,
        reps,
        || forward(false),
        |(_t, y)| y.backward_with(&dy).map(|_| ()),
    )?;
    let composed = timed(&gpu, 2, reps.div_ceil(2), || {
        forward(true)?.1.backward_with(&dy).map(|_| ())
    })?;
    let rows = if rms { 2 } else { 3 };
    let fwd_bytes = 2 * nd * size + rows * d * size;
    let bwd_bytes = 3 * nd * size + (rows + 1) * d * size;
    let copy_fwd = copy_time::<T>(&gpu, fwd_bytes / 2 / size, reps)?;
    let copy_bwd = copy_time::<T>(&gpu, bwd_bytes / 2 / size, reps)?;
    Ok(CudaRow {
        op: if rms { "rms_norm" } else { "layer_norm" },
        dtype: T::NAME,
        n,
        d,
        fwd_us: fwd,
        bwd_us: bwd,
        copy_fwd_us: copy_fwd,
        copy_bwd_us: copy_bwd,
        composed_us: composed,
        fwd_gbs: fwd_bytes as f64 / fwd / 1e3,
        bwd_gbs: bwd_bytes as f64 / bwd / 1e3,
    })
}

/// Every shape of [`CUDA_SHAPES`], LayerNorm and RMSNorm, f32 and bf16.
pub fn run_cuda(reps: usize) -> Result<Vec<CudaRow>> {
    let mut rows = Vec::new();
    for &(n, d) in &CUDA_SHAPES {
        for rms in [false, true] {
            rows.push(measure_cuda::<f32>(n, d, rms, reps)?);
            rows.push(measure_cuda::<half::bf16>(n, d, rms, reps)?);
        }
    }
    Ok(rows)
}
