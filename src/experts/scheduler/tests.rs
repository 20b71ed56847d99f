//! Tests of scheduler.rs.

use super::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Chunk(usize),
    Complete,
}

/// A job of the fake worker. `gate`: inside chunk `k`, say so on `entered`, then block
/// until `release` delivers (or is dropped).
#[derive(Default)]
struct Job {
    id: u32,
    chunks: usize,
    fail_at: Option<usize>,
    panic_at: Option<usize>,
    gate: Option<Gate>,
}

struct Gate {
    chunk: usize,
    entered: Sender<()>,
    release: Receiver<()>,
}

fn job(id: u32, chunks: usize) -> Job {
    Job {
        id,
        chunks,
        ..Job::default()
    }
}

/// A gate and the test's ends of it: (gate, entered, release).
fn gate(chunk: usize) -> (Gate, Receiver<()>, Sender<()>) {
    let (entered, entered_rx) = bounded(1);
    let (release_tx, release) = bounded(1);
    (
        Gate {
            chunk,
            entered,
            release,
        },
        entered_rx,
        release_tx,
    )
}

type Log = Arc<Mutex<Vec<(u32, Ev)>>>;

struct Fake {
    log: Log,
    chunk_delay: Duration,
}

/// Submit `job` with a gate in its chunk 0 and wait until the loader thread is inside it:
/// the job is running and everything submitted now queues behind it. Send on the returned
/// sender to let it go on.
fn start_gated(
    s: &Scheduler<Fake>,
    job: Job,
    p: Priority,
) -> (Ticket<<Fake as Worker>::Done>, Sender<()>) {
    let (g, entered, release) = gate(0);
    let t = s
        .submit(
            Job {
                gate: Some(g),
                ..job
            },
            p,
        )
        .unwrap();
    entered.recv_timeout(PATIENCE).unwrap();
    (t, release)
}

fn fake() -> (Fake, Log) {
    let log = Log::default();
    (
        Fake {
            log: log.clone(),
            chunk_delay: Duration::ZERO,
        },
        log,
    )
}

impl Worker for Fake {
    type Job = Job;
    type Done = u32;
    fn chunks(&mut self, job: &Job) -> usize {
        job.chunks
    }
    fn run_chunk(&mut self, job: &Job, i: usize) -> Result<()> {
        self.log.lock().unwrap().push((job.id, Ev::Chunk(i)));
        if let Some(g) = job.gate.as_ref().filter(|g| g.chunk == i) {
            g.entered.send(()).unwrap();
            let _ = g.release.recv();
        }
        if job.panic_at == Some(i) {
            panic!("injected panic in job {} chunk {i}", job.id);
        }
        if job.fail_at == Some(i) {
            return Err(Error::io(
                format!("job{}-chunk{i}", job.id),
                "read",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        std::thread::sleep(self.chunk_delay);
        Ok(())
    }
    fn complete(&mut self, job: &Job) -> Result<u32> {
        self.log.lock().unwrap().push((job.id, Ev::Complete));
        Ok(job.id)
    }
}

/// `t.wait()` on another thread: a hang fails the test instead of blocking it.
fn wait_within<D: Send + 'static>(t: Ticket<D>) -> Result<D> {
    let (tx, rx) = bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(t.wait());
    });
    rx.recv_timeout(PATIENCE)
        .expect("ticket did not resolve in time")
}

fn events(log: &Log) -> Vec<(u32, Ev)> {
    log.lock().unwrap().clone()
}

/// The events of a job that ran to completion: chunks 0..n then Complete.
fn full(id: u32, n: usize) -> Vec<(u32, Ev)> {
    (0..n)
        .map(|i| (id, Ev::Chunk(i)))
        .chain([(id, Ev::Complete)])
        .collect()
}

#[test]
fn demand_overtakes_a_started_prefetch_between_its_chunks() {
    let (w, log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    let (p1, release) = start_gated(&s, job(1, 3), Priority::Prefetch);
    // The thread is inside chunk 0 of prefetch 1; queue behind it, mixed.
    let p2 = s.submit(job(2, 1), Priority::Prefetch).unwrap();
    let d3 = s.submit(job(3, 2), Priority::Demand).unwrap();
    let p4 = s.submit(job(4, 2), Priority::Prefetch).unwrap();
    let d5 = s.submit(job(5, 1), Priority::Demand).unwrap();
    release.send(()).unwrap();
    for (t, id) in [(p1, 1), (p2, 2), (d3, 3), (p4, 4), (d5, 5)] {
        assert_eq!(wait_within(t).unwrap(), id);
    }
    let mut want = vec![(1, Ev::Chunk(0))];
    want.extend(full(3, 2));
    want.extend(full(5, 1));
    // Prefetch 1 resumes from its next chunk, before the later prefetches.
    want.extend([(1, Ev::Chunk(1)), (1, Ev::Chunk(2)), (1, Ev::Complete)]);
    want.extend(full(2, 1));
    want.extend(full(4, 2));
    assert_eq!(events(&log), want);
    s.shutdown().unwrap();
}

#[test]
fn a_demand_arriving_mid_demand_waits_its_turn() {
    let (w, log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    let (g, entered, release) = gate(1);
    let d1 = s
        .submit(
            Job {
                gate: Some(g),
                ..job(1, 3)
            },
            Priority::Demand,
        )
        .unwrap();
    entered.recv_timeout(PATIENCE).unwrap();
    let d2 = s.submit(job(2, 2), Priority::Demand).unwrap();
    release.send(()).unwrap();
    assert_eq!(wait_within(d1).unwrap(), 1);
    assert_eq!(wait_within(d2).unwrap(), 2);
    let want: Vec<_> = full(1, 3).into_iter().chain(full(2, 2)).collect();
    assert_eq!(events(&log), want);
}

#[test]
fn concurrent_submitters_every_job_runs_each_chunk_once_in_order() {
    let (w, log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    const THREADS: u32 = 8;
    const PER: u32 = 60;
    let results: Vec<(u32, usize, Result<u32>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let s = &s;
                scope.spawn(move || {
                    let tickets: Vec<_> = (0..PER)
                        .map(|k| {
                            let id = t * 1000 + k;
                            let n = ((t * 31 + k * 7) % 5 + 1) as usize;
                            let p = if (t + k) % 3 == 0 {
                                Priority::Demand
                            } else {
                                Priority::Prefetch
                            };
                            (id, n, s.submit(job(id, n), p).unwrap())
                        })
                        .collect();
                    tickets
                        .into_iter()
                        .map(|(id, n, t)| (id, n, wait_within(t)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(results.len(), (THREADS * PER) as usize);
    let ev = events(&log);
    let mut total = 0;
    for (id, n, r) in results {
        assert_eq!(r.unwrap(), id);
        let mine: Vec<_> = ev.iter().copied().filter(|e| e.0 == id).collect();
        assert_eq!(mine, full(id, n), "job {id}");
        total += n + 1;
    }
    // Nothing else ran.
    assert_eq!(ev.len(), total);
    s.shutdown().unwrap();
}

#[test]
fn worker_errors_resolve_exactly_the_failed_tickets() {
    let (w, log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    // A fixed pseudo-random choice of failing jobs and chunks.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut plan = Vec::new();
    for id in 0..200u32 {
        let n = (rnd() % 4 + 1) as usize;
        let fail_at = (rnd() % 3 == 0).then(|| (rnd() % n as u64) as usize);
        let p = if rnd() % 2 == 0 {
            Priority::Demand
        } else {
            Priority::Prefetch
        };
        let t = s
            .submit(
                Job {
                    fail_at,
                    ..job(id, n)
                },
                p,
            )
            .unwrap();
        plan.push((id, n, fail_at, t));
    }
    let ev = events_after(&log, plan, |id, n, fail_at, r, ev| match fail_at {
        None => {
            assert_eq!(r.unwrap(), id);
            assert_eq!(ev, full(id, n));
        }
        Some(k) => {
            match r {
                Err(Error::Io { path, op, source }) => {
                    assert_eq!(path, PathBuf::from(format!("job{id}-chunk{k}")));
                    assert_eq!(op, "read");
                    assert_eq!(source.raw_os_error(), Some(libc::EIO));
                }
                other => panic!("job {id}: expected the injected error, got {other:?}"),
            }
            // Chunks up to the failing one ran; nothing after it, no completion.
            let want: Vec<_> = (0..=k).map(|i| (id, Ev::Chunk(i))).collect();
            assert_eq!(ev, want, "job {id}");
        }
    });
    assert!(ev.iter().any(|e| e.1 == Ev::Complete));
    // The scheduler still serves.
    let t = s.submit(job(999, 2), Priority::Demand).unwrap();
    assert_eq!(wait_within(t).unwrap(), 999);
    s.shutdown().unwrap();
}

/// Wait every planned ticket, then check each with its own events.
fn events_after(
    log: &Log,
    plan: Vec<(u32, usize, Option<usize>, Ticket<u32>)>,
    check: impl Fn(u32, usize, Option<usize>, Result<u32>, Vec<(u32, Ev)>),
) -> Vec<(u32, Ev)> {
    let resolved: Vec<_> = plan
        .into_iter()
        .map(|(id, n, f, t)| (id, n, f, wait_within(t)))
        .collect();
    let ev = events(log);
    for (id, n, f, r) in resolved {
        let mine = ev.iter().copied().filter(|e| e.0 == id).collect();
        check(id, n, f, r, mine);
    }
    ev
}

#[test]
fn a_panicking_worker_fails_every_pending_ticket_and_the_scheduler() {
    let (w, _log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    let (first, release) = start_gated(
        &s,
        Job {
            panic_at: Some(0),
            ..job(1, 2)
        },
        Priority::Demand,
    );
    let queued: Vec<_> = (2..6)
        .map(|id| s.submit(job(id, 2), Priority::Prefetch).unwrap())
        .collect();
    release.send(()).unwrap();
    for t in std::iter::once(first).chain(queued) {
        match wait_within(t) {
            Err(Error::Loader(msg)) => {
                assert!(msg.contains("injected panic in job 1 chunk 0"), "{msg}")
            }
            other => panic!("expected a loader error, got {other:?}"),
        }
    }
    // Once the thread is gone, submit refuses (or, in the instant before, the ticket fails).
    let deadline = Instant::now() + PATIENCE;
    loop {
        match s.submit(job(7, 1), Priority::Demand) {
            Err(e) => {
                assert!(matches!(e, Error::Loader(_)), "{e:?}");
                break;
            }
            Ok(t) => assert!(wait_within(t).is_err()),
        }
        assert!(Instant::now() < deadline, "submit kept accepting work");
        std::thread::sleep(Duration::from_millis(1));
    }
    let e = s.shutdown().unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");
}

#[test]
fn cancel_prefetches_drops_only_queued_prefetches() {
    let (w, log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    let (p1, release) = start_gated(&s, job(1, 2), Priority::Prefetch);
    let p2 = s.submit(job(2, 1), Priority::Prefetch).unwrap();
    let d3 = s.submit(job(3, 1), Priority::Demand).unwrap();
    let p4 = s.submit(job(4, 1), Priority::Prefetch).unwrap();
    s.cancel_prefetches();
    let p5 = s.submit(job(5, 1), Priority::Prefetch).unwrap();
    release.send(()).unwrap();
    for t in [p2, p4] {
        let e = wait_within(t).unwrap_err();
        assert!(e.is_cancelled(), "{e:?}");
    }
    assert_eq!(wait_within(p1).unwrap(), 1);
    assert_eq!(wait_within(d3).unwrap(), 3);
    assert_eq!(wait_within(p5).unwrap(), 5);
    let mut want = vec![(1, Ev::Chunk(0))];
    want.extend(full(3, 1));
    want.extend([(1, Ev::Chunk(1)), (1, Ev::Complete)]);
    want.extend(full(5, 1));
    assert_eq!(events(&log), want);
}

#[test]
fn shutdown_finishes_the_chunk_in_flight_and_cancels_the_rest() {
    let (w, log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    let probe = s.tx.clone();
    let (running, release) = start_gated(&s, job(1, 3), Priority::Prefetch);
    let queued: Vec<_> = (2..8)
        .map(|id| {
            let p = if id % 2 == 0 {
                Priority::Demand
            } else {
                Priority::Prefetch
            };
            s.submit(job(id, 4), p).unwrap()
        })
        .collect();
    let (done_tx, done_rx) = bounded(1);
    std::thread::spawn(move || {
        let _ = done_tx.send(s.shutdown());
    });
    // Release the chunk only once the shutdown request is queued behind the six jobs, so the
    // thread sees it before it could start any further chunk.
    let deadline = Instant::now() + PATIENCE;
    while probe.len() < 7 {
        assert!(Instant::now() < deadline, "shutdown was never requested");
        std::thread::sleep(Duration::from_millis(1));
    }
    let started = Instant::now();
    release.send(()).unwrap();
    done_rx.recv_timeout(PATIENCE).unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    for t in std::iter::once(running).chain(queued) {
        let e = wait_within(t).unwrap_err();
        assert!(e.is_cancelled(), "{e:?}");
    }
    assert_eq!(events(&log), vec![(1, Ev::Chunk(0))]);
}

#[test]
fn drop_with_a_long_queue_returns_promptly_and_resolves_every_ticket() {
    let log = Log::default();
    let w = Fake {
        log: log.clone(),
        chunk_delay: Duration::from_millis(2),
    };
    let s = Scheduler::spawn(w).unwrap();
    let tickets: Vec<_> = (0..200)
        .map(|id| s.submit(job(id, 10), Priority::Prefetch).unwrap())
        .collect();
    // Let it get going, then drop it on another thread, under a deadline.
    let deadline = Instant::now() + PATIENCE;
    while events(&log).is_empty() {
        assert!(Instant::now() < deadline, "the loader never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (tx, rx) = bounded(1);
    std::thread::spawn(move || {
        drop(s);
        let _ = tx.send(());
    });
    rx.recv_timeout(PATIENCE).expect("drop hung");
    let (mut ok, mut cancelled) = (0, 0);
    for (id, mut t) in (0..).zip(tickets) {
        assert!(t.is_done(), "ticket {id} unresolved after drop");
        match t.try_wait().unwrap() {
            Ok(got) => {
                assert_eq!(got, id);
                ok += 1;
            }
            Err(e) => {
                assert!(e.is_cancelled(), "{e:?}");
                cancelled += 1;
            }
        }
        // The result is handed out once.
        assert!(matches!(t.try_wait(), Some(Err(Error::Invalid(_)))));
    }
    assert!(
        cancelled > 0 && ok + cancelled == 200,
        "{ok} ok, {cancelled} cancelled"
    );
    // Every completed job ran all its chunks; nothing ran after the drop.
    let ev = events(&log);
    let completed = ev.iter().filter(|e| e.1 == Ev::Complete).count();
    assert_eq!(completed, ok);
    let after = ev.len();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(events(&log).len(), after);
}

#[test]
fn ticket_try_wait_and_is_done_track_the_job() {
    let (w, _log) = fake();
    let s = Scheduler::spawn(w).unwrap();
    let (mut t, release) = start_gated(&s, job(1, 1), Priority::Demand);
    assert!(!t.is_done());
    assert!(t.try_wait().is_none());
    release.send(()).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !t.is_done() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    // is_done kept the result for the taker.
    assert_eq!(t.try_wait().unwrap().unwrap(), 1);
    assert!(t.is_done());
    assert!(t.wait().is_err());
    // Zero chunks: completes without running any.
    let t = s.submit(job(2, 0), Priority::Prefetch).unwrap();
    assert_eq!(wait_within(t).unwrap(), 2);
}

/// Issue 55, faults: a read that never returns. The waiter gets an error naming the stall limit
/// instead of hanging, and dropping the scheduler leaves the stuck thread behind instead of
/// joining it forever.
#[test]
fn a_load_that_never_returns_is_an_error_after_the_stall_limit() {
    let (w, _log) = fake();
    let stall = Duration::from_millis(300);
    let s = Scheduler::spawn_with(w, stall).unwrap();
    let (stuck, release) = start_gated(&s, job(1, 2), Priority::Demand);
    let started = Instant::now();
    let err = wait_within(stuck).unwrap_err();
    assert!(
        matches!(&err, Error::Loader(m) if m.contains("made no progress for 0.3 s")),
        "{err}"
    );
    assert!(started.elapsed() >= stall, "gave up too early");
    let queued = s.submit(job(2, 1), Priority::Demand).unwrap();
    assert!(matches!(wait_within(queued), Err(Error::Loader(_))));
    let (tx, rx) = bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(s.shutdown());
    });
    let shut = rx
        .recv_timeout(PATIENCE)
        .expect("shutdown joined a stuck thread");
    assert!(matches!(shut, Err(Error::Loader(m)) if m.contains("left behind")));
    drop(release);
}

/// A queue that keeps moving is not a stall, however long the whole wait is.
#[test]
fn a_slow_queue_that_moves_is_not_a_stall() {
    let (mut w, _log) = fake();
    w.chunk_delay = Duration::from_millis(40);
    let s = Scheduler::spawn_with(w, Duration::from_millis(200)).unwrap();
    let first = s.submit(job(1, 10), Priority::Demand).unwrap();
    let last = s.submit(job(2, 10), Priority::Demand).unwrap();
    assert_eq!(wait_within(last).unwrap(), 2);
    assert_eq!(wait_within(first).unwrap(), 1);
}
