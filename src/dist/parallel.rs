//! Gradient buckets summed over ranks while the backward sweep goes on.

use super::{Collective, Flat, Ticket};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::nn::Bound;
use crate::tape::{GradReady, Var};
use crate::tensor::Tensor;
use std::time::{Duration, Instant};

/// PyTorch DDP's default bucket size.
const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Where the communication time of the steps so far went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommStats {
    /// Steps averaged.
    pub steps: u64,
    /// Buckets summed.
    pub buckets: u64,
    /// Bytes this rank handed to the engine.
    pub bytes: u64,
    /// Time spent inside the engine during the sweep (starting sums and
    /// polling them).
    pub overlapped: Duration,
    /// Time spent waiting for sums after the sweep: communication the
    /// backward did not hide.
    pub waiting: Duration,
}

/// Data-parallel gradient averaging over a [`Collective`], as PyTorch's
/// DistributedDataParallel: parameters are grouped into buckets of about
/// `bucket_mb` in reverse order (the order a backward sweep finishes
/// them), and each bucket's sum starts as soon as its last gradient is
/// final, so that it travels while the sweep goes on.
pub struct DataParallel<C: Collective> {
    comm: C,
    bucket_bytes: usize,
    stats: CommStats,
}

impl<C: Collective> DataParallel<C> {
    /// Over `comm`, with 25 MB buckets.
    pub fn new(comm: C) -> Self {
        DataParallel {
            comm,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            stats: CommStats::default(),
        }
    }

    /// Buckets of about `mb` megabytes (2^20 bytes) of gradients; a
    /// parameter larger than that is a bucket of its own.
    pub fn bucket_mb(mut self, mb: f64) -> Result<Self> {
        if !(mb > 0.0 && mb.is_finite()) {
            return Err(Error::InvalidArgument {
                op: "DataParallel::bucket_mb",
                msg: format!("the bucket size must be a positive number of MB, got {mb}"),
            });
        }
        self.bucket_bytes = ((mb * (1u64 << 20) as f64) as usize).max(1);
        Ok(self)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// The engine, for collectives of the caller's own.
    pub fn comm(&mut self) -> &mut C {
        &mut self.comm
    }

    /// Communication time and volume so far.
    pub fn stats(&self) -> CommStats {
        self.stats
    }

    /// Checks that every rank has parameters of the same shapes, then
    /// gives every rank rank 0's values: ranks start equal whatever their
    /// seeds. The error names the first rank that differs.
    pub fn sync_params<T: Element>(&mut self, params: &mut [&mut Tensor<T>]) -> Result<()> {
        let mut layout = (params.len() as u64).to_le_bytes().to_vec();
        for p in params.iter() {
            layout.extend((p.shape().len() as u64).to_le_bytes());
            for &d in p.shape() {
                layout.extend((d as u64).to_le_bytes());
            }
        }
        layout.extend(T::NAME.as_bytes());
        let all = self.comm.all_gather(crate::file::fnv1a64(&[&layout]))?;
        if let Some(r) = all.iter().position(|&x| x != all[0]) {
            return Err(self.error(
                "sync_params",
                format!(
                    "rank {r} has other parameters than rank 0 (count, shapes or dtype differ); \
                     this rank has {} parameters of {} values in {}",
                    params.len(),
                    params.iter().map(|p| p.numel()).sum::<usize>(),
                    T::NAME
                ),
            ));
        }
        let mut flat = pack(params.iter().map(|p| &**p), T::DTYPE)?;
        self.comm.broadcast(&mut flat, 0)?;
        let mut at = 0;
        for p in params.iter_mut() {
            let n = p.numel();
            **p = unpack(&flat, at, p, 1.0)?;
            at += n;
        }
        Ok(())
    }

    /// The backward sweep of `loss`, with the gradients of `params`
    /// averaged over ranks (in `params`' order, ready for
    /// [`crate::nn::Optimizer::update_clipped`], whose clip then sees the
    /// norm of the average).
    pub fn backward<T: Element>(
        &mut self,
        loss: &Var<T>,
        params: &Bound<T>,
    ) -> Result<Vec<Tensor<T>>> {
        let vars = params.vars();
        let plan = Plan::new(vars, self.bucket_bytes, T::DTYPE);
        let mut sweep = Sweep {
            comm: &mut self.comm,
            plan: &plan,
            bufs: plan
                .buckets
                .iter()
                .map(|b| Some(zeros(b.len, T::DTYPE)))
                .collect(),
            left: plan.buckets.iter().map(|b| b.params.len()).collect(),
            tickets: (0..plan.buckets.len()).map(|_| None).collect(),
            order: Vec::new(),
            busy: Duration::ZERO,
            bytes: 0,
        };
        let swept = loss.backward_notify(vars, &mut sweep)?;
        drop(swept);
        // A bucket of parameters the loss never reached (none in a model
        // whose loss uses every parameter) still has to be summed.
        for b in 0..plan.buckets.len() {
            if sweep.tickets[b].is_none() {
                sweep.start(b)?;
            }
        }
        let (order, mut tickets) = (std::mem::take(&mut sweep.order), sweep.tickets);
        let (busy, bytes) = (sweep.busy, sweep.bytes);
        let t = Instant::now();
        let mut sums: Vec<Option<Flat>> = (0..plan.buckets.len()).map(|_| None).collect();
        for b in order {
            if let Some(ticket) = tickets[b].take() {
                sums[b] = Some(self.comm.finish(ticket)?);
            }
        }
        self.stats.waiting += t.elapsed();
        self.stats.overlapped += busy;
        self.stats.bytes += bytes;
        self.stats.buckets += plan.buckets.len() as u64;
        self.stats.steps += 1;
        let scale = 1.0 / self.comm.world() as f64;
        let mut grads = Vec::with_capacity(vars.len());
        for (k, v) in vars.iter().enumerate() {
            let (b, at) = plan.place[k];
            let sum = sums[b]
                .as_ref()
                .ok_or_else(|| self.error("backward", "a bucket was never summed".into()))?;
            grads.push(unpack(sum, at, v.value(), scale)?);
        }
        Ok(grads)
    }

    /// The mean over ranks of each of `values` (losses, metrics).
    pub fn mean(&mut self, values: &[f64]) -> Result<Vec<f64>> {
        let world = self.comm.world() as f64;
        match self.comm.sum(Flat::F64(values.to_vec()))? {
            Flat::F64(v) => Ok(v.into_iter().map(|x| x / world).collect()),
            other => Err(self.error(
                "mean",
                format!("the engine returned {} values of another type", other.len()),
            )),
        }
    }

    fn error(&self, op: &'static str, msg: String) -> Error {
        Error::Collective {
            rank: self.comm.rank(),
            world: self.comm.world(),
            op,
            msg,
        }
    }
}

/// One bucket: which parameters (by index) and how many elements.
struct Bucket {
    params: Vec<usize>,
    len: usize,
}

/// Parameters grouped into buckets, newest first, and where each one sits.
struct Plan {
    buckets: Vec<Bucket>,
    /// Per parameter: its bucket and offset in it.
    place: Vec<(usize, usize)>,
}

impl Plan {
    fn new<T: Element>(vars: &[Var<T>], bucket_bytes: usize, dtype: DType) -> Self {
        let size = if dtype == DType::F64 { 8 } else { 4 };
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut place = vec![(0, 0); vars.len()];
        for k in (0..vars.len()).rev() {
            let n = vars[k].value().numel();
            let fits = buckets
                .last()
                .is_some_and(|b| (b.len + n) * size <= bucket_bytes || b.len == 0);
            if !fits {
                buckets.push(Bucket {
                    params: Vec::new(),
                    len: 0,
                });
            }
            let b = buckets.len() - 1;
            let last = &mut buckets[b];
            place[k] = (b, last.len);
            last.params.push(k);
            last.len += n;
        }
        Plan { buckets, place }
    }
}

/// The sweep's side: packs each final gradient into its bucket and starts
/// the bucket's sum when the bucket is full.
struct Sweep<'a, C: Collective> {
    comm: &'a mut C,
    plan: &'a Plan,
    bufs: Vec<Option<Flat>>,
    left: Vec<usize>,
    tickets: Vec<Option<Ticket>>,
    /// Buckets in the order their sums started (every rank's order).
    order: Vec<usize>,
    busy: Duration,
    bytes: u64,
}

impl<C: Collective> Sweep<'_, C> {
    fn start(&mut self, b: usize) -> Result<()> {
        let t = Instant::now();
        let buf = self.bufs[b].take().unwrap_or_else(|| zeros(0, DType::F32));
        self.bytes += buf.bytes() as u64;
        self.tickets[b] = Some(self.comm.start_sum(buf)?);
        self.order.push(b);
        self.busy += t.elapsed();
        Ok(())
    }
}

impl<T: Element, C: Collective> GradReady<T> for Sweep<'_, C> {
    fn ready(&mut self, index: usize, grad: &Tensor<T>) -> Result<()> {
        let (b, at) = self.plan.place[index];
        let values = grad.to_vec()?;
        match self.bufs[b].as_mut() {
            Some(Flat::F32(v)) => {
                for (d, s) in v[at..at + values.len()].iter_mut().zip(&values) {
                    *d = s.to_f64() as f32;
                }
            }
            Some(Flat::F64(v)) => {
                for (d, s) in v[at..at + values.len()].iter_mut().zip(&values) {
                    *d = s.to_f64();
                }
            }
            _ => {
                return Err(Error::InvalidArgument {
                    op: "DataParallel::backward",
                    msg: format!("parameter {index} was announced twice"),
                })
            }
        }
        self.left[b] -= 1;
        if self.left[b] == 0 {
            self.start(b)?;
        }
        Ok(())
    }

    // Polled after every node, in flight or not: an engine may count the
    // sweep's pace, and polling with nothing started costs nothing.
    fn tick(&mut self) -> Result<()> {
        if self.order.is_empty() {
            return self.comm.progress();
        }
        let t = Instant::now();
        self.comm.progress()?;
        self.busy += t.elapsed();
        Ok(())
    }
}

fn zeros(len: usize, dtype: DType) -> Flat {
    if dtype == DType::F64 {
        Flat::F64(vec![0.0; len])
    } else {
        Flat::F32(vec![0.0; len])
    }
}

/// `tensors` laid end to end in the type they travel in.
fn pack<'a, T: Element>(
    tensors: impl Iterator<Item = &'a Tensor<T>>,
    dtype: DType,
) -> Result<Flat> {
    let mut out = zeros(0, dtype);
    for t in tensors {
        let v = t.to_vec()?;
        match &mut out {
            Flat::F32(o) => o.extend(v.iter().map(|x| x.to_f64() as f32)),
            Flat::F64(o) => o.extend(v.iter().map(|x| x.to_f64())),
        }
    }
    Ok(out)
}

/// `like.numel()` elements of `flat` from `at`, times `scale`, as a tensor
/// of `like`'s shape on `like`'s device.
fn unpack<T: Element>(flat: &Flat, at: usize, like: &Tensor<T>, scale: f64) -> Result<Tensor<T>> {
    let n = like.numel();
    if at + n > flat.len() {
        return Err(Error::ElementCount {
            op: "DataParallel",
            shape: like.shape().to_vec(),
            len: flat.len().saturating_sub(at),
        });
    }
    let data: Vec<T> = match flat {
        Flat::F32(v) => v[at..at + n]
            .iter()
            .map(|&x| T::from_f64((x as f64 * scale) as f32 as f64))
            .collect(),
        Flat::F64(v) => v[at..at + n]
            .iter()
            .map(|&x| T::from_f64(x * scale))
            .collect(),
    };
    Tensor::from_vec(like.shape().to_vec(), data)?.to_device(like.device())
}
