//! The CUDA device: one context and stream per GPU, made on first use; the
//! kernel modules and function handles for it (each family compiled by
//! NVRTC or read from the kernel cache once, each entry point looked up
//! once); cuBLAS; allocation; copies between host and device; and a launch
//! helper. It knows no ops.
//!
//! cudarc panics when a CUDA library is missing, so every entry point
//! checks for the library first and runs driver set-up under
//! `catch_unwind`: no panic crosses the public API.

use super::kernel_cache::{self, Lookup, Origin};
use super::nvrtc::Family;
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
    /// The device's name, as the driver gives it.
    pub(crate) device_name: String,
    /// How device memory is allocated.
    pub(crate) alloc: Alloc,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Families loaded from PTX, with the driver's reason for refusing
    /// their CUBIN.
    from_ptx: Mutex<Vec<(&'static str, String)>>,
    /// Entry points by name (names are unique across families).
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Host buffers whose upload may still be in flight, with their bytes:
    /// kept until the stream is next synchronized.
    staged: Mutex<(Vec<Box<dyn std::any::Any + Send>>, usize)>,
    blas: OnceLock<std::result::Result<Arc<Mutex<CudaBlas>>, String>>,
}

/// How a GPU's memory is allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Alloc {
    /// Stream-ordered pools (`cuMemAllocAsync`/`cuMemFreeAsync`).
    Pools,
    /// `cuMemAlloc`: the device has no memory pools.
    Plain,
    /// `cuMemAlloc`: the device claims pools, but a pool allocation failed
    /// with this error.
    PoolsFailed(String),
}

impl std::fmt::Display for Alloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Alloc::Pools => write!(f, "stream-ordered pools (cuMemAllocAsync)"),
            Alloc::Plain => write!(f, "cuMemAlloc (the device has no memory pools)"),
            Alloc::PoolsFailed(e) => write!(f, "cuMemAlloc (memory pools failed: {e})"),
        }
    }
}

/// Staged upload bytes past which the stream is synchronized and the
/// host buffers released, so staging stays bounded between downloads.
const STAGED_LIMIT: usize = 256 << 20;

/// Tries one pool allocation on `stream` (whose context claims pools).
fn probe_pools(stream: &Arc<CudaStream>) -> Alloc {
    // SAFETY: the buffer is never read; it is freed at once.
    match guarded("cuMemAllocAsync", || unsafe { stream.alloc::<u8>(256) }) {
        Ok(Ok(b)) => {
            drop(b);
            match stream.synchronize() {
                Ok(()) => Alloc::Pools,
                Err(e) => Alloc::PoolsFailed(format!("cuMemFreeAsync: {e}")),
            }
        }
        Ok(Err(e)) => Alloc::PoolsFailed(e.to_string()),
        Err(e) => Alloc::PoolsFailed(e.to_string()),
    }
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

/// The number of GPUs the driver reports.
pub(crate) fn count() -> Result<usize> {
    driver_present()?;
    let n = guarded("cuDeviceGetCount", CudaContext::device_count)?
        .map_err(|e| unavailable(format!("the CUDA driver could not count devices: {e}")))?;
    Ok(n.max(0) as usize)
}

fn make(ordinal: usize) -> Result<Gpu> {
    let n = count()?;
    if ordinal >= n {
        return Err(unavailable(format!(
            "cuda:{ordinal} requested, but the driver reports {n} device(s)"
        )));
    }
    let ctx = guarded("cuCtxCreate", || CudaContext::new(ordinal))?
        .map_err(|e| unavailable(format!("cuda:{ordinal}: context creation failed: {e}")))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| unavailable(format!("cuda:{ordinal}: {e}")))?;
    // One stream per device orders every launch and free already; the
    // per-buffer events cudarc would record on each launch are not needed.
    // SAFETY: no other stream of this context touches our buffers.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    let alloc = if ctx.has_async_alloc() {
        probe_pools(&stream)
    } else {
        Alloc::Plain
    };
    Ok(Gpu {
        ordinal,
        device_name: ctx.name().unwrap_or_else(|e| format!("(unnamed: {e})")),
        stream,
        arch: (major * 10 + minor) as u32,
        alloc,
        modules: Mutex::new(HashMap::new()),
        from_ptx: Mutex::new(Vec::new()),
        functions: Mutex::new(HashMap::new()),
        staged: Mutex::new((Vec::new(), 0)),
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
        family: &'static Family,
        name: &str,
    ) -> Result<CudaFunction> {
        self.function_named(family, &format!("{name}_{}", T::NAME))
    }

    /// Kernel `entry` of `family` (an exact entry-point name), looked up
    /// once per device.
    pub(crate) fn function_named(
        &self,
        family: &'static Family,
        entry: &str,
    ) -> Result<CudaFunction> {
        let lock = || self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = lock().get(entry) {
            return Ok(f.clone());
        }
        let f = self
            .module(family)?
            .load_function(entry)
            .map_err(|e| self.err("cuModuleGetFunction", format!("{entry}: {e}")))?;
        lock().insert(entry.to_string(), f.clone());
        Ok(f)
    }

    /// Family `family`'s module, loaded once per device: the CUBIN from
    /// the kernel cache (or compiled); where the driver refuses it, the PTX
    /// of the same compile; where that is refused too, compiled again here.
    fn module(&self, family: &'static Family) -> Result<Arc<CudaModule>> {
        let mut m = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(md) = m.get(family.name) {
            return Ok(md.clone());
        }
        let (src, name) = (family.source, family.name);
        let ctx = self.stream.context();
        let (c, origin) = kernel_cache::family_code(name, src, self.arch, None, Lookup::Any)?;
        // The CUBIN, else the PTX of the same compile (text ending in a NUL,
        // as the driver reads it); each refusal is kept for the message.
        let try_load = |code: kernel_cache::Compiled, refused: &mut Vec<String>| {
            match ctx.load_module(Ptx::from_binary(code.cubin)) {
                Ok(md) => return Some((md, false)),
                Err(e) => refused.push(format!("its CUBIN ({e})")),
            }
            if code.ptx.is_empty() {
                return None;
            }
            match ctx.load_module(Ptx::from_binary(code.ptx)) {
                Ok(md) => Some((md, true)),
                Err(e) => {
                    refused.push(format!("its PTX ({e})"));
                    None
                }
            }
        };
        let mut refused = Vec::new();
        let mut got = try_load(c, &mut refused);
        if got.is_none() && origin == Origin::Cache {
            let (fresh, _) = kernel_cache::family_code(name, src, self.arch, None, Lookup::Fresh)
                .map_err(|e| {
                self.err(
                    "cuModuleLoadData",
                    format!(
                        "{name}: the driver refused the cached {}, and it cannot be compiled \
                         again: {e}",
                        refused.join(" and ")
                    ),
                )
            })?;
            got = try_load(fresh, &mut refused);
        }
        let (md, ptx) = got.ok_or_else(|| {
            self.err(
                "cuModuleLoadData",
                format!("{name}: the driver refused {}", refused.join(", then ")),
            )
        })?;
        if ptx {
            let why = refused.first().cloned().unwrap_or_default();
            self.from_ptx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((name, why));
        }
        m.insert(name, md.clone());
        Ok(md)
    }

    /// Loads `family` on this device now (see [`Gpu::module`]).
    pub(crate) fn load_family(&self, family: &'static Family) -> Result<()> {
        self.module(family).map(|_| ())
    }

    /// The families this device runs from PTX, each with the driver's
    /// reason for refusing its CUBIN.
    pub(crate) fn ptx_families(&self) -> Vec<(&'static str, String)> {
        self.from_ptx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many families this device has loaded.
    pub(crate) fn families_loaded(&self) -> usize {
        self.modules.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A buffer of `n` elements, from the allocator in use (see [`Alloc`]).
    ///
    /// # Safety
    /// Its contents are undefined until written.
    unsafe fn alloc_raw<T: GpuElement>(&self, n: usize) -> Result<CudaSlice<T>> {
        let n = n.max(1);
        let err = |e: cudarc::driver::DriverError| {
            self.err("cuMemAlloc", format!("{n} elements ({}): {e}", self.alloc))
        };
        match self.alloc {
            // cudarc asks the driver whether pools exist and uses them if so.
            Alloc::Pools | Alloc::Plain => self.stream.alloc::<T>(n).map_err(err),
            Alloc::PoolsFailed(_) => {
                let bytes = n * std::mem::size_of::<T>();
                let p = cudarc::driver::result::malloc_sync(bytes).map_err(err)?;
                // cudarc frees it with cuMemFreeAsync, which also takes
                // cuMemAlloc memory (freed once the stream reaches it).
                Ok(self.stream.upgrade_device_ptr(p, n))
            }
        }
    }

    /// A zeroed buffer of `n` elements.
    pub(crate) fn zeros<T: GpuElement>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every byte is zeroed before the buffer is returned.
        let mut b = unsafe { self.alloc_raw::<T>(n) }?;
        self.stream
            .memset_zeros(&mut b)
            .map_err(|e| self.err("cuMemsetD8", format!("{n} elements: {e}")))?;
        Ok(b)
    }

    /// An uninitialised buffer of `n` elements: every element must be
    /// written by the kernel that fills it before anything reads it.
    pub(crate) fn uninit<T: GpuElement>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: callers write every element before reading (see above).
        unsafe { self.alloc_raw::<T>(n) }
    }

    /// A copy of host data on this GPU; returns once the copy is complete,
    /// so `src` may be dropped or changed at once.
    pub(crate) fn upload<T: GpuElement>(&self, src: &[T]) -> Result<CudaSlice<T>> {
        let d = self.upload_queued(src)?;
        self.synchronize()?;
        Ok(d)
    }

    /// A copy of `src` on this GPU, queued on the stream: `src` is kept
    /// alive until the stream is next synchronized, so the copy never
    /// reads a freed buffer and the caller never waits.
    pub(crate) fn upload_owned<T: GpuElement + Send + 'static>(
        &self,
        src: Vec<T>,
    ) -> Result<CudaSlice<T>> {
        let d = self.upload_queued(&src)?;
        let bytes = std::mem::size_of_val(src.as_slice());
        let over = {
            let mut st = self.staged.lock().unwrap_or_else(|e| e.into_inner());
            st.0.push(Box::new(src));
            st.1 += bytes;
            st.1 > STAGED_LIMIT
        };
        if over {
            self.synchronize()?;
        }
        Ok(d)
    }

    fn upload_queued<T: GpuElement>(&self, src: &[T]) -> Result<CudaSlice<T>> {
        // SAFETY: the copy below writes every element.
        let mut d = unsafe { self.alloc_raw::<T>(src.len()) }?;
        if !src.is_empty() {
            self.stream
                .memcpy_htod(src, &mut d)
                .map_err(|e| self.err("cuMemcpyHtoD", e))?;
        }
        Ok(d)
    }

    /// Waits for everything queued on the stream, then releases the host
    /// buffers whose uploads it held.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err("cuStreamSynchronize", e))?;
        let mut st = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        st.0.clear();
        st.1 = 0;
        Ok(())
    }

    /// The first `n` elements of `src` copied to the host; the stream is
    /// synchronized before the host reads them.
    pub(crate) fn download<T: GpuElement>(&self, src: &CudaSlice<T>, n: usize) -> Result<Vec<T>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut v = self
            .stream
            .clone_dtoh(src)
            .map_err(|e| self.err("cuMemcpyDtoH", e))?;
        self.synchronize()?;
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

/// The device address of an optional buffer, [`NULL`] when absent: how
/// kernels take optional inputs and outputs that are not wanted.
pub(crate) fn addr<T>(b: Option<&cudarc::driver::CudaSlice<T>>) -> u64 {
    use cudarc::driver::DevicePtr;
    match b {
        // The stream's event tracking is off (one stream per device), so
        // the guard returned with the address does nothing.
        Some(b) => b.device_ptr(b.stream()).0,
        None => NULL,
    }
}

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

/// [`crate::layout::broadcast_strides`] as a kernel's fixed array.
fn broadcast_strides(shape: &[usize], out: &[usize]) -> [i64; MAX_RANK] {
    let mut st = [0i64; MAX_RANK];
    for (d, v) in crate::layout::broadcast_strides(shape, out)
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

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        broadcast_strides_follow_numpy,
        a_missing_gpu_is_an_error_not_a_panic,
    ];

    fn broadcast_strides_follow_numpy() {
        let s = strides("t", &[2, 3, 4], &[3, 1], &[2, 1, 4]).unwrap();
        assert_eq!(&s.a[..3], &[0, 1, 0]);
        assert_eq!(&s.b[..3], &[4, 0, 1]);
        assert!(strides("t", &[1; 9], &[1], &[1]).is_err());
    }

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
