//! Data-parallel training across processes: one seam for collective
//! operations ([`Collective`]) and gradient averaging done as PyTorch's
//! DistributedDataParallel does it ([`DataParallel`]).
//!
//! Every rank holds the whole model and runs the same step on its own
//! shard of the batch. Parameters start equal (broadcast from rank 0);
//! gradients are summed over ranks in buckets while the backward sweep
//! goes on, then divided by the world size, so every rank applies the
//! same update and the parameters stay equal bit for bit.
//!
//! [`Single`] is the world of one process and needs nothing. The MPI
//! engine is the `fusegrad-mpi` crate, which keeps the library free of
//! MPI. `Nccl` (with the CUDA backend) sums on the GPUs, bootstrapped over
//! another engine; NCCL is loaded at run time.

#[cfg(feature = "cuda")]
mod nccl;
mod parallel;

#[cfg(feature = "cuda")]
pub use nccl::{nccl_version, Nccl};
pub use parallel::{CommStats, DataParallel};

use crate::error::{Error, Result};

/// A flat buffer that a collective reduces or broadcasts, in the element
/// type it travels in: f64 for f64 models, f32 for the others (16-bit
/// gradients are summed in f32).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Flat {
    /// Single precision.
    F32(Vec<f32>),
    /// Double precision.
    F64(Vec<f64>),
}

impl Flat {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Flat::F32(v) => v.len(),
            Flat::F64(v) => v.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        match self {
            Flat::F32(v) => v.len() * 4,
            Flat::F64(v) => v.len() * 8,
        }
    }

    /// Element `i`, widened to f64.
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Flat::F32(v) => v[i] as f64,
            Flat::F64(v) => v[i],
        }
    }
}

/// A sum started by [`Collective::start_sum`], redeemed with
/// [`Collective::finish`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

impl Ticket {
    /// An engine's handle for its `id`-th started sum.
    pub fn new(id: u64) -> Self {
        Ticket(id)
    }

    /// The engine's id of the sum.
    pub fn id(&self) -> u64 {
        self.0
    }
}

/// The collective operations data parallelism needs. Every rank must call
/// them in the same order with buffers of the same length and type; each
/// call that waits on other ranks gives up after the engine's time limit
/// with an [`Error::Collective`] that names the ranks it was waiting on.
pub trait Collective {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// Starts the element-wise sum of `buf` over all ranks, without waiting.
    fn start_sum(&mut self, buf: Flat) -> Result<Ticket>;
    /// Moves started sums on without waiting (engines that progress only
    /// when called).
    fn progress(&mut self) -> Result<()>;
    /// Waits for a started sum and returns it.
    fn finish(&mut self, ticket: Ticket) -> Result<Flat>;
    /// Replaces `buf` on every rank with `root`'s.
    fn broadcast(&mut self, buf: &mut Flat, root: usize) -> Result<()>;
    /// Every rank's `value`, in rank order.
    fn all_gather(&mut self, value: u64) -> Result<Vec<u64>>;
    /// Waits until every rank has reached it.
    fn barrier(&mut self) -> Result<()>;
    /// The sum of `buf` over ranks, waited for.
    fn sum(&mut self, buf: Flat) -> Result<Flat> {
        let t = self.start_sum(buf)?;
        self.finish(t)
    }
    /// After this rank has reported an error: ends the job on every rank
    /// (MPI's `MPI_Abort`), so that none waits on this one. Does nothing
    /// in a world of one.
    fn abort_all(&mut self, _code: i32) {}
}

impl<C: Collective + ?Sized> Collective for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world(&self) -> usize {
        (**self).world()
    }
    fn start_sum(&mut self, buf: Flat) -> Result<Ticket> {
        (**self).start_sum(buf)
    }
    fn progress(&mut self) -> Result<()> {
        (**self).progress()
    }
    fn finish(&mut self, ticket: Ticket) -> Result<Flat> {
        (**self).finish(ticket)
    }
    fn broadcast(&mut self, buf: &mut Flat, root: usize) -> Result<()> {
        (**self).broadcast(buf, root)
    }
    fn all_gather(&mut self, value: u64) -> Result<Vec<u64>> {
        (**self).all_gather(value)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
    fn abort_all(&mut self, code: i32) {
        (**self).abort_all(code)
    }
}

/// The world size an MPI launcher (`mpirun`, `mpiexec`, `srun`) announced
/// to this process through its environment, if one started it.
pub fn launcher_world() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// The world of one process: every collective returns its input.
#[derive(Debug, Default)]
pub struct Single {
    started: Vec<Option<Flat>>,
}

impl Single {
    /// World size 1.
    pub fn new() -> Self {
        Single::default()
    }
}

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn start_sum(&mut self, buf: Flat) -> Result<Ticket> {
        self.started.push(Some(buf));
        Ok(Ticket::new(self.started.len() as u64 - 1))
    }
    fn progress(&mut self) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, ticket: Ticket) -> Result<Flat> {
        let buf = self
            .started
            .get_mut(ticket.id() as usize)
            .and_then(Option::take)
            .ok_or_else(|| Error::Collective {
                rank: 0,
                world: 1,
                op: "finish",
                msg: format!("sum {} was not started or is already finished", ticket.id()),
            })?;
        if self.started.iter().all(Option::is_none) {
            self.started.clear();
        }
        Ok(buf)
    }
    fn broadcast(&mut self, _buf: &mut Flat, root: usize) -> Result<()> {
        if root != 0 {
            return Err(Error::Collective {
                rank: 0,
                world: 1,
                op: "broadcast",
                msg: format!("root {root} is not a rank of a world of 1"),
            });
        }
        Ok(())
    }
    fn all_gather(&mut self, value: u64) -> Result<Vec<u64>> {
        Ok(vec![value])
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The rank-strided shard that `rank` of `world` takes of `items`, read
/// as rows of `row` elements: rows `rank`, `rank + world`, ... (so the
/// shards of all ranks together hold every row once). A trailing partial
/// row is never taken.
pub fn shard<X: Clone>(items: &[X], row: usize, rank: usize, world: usize) -> Vec<X> {
    items
        .chunks_exact(row.max(1))
        .skip(rank)
        .step_by(world.max(1))
        .flatten()
        .cloned()
        .collect()
}
