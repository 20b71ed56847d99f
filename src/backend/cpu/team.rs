//! A fork-join team for batch-1 ops: the calling thread and `n - 1` helpers run one job at a
//! time, each job split into items the threads claim from a shared counter.
//!
//! Why not rayon: a decode step is ~400 small ops back to back, and `install` from outside a
//! rayon pool puts the caller to sleep on a latch and wakes it per op; that hand-off took ~30% of
//! a 2-core decode (benches/results/2026-12-02-cpu-issue56-cpu-path.md). Here the caller works
//! too, and idle helpers spin briefly, then yield, then park, so back-to-back ops cost a few
//! atomics. (fork_union does the same but builds C++ and wants `&mut` for every call.)

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A published job: called once per thread with its index, each call claiming items.
type Job = dyn Fn() + Sync;

/// `Shared::inside`'s flag: the job takes no more helpers.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// How long an idle helper spins (then yields) before it parks: longer than the gaps between a
/// decode step's ops, shorter than a user's pause.
const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_millis(2);

thread_local! {
    /// Set while this thread runs a team's job: a nested `run` works alone instead of waiting
    /// for helpers that are busy with the outer job.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
    /// This thread's place in its team: i for helper i, 0 for any other thread (a caller).
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

struct Shared {
    /// Bumped by the caller once per job, after `job` is written.
    epoch: AtomicUsize,
    /// Written by the caller only while the job is closed with no helper in it (`inside` is
    /// CLOSED); read by a helper only after it entered (`inside` counted it, not closed).
    job: UnsafeCell<Option<*const Job>>,
    /// Helpers running the current job, plus CLOSED once the caller has claimed every item: a
    /// helper that arrives later stays out, so the caller never waits for a helper that the OS
    /// has not scheduled yet (on a busy host that took milliseconds), only for those at work.
    inside: AtomicUsize,
    /// A helper's job panicked; the caller re-raises it.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Parked helpers wait here for the next epoch.
    parked: Mutex<usize>,
    wake: Condvar,
}

// SAFETY: `job` follows the protocol documented on it: one writer (the caller, holding `caller`)
// while every helper is idle, readers only after an Acquire load of the epoch that published it.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

pub struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// One caller at a time.
    caller: Mutex<()>,
}

impl Team {
    /// A team of `threads` (the caller counts as one), helpers named `{name}-{i}`.
    pub fn new(threads: usize, name: &str) -> crate::Result<Team> {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            inside: AtomicUsize::new(CLOSED),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            parked: Mutex::new(0),
            wake: Condvar::new(),
        });
        let mut team = Team {
            shared,
            helpers: Vec::new(),
            caller: Mutex::new(()),
        };
        for i in 1..threads.max(1) {
            let s = Arc::clone(&team.shared);
            let h = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    INDEX.set(i);
                    helper(&s)
                })
                .map_err(|e| {
                    crate::Error::Invalid(format!(
                        "cannot start {threads} CPU threads ({name}): {e}"
                    ))
                })?;
            team.helpers.push(h);
        }
        Ok(team)
    }

    /// Threads that take part in a job, the caller included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// The calling thread's index in 0..threads() while it runs a job's items: helper i is i, the
    /// caller 0 (for per-thread statistics).
    pub fn thread_index() -> usize {
        INDEX.get()
    }

    /// Calls `f(i)` for every i in 0..items, spread over the team; returns when all are done.
    /// Which thread runs an item is not fixed, so `f` must not depend on it.
    pub fn for_each(&self, items: usize, f: impl Fn(usize) + Sync) {
        let next = AtomicUsize::new(0);
        let claim = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= items {
                break;
            }
            f(i);
        };
        if items <= 1 || self.helpers.is_empty() || IN_JOB.get() {
            claim();
            return;
        }
        self.run(&claim);
    }

    fn run<'a>(&self, job: &'a (dyn Fn() + Sync + 'a)) {
        let _one = lock(&self.caller);
        let s = &*self.shared;
        // SAFETY: the pointer's lifetime is erased while it is published; `Finish` below closes
        // the job and waits (also when `job` panics on this thread) until no helper is inside it,
        // before this borrow ends. No helper is inside now: the previous `run` waited for that,
        // and the job stays closed until the store below.
        unsafe {
            let erased: *const Job =
                std::mem::transmute::<&'a (dyn Fn() + Sync + 'a), &'static Job>(job);
            *s.job.get() = Some(erased);
        }
        s.panicked.store(false, Ordering::Relaxed);
        s.inside.store(0, Ordering::Release);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if *lock(&s.parked) > 0 {
            s.wake.notify_all();
        }
        let finish = Finish(s);
        IN_JOB.set(true);
        job();
        IN_JOB.set(false);
        drop(finish);
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("a CPU worker thread panicked");
        }
    }
}

/// Closes the current job and waits for the helpers inside it when dropped.
struct Finish<'a>(&'a Shared);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        IN_JOB.set(false);
        self.0.inside.fetch_or(CLOSED, Ordering::AcqRel);
        let started = Instant::now();
        while self.0.inside.load(Ordering::Acquire) != CLOSED {
            if started.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        drop(lock(&self.shared.parked));
        self.shared.wake.notify_all();
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn helper(s: &Shared) {
    let mut seen = 0;
    IN_JOB.set(true);
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let idle = started.elapsed();
            if idle < SPIN {
                std::hint::spin_loop();
            } else if idle < YIELD {
                std::thread::yield_now();
            } else {
                let mut parked = lock(&s.parked);
                *parked += 1;
                while s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                    parked = s.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
                }
                *parked -= 1;
            }
        }
        // Enter unless the job is already closed (its caller claimed every item).
        let mut n = s.inside.load(Ordering::Acquire);
        while n & CLOSED == 0 {
            match s
                .inside
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => n = now,
            }
        }
        if n & CLOSED != 0 {
            continue;
        }
        // SAFETY: this helper is counted in `inside` of a job that was open: the caller wrote the
        // job before opening it and keeps it alive until `inside` drops back to CLOSED, which
        // this helper has not signalled yet. (If the epoch moved on meanwhile, the job is the
        // newer one: items are claimed from its own counter, so taking part is harmless.)
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: as above.
            let f = unsafe { &*job };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                s.panicked.store(true, Ordering::Release);
            }
        }
        s.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_whatever_the_team() {
        for threads in [1, 2, 3, 8] {
            let team = Team::new(threads, "t").unwrap();
            for items in [0, 1, 2, 7, 100] {
                let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
                for _ in 0..50 {
                    team.for_each(items, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                }
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
            }
        }
    }

    #[test]
    fn nested_jobs_run_on_the_calling_thread() {
        let team = Team::new(2, "t").unwrap();
        let sum = AtomicUsize::new(0);
        team.for_each(4, |i| {
            team.for_each(3, |j| {
                sum.fetch_add(i * 3 + j, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.load(Ordering::Relaxed), (0..12).sum::<usize>());
    }

    #[test]
    fn a_panicking_item_reaches_the_caller_and_the_team_goes_on() {
        let team = Team::new(3, "t").unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.for_each(16, |i| assert!(i != 5, "item 5"));
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        team.for_each(16, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 16);
    }

    #[test]
    fn parked_helpers_wake_for_the_next_job() {
        let team = Team::new(2, "t").unwrap();
        std::thread::sleep(YIELD * 3);
        let n = AtomicUsize::new(0);
        team.for_each(64, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 64);
    }
}
