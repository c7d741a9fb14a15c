//! `fusegrad bench --device cuda`: the fused LayerNorm and RMSNorm on a GPU
//! against a same-run device-to-device copy of the same bytes and against
//! the composed twin, timed with CUDA events (median of many reps after
//! warm-up).
//!
//! What a timed window holds: only the op's device work. Each rep queues
//! [`Spin`]'s kernel, then the start event, then builds the tape and
//! launches the op, then the stop event; the GPU spins while the host
//! works, so the start event fires after the host has queued everything.
//! A rep whose start event had already fired when the host finished is
//! counted as late (its window may hold host time), and the spin doubles.
//!
//! Inputs are drawn on the device (`kernels/bench.cu`, `fill_normal`),
//! once per shape and dtype, and shared by both norms.
//!
//! Minimal bytes per element: the forward reads `x` and writes `y`; the
//! backward reads `x` and `dy` and writes `dx` (gamma, beta and their
//! gradients are rows of `D`, counted too). The copy moves a buffer of half
//! those bytes (it reads it and writes another), so a fraction of 1.0 means
//! the op ran at the copy's rate.

use crate::device::cuda::{self, blocks_for, cfg, launch, Gpu};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops;
use crate::tape::Tape;
use crate::tape::Var;
use crate::tensor::Tensor;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice};
use std::sync::Arc;

/// This family's CUDA C (`kernels/bench.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "bench",
    source: include_str!("../../kernels/bench.cu"),
};

/// The shapes the GPU bench times (`docs/gpu.md`).
pub const CUDA_SHAPES: [(usize, usize); 5] = [
    (32768, 4096),
    (8192, 8192),
    (16384, 1024),
    (4096, 768),
    (2048, 65536),
];

/// Reps per timed figure unless told otherwise.
pub const CUDA_REPS: usize = 20;

/// What a timed window holds, for the bench's header line.
pub const CUDA_WINDOW: &str = "the op's device work only: a spin kernel queued ahead of \
     the start event keeps the GPU busy while the host builds the tape and launches the op";

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
    /// Timed reps (over all five figures) whose start event had fired
    /// before the host finished queueing: their windows may hold host time.
    pub late_reps: usize,
}

/// `v` with `prec` decimals, or `null`: JSON has no NaN or infinity.
fn num(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        "null".into()
    }
}

/// `s` as a JSON string (quotes, backslashes and control characters
/// escaped).
fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

impl CudaRow {
    /// Fraction of the same-run copy rate, forward and backward.
    pub fn fractions(&self) -> (f64, f64) {
        (
            self.copy_fwd_us / self.fwd_us,
            self.copy_bwd_us / self.bwd_us,
        )
    }

    /// One JSON object on one line (a row of the bench's JSON Lines).
    pub fn json(&self) -> String {
        let (ff, fb) = self.fractions();
        format!(
            "{{\"op\":{},\"dtype\":{},\"n\":{},\"d\":{},\"fwd_us\":{},\"bwd_us\":{},\
             \"copy_fwd_us\":{},\"copy_bwd_us\":{},\"fwd_gbs\":{},\"bwd_gbs\":{},\
             \"fwd_of_copy\":{},\"bwd_of_copy\":{},\"composed_us\":{},\"late_reps\":{}}}",
            json_str(self.op),
            json_str(self.dtype),
            self.n,
            self.d,
            num(self.fwd_us, 2),
            num(self.bwd_us, 2),
            num(self.copy_fwd_us, 2),
            num(self.copy_bwd_us, 2),
            num(self.fwd_gbs, 1),
            num(self.bwd_gbs, 1),
            num(ff, 3),
            num(fb, 3),
            num(self.composed_us, 2),
            self.late_reps
        )
    }
}

/// The first line of the bench's JSON Lines: the device and what a
/// window holds (no "op" key, so readers of rows can skip it).
pub fn cuda_json_header(reps: usize) -> Result<String> {
    Ok(format!(
        "{{\"device\":{},\"name\":{},\"window\":{},\"reps\":{reps}}}",
        json_str("cuda:0"),
        json_str(&cuda_device_name()?),
        json_str(CUDA_WINDOW)
    ))
}

/// The driver's name for cuda:0.
pub fn cuda_device_name() -> Result<String> {
    let gpu = cuda::gpu(0)?;
    gpu.stream
        .context()
        .name()
        .map_err(|e| gpu.err("cuDeviceGetName", e))
}

/// Header of [`CudaRow`]'s table line.
pub const CUDA_HEADER: &str = "op          dtype  N x D           fwd us  (of copy)   bwd us  (of copy)  fwd GB/s  bwd GB/s  composed us  speed-up  late";

impl std::fmt::Display for CudaRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ff, fb) = self.fractions();
        write!(
            f,
            "{:<11} {:<6} {:<14} {:>8.1}  ({:>5.2})  {:>8.1}  ({:>5.2})  {:>8.0}  {:>8.0}  {:>11.1}  {:>7.2}x  {:>4}",
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
            self.composed_us / (self.fwd_us + self.bwd_us),
            self.late_reps
        )
    }
}

/// Writes standard normals into `out[..n]`, element `i` a function of
/// `(seed, offset + i)` alone (`fill_normal` in `kernels/bench.cu`).
fn fill_normal<T: Element>(
    gpu: &Gpu,
    out: &mut CudaSlice<T>,
    n: usize,
    seed: u64,
    offset: u64,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    launch!(gpu, "fill_normal", gpu.function::<T>(&KERNELS, "fill_normal")?,
        cfg(blocks_for(n, 256), 256, 0);
        out, &(n as i64), &seed, &offset)
}

/// A tensor of `shape` on `cuda:ordinal` filled with standard normals drawn
/// on the device: element `i` (row-major) depends on `(seed, offset + i)`
/// alone, so equal arguments give equal bits.
pub fn cuda_normal<T: Element>(
    ordinal: usize,
    shape: &[usize],
    seed: u64,
    offset: u64,
) -> Result<Tensor<T>> {
    let gpu = cuda::gpu(ordinal)?;
    let n: usize = shape.iter().product();
    let mut data = gpu.uninit::<T>(n)?;
    fill_normal(&gpu, &mut data, n, seed, offset)?;
    Tensor::from_cuda(shape, gpu, data)
}

/// Keeps the GPU busy ahead of a window's start event (`bench_spin`), for
/// at least as many cycles as the host has needed so far to queue an op.
struct Spin {
    gpu: Arc<Gpu>,
    f: CudaFunction,
    cycles: i64,
}

impl Spin {
    /// Cycles of the first spin: enough for a fused op's few launches; a
    /// late rep doubles it.
    const START: i64 = 400_000;
    /// The longest spin: host work slower than this is reported as late
    /// rather than waited out.
    const MAX: i64 = 1 << 26;

    fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Spin {
            gpu: gpu.clone(),
            f: gpu.function_named(&KERNELS, "bench_spin")?,
            cycles: Self::START,
        })
    }

    fn launch(&self) -> Result<()> {
        let g = &self.gpu;
        launch!(g, "bench_spin", &self.f, cfg(1, 1, 0); &self.cycles)
    }

    /// The start event fired before the host finished: spin longer.
    fn was_late(&mut self) {
        self.cycles = (self.cycles * 2).min(Self::MAX);
    }
}

/// Times windows on one GPU: two events reused by every rep, and the spin.
struct Timer {
    gpu: Arc<Gpu>,
    spin: Spin,
    start: CudaEvent,
    stop: CudaEvent,
    /// Late timed reps since the last [`Timer::take_late`].
    late: usize,
}

impl Timer {
    fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        // Timing calls the event entry points, which `gpu` did not check.
        crate::device::driver_lib::driver_events()
            .map_err(|reason| crate::error::Error::CudaUnavailable { reason })?;
        let ctx = gpu.stream.context();
        let ev = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| gpu.err("cuEventCreate", e))
        };
        Ok(Timer {
            gpu: gpu.clone(),
            spin: Spin::new(gpu)?,
            start: ev()?,
            stop: ev()?,
            late: 0,
        })
    }

    /// One window around `f(s)`: spin, start event, `f`, stop event.
    /// Returns the window in µs and whether the start event had fired
    /// before the stop event was queued.
    fn window<S>(&mut self, s: S, f: &mut impl FnMut(S) -> Result<()>) -> Result<(f64, bool)> {
        let g = &self.gpu;
        self.spin.launch()?;
        self.start
            .record(&g.stream)
            .map_err(|e| g.err("cuEventRecord", e))?;
        f(s)?;
        self.stop
            .record(&g.stream)
            .map_err(|e| g.err("cuEventRecord", e))?;
        let late = self
            .start
            .try_is_complete()
            .map_err(|e| g.err("cuEventQuery", e))?;
        if late {
            self.spin.was_late();
        }
        self.stop
            .synchronize()
            .map_err(|e| g.err("cuEventSynchronize", e))?;
        let ms = self
            .start
            .elapsed_ms(&self.stop)
            .map_err(|e| g.err("cuEventElapsedTime", e))?;
        Ok((ms as f64 * 1e3, late))
    }

    /// Median time (µs) of `f` over `reps` windows after at least `warm`
    /// untimed ones; `setup` runs before each spin (its launches queue
    /// ahead of the window, so they are not timed). Warm-up goes on, a few
    /// reps at most, while the spin is still growing to cover the host.
    fn median_after<S>(
        &mut self,
        warm: usize,
        reps: usize,
        mut setup: impl FnMut() -> Result<S>,
        mut f: impl FnMut(S) -> Result<()>,
    ) -> Result<f64> {
        const EXTRA_WARM: usize = 4;
        for w in 0.. {
            let (_, late) = self.window(setup()?, &mut f)?;
            if w + 1 >= warm && (!late || w + 1 >= warm + EXTRA_WARM) {
                break;
            }
        }
        let mut t = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let (us, late) = self.window(setup()?, &mut f)?;
            self.late += late as usize;
            t.push(us);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    }

    /// [`Timer::median_after`] with nothing before the spin.
    fn median(
        &mut self,
        warm: usize,
        reps: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        self.median_after(warm, reps, || Ok(()), |()| f())
    }

    fn take_late(&mut self) -> usize {
        std::mem::take(&mut self.late)
    }
}

/// A shape's inputs on cuda:0, drawn once and shared by both norms and
/// every rep: `x` and the cotangent `dy` (`[n, d]`), gamma and beta
/// (`[d]`), and the copy's source and destination.
pub struct CudaInputs<T: Element> {
    gpu: Arc<Gpu>,
    n: usize,
    d: usize,
    x: Tensor<T>,
    dy: Tensor<T>,
    g: Tensor<T>,
    b: Tensor<T>,
    copy_src: CudaSlice<T>,
    copy_dst: CudaSlice<T>,
}

impl<T: Element> CudaInputs<T> {
    /// Standard normals from one stream of `seed`: x, dy, gamma and beta
    /// at consecutive offsets, so no two share a value.
    pub fn new(n: usize, d: usize, seed: u64) -> Result<Self> {
        let gpu = cuda::gpu(0)?;
        let nd = n.checked_mul(d).ok_or_else(|| Error::InvalidArgument {
            op: "bench",
            msg: format!("{n}x{d} has more elements than usize holds"),
        })?;
        let (nd64, d64) = (nd as u64, d as u64);
        let x = cuda_normal(0, &[n, d], seed, 0)?;
        let dy = cuda_normal(0, &[n, d], seed, nd64)?;
        let g = cuda_normal(0, &[d], seed, 2 * nd64)?;
        let b = cuda_normal(0, &[d], seed, 2 * nd64 + d64)?;
        // The largest copy: LayerNorm's backward bytes, halved.
        let elems = copy_elems(n, d, false).1;
        let copy_src = gpu.zeros::<T>(elems)?;
        let copy_dst = gpu.zeros::<T>(elems)?;
        Ok(CudaInputs {
            gpu,
            n,
            d,
            x,
            dy,
            g,
            b,
            copy_src,
            copy_dst,
        })
    }
}

/// Minimal bytes of the forward and the backward, in elements.
fn minimal_elems(n: usize, d: usize, rms: bool) -> (usize, usize) {
    let rows = if rms { 2 } else { 3 };
    (2 * n * d + rows * d, 3 * n * d + (rows + 1) * d)
}

/// Elements the same-run copies move, forward and backward: half the
/// minimal bytes each (the copy reads them and writes as many).
fn copy_elems(n: usize, d: usize, rms: bool) -> (usize, usize) {
    let (f, b) = minimal_elems(n, d, rms);
    (f / 2, b / 2)
}

/// One row: `rms` picks RMSNorm.
pub fn measure_cuda<T: Element>(
    inputs: &mut CudaInputs<T>,
    rms: bool,
    reps: usize,
) -> Result<CudaRow> {
    let mut timer = Timer::new(&inputs.gpu)?;
    measure_with(&mut timer, inputs, rms, reps)
}

fn measure_with<T: Element>(
    timer: &mut Timer,
    inputs: &mut CudaInputs<T>,
    rms: bool,
    reps: usize,
) -> Result<CudaRow> {
    let (n, d) = (inputs.n, inputs.d);
    timer.take_late();
    let forward = |composed: bool| -> Result<(Tape<T>, Var<T>)> {
        let tape = Tape::new();
        let (xv, gv, bv) = (
            tape.var(inputs.x.clone()),
            tape.var(inputs.g.clone()),
            tape.var(inputs.b.clone()),
        );
        let y = match (rms, composed) {
            (false, false) => ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5)?,
            (false, true) => ops::layer_norm_composed(&xv, Some(&gv), Some(&bv), 1e-5)?,
            (true, false) => ops::rms_norm(&xv, Some(&gv), 1e-6)?,
            (true, true) => ops::rms_norm_composed(&xv, Some(&gv), 1e-6)?,
        };
        Ok((tape, y))
    };
    let dy = &inputs.dy;
    let fwd = timer.median(3, reps, || forward(false).map(|_| ()))?;
    let bwd = timer.median_after(
        3,
        reps,
        || forward(false),
        |(_t, y)| y.backward_with(dy).map(|_| ()),
    )?;
    let composed = timer.median(2, reps.div_ceil(2), || {
        forward(true)?.1.backward_with(dy).map(|_| ())
    })?;
    let (cf, cb) = copy_elems(n, d, rms);
    let gpu = inputs.gpu.clone();
    let (src, dst) = (&inputs.copy_src, &mut inputs.copy_dst);
    let mut copy = |elems: usize| {
        timer.median(3, reps, || {
            gpu.stream
                .memcpy_dtod(&src.slice(..elems), &mut dst.slice_mut(..elems))
                .map_err(|e| gpu.err("cuMemcpyDtoD", e))
        })
    };
    let copy_fwd = copy(cf)?;
    let copy_bwd = copy(cb)?;
    let size = std::mem::size_of::<T>();
    let (ef, eb) = minimal_elems(n, d, rms);
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
        fwd_gbs: (ef * size) as f64 / fwd / 1e3,
        bwd_gbs: (eb * size) as f64 / bwd / 1e3,
        late_reps: timer.take_late(),
    })
}

/// Per shape of `shapes`, f32 then bf16, LayerNorm then RMSNorm: one row
/// each, handed to `emit` as soon as it is measured (so a run cut short
/// has printed every row it finished).
pub fn run_cuda(
    shapes: &[(usize, usize)],
    reps: usize,
    mut emit: impl FnMut(&CudaRow) -> Result<()>,
) -> Result<()> {
    let gpu = cuda::gpu(0)?;
    let mut timer = Timer::new(&gpu)?;
    for (k, &(n, d)) in shapes.iter().enumerate() {
        let seed = 7 + k as u64;
        shape_rows::<f32>(&mut timer, n, d, seed, reps, &mut emit)?;
        shape_rows::<half::bf16>(&mut timer, n, d, seed, reps, &mut emit)?;
    }
    Ok(())
}

/// Both norms at one shape and dtype; the inputs are freed before the
/// next dtype's are drawn.
fn shape_rows<T: Element>(
    timer: &mut Timer,
    n: usize,
    d: usize,
    seed: u64,
    reps: usize,
    emit: &mut impl FnMut(&CudaRow) -> Result<()>,
) -> Result<()> {
    let mut inputs = CudaInputs::<T>::new(n, d, seed)?;
    for rms in [false, true] {
        emit(&measure_with(timer, &mut inputs, rms, reps)?)?;
    }
    Ok(())
}
