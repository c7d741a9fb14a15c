//! The CUDA device: one context and stream per GPU, made on first use; the
//! kernel modules compiled for it (by NVRTC, per family, cached); cuBLAS;
//! copies between host and device; and a launch helper. It knows no ops.
//!
//! cudarc panics when a CUDA library is missing, so every entry point
//! checks for the library first and runs driver set-up under
//! `catch_unwind`: no panic crosses the public API.

use super::nvrtc;
use crate::dtype::Element;
use crate::error::{Error, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

/// What an element type needs to live on the GPU.
pub trait GpuElement: DeviceRepr + ValidAsZeroBits {}
impl<T: DeviceRepr + ValidAsZeroBits> GpuElement for T {}

/// One GPU: its context, the stream every op runs on, its architecture,
/// and what was compiled or made for it.
pub(crate) struct Gpu {
    pub(crate) ordinal: usize,
    pub(crate) stream: Arc<CudaStream>,
    /// `sm_XY` as XY.
    pub(crate) arch: u32,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    blas: OnceLock<std::result::Result<Arc<Mutex<CudaBlas>>, String>>,
}

fn unavailable(reason: String) -> Error {
    Error::CudaUnavailable { reason }
}

/// Runs driver code that may panic (a missing symbol) as a `Result`.
fn guarded<R>(what: &str, f: impl FnOnce() -> R) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        unavailable(format!("{what} failed: {msg}"))
    })
}

/// The driver library, checked once.
fn driver_present() -> Result<()> {
    static P: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to load the library by name.
    if *P.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() }) {
        // Before cudarc's first call: a stub would panic in it.
        super::driver_lib::driver().map_err(unavailable)
    } else {
        Err(unavailable(
            "the CUDA driver library (libcuda.so) was not found on the loader path: \
             no NVIDIA driver on this machine"
                .into(),
        ))
    }
}

fn make(ordinal: usize) -> Result<Gpu> {
    driver_present()?;
    let n = guarded("cuDeviceGetCount", CudaContext::device_count)?
        .map_err(|e| unavailable(format!("the CUDA driver could not count devices: {e}")))?;
    if ordinal >= n.max(0) as usize {
        return Err(unavailable(format!(
            "cuda:{ordinal} requested, but the driver reports {n} device(s)"
        )));
    }
    let ctx = guarded("cuCtxCreate", || CudaContext::new(ordinal))?
        .map_err(|e| unavailable(format!("cuda:{ordinal}: context creation failed: {e}")))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| unavailable(format!("cuda:{ordinal}: {e}")))?;
    nvrtc::available()?;
    // One stream per device orders every launch and free already; the
    // per-buffer events cudarc would record on each launch are not needed.
    // SAFETY: no other stream of this context touches our buffers.
    unsafe { ctx.disable_event_tracking() };
    Ok(Gpu {
        ordinal,
        stream: ctx.default_stream(),
        arch: (major * 10 + minor) as u32,
        modules: Mutex::new(HashMap::new()),
        blas: OnceLock::new(),
    })
}

/// The GPU `ordinal`, made on first use; `CudaUnavailable` with a sentence
/// naming what is missing when it cannot be used.
pub(crate) fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let map = GPUS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = m.get(&ordinal) {
        return Ok(g.clone());
    }
    let g = Arc::new(make(ordinal)?);
    m.insert(ordinal, g.clone());
    Ok(g)
}

impl Gpu {
    /// The device as a user names it.
    pub(crate) fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    /// A driver or library error as `Error::Cuda` for `op`.
    pub(crate) fn err(&self, op: &'static str, e: impl std::fmt::Display) -> Error {
        Error::Cuda {
            op,
            device: self.name(),
            msg: e.to_string(),
        }
    }

    /// Kernel `name_<dtype>` of `family`, compiling the family for this
    /// GPU's architecture on first use.
    pub(crate) fn function<T: Element>(
        &self,
        family: &'static str,
        name: &str,
    ) -> Result<CudaFunction> {
        self.function_named(family, &format!("{name}_{}", T::NAME))
    }

    /// Kernel `entry` of `family` (an exact entry-point name).
    pub(crate) fn function_named(&self, family: &'static str, entry: &str) -> Result<CudaFunction> {
        let module = {
            let mut m = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(family) {
                Some(md) => md.clone(),
                None => {
                    let src = nvrtc::FAMILIES
                        .iter()
                        .find(|(n, _)| *n == family)
                        .map(|(_, s)| *s)
                        .ok_or_else(|| self.err("kernel lookup", format!("no family {family}")))?;
                    let c = nvrtc::compile(family, src, self.arch)?;
                    let md = self
                        .stream
                        .context()
                        .load_module(Ptx::from_binary(c.cubin))
                        .map_err(|e| self.err("cuModuleLoadData", e))?;
                    m.insert(family, md.clone());
                    md
                }
            }
        };
        module
            .load_function(entry)
            .map_err(|e| self.err("cuModuleGetFunction", format!("{entry}: {e}")))
    }

    /// A zeroed buffer of `n` elements.
    pub(crate) fn zeros<T: GpuElement>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| self.err("cuMemAlloc", format!("{n} elements: {e}")))
    }

    /// An uninitialised buffer of `n` elements: every element must be
    /// written by the kernel that fills it before anything reads it.
    pub(crate) fn uninit<T: GpuElement>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: callers write every element before reading (see above).
        unsafe { self.stream.alloc::<T>(n.max(1)) }
            .map_err(|e| self.err("cuMemAlloc", format!("{n} elements: {e}")))
    }

    /// A copy of host data on this GPU.
    pub(crate) fn upload<T: GpuElement>(&self, src: &[T]) -> Result<CudaSlice<T>> {
        if src.is_empty() {
            return self.zeros(0);
        }
        self.stream
            .clone_htod(src)
            .map_err(|e| self.err("cuMemcpyHtoD", e))
    }

    /// The first `n` elements of `src` copied to the host (waits for the
    /// stream).
    pub(crate) fn download<T: GpuElement>(&self, src: &CudaSlice<T>, n: usize) -> Result<Vec<T>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut v = self
            .stream
            .clone_dtoh(src)
            .map_err(|e| self.err("cuMemcpyDtoH", e))?;
        v.truncate(n);
        Ok(v)
    }

    /// cuBLAS on this GPU's stream, made on first use.
    pub(crate) fn blas(&self) -> Result<Arc<Mutex<CudaBlas>>> {
        self.blas
            .get_or_init(|| {
                // SAFETY: only tries to load the library by name.
                if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                    return Err("cuBLAS (libcublas.so) was not found on the loader path".into());
                }
                super::driver_lib::cublas()?;
                match guarded("cublasCreate", || CudaBlas::new(self.stream.clone())) {
                    Ok(Ok(b)) => Ok(Arc::new(Mutex::new(b))),
                    Ok(Err(e)) => Err(format!("cublasCreate failed: {e}")),
                    Err(e) => Err(e.to_string()),
                }
            })
            .clone()
            .map_err(unavailable)
    }
}

/// A null device pointer, for optional kernel arguments.
pub(crate) const NULL: u64 = 0;

/// Launches `f` on `gpu`'s stream with `cfg` and the arguments in order
/// (buffers as `&slice`/`&mut slice`, scalars as `&value`), turning a
/// driver error into `Error::Cuda` for `op`.
macro_rules! launch {
    ($gpu:expr, $op:expr, $f:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        use cudarc::driver::PushKernelArg as _;
        let f = $f;
        // One expression, so temporaries among the arguments live through
        // the launch.
        // SAFETY: the arguments match the kernel's documented signature
        // (kernels/*.cu) in order and type, and every buffer holds the
        // elements the launch geometry reaches.
        let r = unsafe { $gpu.stream.launch_builder(&f)$(.arg($arg))*.launch($cfg) };
        r.map(|_| ()).map_err(|e| $gpu.err($op, e))
    }};
}
pub(crate) use launch;

/// Launch geometry: `grid` blocks of `block` threads, `smem` bytes of
/// dynamic shared memory.
pub(crate) fn cfg(grid: u32, block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.max(1), 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem,
    }
}

/// Blocks for a grid-stride loop over `n` items, `per_block` per block per
/// sweep, capped (the loop covers the rest).
pub(crate) fn blocks_for(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block.max(1)).clamp(1, 65_535 * 8) as u32
}

/// Maximum rank of a strided kernel's operands (`MAX_RANK` in
/// `kernels/common.cuh`).
pub(crate) const MAX_RANK: usize = 8;

/// `Strides` of `kernels/common.cuh`: the output's shape and, per
/// operand, the element stride of each output dimension (0 where the
/// operand broadcasts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Strides {
    pub(crate) rank: i32,
    pub(crate) shape: [i64; MAX_RANK],
    pub(crate) a: [i64; MAX_RANK],
    pub(crate) b: [i64; MAX_RANK],
}

// SAFETY: plain old data with C layout, matching the C struct field for
// field (int, then three arrays of long long; the padding agrees).
unsafe impl DeviceRepr for Strides {}

/// [`crate::shape::broadcast_strides`] as a kernel's fixed array.
fn broadcast_strides(shape: &[usize], out: &[usize]) -> [i64; MAX_RANK] {
    let mut st = [0i64; MAX_RANK];
    for (d, v) in crate::shape::broadcast_strides(shape, out)
        .into_iter()
        .enumerate()
    {
        st[d] = v as i64;
    }
    st
}

/// `Strides` for an output of shape `out` read from `a` and `b` with
/// broadcasting; `Err` past [`MAX_RANK`] dimensions.
pub(crate) fn strides(
    op: &'static str,
    out: &[usize],
    a: &[usize],
    b: &[usize],
) -> Result<Strides> {
    if out.len() > MAX_RANK {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "rank {} is above the CUDA kernels' limit of {MAX_RANK}",
                out.len()
            ),
        });
    }
    let mut s = Strides {
        rank: out.len() as i32,
        ..Default::default()
    };
    for (d, &n) in out.iter().enumerate() {
        s.shape[d] = n as i64;
    }
    s.a = broadcast_strides(a, out);
    s.b = broadcast_strides(b, out);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_strides_follow_numpy() {
        let s = strides("t", &[2, 3, 4], &[3, 1], &[2, 1, 4]).unwrap();
        assert_eq!(&s.a[..3], &[0, 1, 0]);
        assert_eq!(&s.b[..3], &[4, 0, 1]);
        assert!(strides("t", &[1; 9], &[1], &[1]).is_err());
    }

    #[test]
    fn a_missing_gpu_is_an_error_not_a_panic() {
        // On a machine without a driver or GPU this names what is missing;
        // on one with a GPU, cuda:999 does not exist.
        match gpu(999) {
            Err(Error::CudaUnavailable { reason }) => assert!(!reason.is_empty()),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("cuda:999 should not exist"),
        }
    }
}
