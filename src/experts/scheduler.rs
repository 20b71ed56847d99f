//! The load scheduler: one thread, "hob-loader", that owns a [`Worker`] and runs its jobs chunk
//! by chunk. Demand loads (an expert the current layer needs now) run before prefetches (experts
//! the predictor expects later), FIFO within a priority. HOBBIT notes that a copy in flight
//! cannot be interrupted; splitting every load into chunks is the fix: between two chunks the
//! thread looks for new demand jobs, so a demand miss overtakes a prefetch that is half done,
//! and the prefetch resumes from its next chunk afterwards (shared/DESIGN.md, "GPU and host
//! memory").
//!
//! The scheduler is generic over the worker, so its ordering, error and shutdown behaviour is
//! tested here with fake workers; the engine's loader (experts::engine::loader: bytes to the
//! device's copier, with an event as the completion) plugs in unchanged.
//!
//! Every submitted job gets a [`Ticket`] that resolves exactly once: to the worker's completion,
//! to the worker's error, to [`Error::Cancelled`] (a prefetch dropped by
//! [`Scheduler::cancel_prefetches`], or anything left when the scheduler shuts down), or to
//! [`Error::Loader`] when the worker panicked. No ticket is left hanging: a waiter whose loader
//! thread has made no progress for the scheduler's stall limit (a read that never returns) gets
//! [`Error::Loader`] naming the limit instead of waiting forever.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::error::{Error, Result};

/// How long the loader thread may go without finishing a chunk before a waiter calls its load
/// stuck. Chunks are a few MiB: even a slow SSD moves one in well under a second.
pub const DEFAULT_STALL: Duration = Duration::from_secs(60);

/// When the loader thread last made progress (took a message or ran a chunk), shared with the
/// tickets so a waiter can tell a long queue from a stuck read.
struct Heartbeat {
    start: Instant,
    /// Milliseconds after `start`.
    last_ms: AtomicU64,
    /// A waiter may give up after this long without progress.
    stall: Duration,
}

impl Heartbeat {
    fn beat(&self) {
        let ms = self.start.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
    fn stuck(&self) -> Error {
        Error::Loader(format!(
            "an expert load made no progress for {:.1} s: the disk or the device stopped answering",
            self.stall.as_secs_f64()
        ))
    }
}

/// Which queue a job joins. Demand jobs run first; FIFO within a priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Priority {
    Demand,
    Prefetch,
}

/// What the loader thread runs. Called only from that thread.
pub trait Worker: Send + 'static {
    type Job: Send + 'static;
    type Done: Send + 'static;
    /// Number of chunks the job is split into (>= 1; 0 means "nothing to load": the job
    /// completes at once). Called once per job, when it starts.
    fn chunks(&mut self, job: &Self::Job) -> usize;
    /// Do chunk i (in order 0..chunks) of job. Errors abort the job.
    fn run_chunk(&mut self, job: &Self::Job, i: usize) -> Result<()>;
    /// All chunks done: produce the completion (on the GPU: an event the compute stream waits on).
    fn complete(&mut self, job: &Self::Job) -> Result<Self::Done>;
}

enum Msg<J, D> {
    Job {
        job: J,
        priority: Priority,
        reply: Sender<Result<D>>,
    },
    CancelPrefetches,
    Shutdown,
}

/// A queued or running job.
struct Entry<J, D> {
    job: J,
    reply: Sender<Result<D>>,
    /// The chunk count, known once the job has started (`None`: not started).
    chunks: Option<usize>,
    /// The next chunk to run.
    next: usize,
}

impl<J, D> Entry<J, D> {
    fn resolve(self, result: Result<D>) {
        // The submitter may have dropped its ticket: nobody to tell, which is fine.
        let _ = self.reply.send(result);
    }
}

/// The loader thread's state. A started job stays at the front of its queue until it resolves,
/// so a paused prefetch resumes before later prefetches.
struct Queues<J, D> {
    demand: VecDeque<Entry<J, D>>,
    prefetch: VecDeque<Entry<J, D>>,
    shutdown: bool,
}

impl<J, D> Queues<J, D> {
    fn new() -> Self {
        Queues {
            demand: VecDeque::new(),
            prefetch: VecDeque::new(),
            shutdown: false,
        }
    }

    fn is_idle(&self) -> bool {
        self.demand.is_empty() && self.prefetch.is_empty()
    }

    fn accept(&mut self, msg: Msg<J, D>) {
        match msg {
            Msg::Job {
                job,
                priority,
                reply,
            } => {
                let entry = Entry {
                    job,
                    reply,
                    chunks: None,
                    next: 0,
                };
                match priority {
                    Priority::Demand => self.demand.push_back(entry),
                    Priority::Prefetch => self.prefetch.push_back(entry),
                }
            }
            Msg::CancelPrefetches => {
                // Only jobs not started: a started prefetch has chunks in its destination
                // already, and finishing it is cheaper than undoing it.
                let (started, waiting): (VecDeque<_>, VecDeque<_>) =
                    self.prefetch.drain(..).partition(|e| e.chunks.is_some());
                self.prefetch = started;
                for e in waiting {
                    e.resolve(Err(Error::Cancelled("prefetch cancelled")));
                }
            }
            Msg::Shutdown => self.shutdown = true,
        }
    }

    /// Resolve every queued or started job with `err()`.
    fn fail_all(&mut self, err: impl Fn() -> Error) {
        for e in self.demand.drain(..).chain(self.prefetch.drain(..)) {
            e.resolve(Err(err()));
        }
    }
}

/// Run one chunk of the job that goes next (or complete it), resolving it when it is done.
fn step<W: Worker>(w: &mut W, q: &mut Queues<W::Job, W::Done>) {
    let queue = if q.demand.is_empty() {
        &mut q.prefetch
    } else {
        &mut q.demand
    };
    let Some(e) = queue.front_mut() else {
        return;
    };
    let job = &e.job;
    let n = *e.chunks.get_or_insert_with(|| w.chunks(job));
    let result = if e.next < n {
        match w.run_chunk(&e.job, e.next) {
            Ok(()) => {
                e.next += 1;
                if e.next < n {
                    return;
                }
                w.complete(&e.job)
            }
            Err(err) => Err(err),
        }
    } else {
        w.complete(&e.job)
    };
    if let Some(e) = queue.pop_front() {
        e.resolve(result);
    }
}

/// The loop: block while idle, otherwise take every waiting message, then run one chunk.
fn serve<W: Worker>(
    w: &mut W,
    rx: &Receiver<Msg<W::Job, W::Done>>,
    q: &mut Queues<W::Job, W::Done>,
    heart: &Heartbeat,
) {
    loop {
        if q.is_idle() {
            match rx.recv() {
                Ok(msg) => q.accept(msg),
                // Every sender is gone: the scheduler was dropped.
                Err(_) => return,
            }
        }
        heart.beat();
        while let Ok(msg) = rx.try_recv() {
            q.accept(msg);
        }
        if q.shutdown {
            return;
        }
        step(w, q);
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// The thread's body. Returns the panic message if the worker panicked.
fn thread_main<W: Worker>(
    mut worker: W,
    rx: Receiver<Msg<W::Job, W::Done>>,
    heart: &Heartbeat,
) -> std::result::Result<(), String> {
    let mut q = Queues::new();
    // The worker may be half way through a job when it panics: it is not used again, and every
    // job is failed, so no broken invariant of it can be observed.
    let outcome = catch_unwind(AssertUnwindSafe(|| serve(&mut worker, &rx, &mut q, heart)));
    let (result, err): (_, Box<dyn Fn() -> Error>) = match outcome {
        Ok(()) => (
            Ok(()),
            Box::new(|| Error::Cancelled("the loader shut down")),
        ),
        Err(payload) => {
            let msg = format!("the worker panicked: {}", panic_text(payload.as_ref()));
            log::error!("hob-loader: {msg}; failing every queued load");
            let m = msg.clone();
            (Err(msg), Box::new(move || Error::Loader(m.clone())))
        }
    };
    q.fail_all(&err);
    // Jobs still in the channel. Anything sent after this loop is discarded when `rx` drops;
    // its ticket sees the disconnection and reports the loader gone.
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Job { reply, .. } = msg {
            let _ = reply.send(Err(err()));
        }
    }
    result
}

/// The loader thread and the way to give it work. `submit` and `cancel_prefetches` take `&self`:
/// share it between threads by reference.
pub struct Scheduler<W: Worker> {
    tx: Sender<Msg<W::Job, W::Done>>,
    thread: Option<JoinHandle<std::result::Result<(), String>>>,
    heart: Arc<Heartbeat>,
    /// Disconnects when the thread ends (its sender is dropped there).
    exited: Receiver<()>,
}

impl<W: Worker> Scheduler<W> {
    /// Start the thread "hob-loader", which owns `worker` from now on, with the default stall
    /// limit.
    pub fn spawn(worker: W) -> Result<Self> {
        Self::spawn_with(worker, DEFAULT_STALL)
    }

    /// As [`Scheduler::spawn`]; a waiter gives up after `stall` without progress.
    pub fn spawn_with(worker: W, stall: Duration) -> Result<Self> {
        let (tx, rx) = unbounded();
        let (alive, exited) = bounded::<()>(0);
        let heart = Arc::new(Heartbeat {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            stall,
        });
        let h = heart.clone();
        let thread = std::thread::Builder::new()
            .name("hob-loader".into())
            .spawn(move || {
                let _alive = alive;
                thread_main(worker, rx, &h)
            })
            .map_err(|e| Error::Loader(format!("cannot start the loader thread: {e}")))?;
        Ok(Scheduler {
            tx,
            thread: Some(thread),
            heart,
            exited,
        })
    }

    /// Queue a job. Fails if the loader thread has died (its worker panicked).
    pub fn submit(&self, job: W::Job, priority: Priority) -> Result<Ticket<W::Done>> {
        let (reply, rx) = bounded(1);
        // The wait for this job starts now, however long the thread was idle before.
        self.heart.beat();
        self.tx
            .send(Msg::Job {
                job,
                priority,
                reply,
            })
            .map_err(|_| Error::Loader("the loader thread is not running".into()))?;
        Ok(Ticket {
            rx,
            ready: RefCell::new(None),
            taken: false,
            heart: self.heart.clone(),
        })
    }

    /// Drop every queued prefetch that has not started; their tickets resolve to
    /// [`Error::Cancelled`]. A prefetch already started finishes. Prefetches submitted after
    /// this call are kept. Takes effect when the thread next looks at its queue (at the latest
    /// after the chunk in flight).
    pub fn cancel_prefetches(&self) {
        // Fails only if the thread is gone, and then nothing is queued.
        let _ = self.tx.send(Msg::CancelPrefetches);
    }

    /// Let the chunk in flight finish, cancel everything else ([`Error::Cancelled`]) and join
    /// the thread. Errs if the worker had panicked. Dropping the scheduler does the same.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        // Fails only if the thread already ended; join reports how.
        self.heart.beat();
        let _ = self.tx.send(Msg::Shutdown);
        // A thread stuck in a read that never returns is left behind rather than joined forever.
        loop {
            match self.exited.recv_timeout(self.heart.stall.min(POLL)) {
                Err(RecvTimeoutError::Disconnected) | Ok(()) => break,
                Err(RecvTimeoutError::Timeout) if self.heart.quiet_for() >= self.heart.stall => {
                    return Err(Error::Loader(format!(
                        "the loader thread is stuck ({}); it was left behind",
                        self.heart.stuck()
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        match thread.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(msg)) => Err(Error::Loader(msg)),
            Err(payload) => Err(Error::Loader(format!(
                "the loader thread panicked: {}",
                panic_text(payload.as_ref())
            ))),
        }
    }
}

impl<W: Worker> Drop for Scheduler<W> {
    /// As [`Scheduler::shutdown`]; returns once the chunk in flight is done.
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("{e}");
        }
    }
}

/// The promise of one job's outcome. Resolves exactly once; `wait` never hangs past the loader
/// thread's end.
pub struct Ticket<D> {
    rx: Receiver<Result<D>>,
    /// A result `is_done` received before anyone asked for it.
    ready: RefCell<Option<Result<D>>>,
    /// The result was handed out.
    taken: bool,
    heart: Arc<Heartbeat>,
}

/// How often a waiter looks at the loader's heartbeat.
const POLL: Duration = Duration::from_millis(250);

fn lost() -> Error {
    Error::Loader("the loader thread exited before finishing this load".into())
}

fn taken_twice() -> Error {
    Error::Invalid("this load's result was already taken from its ticket".into())
}

impl<D> Ticket<D> {
    /// Block until the job resolves, or until the loader thread has made no progress for the
    /// scheduler's stall limit (then an error; the job may still finish later, unseen).
    pub fn wait(self) -> Result<D> {
        if self.taken {
            return Err(taken_twice());
        }
        if let Some(r) = self.ready.into_inner() {
            return r;
        }
        loop {
            match self.rx.recv_timeout(self.heart.stall.min(POLL)) {
                Ok(r) => return r,
                Err(RecvTimeoutError::Disconnected) => return Err(lost()),
                Err(RecvTimeoutError::Timeout) if self.heart.quiet_for() >= self.heart.stall => {
                    return Err(self.heart.stuck());
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// The result if the job has resolved; `None` while it is queued or running. After the
    /// result was taken once, later calls return an error.
    pub fn try_wait(&mut self) -> Option<Result<D>> {
        if self.taken {
            return Some(Err(taken_twice()));
        }
        let r = match self.ready.get_mut().take() {
            Some(r) => r,
            None => match self.rx.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => Err(lost()),
            },
        };
        self.taken = true;
        Some(r)
    }

    /// `f` of the result, once the job has resolved and while the result is not taken.
    pub fn peek<R>(&self, f: impl FnOnce(&Result<D>) -> R) -> Option<R> {
        if !self.is_done() {
            return None;
        }
        self.ready.borrow().as_ref().map(f)
    }

    /// True once the job has resolved (its result may still be taken).
    pub fn is_done(&self) -> bool {
        if self.taken || self.ready.borrow().is_some() {
            return true;
        }
        let r = match self.rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => Err(lost()),
        };
        *self.ready.borrow_mut() = Some(r);
        true
    }
}

#[cfg(test)]
mod tests;
