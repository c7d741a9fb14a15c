//! The kernels' launcher: a team of helper threads that stay awake between
//! calls, and a caller that works alongside them.
//!
//! A rayon launch from a thread outside its pool puts the job in the
//! pool's queue and puts the caller to sleep until a worker has done it:
//! once rayon's workers have gone to sleep, two wake-ups (the worker's,
//! then the caller's), a large part of a short LayerNorm call.
//!
//! [`run_tasks`] publishes the tasks in one slot and starts on its own
//! block of them at once; helpers take a block each as soon as they see
//! the slot, then what is left of the others' (see [`Job`]). A helper
//! spins for [`SPIN`] after its last task, yields for [`YIELD`], then
//! sleeps until the next launch wakes it. The caller never sleeps: it
//! waits only for tasks a helper has already started. Which thread runs a
//! task changes nothing in what the task computes, so the kernels' results
//! stay bitwise the same for any number of threads.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper spins for the next launch after its last task.
pub const SPIN: Duration = Duration::from_micros(100);
/// How long it then yields its core between looks, before it sleeps.
pub const YIELD: Duration = Duration::from_millis(2);

/// One launch: `count` tasks, cut into one block of consecutive tasks per
/// thread. Each thread runs its own block front to back, then takes what
/// is left of the others' from their backs, so that consecutive tasks run
/// on one thread and the row each task prefetches for the next is read by
/// the thread that prefetched it (tasks handed out one by one from a
/// shared counter would alternate between the threads).
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    /// Per thread (the caller first), its block's unclaimed tasks
    /// `front..back`, packed as `front << 32 | back`.
    blocks: Vec<AtomicU64>,
    /// Helper seats left; a helper takes block `seats` as it sits down.
    seats: AtomicUsize,
    panicked: AtomicBool,
}

impl<'a> Job<'a> {
    /// `count` tasks (at most `u32::MAX`) for `threads` threads.
    fn new(f: &'a (dyn Fn(usize) + Sync), count: usize, threads: usize) -> Self {
        let bound = |p: usize| (count * p / threads) as u64;
        Job {
            f,
            blocks: (0..threads)
                .map(|p| AtomicU64::new(bound(p) << 32 | bound(p + 1)))
                .collect(),
            seats: AtomicUsize::new(threads - 1),
            panicked: AtomicBool::new(false),
        }
    }

    /// Claims a task of block `b`: its first unclaimed one if `front`,
    /// else its last.
    fn claim(&self, b: usize, front: bool) -> Option<usize> {
        let block = self.blocks.get(b)?;
        let step = |v: u64| {
            let (lo, hi) = (v >> 32, v & 0xffff_ffff);
            match (lo < hi, front) {
                (false, _) => None,
                (true, true) => Some((lo + 1) << 32 | hi),
                (true, false) => Some(lo << 32 | (hi - 1)),
            }
        };
        let old = block.fetch_update(SeqCst, SeqCst, step).ok()?;
        Some(if front {
            old >> 32
        } else {
            (old & 0xffff_ffff) - 1
        } as usize)
    }

    /// Runs block `b`'s tasks in order, then what is left of the other
    /// blocks, each from its back.
    fn work(&self, b: usize) {
        let outer = IN_TASK.replace(true);
        let n = self.blocks.len();
        let others = (1..n).map(|k| (b + k) % n);
        let mine = std::iter::from_fn(|| self.claim(b, true));
        let stolen = others.flat_map(|q| std::iter::from_fn(move || self.claim(q, false)));
        for i in mine.chain(stolen) {
            if catch_unwind(AssertUnwindSafe(|| (self.f)(i))).is_err() {
                self.panicked.store(true, SeqCst);
            }
        }
        IN_TASK.set(outer);
    }
}

/// The published job (null when none), erased to `'static`: see
/// [`run_tasks`] for why no helper touches it after its caller returns.
static SLOT: AtomicPtr<Job<'static>> = AtomicPtr::new(std::ptr::null_mut());
/// Helpers that may be looking at the published job.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Helpers asleep; launches wake them through [`WAKE`].
static SLEEPING: Mutex<usize> = Mutex::new(0);
static WAKE: Condvar = Condvar::new();
static TEAM: AtomicBool = AtomicBool::new(true);

thread_local! {
    /// Whether this thread is running a team task. A launch from inside
    /// one runs its tasks in place: a helper that published a nested job
    /// would wait for `INSIDE` to drain while counted in it itself (the
    /// outer caller may already have cleared the slot for its last tasks).
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Turns the team on or off (process-wide; for benchmarks that measure
/// what it is worth). Off, [`run_tasks`] hands the tasks to rayon. It
/// changes only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_team(on: bool) {
    TEAM.store(on, SeqCst)
}

/// The number of helper threads: one less than rayon's global thread
/// count (`RAYON_NUM_THREADS`, else the CPUs), started on first use.
fn helpers() -> usize {
    static STARTED: OnceLock<usize> = OnceLock::new();
    *STARTED.get_or_init(|| {
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1);
        let mut started = 0;
        for k in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("fusegrad-{k}"))
                .spawn(helper);
            started += usize::from(spawned.is_ok());
        }
        started
    })
}

/// A helper's life: wait for a job (spin, yield, then sleep), take a seat,
/// work, leave.
fn helper() {
    loop {
        let start = Instant::now();
        let mut looks = 0u32;
        while SLOT.load(SeqCst).is_null() {
            looks = looks.wrapping_add(1);
            if !looks.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let idle = start.elapsed();
            if idle < SPIN {
                std::hint::spin_loop();
            } else if idle < SPIN + YIELD {
                std::thread::yield_now();
            } else {
                sleep_until_launch();
                break;
            }
        }
        INSIDE.fetch_add(1, SeqCst);
        let p = SLOT.load(SeqCst);
        // SAFETY: a non-null slot points at a live job: its caller clears
        // the slot and then waits for `INSIDE` to reach zero before the job
        // goes out of scope, and this helper counted itself in before
        // reading the slot (both orders are sequentially consistent).
        if let Some(job) = unsafe { p.as_ref() } {
            match job.seats.fetch_update(SeqCst, SeqCst, |s| s.checked_sub(1)) {
                Ok(seat) => job.work(seat),
                Err(_) => {
                    // No seat: let the others finish before looking again.
                    while SLOT.load(SeqCst) == p {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        INSIDE.fetch_sub(1, SeqCst);
    }
}

/// Sleeps until a launch publishes a job.
fn sleep_until_launch() {
    let Ok(mut asleep) = SLEEPING.lock() else {
        return;
    };
    *asleep += 1;
    while SLOT.load(SeqCst).is_null() {
        asleep = match WAKE.wait(asleep) {
            Ok(g) => g,
            Err(_) => return,
        };
    }
    *asleep -= 1;
}

/// Runs `f(0)`, ..., `f(count - 1)`, each once, on this thread and the
/// team's helpers (at most `rayon::current_num_threads()` threads in all,
/// so a rayon pool of one thread runs them all here), and returns when all
/// are done. If another launch holds the team, this thread is running one
/// of its tasks, or there is one task, this thread runs them all. A panic
/// in a task is raised here once all are done.
pub(crate) fn run_tasks(count: usize, f: &(dyn Fn(usize) + Sync)) {
    let threads = rayon::current_num_threads();
    if count <= 1 || threads <= 1 || IN_TASK.get() {
        return (0..count).for_each(f);
    }
    if !TEAM.load(SeqCst) || u32::try_from(count).is_err() {
        use rayon::prelude::*;
        return (0..count).into_par_iter().for_each(f);
    }
    let job = Job::new(f, count, 1 + helpers().min(threads - 1).min(count - 1));
    let p = (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
    let published = job.blocks.len() > 1
        && SLOT
            .compare_exchange(std::ptr::null_mut(), p, SeqCst, SeqCst)
            .is_ok();
    if published && SLEEPING.lock().is_ok_and(|g| *g > 0) {
        WAKE.notify_all();
    }
    job.work(0);
    if published {
        // Every task is claimed. Unpublish, then wait for the helpers
        // still looking at the job (they may be running the last tasks).
        SLOT.store(std::ptr::null_mut(), SeqCst);
        while INSIDE.load(SeqCst) > 0 {
            std::hint::spin_loop();
        }
    }
    if job.panicked.load(SeqCst) {
        panic!("a fusegrad kernel task panicked");
    }
}

/// `f` of each item, in parallel through [`run_tasks`] (one task per
/// item), in item order.
pub fn run_each<I: Send, O: Send>(items: Vec<I>, f: impl Fn(I) -> O + Sync) -> Vec<O> {
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    // Each slot is taken by the one task that claims its index.
    let slots: Vec<Mutex<(Option<I>, Option<O>)>> = items
        .into_iter()
        .map(|k| Mutex::new((Some(k), None)))
        .collect();
    run_tasks(slots.len(), &|i| {
        if let Some(Ok(mut slot)) = slots.get(i).map(|s| s.lock()) {
            slot.1 = slot.0.take().map(&f);
        }
    });
    slots
        .into_iter()
        .filter_map(|s| s.into_inner().ok().and_then(|(_, out)| out))
        .collect()
}
