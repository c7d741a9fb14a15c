//! [`Mpi`]: fusegrad's [`Collective`] over MPI (rsmpi, the `mpi` crate,
//! on the system's OpenMPI or MPICH), for data-parallel training on CPU
//! ranks launched by `mpirun`.
//!
//! Every collective is started non-blocking and then polled, so that a
//! gradient bucket's sum moves on while the backward sweep goes on, and so
//! that no call waits past the time limit: a rank that died or hangs
//! makes the others fail with an error that names it, never a hang.

use fusegrad::dist::{Collective, Flat, Ticket};
use fusegrad::{Error, Result};
use mpi::ffi;
use mpi::traits::AsRaw;
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

/// Whether this process was started by an MPI launcher (`mpirun`,
/// `mpiexec`, `srun`), read from the environment the launcher sets.
pub fn launched() -> bool {
    fusegrad::dist::launcher_world().is_some()
}

/// A sum in flight: the buffers MPI reads and writes stay here, unmoved,
/// until it completes.
struct InFlight {
    send: Flat,
    recv: Flat,
    request: ffi::MPI_Request,
    done: bool,
}

/// The MPI world (`MPI_COMM_WORLD`) as a [`Collective`].
pub struct Mpi {
    world: mpi::topology::SimpleCommunicator,
    rank: usize,
    size: usize,
    limit: Duration,
    /// Each rank's process id and host (hashed), to say which one is gone.
    pids: Vec<u64>,
    hosts: Vec<u64>,
    started: HashMap<u64, InFlight>,
    next: u64,
    /// A collective failed: finalizing would wait on the missing ranks.
    failed: bool,
    _universe: mpi::environment::Universe,
}

impl Mpi {
    /// Initializes MPI (funneled: only this thread calls it) with `limit`
    /// for every collective that waits on other ranks.
    pub fn init(limit: Duration) -> Result<Mpi> {
        let (universe, _) =
            mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or_else(|| {
                fail(
                    0,
                    1,
                    "init",
                    "MPI is already initialized in this process".into(),
                )
            })?;
        let world = universe.world();
        // Errors come back as codes, so that they can be reported.
        unsafe { ffi::MPI_Comm_set_errhandler(world.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
        let (mut rank, mut size) = (0, 0);
        unsafe {
            ffi::MPI_Comm_rank(world.as_raw(), &mut rank);
            ffi::MPI_Comm_size(world.as_raw(), &mut size);
        }
        let mut me = Mpi {
            world,
            rank: rank as usize,
            size: size as usize,
            limit,
            pids: Vec::new(),
            hosts: Vec::new(),
            started: HashMap::new(),
            next: 0,
            failed: false,
            _universe: universe,
        };
        me.pids = me.all_gather(std::process::id() as u64)?;
        me.hosts = me.all_gather(host_hash())?;
        Ok(me)
    }

    /// The time limit of each collective.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Ends every rank of the job with `code` (`MPI_Abort`): what a rank
    /// does after reporting a failure, so that no other rank is left
    /// waiting on it.
    pub fn abort(&self, code: i32) -> ! {
        unsafe { ffi::MPI_Abort(self.world.as_raw(), code as c_int) };
        std::process::exit(code)
    }

    fn err(&mut self, op: &'static str, msg: String) -> Error {
        self.failed = true;
        fail(self.rank, self.size, op, msg)
    }

    fn check(&mut self, op: &'static str, code: c_int) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(self.err(op, format!("MPI error {code}; {}", self.peers())))
    }

    /// Waits for `request` until the time limit.
    fn wait(&mut self, op: &'static str, request: &mut ffi::MPI_Request) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut flag = 0;
            let code = unsafe { ffi::MPI_Test(request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            self.check(op, code)?;
            if flag != 0 {
                return Ok(());
            }
            if start.elapsed() > self.limit {
                let msg = format!(
                    "did not complete within the time limit of {:.0} s; {}",
                    self.limit.as_secs_f64(),
                    self.peers()
                );
                return Err(self.err(op, msg));
            }
            std::thread::yield_now();
        }
    }

    /// What is known of the other ranks: for those on this host, whether
    /// their process has exited or is stopped.
    fn peers(&self) -> String {
        let me = host_hash();
        let mut notes = Vec::new();
        for r in (0..self.size).filter(|&r| r != self.rank) {
            let (Some(&pid), Some(&host)) = (self.pids.get(r), self.hosts.get(r)) else {
                continue;
            };
            let note = if host != me {
                format!("rank {r} (pid {pid} on another host) did not answer")
            } else {
                match process_state(pid) {
                    None | Some('Z') | Some('X') => format!("rank {r} (pid {pid}) has exited"),
                    Some('T') | Some('t') => format!("rank {r} (pid {pid}) is stopped"),
                    Some(_) => {
                        format!("rank {r} (pid {pid}) is running but did not reach this collective")
                    }
                }
            };
            notes.push(note);
        }
        if notes.is_empty() {
            "no other rank is known".into()
        } else {
            notes.join("; ")
        }
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        // MPI_Finalize would wait for ranks that are gone.
        if self.failed {
            unsafe { ffi::MPI_Abort(self.world.as_raw(), 1) };
        }
    }
}

fn fail(rank: usize, world: usize, op: &'static str, msg: String) -> Error {
    Error::Collective {
        rank,
        world,
        op,
        msg,
    }
}

/// The pointer, count and MPI type of a buffer.
fn raw(buf: &mut Flat) -> (*mut c_void, c_int, ffi::MPI_Datatype) {
    match buf {
        Flat::F32(v) => (v.as_mut_ptr().cast(), v.len() as c_int, unsafe {
            ffi::RSMPI_FLOAT
        }),
        Flat::F64(v) => (v.as_mut_ptr().cast(), v.len() as c_int, unsafe {
            ffi::RSMPI_DOUBLE
        }),
        _ => (std::ptr::null_mut(), 0, unsafe { ffi::RSMPI_FLOAT }),
    }
}

fn empty_like(buf: &Flat) -> Flat {
    match buf {
        Flat::F64(v) => Flat::F64(vec![0.0; v.len()]),
        other => Flat::F32(vec![0.0; other.len()]),
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn start_sum(&mut self, buf: Flat) -> Result<Ticket> {
        if buf.len() > c_int::MAX as usize {
            return Err(self.err(
                "all_reduce",
                format!("{} elements is more than MPI counts", buf.len()),
            ));
        }
        let mut f = InFlight {
            recv: empty_like(&buf),
            send: buf,
            request: unsafe { ffi::RSMPI_REQUEST_NULL },
            done: false,
        };
        let (send, n, ty) = raw(&mut f.send);
        let (recv, _, _) = raw(&mut f.recv);
        // The heap buffers do not move when `f` does: they stay valid in
        // `started` until the request completes.
        let code = unsafe {
            ffi::MPI_Iallreduce(
                send,
                recv,
                n,
                ty,
                ffi::RSMPI_SUM,
                self.world.as_raw(),
                &mut f.request,
            )
        };
        self.check("all_reduce", code)?;
        let id = self.next;
        self.next += 1;
        self.started.insert(id, f);
        Ok(Ticket::new(id))
    }

    fn progress(&mut self) -> Result<()> {
        let mut code = 0;
        for f in self.started.values_mut().filter(|f| !f.done) {
            let mut flag = 0;
            code = unsafe { ffi::MPI_Test(&mut f.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if code != 0 {
                break;
            }
            f.done = flag != 0;
        }
        self.check("all_reduce", code)
    }

    fn finish(&mut self, ticket: Ticket) -> Result<Flat> {
        let Some(mut f) = self.started.remove(&ticket.id()) else {
            return Err(self.err(
                "all_reduce",
                format!("sum {} was not started or is already finished", ticket.id()),
            ));
        };
        if !f.done {
            if let Err(e) = self.wait("all_reduce", &mut f.request) {
                // MPI may still write into the buffers: they must outlive it.
                std::mem::forget(f);
                return Err(e);
            }
        }
        Ok(f.recv)
    }

    fn broadcast(&mut self, buf: &mut Flat, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(self.err(
                "broadcast",
                format!("root {root} is not a rank of a world of {}", self.size),
            ));
        }
        // An owned copy: after a time-out MPI may still write into it, so
        // it is leaked rather than freed, and `buf` is left as it was.
        let mut own = buf.clone();
        let (ptr, n, ty) = raw(&mut own);
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let code = unsafe {
            ffi::MPI_Ibcast(ptr, n, ty, root as c_int, self.world.as_raw(), &mut request)
        };
        self.check("broadcast", code)?;
        if let Err(e) = self.wait("broadcast", &mut request) {
            std::mem::forget(own);
            return Err(e);
        }
        *buf = own;
        Ok(())
    }

    fn all_gather(&mut self, value: u64) -> Result<Vec<u64>> {
        let mine = vec![value];
        let mut all = vec![0u64; self.size];
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let code = unsafe {
            ffi::MPI_Iallgather(
                mine.as_ptr().cast(),
                1,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_UINT64_T,
                self.world.as_raw(),
                &mut request,
            )
        };
        self.check("all_gather", code)?;
        if let Err(e) = self.wait("all_gather", &mut request) {
            // MPI may still read `mine` and write `all`.
            std::mem::forget((mine, all));
            return Err(e);
        }
        Ok(all)
    }

    fn abort_all(&mut self, code: i32) {
        self.abort(code)
    }

    fn barrier(&mut self) -> Result<()> {
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let code = unsafe { ffi::MPI_Ibarrier(self.world.as_raw(), &mut request) };
        self.check("barrier", code)?;
        self.wait("barrier", &mut request)
    }
}

/// A hash of this host's name, to tell which ranks share it.
fn host_hash() -> u64 {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    name.trim().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The state letter of process `pid` (`R`, `S`, `T`, `Z`, ...), or `None`
/// if there is no such process.
fn process_state(pid: u64) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}
