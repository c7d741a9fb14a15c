//! Data parallelism (`fusegrad::dist`) without MPI: over one rank it gives
//! the sweep's own gradients bit for bit; buckets start during the sweep;
//! two ranks in threads (summing in rank order, as MPI does for two)
//! match one process on the doubled batch; ranks start equal whatever
//! their seeds, and ranks with other models are named.

use fusegrad::dist::{shard, Collective, DataParallel, Flat, Single, Ticket};
use fusegrad::nn::{AdamW, Mlp, MlpConfig, Module, Optimizer, Parameters};
use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Error, Result, Tape, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// What one rank put into an exchange.
#[derive(Clone)]
enum Put {
    Flat(Flat),
    Word(u64),
}

/// Ranks that are threads of one process: the n-th collective of every
/// rank is one exchange, complete when all have put their part.
struct Hub {
    world: usize,
    parts: Mutex<HashMap<u64, Vec<Option<Put>>>>,
    cv: Condvar,
}

struct Threads {
    hub: Arc<Hub>,
    rank: usize,
    next: u64,
}

impl Threads {
    fn world(n: usize) -> Vec<Threads> {
        let hub = Arc::new(Hub {
            world: n,
            parts: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
        });
        (0..n)
            .map(|rank| Threads {
                hub: hub.clone(),
                rank,
                next: 0,
            })
            .collect()
    }

    fn put(&mut self, p: Put) -> u64 {
        let id = self.next;
        self.next += 1;
        let mut parts = self.hub.parts.lock().unwrap();
        parts
            .entry(id)
            .or_insert_with(|| vec![None; self.hub.world])[self.rank] = Some(p);
        self.hub.cv.notify_all();
        id
    }

    /// Every rank's part of exchange `id`, in rank order.
    fn all(&self, id: u64) -> Vec<Put> {
        let mut parts = self.hub.parts.lock().unwrap();
        loop {
            if let Some(v) = parts.get(&id) {
                if v.iter().all(Option::is_some) {
                    return v.iter().map(|p| p.clone().unwrap()).collect();
                }
            }
            parts = self.hub.cv.wait(parts).unwrap();
        }
    }
}

impl Collective for Threads {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.hub.world
    }
    fn start_sum(&mut self, buf: Flat) -> Result<Ticket> {
        Ok(Ticket::new(self.put(Put::Flat(buf))))
    }
    fn progress(&mut self) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, ticket: Ticket) -> Result<Flat> {
        let mut it = self.all(ticket.id()).into_iter().map(|p| match p {
            Put::Flat(f) => f,
            Put::Word(_) => panic!("a sum met a gather"),
        });
        let mut acc = it.next().unwrap();
        for f in it {
            match (&mut acc, f) {
                (Flat::F32(a), Flat::F32(b)) => a.iter_mut().zip(b).for_each(|(x, y)| *x += y),
                (Flat::F64(a), Flat::F64(b)) => a.iter_mut().zip(b).for_each(|(x, y)| *x += y),
                _ => panic!("ranks sum other types"),
            }
        }
        Ok(acc)
    }
    fn broadcast(&mut self, buf: &mut Flat, root: usize) -> Result<()> {
        let id = self.put(Put::Flat(buf.clone()));
        if let Put::Flat(f) = &self.all(id)[root] {
            *buf = f.clone();
        }
        Ok(())
    }
    fn all_gather(&mut self, value: u64) -> Result<Vec<u64>> {
        let id = self.put(Put::Word(value));
        Ok(self
            .all(id)
            .into_iter()
            .map(|p| match p {
                Put::Word(w) => w,
                Put::Flat(_) => panic!("a gather met a sum"),
            })
            .collect())
    }
    fn barrier(&mut self) -> Result<()> {
        let id = self.put(Put::Word(0));
        self.all(id);
        Ok(())
    }
}

fn model<T: Element>(seed: u64) -> Mlp<T> {
    Mlp::new(&[6, 24, 24, 5], &MlpConfig::default(), &mut Rng::new(seed)).unwrap()
}

/// A batch of `rows` inputs and regression targets, the same every call.
fn batch<T: Element>(rows: usize, step: u64) -> (Vec<T>, Vec<T>) {
    let mut r = Rng::new(100 + step);
    let x = (0..rows * 6).map(|_| T::from_f64(r.normal())).collect();
    let y = (0..rows * 5).map(|_| T::from_f64(r.normal())).collect();
    (x, y)
}

fn loss<T: Element>(
    m: &Mlp<T>,
    tape: &Tape<T>,
    x: Vec<T>,
    y: Vec<T>,
) -> (fusegrad::nn::Bound<T>, fusegrad::Var<T>) {
    let rows = x.len() / 6;
    let p = m.bind(tape);
    let x = tape.constant(Tensor::from_vec(vec![rows, 6], x).unwrap());
    let y = tape.constant(Tensor::from_vec(vec![rows, 5], y).unwrap());
    let out = m.forward(&p, &x).unwrap();
    let l = ops::mse(&out, &y).unwrap();
    (p, l)
}

fn values<T: Element>(m: &Mlp<T>) -> Vec<Vec<f64>> {
    m.params()
        .iter()
        .map(|t| t.to_vec().unwrap().iter().map(|v| v.to_f64()).collect())
        .collect()
}

#[test]
fn one_rank_gives_the_sweeps_own_gradients_bit_for_bit_in_any_bucket_size() {
    fn check<T: Element>() {
        let m = model::<T>(3);
        let (x, y) = batch::<T>(8, 0);
        let tape = Tape::new();
        let (p, l) = loss(&m, &tape, x.clone(), y.clone());
        let want = p.grads(&l.backward().unwrap()).unwrap();
        for mb in [25.0, 1e-4, 1e-9] {
            let mut dp = DataParallel::new(Single::new()).bucket_mb(mb).unwrap();
            let tape = Tape::new();
            let (p, l) = loss(&m, &tape, x.clone(), y.clone());
            let got = dp.backward(&l, &p).unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.shape(), w.shape());
                assert_eq!(
                    g.to_vec().unwrap(),
                    w.to_vec().unwrap(),
                    "{} at {mb} MB",
                    T::NAME
                );
            }
            let s = dp.stats();
            let n = m.params().len() as u64;
            assert_eq!(s.steps, 1);
            // 1e-9 MB is less than any parameter: one bucket each.
            assert!(if mb < 1e-6 {
                s.buckets == n
            } else {
                s.buckets <= n && s.buckets >= 1
            });
        }
    }
    check::<f32>();
    check::<f64>();
    check::<half::bf16>();
}

/// Single, noting how many sweep nodes had passed when each sum started.
#[derive(Default)]
struct Recorder {
    inner: Single,
    ticks: usize,
    starts: Vec<(usize, usize)>,
}

impl Collective for Recorder {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn start_sum(&mut self, buf: Flat) -> Result<Ticket> {
        self.starts.push((self.ticks, buf.len()));
        self.inner.start_sum(buf)
    }
    fn progress(&mut self) -> Result<()> {
        self.ticks += 1;
        Ok(())
    }
    fn finish(&mut self, t: Ticket) -> Result<Flat> {
        self.inner.finish(t)
    }
    fn broadcast(&mut self, b: &mut Flat, root: usize) -> Result<()> {
        self.inner.broadcast(b, root)
    }
    fn all_gather(&mut self, v: u64) -> Result<Vec<u64>> {
        self.inner.all_gather(v)
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}

#[test]
fn each_bucket_starts_as_soon_as_its_gradients_are_final_newest_parameters_first() {
    let m = model::<f32>(1);
    let (x, y) = batch::<f32>(8, 0);
    let tape = Tape::new();
    let (p, l) = loss(&m, &tape, x, y);
    let nodes = tape.len();
    // A bucket per parameter.
    let mut dp = DataParallel::new(Recorder::default())
        .bucket_mb(1e-9)
        .unwrap();
    dp.backward(&l, &p).unwrap();
    let starts = dp.comm().starts.clone();
    let sizes: Vec<usize> = m.params().iter().map(|t| t.numel()).collect();
    assert_eq!(starts.len(), sizes.len());
    // The last layer's parameters are final first and go first, long
    // before the sweep ends; the first layer's go last.
    assert!(
        starts[0].0 < nodes / 2,
        "first start after {} of {nodes} nodes",
        starts[0].0
    );
    let last_layer = &sizes[sizes.len() - 2..];
    assert!(last_layer.contains(&starts[0].1), "{starts:?}");
    assert!(starts.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(starts.last().unwrap().0 > starts[0].0);
    let mut got: Vec<usize> = starts.iter().map(|s| s.1).collect();
    let mut want = sizes.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // With one big bucket, the one sum starts when the last gradient is final.
    let tape = Tape::new();
    let (p, l) = loss(&m, &tape, batch::<f32>(8, 0).0, batch::<f32>(8, 0).1);
    let mut dp = DataParallel::new(Recorder::default());
    dp.backward(&l, &p).unwrap();
    assert_eq!(dp.comm().starts.len(), 1);
    assert_eq!(dp.comm().starts[0].1, sizes.iter().sum::<usize>());
    assert!(dp.comm().starts[0].0 > starts[0].0);
}

/// `steps` AdamW steps with clipping on each of `world` thread ranks, each
/// on its shard of a batch of `world * rows` rows, from models seeded
/// differently (rank 0's wins); the losses (averaged) and rank 0's model.
fn train<T: Element>(world: usize, rows: usize, steps: u64, mb: f64) -> (Vec<f64>, Vec<Vec<f64>>) {
    let handles: Vec<_> = Threads::world(world)
        .into_iter()
        .map(|comm| {
            std::thread::spawn(move || {
                let rank = comm.rank();
                let mut dp = DataParallel::new(comm).bucket_mb(mb).unwrap();
                let mut m = model::<T>(7 + rank as u64);
                dp.sync_params(&mut m.params_mut()).unwrap();
                let mut opt = AdamW::<T>::with_lr(1e-2).unwrap();
                let mut losses = Vec::new();
                for s in 0..steps {
                    let (x, y) = batch::<T>(world * rows, s);
                    let (x, y) = (shard(&x, 6, rank, world), shard(&y, 5, rank, world));
                    let tape = Tape::new();
                    let (p, l) = loss(&m, &tape, x, y);
                    let v = l.value().to_vec().unwrap()[0].to_f64();
                    let g = dp.backward(&l, &p).unwrap();
                    // A clip that bites: the norm is the averaged gradient's.
                    opt.update_clipped(&mut m.params_mut(), g, 0.5).unwrap();
                    losses.push(dp.mean(&[v]).unwrap()[0]);
                }
                (losses, values(&m))
            })
        })
        .collect();
    let mut out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for o in &out[1..] {
        assert_eq!(o.1, out[0].1, "ranks ended with different parameters");
    }
    out.swap_remove(0)
}

fn worst_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f64::max)
}

#[test]
fn two_ranks_match_one_process_on_the_doubled_batch() {
    // f64 to 1e-12, f32 to 1e-6 (relative, per step and per tensor).
    fn check<T: Element>(tol: f64) {
        let (l1, p1) = train::<T>(1, 16, 20, 25.0);
        let (l2, p2) = train::<T>(2, 8, 20, 1e-4);
        let rel = worst_rel(&l2, &l1);
        assert!(rel < tol, "{}: losses differ by {rel:e}", T::NAME);
        for (a, b) in p2.iter().zip(&p1) {
            let rel = worst_rel(a, b);
            assert!(rel < tol, "{}: parameters differ by {rel:e}", T::NAME);
        }
        // The runs did train.
        assert!(l1[19] < l1[0] * 0.9, "{l1:?}");
        // Deterministic: again, bit for bit.
        assert_eq!(train::<T>(2, 8, 20, 1e-4), (l2, p2));
    }
    check::<f64>(1e-12);
    check::<f32>(1e-6);
}

#[test]
fn ranks_with_other_models_are_named_and_bad_buckets_refused() {
    let handles: Vec<_> = Threads::world(3)
        .into_iter()
        .map(|comm| {
            std::thread::spawn(move || {
                let rank = comm.rank();
                let mut dp = DataParallel::new(comm);
                let width = if rank == 2 { 25 } else { 24 };
                let mut m: Mlp<f32> =
                    Mlp::new(&[6, width, 5], &MlpConfig::default(), &mut Rng::new(1)).unwrap();
                dp.sync_params(&mut m.params_mut())
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap().unwrap_err();
        match &e {
            Error::Collective { op, msg, world, .. } => {
                assert_eq!((*op, *world), ("sync_params", 3));
                assert!(
                    msg.contains("rank 2 has other parameters than rank 0"),
                    "{e}"
                );
            }
            other => panic!("{other}"),
        }
    }
    for mb in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = DataParallel::new(Single::new())
            .bucket_mb(mb)
            .err()
            .unwrap();
        assert!(e.to_string().contains("bucket size"), "{e}");
    }
}

#[test]
fn shards_of_all_ranks_hold_every_row_once() {
    let rows: Vec<u32> = (0..7 * 3).collect();
    let shards: Vec<Vec<u32>> = (0..3).map(|r| shard(&rows, 3, r, 3)).collect();
    assert_eq!(shards[0], vec![0, 1, 2, 9, 10, 11, 18, 19, 20]);
    let mut all: Vec<u32> = shards.concat();
    all.sort();
    assert_eq!(all, rows);
    assert_eq!(shard(&rows, 3, 0, 1), rows);
}
