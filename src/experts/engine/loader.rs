//! The loader thread's worker: a load job copies one file range (an expert blob, or one of its
//! matrices) into a slot, in chunks of 16 MiB so that a demand load overtakes a prefetch
//! between two of them (experts::scheduler). Bytes come from the page cache or the SSD; the
//! device's copier moves them (by DMA from page-locked file pages, through staging, or into
//! mapped host slots); an emulated link or SSD paces them.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::Mmap;
use rayon::prelude::*;

use crate::experts::io::BlobSource;
use crate::experts::scheduler::{Ticket, Worker};
use crate::model::{ChunkCopier, DeviceEvent};
use crate::Error;

/// Bytes a chunk carries at most.
pub const CHUNK: usize = 16 << 20;
/// Chunks a demand load may queue behind on the link (the copier keeps this many in flight).
pub const CHUNKS_IN_FLIGHT: usize = 4;
/// Threads copying out of the page cache: enough to outrun a 25 GB/s link, the other cores left
/// to CPU experts.
const FILL_THREADS: usize = 8;
/// Lateness of a paced chunk still counted as back to back with the previous one (a sleep's
/// overshoot, not an idle link).
const PACE_SLACK: Duration = Duration::from_micros(500);

/// One load: file bytes `src` to `dst` (a device address, or a host address of a mapped arena).
pub struct LoadJob<E> {
    pub src: Range<usize>,
    pub dst: u64,
    pub mapped: bool,
    /// Compute that may still read the destination's previous contents.
    pub after: E,
    /// Set by the engine to drop the rest of a prefetch proven wrong: the job's next chunk
    /// fails it with [`Error::Cancelled`] instead of running.
    pub abort: Option<Arc<AtomicBool>>,
}

impl<E> LoadJob<E> {
    fn chunks(&self) -> usize {
        self.src.len().div_ceil(CHUNK)
    }

    /// Chunk `i`: (file range, destination).
    fn chunk(&self, i: usize) -> (Range<usize>, u64) {
        let at = i * CHUNK;
        let len = CHUNK.min(self.src.len() - at);
        let start = self.src.start + at;
        (start..start + len, self.dst + at as u64)
    }
}

/// Bytes and time the loader has spent, shared with the engine.
#[derive(Default)]
pub struct LoadCounters {
    pub bytes: AtomicU64,
    pub disk_bytes: AtomicU64,
    pub nanos: AtomicU64,
}

/// A load's completion: the event after its last copy (None for a mapped arena: the host wrote
/// it, and the job returned once done).
pub type Done<E> = Option<E>;

/// Whether a load has landed: its job ran and its last copy finished.
pub fn landed<E: DeviceEvent>(t: &Ticket<Done<E>>) -> bool {
    t.peek(|r| !matches!(r, Ok(Some(ev)) if !ev.is_complete()))
        .unwrap_or(false)
}

/// The loader thread's state.
pub struct Loader<C: ChunkCopier> {
    copier: C,
    map: Arc<Mmap>,
    /// Direct copies from the page-locked file (else staging, or mapped arenas).
    direct: bool,
    /// The emulated link paced on the host (staged and mapped loads), bytes per second, and when
    /// it has carried every chunk handed to it so far.
    pace: Option<f64>,
    link_free: Instant,
    disk: Option<Box<dyn BlobSource>>,
    counters: Arc<LoadCounters>,
    fill_pool: rayon::ThreadPool,
}

impl<C: ChunkCopier> Loader<C> {
    pub fn new(
        copier: C,
        map: Arc<Mmap>,
        direct: bool,
        (pace, disk): (Option<f64>, Option<Box<dyn BlobSource>>),
        counters: Arc<LoadCounters>,
    ) -> crate::Result<Self> {
        let fill_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(FILL_THREADS)
            .thread_name(|i| format!("hob-fill-{i}"))
            .build()
            .map_err(|e| Error::Loader(format!("cannot start the loader's copy threads: {e}")))?;
        Ok(Loader {
            copier,
            map,
            direct,
            // Direct copies are paced by the device itself.
            pace: pace.filter(|_| !direct),
            link_free: Instant::now(),
            disk,
            counters,
            fill_pool,
        })
    }
}

impl<C: ChunkCopier> Worker for Loader<C> {
    type Job = LoadJob<C::Event>;
    type Done = Done<C::Event>;

    fn chunks(&mut self, job: &Self::Job) -> usize {
        job.chunks()
    }

    fn run_chunk(&mut self, job: &Self::Job, i: usize) -> crate::Result<()> {
        if job
            .abort
            .as_ref()
            .is_some_and(|a| a.load(Ordering::Acquire))
        {
            return Err(Error::Cancelled("prefetch proven wrong"));
        }
        let started = Instant::now();
        if i == 0 {
            self.copier.after(&job.after, job.mapped)?;
        }
        let (src, dst) = job.chunk(i);
        let len = src.len();
        let mut paced = None;
        let (pool, map, disk, counters) =
            (&self.fill_pool, &self.map, &mut self.disk, &self.counters);
        let (pace, link_free) = (self.pace, &mut self.link_free);
        if job.mapped {
            // The emulated disk or link carries the chunk from when its read starts (the copy
            // out of the page cache stands in for that transfer, and overlaps it).
            let began = Instant::now();
            self.copier.fill_mapped(dst, len, &mut |buf| {
                fill(pool, map, disk, src.clone(), buf, counters)
            })?;
            pace_chunk(pace, link_free, len, Some(began));
        } else if self.direct {
            paced = self.copier.copy_direct(&self.map[src], dst)?;
        } else {
            // Filled while the previous chunk crosses, then across once the link is free (as a
            // card's DMA follows its staging copy).
            self.copier.copy_staged(dst, len, &mut |buf| {
                fill(pool, map, disk, src.clone(), buf, counters)?;
                pace_chunk(pace, link_free, len, None);
                Ok(())
            })?;
        }
        self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
        // Paced on the device: the link is busy for the chunk's crossing time.
        let busy = paced.unwrap_or_else(|| started.elapsed());
        self.counters
            .nanos
            .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn complete(&mut self, job: &Self::Job) -> crate::Result<Self::Done> {
        // The job is through the emulated link when its last chunk is.
        let waited = Instant::now();
        if self.pace.is_some() {
            sleep_until(self.link_free);
        }
        self.counters
            .nanos
            .fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if job.mapped {
            Ok(None)
        } else {
            self.copier.fence().map(Some)
        }
    }
}

/// Emulated link (a profile's pace): chunks cross it one after another at `pace` bytes/s;
/// interleaved jobs (a demand overtaking a prefetch) share it. `began`: when the chunk's
/// transfer was issued, where the fill is that transfer (a read into a mapped slot); else it
/// crosses once filled.
fn pace_chunk(pace: Option<f64>, link_free: &mut Instant, len: usize, began: Option<Instant>) {
    let Some(bw) = pace else {
        return;
    };
    sleep_until(*link_free);
    // A chunk that follows the previous one without a real gap crosses right behind it, so the
    // link keeps its rate (never faster than the link: the clock advances len / bw per chunk).
    let now = Instant::now();
    let start = match began {
        Some(b) => b.max(*link_free),
        None if now.saturating_duration_since(*link_free) < PACE_SLACK => *link_free,
        None => now,
    };
    *link_free = start + Duration::from_secs_f64(len as f64 / bw);
}

fn sleep_until(t: Instant) {
    if let Some(rest) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(rest);
    }
}

/// Bytes `src` of the file into `dst`: from the SSD when a reader is set, else copied out of the
/// mapped file by the fill threads.
fn fill(
    pool: &rayon::ThreadPool,
    map: &Mmap,
    disk: &mut Option<Box<dyn BlobSource>>,
    src: Range<usize>,
    dst: &mut [u8],
    counters: &LoadCounters,
) -> crate::Result<()> {
    match disk {
        Some(r) => {
            r.read_into(src.start as u64, dst)?;
            counters
                .disk_bytes
                .fetch_add(dst.len() as u64, Ordering::Relaxed);
        }
        None => pool.install(|| {
            dst.par_chunks_mut(1 << 20)
                .zip(map[src].par_chunks(1 << 20))
                .for_each(|(d, s)| d.copy_from_slice(s))
        }),
    }
    Ok(())
}
