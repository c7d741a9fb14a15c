//! Per-op timers for `fusegrad bench --train`'s breakdown of a training
//! step. Crate-private: only the bench turns them on.
//!
//! Off (the default), every hook costs one relaxed atomic load and a
//! branch. On, the tape times each op's forward and backward, the sweep's
//! broadcast sums and gradient accumulation, and the buffer pool its takes
//! and gives; an op's figure excludes the allocation inside it, which is
//! tallied on its own, so that the tallies are disjoint and add up.
//!
//! Tallies are per thread: they describe the thread that runs the tape
//! (helper threads work inside the op's span and are counted in its wall
//! time, not in addition to it).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the timers on or off for every thread.
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed)
}

/// Whether the timers are on.
#[inline]
fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Where in the tape a span was timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// `Op::forward` in `Tape::apply`.
    Forward,
    /// `Op::backward` in the reverse sweep.
    Backward,
    /// Summing a broadcast gradient back to an input's shape (bias
    /// gradients), in the sweep.
    SumToShape,
    /// Adding a second gradient into an input's, in the sweep.
    Accumulate,
    /// Outside the tape: the optimizer step's gradient clipping.
    Step,
}

/// What a span is tallied under: the op's name, the phase and the rank of
/// the op's output (which tells a Linear's matmul, rank 2 or 3, from an
/// attention head's, rank 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub op: &'static str,
    pub phase: Phase,
    pub rank: usize,
}

/// Calls and nanoseconds, allocation excluded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub calls: u64,
    pub ns: u64,
}

thread_local! {
    static OPS: RefCell<Vec<(Key, Tally)>> = const { RefCell::new(Vec::new()) };
    /// Nanoseconds in the pool's takes and gives on this thread.
    static ALLOC_NS: Cell<u64> = const { Cell::new(0) };
    static ALLOC_CALLS: Cell<u64> = const { Cell::new(0) };
    /// An op span is open: a nested one is not timed, so no time counts twice.
    static OPEN: Cell<bool> = const { Cell::new(false) };
}

/// An open op span. Dropping it closes it, so an op that fails between
/// `start` and `stop` leaves the thread's spans usable.
pub(crate) struct Span {
    start: Instant,
    alloc0: u64,
}

impl Drop for Span {
    fn drop(&mut self) {
        OPEN.set(false);
    }
}

/// Opens an op span: `None` when the timers are off or a span is open.
#[inline]
pub(crate) fn start() -> Option<Span> {
    if !on() || OPEN.get() {
        return None;
    }
    OPEN.set(true);
    Some(Span {
        start: Instant::now(),
        alloc0: ALLOC_NS.get(),
    })
}

/// Closes `span` (if any) and tallies its time, less the allocation inside
/// it, under `key`.
#[inline]
pub(crate) fn stop(span: Option<Span>, op: &'static str, phase: Phase, rank: usize) {
    if let Some(s) = span {
        stop_span(s, Key { op, phase, rank });
    }
}

fn stop_span(s: Span, key: Key) {
    let ns = s.start.elapsed().as_nanos() as u64;
    let net = ns.saturating_sub(ALLOC_NS.get() - s.alloc0);
    OPS.with_borrow_mut(|ops| {
        // A step has a few dozen keys: a linear search beats hashing.
        match ops.iter_mut().find(|(k, _)| *k == key) {
            Some((_, t)) => {
                t.calls += 1;
                t.ns += net;
            }
            None => ops.push((key, Tally { calls: 1, ns: net })),
        }
    });
}

/// Starts timing an allocation: `None` when the timers are off.
#[inline]
pub(crate) fn alloc_start() -> Option<Instant> {
    on().then(Instant::now)
}

/// Adds the time since `t` (if any) to this thread's allocation tally.
#[inline]
pub(crate) fn alloc_stop(t: Option<Instant>) {
    if let Some(t) = t {
        ALLOC_NS.set(ALLOC_NS.get() + t.elapsed().as_nanos() as u64);
        ALLOC_CALLS.set(ALLOC_CALLS.get() + 1);
    }
}

/// This thread's allocation tally so far: (nanoseconds, calls).
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub fn alloc_so_far() -> (u64, u64) {
    (ALLOC_NS.get(), ALLOC_CALLS.get())
}

/// This thread's op tallies since the last call, sorted by key; they are
/// reset (the allocation tally is not: read it before and after).
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub fn take_ops() -> Vec<(Key, Tally)> {
    let mut v = OPS.with_borrow_mut(std::mem::take);
    v.sort_by_key(|(k, _)| *k);
    v
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![spans_tally_only_when_on_and_never_nest];

    fn spans_tally_only_when_on_and_never_nest() {
        // The only test that turns the switch on; other threads' tallies
        // are their own.
        take_ops();
        assert!(start().is_none(), "off by default");
        set_enabled(true);
        let outer = start();
        assert!(outer.is_some());
        assert!(start().is_none(), "a nested span would count twice");
        // An op that fails drops its span untallied, and spans go on.
        let failed = outer;
        drop(failed);
        let outer = start();
        assert!(outer.is_some());
        let a = alloc_start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        alloc_stop(a);
        stop(outer, "matmul", Phase::Forward, 3);
        set_enabled(false);
        let ops = take_ops();
        assert_eq!(ops.len(), 1);
        let (k, t) = ops[0];
        assert_eq!(
            (k.op, k.phase, k.rank, t.calls),
            ("matmul", Phase::Forward, 3, 1)
        );
        // The sleep was allocation time, so the op's own is well under it.
        assert!(t.ns < 10_000_000, "{t:?}");
        assert!(alloc_so_far().0 >= 20_000_000);
        assert!(take_ops().is_empty());
    }
}
