//! NCCL for GPU ranks: each bucket is summed on the GPU by NCCL, on a
//! stream of its own, with NCCL's unique id handed out over a bootstrap
//! collective (MPI across processes, [`super::Single`] alone).
//!
//! NCCL is loaded at run time, like the rest of CUDA. Its soname is
//! `libnccl.so.2`, which is not among the names cudarc's loader tries, so
//! the few entry points used here are looked up and called through their C
//! signatures (`nccl.h`, stable since NCCL 2.0).

use super::{Collective, Flat, Ticket};
use crate::device::cuda::{gpu, Gpu};
use crate::device::nvrtc::{search_folders, SearchEnv};
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

/// `ncclComm_t`.
type CommPtr = *mut c_void;
/// `ncclResult_t`: 0 is success, 7 `ncclInProgress`.
type Res = c_int;
const IN_PROGRESS: Res = 7;
/// `ncclDataType_t` of f32 and f64; `ncclRedOp_t` of a sum.
const NCCL_F32: c_int = 7;
const NCCL_F64: c_int = 8;
const NCCL_SUM: c_int = 0;

type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    CommPtr,
    *mut c_void,
) -> Res;

/// The loaded library and its entry points.
struct Api {
    path: String,
    version: c_int,
    unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    init_rank: unsafe extern "C" fn(*mut CommPtr, c_int, UniqueId, c_int) -> Res,
    all_reduce: AllReduce,
    abort: unsafe extern "C" fn(CommPtr) -> Res,
    destroy: unsafe extern "C" fn(CommPtr) -> Res,
    async_error: unsafe extern "C" fn(CommPtr, *mut Res) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    // Last: the pointers above live as long as it.
    _lib: libloading::Library,
}

/// NCCL's library file names, preferred first.
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where NCCL is looked for after the loader's own search: the folders
/// NVRTC is looked for in, and beside each of pip's `nvidia/*/lib`
/// folders among them every other `nvidia/*/lib` (PyTorch's wheels put
/// NCCL in `nvidia/nccl/lib`).
fn folders() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for f in search_folders(&SearchEnv::of_process()) {
        let nvidia = f.parent().and_then(Path::parent);
        if let Some(nvidia) = nvidia.filter(|n| n.ends_with("nvidia") && f.ends_with("lib")) {
            if let Ok(rd) = std::fs::read_dir(nvidia) {
                let mut libs: Vec<PathBuf> = rd
                    .filter_map(|e| Some(e.ok()?.path().join("lib")))
                    .collect();
                libs.sort();
                v.extend(libs);
            }
        }
        v.push(f);
    }
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
    v
}

/// Opens NCCL: `FUSEGRAD_NCCL` (a file or folder) when set, else by name
/// through the loader, else from [`folders`].
fn open() -> std::result::Result<(libloading::Library, String), String> {
    let by_path = |p: &Path| {
        // SAFETY: loading NCCL runs only its initialisers.
        unsafe { libloading::Library::new(p) }
            .map(|l| (l, p.display().to_string()))
            .map_err(|e| format!("cannot load NCCL from {}: {e}", p.display()))
    };
    if let Some(v) = std::env::var_os("FUSEGRAD_NCCL").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        let file = if p.is_dir() {
            NAMES.iter().map(|n| p.join(n)).find(|f| f.is_file())
        } else {
            Some(p.clone()).filter(|f| f.is_file())
        };
        return file
            .ok_or_else(|| format!("FUSEGRAD_NCCL={} holds no libnccl.so.2", p.display()))
            .and_then(|f| by_path(&f));
    }
    for n in NAMES {
        // SAFETY: as above, by name through the loader's search.
        if let Ok(l) = unsafe { libloading::Library::new(n) } {
            return Ok((l, n.to_string()));
        }
    }
    let searched = folders();
    match searched
        .iter()
        .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
        .find(|f| f.is_file())
    {
        Some(f) => by_path(&f),
        None => Err(format!(
            "NCCL (libnccl.so.2) was not found: not on the loader path by name, FUSEGRAD_NCCL \
             is unset, and none is in {} folders searched (pip's nvidia-nccl-cu13 or the \
             libnccl2 package installs it)",
            searched.len()
        )),
    }
}

fn load() -> std::result::Result<Api, String> {
    let (lib, path) = open()?;
    // SAFETY: each symbol is read with its signature in nccl.h; the
    // pointers are kept together with the library that holds them.
    unsafe {
        macro_rules! sym {
            ($name:literal) => {
                *lib.get($name).map_err(|_| {
                    format!(
                        "{path} lacks {} (not NCCL 2)",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        let get_version: unsafe extern "C" fn(*mut c_int) -> Res = sym!(b"ncclGetVersion\0");
        let mut version = 0;
        if get_version(&mut version) != 0 {
            return Err(format!("ncclGetVersion failed ({path})"));
        }
        Ok(Api {
            unique_id: sym!(b"ncclGetUniqueId\0"),
            init_rank: sym!(b"ncclCommInitRank\0"),
            all_reduce: sym!(b"ncclAllReduce\0"),
            abort: sym!(b"ncclCommAbort\0"),
            destroy: sym!(b"ncclCommDestroy\0"),
            async_error: sym!(b"ncclCommGetAsyncError\0"),
            error_string: sym!(b"ncclGetErrorString\0"),
            version,
            path,
            _lib: lib,
        })
    }
}

/// NCCL, loaded once per process.
fn api() -> std::result::Result<&'static Api, String> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// NCCL's version as `NCCL 2.27.3 (FILE)`, or why it cannot be loaded.
pub fn nccl_version() -> Result<String> {
    let a = api().map_err(|reason| Error::CudaUnavailable { reason })?;
    let v = a.version;
    let (major, minor, patch) = if v >= 10000 {
        (v / 10000, v / 100 % 100, v % 100)
    } else {
        (v / 1000, v / 100 % 10, v % 100)
    };
    Ok(format!("NCCL {major}.{minor}.{patch} ({})", a.path))
}

/// A bucket on the GPU and the host buffer it returns to.
enum Buf {
    /// Nothing to sum.
    Empty(Flat),
    F32(CudaSlice<f32>, Vec<f32>),
    F64(CudaSlice<f64>, Vec<f64>),
}

/// A sum queued on the NCCL stream: its buffers and the event after it.
struct InFlight {
    buf: Buf,
    done: Option<CudaEvent>,
}

/// NCCL across the GPUs of a job, one GPU per rank.
pub struct Nccl {
    boot: Box<dyn Collective>,
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
    comm: CommPtr,
    limit: Duration,
    started: Vec<Option<InFlight>>,
}

impl Nccl {
    /// NCCL over the ranks of `boot`, this rank on `device` (a GPU), each
    /// sum given up after `limit`. Every rank must call it. When any rank
    /// cannot load NCCL or its GPU, every rank returns an error naming it.
    pub fn over(mut boot: Box<dyn Collective>, device: Device, limit: Duration) -> Result<Nccl> {
        let (rank, world) = (boot.rank(), boot.world());
        let fail = |msg: String| Error::Collective {
            rank,
            world,
            op: "Nccl::over",
            msg,
        };
        // Every rank says whether it can go on before any waits on NCCL.
        let mut id = UniqueId { internal: [0; 128] };
        let ready = || -> std::result::Result<(&'static Api, Arc<Gpu>), String> {
            let Device::Cuda(ordinal) = device else {
                return Err(format!(
                    "NCCL sums on a GPU, and this rank's device is {device}"
                ));
            };
            let a = api()?;
            let g = gpu(ordinal).map_err(|e| e.to_string())?;
            Ok((a, g))
        };
        let mine = ready().and_then(|(a, g)| {
            if rank == 0 {
                g.stream
                    .context()
                    .bind_to_thread()
                    .map_err(|e| g.err("cuCtxSetCurrent", e).to_string())?;
                // SAFETY: the signature in nccl.h; writes the 128-byte id.
                let r = unsafe { (a.unique_id)(&mut id) };
                if r != 0 {
                    return Err(format!("ncclGetUniqueId failed: {}", error_text(a, r)));
                }
            }
            Ok((a, g))
        });
        let flags = boot.all_gather(mine.is_ok() as u64)?;
        let (a, g) = match mine {
            Err(why) => return Err(fail(why)),
            Ok(m) => m,
        };
        if let Some(r) = flags.iter().position(|&f| f == 0) {
            return Err(fail(format!(
                "rank {r} could not start NCCL (its own message says why)"
            )));
        }
        // Rank 0's id, eight bytes at a time.
        for chunk in id.internal.chunks_mut(8) {
            let mut w = [0u8; 8];
            for (b, c) in w.iter_mut().zip(chunk.iter()) {
                *b = *c as u8;
            }
            let w = boot.all_gather(u64::from_le_bytes(w))?[0].to_le_bytes();
            for (c, b) in chunk.iter_mut().zip(w) {
                *c = b as c_char;
            }
        }
        let ctx = g.stream.context().clone();
        ctx.bind_to_thread()
            .map_err(|e| g.err("cuCtxSetCurrent", e))?;
        let stream = ctx.new_stream().map_err(|e| g.err("cuStreamCreate", e))?;
        let mut comm: CommPtr = std::ptr::null_mut();
        // SAFETY: the signature in nccl.h; writes the communicator. It
        // returns once every rank has joined with the same id.
        let r = unsafe { (a.init_rank)(&mut comm, world as c_int, id, rank as c_int) };
        if r != 0 {
            return Err(fail(format!(
                "ncclCommInitRank on {}: {}",
                g.name(),
                error_text(a, r)
            )));
        }
        Ok(Nccl {
            boot,
            gpu: g,
            stream,
            comm,
            limit,
            started: Vec::new(),
        })
    }

    fn err(&self, op: &'static str, msg: impl Into<String>) -> Error {
        Error::Collective {
            rank: self.boot.rank(),
            world: self.boot.world(),
            op,
            msg: msg.into(),
        }
    }

    fn cuda(&self, op: &'static str, e: impl std::fmt::Display) -> Error {
        self.err(op, format!("{} on {}", e, self.gpu.name()))
    }

    /// Ends the communicator at once (pending sums are dropped), so that no
    /// later call waits on a rank that is gone.
    fn abort(&mut self) {
        if let (false, Ok(a)) = (self.comm.is_null(), api()) {
            // SAFETY: a communicator made by `over`, never used again.
            unsafe { (a.abort)(self.comm) };
            self.comm = std::ptr::null_mut();
        }
    }

    fn live(&self, op: &'static str) -> Result<&'static Api> {
        if self.comm.is_null() {
            return Err(self.err(op, "NCCL was aborted after an earlier error"));
        }
        api().map_err(|m| self.err(op, m))
    }
}

fn n_of(b: &Buf) -> usize {
    match b {
        Buf::Empty(h) => h.len(),
        Buf::F32(_, h) => h.len(),
        Buf::F64(_, h) => h.len(),
    }
}

fn error_text(a: &Api, r: Res) -> String {
    // SAFETY: NCCL returns a static C string for every result code.
    let p = unsafe { (a.error_string)(r) };
    if p.is_null() {
        return format!("NCCL error {r}");
    }
    // SAFETY: non-null, NUL-terminated, static (above).
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    format!("{s} (NCCL error {r})")
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.boot.rank()
    }
    fn world(&self) -> usize {
        self.boot.world()
    }

    fn start_sum(&mut self, host: Flat) -> Result<Ticket> {
        let a = self.live("all_reduce")?;
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.cuda("cuCtxSetCurrent", e))?;
        let n = host.len();
        let up = |e| self.cuda("cuMemcpyHtoD", e);
        let buf = match host {
            h if h.is_empty() => Buf::Empty(h),
            Flat::F32(v) => Buf::F32(self.stream.clone_htod(&v).map_err(up)?, v),
            Flat::F64(v) => Buf::F64(self.stream.clone_htod(&v).map_err(up)?, v),
        };
        let (ptr, ty) = match &buf {
            Buf::Empty(_) => (0, NCCL_F32),
            Buf::F32(d, _) => (d.device_ptr(&self.stream).0, NCCL_F32),
            Buf::F64(d, _) => (d.device_ptr(&self.stream).0, NCCL_F64),
        };
        if n == 0 {
            self.started.push(Some(InFlight { buf, done: None }));
            return Ok(Ticket::new(self.started.len() as u64 - 1));
        }
        let ptr = ptr as *mut c_void;
        // SAFETY: `ptr` holds `n` elements of type `ty` on this
        // communicator's GPU; the sum is in place, queued on `stream`, and
        // the buffer lives until `finish` has waited for it.
        let r = unsafe {
            (a.all_reduce)(
                ptr,
                ptr,
                n,
                ty,
                NCCL_SUM,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        if r != 0 && r != IN_PROGRESS {
            let msg = format!("ncclAllReduce of {n} values: {}", error_text(a, r));
            self.abort();
            return Err(self.err("all_reduce", msg));
        }
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| self.cuda("cuEventRecord", e))?;
        self.started.push(Some(InFlight {
            buf,
            done: Some(done),
        }));
        Ok(Ticket::new(self.started.len() as u64 - 1))
    }

    // NCCL's kernels progress on the GPU by themselves.
    fn progress(&mut self) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, ticket: Ticket) -> Result<Flat> {
        let a = self.live("all_reduce")?;
        let id = ticket.id();
        let Some(f) = self.started.get_mut(id as usize).and_then(Option::take) else {
            return Err(self.err(
                "finish",
                format!("sum {id} was not started or is already finished"),
            ));
        };
        let t0 = Instant::now();
        while let Some(done) = &f.done {
            match done.try_is_complete() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return Err(self.cuda("cuEventQuery", e)),
            }
            let mut state: Res = 0;
            // SAFETY: the signature in nccl.h; writes one result code.
            unsafe { (a.async_error)(self.comm, &mut state) };
            if state != 0 && state != IN_PROGRESS {
                let msg = format!(
                    "NCCL failed while summing: {} (a rank has died or its link is down)",
                    error_text(a, state)
                );
                self.abort();
                return Err(self.err("all_reduce", msg));
            }
            if t0.elapsed() > self.limit {
                self.abort();
                return Err(self.err(
                    "all_reduce",
                    format!(
                        "the NCCL sum of {} values did not finish within {:.1} s: another \
                         rank has died, stopped, or is that far behind",
                        n_of(&f.buf),
                        self.limit.as_secs_f64()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        let down = |e| self.cuda("cuMemcpyDtoH", e);
        let out = match f.buf {
            Buf::Empty(h) => h,
            Buf::F32(d, mut h) => {
                self.stream.memcpy_dtoh(&d, &mut h).map_err(down)?;
                Flat::F32(h)
            }
            Buf::F64(d, mut h) => {
                self.stream.memcpy_dtoh(&d, &mut h).map_err(down)?;
                Flat::F64(h)
            }
        };
        self.stream.synchronize().map_err(down)?;
        if self.started.iter().all(Option::is_none) {
            self.started.clear();
        }
        Ok(out)
    }

    fn broadcast(&mut self, buf: &mut Flat, root: usize) -> Result<()> {
        self.boot.broadcast(buf, root)
    }
    fn all_gather(&mut self, value: u64) -> Result<Vec<u64>> {
        self.boot.all_gather(value)
    }
    fn barrier(&mut self) -> Result<()> {
        self.boot.barrier()
    }
    fn abort_all(&mut self, code: i32) {
        self.abort();
        self.boot.abort_all(code);
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // A sum still in flight may wait on a rank that is gone: abort
        // rather than wait.
        if self.started.iter().any(Option::is_some) {
            self.abort();
        }
        if let (false, Ok(a)) = (self.comm.is_null(), api()) {
            // SAFETY: a communicator made by `over` with nothing in flight,
            // not used after this.
            unsafe { (a.destroy)(self.comm) };
        }
    }
}
