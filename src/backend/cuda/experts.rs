//! The HOBBIT expert engine on a CUDA device.
//!
//! - Two pools of slots (high and low precision), carved once from the expert budget; which
//!   expert lives in which slot is decided by the precision-aware policy (experts::cache).
//! - Per token and layer the scorer (experts::scorer) picks high, low or skip for every routed
//!   expert; a high miss whose low copy is cached runs in low precision (unless disabled).
//! - Misses become load jobs for the loader thread (experts::scheduler): demand before
//!   prefetch, in 16 MiB chunks so a demand miss overtakes a prefetch in flight. Each job waits
//!   for the compute that still reads the slot's previous expert (an event), copies on its own
//!   stream (straight from the page-locked pages of the mapped file when they fit in RAM, else
//!   through pinned staging), and completes with an event the compute stream waits on.
//! - Stacked-gate prediction (experts::predictor) prefetches the first later layer with a
//!   predicted miss, in the precision the scorer would pick; predicted experts are protected
//!   from eviction until their layer has run. Protection is a count of holds (experts::cache):
//!   a prediction and each slot placement take one and release their own; after each layer
//!   none is left on its experts (checked: an error otherwise).
//! - Cooperative mode: a decode miss may instead be computed by CPU threads from host memory,
//!   chosen by a cost model (measured load time vs measured CPU time), overlapping GPU work.
//! - Slow tiers: the mmap (page cache) by default; the SSD (io_uring + O_DIRECT) when asked or
//!   on unified-memory platforms, where the slots themselves are mapped host memory (Jetson).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use memmap2::Mmap;
use rayon::prelude::*;

use super::{cuda_err, ptr, CudaBackend, DevMat, Gpu, QueuedRead, SlotArgs, SLOTS_MAX_K};
use crate::backend::cpu::{CpuBackend, FfnJob, PassStats};
use crate::experts::behind::LoadBehind;
use crate::experts::cache::{pool_slots, ExpertCache, Insertion, Policy, PoolKind};
use crate::experts::io::{open_reader, BlobSource};
use crate::experts::predictor::Predictor;
use crate::experts::scheduler::{Priority, Scheduler, Ticket, Worker};
use crate::experts::trace::TraceWriter;
use crate::experts::{Group, LayerPlan, Precision, PrecisionPlan};
use crate::format::variant::BLOB_ALIGN;
use crate::format::{ExpertLayout, HobFile};
use crate::model::ops::{ExpertExecutor, OnDevice, Route};
use crate::model::{ExpertReport, ExpertStats, VariantStats};
use crate::quant::Matrix;
use crate::Error;

/// Where a missed expert's bytes come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Tier {
    /// The mapped file (host RAM through the page cache).
    Memory,
    /// The SSD, read with io_uring + O_DIRECT (pread where unavailable).
    Disk,
}

/// The expert engine's configuration.
pub struct CacheConfig {
    /// Bytes for both pools (rounded down to whole slots); None: room for every expert.
    pub budget: Option<usize>,
    /// Pace loads to this many bytes per second (profile emulation).
    pub pace_bytes_per_s: Option<f64>,
    /// Fill the pools before the first token (layer order).
    pub preload: bool,
    pub plan: PrecisionPlan,
    pub policy: Policy,
    /// Share of the budget's bytes for the low-precision pool (when the plan has a low variant).
    pub low_share: f64,
    /// A high-precision miss whose low copy is cached runs in low precision (not the top-1).
    pub substitute_low: bool,
    /// A low-precision route whose high copy is cached runs in high precision (low precision
    /// is for misses; off only to compare against the CPU's fixed per-route choice).
    pub upgrade_low: bool,
    /// Layers predicted ahead for prefetching (0: off).
    pub prefetch: usize,
    /// Only predicted experts with at least this predicted gate weight are prefetched (0: all).
    pub prefetch_min_weight: f32,
    /// CPU threads computing missed experts (cooperative mode); None: off.
    pub cpu_experts: Option<usize>,
    /// Cooperative mode: a miss the CPU computes is also loaded into the cache, at prefetch
    /// priority, when the link is idle, so that the cache keeps following the routing (as it
    /// does without CPU experts) for later tokens that reuse the expert.
    pub load_behind: bool,
    pub tier: Tier,
    /// Slots in mapped pinned host memory, read by the GPU in place (unified-memory mode).
    pub mapped: bool,
    /// Memory tier, device slots: page-lock the used variants' pages of the mapped file so the
    /// copy engine reads them directly (no staging copy, no CPU thread); falls back to staging
    /// when they do not fit in half the RAM or the driver refuses.
    pub pin_file: bool,
    /// Cooperative mode: how much of a CPU-computed dense expert the GPU takes over.
    pub split: Split,
    /// Decode tokens route and compute on the device, with no host round trip per layer, once
    /// every expert is resident in one precision (exact plan, no CPU experts); off: every
    /// layer's routes come to the host (for A/B runs).
    pub device_routing: bool,
    /// A host-routed decode layer whose experts are all in cache slots of one pool runs them
    /// with the routed kernels (a table of those slots written on the stream: two or three
    /// launches instead of five per expert; the same sums). Off also with HOB_ROUTED_SLOTS=0.
    pub routed_slots: bool,
    pub trace: Option<TraceWriter>,
}

/// Cooperative decode: a missed dense (f16/bf16) expert that the CPU computes may be split with
/// the GPU. The GPU takes its last rows of gate and up and the matching columns of down, loaded
/// over the otherwise idle link (direct loads only) into a small arena carved from the expert
/// budget, while the CPU computes the leading rows; the two halves of the output are summed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Split {
    Off,
    /// The GPU's share per layer balances the link against the CPU (cost model), 0 to 50%.
    Auto,
    /// A fixed share of the rows (rounded to 64), for tests and ablations.
    Share(f64),
}

impl Split {
    /// `off`, `auto`, or a share in (0, 1).
    pub fn parse(s: &str) -> crate::Result<Split> {
        match s {
            "off" => Ok(Split::Off),
            "auto" => Ok(Split::Auto),
            _ => match s.parse::<f64>() {
                Ok(f) if f > 0.0 && f < 1.0 => Ok(Split::Share(f)),
                _ => Err(Error::Invalid(format!(
                    "--split-experts {s}: give auto, off, or the GPU's share of a split expert's rows (between 0 and 1)"
                ))),
            },
        }
    }
}

/// Rows of a split are whole multiples of this (keeps the GPU's rows 16-byte aligned).
const SPLIT_ROWS: usize = 64;
/// Auto splits give the GPU at least this many rows (fewer are not worth a load).
const SPLIT_MIN_ROWS: usize = 256;

impl CacheConfig {
    /// One variant, LRU, on-demand loads from memory: the plain cache.
    pub fn simple(variant: usize, budget: Option<usize>) -> CacheConfig {
        CacheConfig {
            budget,
            pace_bytes_per_s: None,
            preload: true,
            plan: PrecisionPlan::single(variant),
            policy: Policy::Lru,
            low_share: 0.0,
            substitute_low: false,
            upgrade_low: true,
            prefetch: 0,
            prefetch_min_weight: 0.0,
            cpu_experts: None,
            load_behind: true,
            tier: Tier::Memory,
            mapped: false,
            pin_file: true,
            split: Split::Off,
            device_routing: true,
            routed_slots: true,
            trace: None,
        }
    }
}

const STAGING_CHUNK: usize = 16 << 20;
const STAGING_BUFFERS: usize = 4;
/// Threads the loader copies out of the page cache with: enough to outrun a 25 GB/s link, the
/// other cores left to CPU experts.
const FILL_THREADS: usize = 8;

/// Slot memory of one pool.
enum Arena {
    Device(CudaSlice<u8>),
    /// Mapped pinned host memory: (host pointer, device pointer of the same bytes).
    Mapped(PinnedHostSlice<u8>, u64),
}

struct Pool {
    variant: usize,
    layout: ExpertLayout,
    slot_bytes: usize,
    arena: Arena,
    /// Per slot: the load that fills it, until the compute stream has been told to wait for it.
    /// In mapped mode a load is three jobs, one per matrix (gate, up, down; `pending` is the
    /// last), so a decode layer can start on a missed expert's first matrices while the rest
    /// land: `parts` holds the earlier ones' tickets, in order.
    pending: Vec<Option<Ticket<Option<CudaEvent>>>>,
    parts: Vec<Vec<Ticket<Option<CudaEvent>>>>,
    /// Per slot: filled by a prefetch and not used since.
    prefetched: Vec<bool>,
    /// Per slot with a prefetch pending: the flag that drops the rest of its load.
    abort: Vec<Option<Arc<AtomicBool>>>,
    /// Per slot with a pending load: when the engine expects it done (its link model).
    due: Vec<Option<Instant>>,
}

impl Pool {
    fn base(&self, gpu: &Gpu) -> u64 {
        match &self.arena {
            Arena::Device(a) => ptr(a, &gpu.stream),
            Arena::Mapped(_, d) => *d,
        }
    }
    fn host_base(&self) -> usize {
        match &self.arena {
            Arena::Device(_) => 0,
            Arena::Mapped(h, _) => h.as_ptr().map_or(0, |p| p as usize),
        }
    }
}

/// A rectangle of file bytes to copy: `rows` rows of `width` bytes, `pitch` apart in the file,
/// packed densely at `dst` (a whole blob is one row).
#[derive(Clone, Copy, Debug)]
struct Piece {
    src: usize,
    pitch: usize,
    width: usize,
    rows: usize,
    dst: u64,
}

impl Piece {
    fn blob(src: Range<usize>, dst: u64) -> Piece {
        Piece {
            src: src.start,
            pitch: src.len(),
            width: src.len(),
            rows: 1,
            dst,
        }
    }

    fn bytes(&self) -> usize {
        self.width * self.rows
    }

    fn rows_per_chunk(&self) -> usize {
        (STAGING_CHUNK / self.width.max(1)).max(1)
    }

    /// Chunks of at most STAGING_CHUNK bytes: byte ranges of one row, whole rows of a rectangle.
    fn chunks(&self) -> usize {
        if self.rows == 1 {
            self.width.div_ceil(STAGING_CHUNK)
        } else {
            self.rows.div_ceil(self.rows_per_chunk())
        }
    }

    /// Chunk `i`, as a piece of its own.
    fn chunk(&self, i: usize) -> Piece {
        if self.rows == 1 {
            let at = i * STAGING_CHUNK;
            let len = STAGING_CHUNK.min(self.width - at);
            Piece {
                src: self.src + at,
                pitch: len,
                width: len,
                rows: 1,
                dst: self.dst + at as u64,
            }
        } else {
            let k = self.rows_per_chunk();
            let r0 = i * k;
            Piece {
                src: self.src + r0 * self.pitch,
                pitch: self.pitch,
                width: self.width,
                rows: k.min(self.rows - r0),
                dst: self.dst + (r0 * self.width) as u64,
            }
        }
    }
}

/// One load: file bytes into a slot (a whole blob), or the rows of an expert split with the CPU.
struct LoadJob {
    /// Destinations: device addresses (device arena), or host addresses (mapped arena).
    pieces: Vec<Piece>,
    mapped: bool,
    /// Compute that may still read the destination's previous contents.
    after: CudaEvent,
    /// Set by the engine to drop the rest of a prefetch proven wrong: the job's next chunk
    /// fails it with [`Error::Cancelled`] instead of running.
    abort: Option<Arc<AtomicBool>>,
}

impl LoadJob {
    /// Chunk `i` of the job.
    fn chunk(&self, mut i: usize) -> Option<Piece> {
        for p in &self.pieces {
            let n = p.chunks();
            if i < n {
                return Some(p.chunk(i));
            }
            i -= n;
        }
        None
    }
}

/// Bytes and time the loader has spent, shared with the compute thread.
#[derive(Default)]
struct LoadCounters {
    bytes: AtomicU64,
    disk_bytes: AtomicU64,
    nanos: AtomicU64,
}

/// The loader thread's state.
struct Loader {
    ctx: Arc<CudaContext>,
    bound: bool,
    map: Arc<Mmap>,
    copy: Arc<CudaStream>,
    staging: Vec<(PinnedHostSlice<u8>, Option<CudaEvent>)>,
    next: usize,
    pace: Option<f64>,
    /// When the emulated (paced) link has carried every chunk handed to it so far.
    link_free: Instant,
    disk: Option<Box<dyn BlobSource>>,
    counters: Arc<LoadCounters>,
    /// Threads copying out of the mapped file: a few are enough to outrun any link, and they
    /// leave the other cores to CPU experts.
    fill_pool: rayon::ThreadPool,
    /// Direct loads: chunks copied by the copy engine straight out of the page-locked file, and
    /// the events of those still in flight (oldest first; bounded like the staging buffers, so
    /// a demand job is never queued behind more than that of a prefetch).
    pinned: Option<PinnedFile>,
    in_flight: std::collections::VecDeque<CudaEvent>,
    /// Direct loads under a profile's pace: paced on the copy stream.
    link: Option<LinkClock>,
}

/// Lateness of a paced chunk still counted as back to back with the previous one (sleep
/// overshoot, not an idle link).
const PACE_SLACK: Duration = Duration::from_micros(500);

/// Chunks a direct load keeps queued on the copy stream: with the link paced on the GPU, enough
/// to keep it busy while the loader thread waits for a core (~2.5 ms at 25 GB/s).
const DIRECT_IN_FLIGHT: usize = 4;

/// A load has landed: its job ran and its last copy (with its pacing) finished on the GPU.
fn landed(t: &Ticket<Option<CudaEvent>>) -> bool {
    t.peek(|r| !matches!(r, Ok(Some(ev)) if !ev.is_complete()))
        .unwrap_or(false)
}

/// The emulated link paced on the copy stream itself (kernels link_start / link_wait): a
/// chunk's copy holds the stream for its bytes at the profile's rate.
struct LinkClock {
    clock: CudaSlice<u64>,
    start: cudarc::driver::CudaFunction,
    wait: cudarc::driver::CudaFunction,
    bytes_per_s: f64,
}

impl LinkClock {
    fn launch(
        &self,
        stream: &CudaStream,
        f: &cudarc::driver::CudaFunction,
        ns: Option<u64>,
    ) -> crate::Result<()> {
        use cudarc::driver::{DevicePtr, PushKernelArg};
        let clk = self.clock.device_ptr(stream).0;
        let mut b = stream.launch_builder(f);
        b.arg(&clk);
        if let Some(ns) = &ns {
            b.arg(ns);
        }
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: link_start(u64*) and link_wait(const u64*, u64) take the clock (one live
        // device u64 of this struct) and, for link_wait, a duration.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda_err)
    }

    /// The next chunk starts crossing now.
    fn start(&self, stream: &CudaStream) -> crate::Result<()> {
        self.launch(stream, &self.start, None)
    }

    /// Hold the stream until a chunk of `len` bytes has crossed; returns that time.
    fn wait(&self, stream: &CudaStream, len: usize) -> crate::Result<Duration> {
        let d = Duration::from_secs_f64(len as f64 / self.bytes_per_s);
        self.launch(stream, &self.wait, Some(d.as_nanos() as u64))?;
        Ok(d)
    }
}

/// An event the host sleeps on: waits for loads may overlap CPU experts, and a spinning wait
/// would take a core from them. (Stream syncs keep CUDA's default spin: they come where the
/// CPU experts are idle, routing and their input and output, and spinning answers sooner.)
fn blocking_event(stream: &CudaStream) -> crate::Result<CudaEvent> {
    use cudarc::driver::sys::CUevent_flags;
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
        .map_err(cuda_err)
}

/// The expert pages of the mapped file, page-locked for the copy engine (a read-only
/// registration): a load goes from the page cache to the device by DMA, with no staging copy
/// and no CPU thread, so it takes nothing from CPU experts but host memory bandwidth.
struct PinnedFile {
    ctx: Arc<CudaContext>,
    /// Registered (address, length) ranges of `_map`, which stays mapped while they are.
    ranges: Vec<(usize, usize)>,
    _map: Arc<Mmap>,
}

impl PinnedFile {
    /// Register `ranges` of `map` (widened to whole pages, merged where they touch). Err: why
    /// not, after undoing whatever part was registered.
    fn register(
        ctx: &Arc<CudaContext>,
        map: Arc<Mmap>,
        mut ranges: Vec<Range<usize>>,
    ) -> Result<PinnedFile, String> {
        let page = page_size();
        let end = map.len().div_ceil(page) * page;
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::new();
        for r in ranges {
            let r = r.start / page * page..(r.end.div_ceil(page) * page).min(end);
            match merged.last_mut() {
                Some(m) if r.start <= m.end => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        ctx.bind_to_thread().map_err(|e| e.to_string())?;
        let mut me = PinnedFile {
            ctx: ctx.clone(),
            ranges: Vec::new(),
            _map: map.clone(),
        };
        let base = map.as_ptr() as usize;
        for r in merged {
            let at = base + r.start;
            // SAFETY: at .. at + len lies inside the live mapping `map` (whole pages of it; `me`
            // holds the mapping for as long as the registration lives), registered
            // read-only: the device only ever reads it.
            let res = unsafe {
                cudarc::driver::sys::cuMemHostRegister_v2(
                    at as *mut std::ffi::c_void,
                    r.len(),
                    cudarc::driver::sys::CU_MEMHOSTREGISTER_READ_ONLY,
                )
            }
            .result();
            if let Err(e) = res {
                return Err(format!(
                    "page-locking {:.1} MB at file offset {}: {e}",
                    r.len() as f64 / 1e6,
                    r.start
                ));
            }
            me.ranges.push((at, r.len()));
        }
        Ok(me)
    }

    fn bytes(&self) -> usize {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

impl Drop for PinnedFile {
    fn drop(&mut self) {
        if self.ranges.is_empty() {
            return;
        }
        // Copies out of these pages must be over before they are unlocked.
        if let Err(e) = self.ctx.synchronize() {
            log::warn!("expert loader: {e}");
        }
        for &(at, _) in &self.ranges {
            // SAFETY: `at` was registered by register() and has not been unregistered since.
            let res =
                unsafe { cudarc::driver::sys::cuMemHostUnregister(at as *mut std::ffi::c_void) };
            if let Err(e) = res.result() {
                log::warn!("expert loader: unlocking file pages: {e}");
            }
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running system; no memory is passed.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(4096)
}

impl Worker for Loader {
    type Job = LoadJob;
    type Done = Option<CudaEvent>;

    fn chunks(&mut self, job: &LoadJob) -> usize {
        job.pieces.iter().map(Piece::chunks).sum()
    }

    fn run_chunk(&mut self, job: &LoadJob, i: usize) -> crate::Result<()> {
        if job
            .abort
            .as_ref()
            .is_some_and(|a| a.load(Ordering::Acquire))
        {
            return Err(Error::Cancelled("prefetch proven wrong"));
        }
        if !self.bound {
            self.ctx.bind_to_thread().map_err(cuda_err)?;
            self.bound = true;
        }
        let chunk_start = Instant::now();
        if i == 0 {
            if job.mapped {
                job.after.synchronize().map_err(cuda_err)?;
            } else {
                self.copy.wait(&job.after).map_err(cuda_err)?;
            }
        }
        let c = job
            .chunk(i)
            .ok_or_else(|| Error::Loader(format!("load job has no chunk {i}")))?;
        let len = c.bytes();
        let src = c.src..c.src + len;
        let mut paced = None;
        if c.rows > 1 && (job.mapped || self.pinned.is_none()) {
            return Err(Error::Loader(
                "a strided load needs the page-locked file (direct loads)".into(),
            ));
        }
        if job.mapped {
            // SAFETY: dst .. + len lies inside one slot of a live mapped arena (the engine
            // outlives the loader: it shuts the scheduler down before freeing the arena), and
            // no kernel reads the slot now (the job waited for `after`, and the slot's next
            // reader waits for this job).
            let dst = unsafe { std::slice::from_raw_parts_mut(c.dst as usize as *mut u8, len) };
            // The emulated disk or link carries the chunk from when its read starts (the copy
            // out of the page cache stands in for that transfer, and overlaps it).
            let began = Instant::now();
            self.fill(src, dst)?;
            Self::pace_chunk(self.pace, &mut self.link_free, len, Some(began));
        } else if self.pinned.is_some() {
            if self.in_flight.len() >= DIRECT_IN_FLIGHT {
                if let Some(ev) = self.in_flight.pop_front() {
                    ev.synchronize().map_err(cuda_err)?;
                }
            }
            match &self.link {
                Some(l) => l.start(&self.copy)?,
                None => Self::pace_chunk(self.pace, &mut self.link_free, len, None),
            }
            if c.rows == 1 {
                // SAFETY: dst .. + len lies inside the job's destination in the device arena;
                // the source lies in page-locked pages of the mapping the loader holds.
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(
                        c.dst,
                        &self.map[src],
                        self.copy.cu_stream(),
                    )
                    .map_err(cuda_err)?;
                }
            } else {
                let last = c.src + (c.rows - 1) * c.pitch + c.width;
                if last > self.map.len() {
                    return Err(Error::Loader(format!(
                        "strided load past the end of the file ({last} > {})",
                        self.map.len()
                    )));
                }
                let copy = cudarc::driver::sys::CUDA_MEMCPY2D_st {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                    srcHost: self.map[c.src..].as_ptr() as *const std::ffi::c_void,
                    srcDevice: 0,
                    srcArray: std::ptr::null_mut(),
                    srcPitch: c.pitch,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: c.dst,
                    dstArray: std::ptr::null_mut(),
                    dstPitch: c.width,
                    WidthInBytes: c.width,
                    Height: c.rows,
                };
                // SAFETY: the source rows lie inside the mapping (checked above), in its
                // page-locked pages; the destination, rows x width bytes packed, lies inside the
                // job's region of the device arena, which no kernel reads until this job is done.
                unsafe {
                    cudarc::driver::sys::cuMemcpy2DAsync_v2(&copy, self.copy.cu_stream())
                        .result()
                        .map_err(cuda_err)?;
                }
            }
            if let Some(l) = &self.link {
                paced = Some(l.wait(&self.copy, len)?);
            }
            self.in_flight.push_back(blocking_event(&self.copy)?);
        } else {
            let (host, done) = &mut self.staging[self.next];
            self.next = (self.next + 1) % STAGING_BUFFERS;
            if let Some(ev) = done.take() {
                ev.synchronize().map_err(cuda_err)?;
            }
            let host = &mut host.as_mut_slice().map_err(cuda_err)?[..len];
            let (map, disk) = (&self.map, &mut self.disk);
            Self::fill_from(&self.fill_pool, map, disk, src, host, &self.counters)?;
            Self::pace_chunk(self.pace, &mut self.link_free, len, None);
            // SAFETY: dst .. + len lies inside the job's slot of the device arena; the staging
            // buffer is not written again before `done` is reached.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(c.dst, &*host, self.copy.cu_stream())
                    .map_err(cuda_err)?;
            }
            *done = Some(blocking_event(&self.copy)?);
        }
        self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
        // Paced on the GPU: the link is busy for the chunk's crossing time.
        let busy = paced.unwrap_or_else(|| chunk_start.elapsed());
        self.counters
            .nanos
            .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn complete(&mut self, job: &LoadJob) -> crate::Result<Option<CudaEvent>> {
        // The job is through the emulated link when its last chunk is.
        let waited = Instant::now();
        self.wait_for_link();
        self.counters
            .nanos
            .fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let done = if job.mapped {
            None
        } else {
            Some(blocking_event(&self.copy)?)
        };
        Ok(done)
    }
}

impl Loader {
    /// Emulated link (a profile's pace): chunks cross it one after another at `pace` bytes/s.
    /// A chunk is filled on the host while the previous one is crossing (as staging overlaps
    /// DMA on a real card), then waits for the link and takes it for len / pace seconds.
    /// Interleaved jobs (a demand overtaking a prefetch) share the one link. `began`: when the
    /// chunk's transfer was issued, where the fill is that transfer (mapped mode: a read into
    /// the slot itself); else it crosses once filled (staging, as a real card's copy follows
    /// its staging copy).
    fn pace_chunk(pace: Option<f64>, link_free: &mut Instant, len: usize, began: Option<Instant>) {
        if let Some(bw) = pace {
            Self::sleep_until(*link_free);
            // A sleep overshoots by tens of microseconds; a chunk that follows the previous one
            // without a real gap crosses right behind it, so the link keeps its rate (the
            // clock still advances len / bw per chunk: never faster than the link).
            let now = Instant::now();
            let start = match began {
                Some(b) => b.max(*link_free),
                None if now.saturating_duration_since(*link_free) < PACE_SLACK => *link_free,
                None => now,
            };
            *link_free = start + Duration::from_secs_f64(len as f64 / bw);
        }
    }

    /// Sleep until the emulated link has carried every chunk so far.
    fn wait_for_link(&self) {
        if self.pace.is_some() {
            Self::sleep_until(self.link_free);
        }
    }

    fn sleep_until(t: Instant) {
        if let Some(rest) = t.checked_duration_since(Instant::now()) {
            std::thread::sleep(rest);
        }
    }

    fn fill(&mut self, src: Range<usize>, dst: &mut [u8]) -> crate::Result<()> {
        Self::fill_from(
            &self.fill_pool,
            &self.map,
            &mut self.disk,
            src,
            dst,
            &self.counters,
        )
    }

    /// Bytes `src` of the file into `dst`: from the SSD when a reader is set, else copied out of
    /// the mapped file by several threads.
    fn fill_from(
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
}

/// Bytes of the experts of `variants` in the file.
fn used_bytes(file: &HobFile, variants: &[usize]) -> usize {
    let n = file.n_layers() * file.n_experts();
    variants
        .iter()
        .map(|&v| n * file.expert_layout(v).size)
        .sum()
}

/// File ranges of every expert blob of `variants`.
fn used_ranges(file: &HobFile, variants: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for l in 0..file.n_layers() {
        for e in 0..file.n_experts() {
            out.extend(variants.iter().map(|&v| file.blob_range(l, e, v, false)));
        }
    }
    out
}

/// The host's RAM in bytes (0 when /proc/meminfo cannot be read).
fn host_ram() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Whether the experts of `variants` fit in half the host's RAM (what page-locking or mapping
/// them ahead may take); when not, logs `not` with the sizes.
fn fit_in_half_ram(file: &HobFile, variants: &[usize], not: &str) -> bool {
    let (bytes, ram) = (used_bytes(file, variants), host_ram());
    let fits = bytes <= ram / 2;
    if !fits {
        log::info!(
            "{not}: {:.1} GB of experts, {:.1} GB of RAM",
            bytes as f64 / 1e9,
            ram as f64 / 1e9
        );
    }
    fits
}

/// Page-lock the experts of `variants` for direct loads when they fit in half the RAM; None
/// (logged) otherwise: loads go through staging.
fn pin_file(gpu: &Gpu, file: &HobFile, variants: &[usize]) -> Option<PinnedFile> {
    if !fit_in_half_ram(file, variants, "expert loads go through staging") {
        return None;
    }
    let started = Instant::now();
    match PinnedFile::register(&gpu.ctx, file.shared_map(), used_ranges(file, variants)) {
        Ok(p) => {
            log::info!(
                "page-locked {:.1} GB of expert pages for direct loads in {:.1} s",
                p.bytes() as f64 / 1e9,
                started.elapsed().as_secs_f64()
            );
            Some(p)
        }
        Err(why) => {
            log::warn!("expert loads go through staging: {why}");
            None
        }
    }
}

/// Map the pages of the experts in `variants` up front, when they fit in half the host's RAM:
/// the loader copies missed experts out of the mapped file and CPU experts compute from it, and
/// the first touch of each 4 KiB page costs a fault (~86,000 for one f16 Mixtral expert), which
/// would otherwise land in the middle of decoding. Best effort: logs and goes on when the
/// kernel lacks MADV_POPULATE_READ (Linux < 5.14).
fn populate(file: &HobFile, variants: &[usize]) {
    if !fit_in_half_ram(file, variants, "not mapping expert pages ahead") {
        return;
    }
    let started = Instant::now();
    let map = file.shared_map();
    for r in used_ranges(file, variants) {
        if let Err(err) = map.advise_range(memmap2::Advice::PopulateRead, r.start, r.len()) {
            log::warn!("cannot map expert pages ahead (madvise POPULATE_READ): {err}");
            return;
        }
    }
    log::info!(
        "mapped {:.1} GB of expert pages in {:.1} s",
        used_bytes(file, variants) as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
}

/// Where one group of a layer runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    /// Slot of a pool.
    Slot(PoolKind, usize),
    /// CPU helper threads.
    Cpu,
}

/// Moving averages the cooperative mode decides with.
#[derive(Default)]
struct CostModel {
    /// Seconds per CPU-computed expert, per variant (measured once at start, then refreshed by
    /// every CPU expert).
    cpu_s: Vec<Option<f64>>,
    /// Per variant: misses sent to the link since the CPU last computed one. A slow sample
    /// would otherwise keep a variant off the CPU for good (it is only refreshed there).
    since_cpu: Vec<u32>,
}

/// A variant's misses sent to the link in a row before one goes to the CPU to re-measure it.
const CPU_PROBE_EVERY: u32 = 8;

pub struct CudaExperts<'f> {
    file: &'f HobFile,
    gpu: Arc<Gpu>,
    plan: PrecisionPlan,
    cache: ExpertCache,
    pools: [Option<Pool>; 2],
    loader: Option<Scheduler<Loader>>,
    counters: Arc<LoadCounters>,
    substitute_low: bool,
    upgrade_low: bool,
    predictor: Option<(Predictor, CudaSlice<u8>, CudaSlice<f32>)>,
    /// Keys protected for a predicted layer: protected[layer].
    protected: Vec<Vec<(PoolKind, (usize, usize))>>,
    cpu: Option<(Arc<CpuBackend>, CostModel)>,
    trace: Option<TraceWriter>,
    pace: Option<f64>,
    tier: Tier,
    mapped: bool,
    layer_plan: LayerPlan,
    /// Work buffers, sized for `cap_t` tokens.
    cap_t: usize,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    down: CudaSlice<f32>,
    xs: CudaSlice<f32>,
    idx: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    host_x: Vec<f32>,
    // Counters since the last reset.
    hits: Vec<u64>,
    misses: Vec<u64>,
    skipped: u64,
    substituted: u64,
    cpu_computed: u64,
    prefetch_issued: u64,
    prefetch_used: u64,
    /// Prefetches dropped while loading because their layer did not route their expert, and
    /// whether that is done (off with HOB_PREFETCH_CANCEL=0).
    prefetch_cancelled: u64,
    cancel_wrong: bool,
    /// CacheConfig::prefetch_min_weight.
    prefetch_min_weight: f32,
    wait: Duration,
    /// Loads the compute stream waits for on the GPU (no CPU experts: the host does not wait):
    /// (an event where the stream reached the wait, the load's last event), timed once both
    /// have completed and added to `wait`.
    gpu_waits: Vec<(CudaEvent, CudaEvent)>,
    cpu_wait: Duration,
    /// Cooperative decode: the CPU helpers' idle time between two consecutive layers' jobs of
    /// one token, in the parts of `ExpertStats::cpu_gaps`; and the last layer with background
    /// CPU jobs: (layer, when its CPU work ended, when the layer returned).
    cpu_gaps: [Duration; 4],
    /// The helpers' pass counters at the last reset.
    pass_base: PassStats,
    cpu_mark: Option<(usize, Instant, Instant)>,
    /// Loader counters (bytes, disk bytes, nanoseconds) at the last reset.
    base_bytes: (u64, u64, u64),
    /// Seconds CPU helpers spent on experts since the last reset.
    cpu_busy: f64,
    decoded: u64,
    /// When the loader is expected to have finished everything queued so far.
    link_due: Instant,
    /// Decode: moving average of the seconds between the starts of consecutive layers, and
    /// when the last layer started.
    layer_s: Option<f64>,
    layer_started: Option<(usize, Instant)>,
    /// Cooperative decode: experts whose load was still in flight, computed by the CPU.
    late_to_cpu: u64,
    /// CacheConfig::load_behind, whether it pays on this routing, and the loads it queued.
    load_behind: bool,
    behind: LoadBehind,
    loaded_behind: u64,
    behind_chances: u64,
    /// Bytes of the experts the CPU computed (it streams them from host memory).
    cpu_bytes: u64,
    /// The loader copies straight out of the page-locked file (no staging).
    direct_loads: bool,
    split: Split,
    /// Device memory for the GPU's rows of split experts (one layer's worth at a time).
    split_arena: Option<CudaSlice<u8>>,
    /// Experts split with the GPU, and the bytes of their rows it loaded.
    split_experts: u64,
    split_bytes: u64,
    top_k: usize,
    /// Device-routed decode: allowed by the configuration (exact plan, one pool holding every
    /// expert, no CPU experts), its tables once every expert has landed, and whether the
    /// current token takes it (decided at layer 0).
    device_allowed: bool,
    device: Option<DeviceRouting>,
    device_token: bool,
    /// The routes of a device-routed token wait to be read back (end_forward).
    device_pending: bool,
    /// The last device-routed token's routes are queued for reading (end_forward) and not yet
    /// counted (after_forward).
    routes_queued: bool,
    /// The last device-routed token's routes are read back and checked but not yet counted
    /// (account_device; count_held counts them).
    routes_held: bool,
    /// Decode tokens that took the device-routed path.
    device_tokens: u64,
    /// Host time spent counting device-routed tokens' routes once they arrived (account_device).
    device_account: Duration,
    /// Host-routed decode layers through the routed kernels (CacheConfig::routed_slots): whether
    /// allowed, each pool's matrices suit them (decided on first use), their buffers, and how
    /// many layers took them.
    routed_slots: bool,
    slot_kinds: [Option<bool>; 2],
    slot_work: Option<SlotWork>,
    slot_layers: u64,
    /// Decode layers (without CPU helpers) whose loads were pending while cached experts were
    /// computed first (early_layer; off with HOB_HITS_FIRST=0), and how many there were.
    hits_first: bool,
    early_layers: u64,
    /// A replayed routing's predictions for the layer about to run (replayed_predictions): the
    /// prefetch takes them instead of the stacked gates' product.
    replayed_pred: Option<Vec<(usize, Vec<Route>)>>,
    /// Prefill experts of int4 g64 through expert_ffn_q4h (off with HOB_EXPERT_Q4H=0: the
    /// per-matrix products, for A/B runs).
    ffn_q4h: bool,
}

/// Buffers of host-routed decode layers computed by the routed kernels: the table and routes
/// `put_slots` writes, the gate/up products ([2k, ffn]) and the down outputs ([k, hidden]).
struct SlotWork {
    tab: CudaSlice<u8>,
    routes: CudaSlice<f32>,
    work: CudaSlice<f32>,
}

/// Decode with routing on the device (every expert resident in the high pool).
struct DeviceRouting {
    /// [layers][experts][gate, up, down] matrices in their slots.
    table: CudaSlice<DevMat>,
    /// Per layer: the token's k expert indices then their k weights (Gpu::route).
    routes: CudaSlice<f32>,
    /// gate and up of the k experts ([2k, ffn]), then their down outputs ([k, hidden]; also
    /// room for router logits).
    work: CudaSlice<f32>,
    /// One expert's gate and down matrices (shape and kind of every expert's).
    gate: DevMat,
    down: DevMat,
    host: Vec<f32>,
    /// Where the routes of a token land without a wait of their own (queued in end_forward,
    /// counted in after_forward, once the logits' read has waited for the device); None with
    /// HOB_ROUTES_QUEUED=0 (the A/B switch: a read and a wait of their own).
    read: Option<QueuedRead>,
}

/// The GPU's part of a split expert: its rows loaded at `at` in the split arena.
struct SplitJob {
    expert: usize,
    variant: usize,
    weight: f32,
    /// First row (of ffn) the GPU computes; the CPU computes the rows before it.
    from: usize,
    /// Device addresses of its gate rows, up rows and down columns (packed [hidden, rows]).
    at: [u64; 3],
    ticket: Ticket<Option<CudaEvent>>,
}

/// A decode expert the CPU helpers compute: its leading `rows` rows of ffn (all of them unless
/// split with the GPU).
#[derive(Clone, Copy, Debug)]
struct CpuJob {
    expert: usize,
    variant: usize,
    weight: f32,
    rows: usize,
}

/// What the CPU helpers report per job: (variant, seconds, share of the expert's rows).
type CpuTimes = Vec<(usize, f64, f64)>;

fn align256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

impl<'f> CudaExperts<'f> {
    pub fn new(
        model: &crate::model::Model<'f>,
        backend: &CudaBackend,
        mut cfg: CacheConfig,
    ) -> crate::Result<Self> {
        let file: &'f HobFile = model.file;
        let gpu = backend.gpu().clone();
        let mut plan = cfg.plan.clone();
        if plan.is_exact() {
            // All high: a low pool would never be used, and substitution would change results.
            plan.low = None;
            cfg.substitute_low = false;
        }
        let (n_layers, n_experts) = (file.n_layers(), file.n_experts());
        let total = n_layers * n_experts;
        let (hidden, ffn) = file.expert_dims();
        let high_bytes = file.expert_layout(plan.high).padded_size;
        let low_bytes = plan.low.map(|l| file.expert_layout(l).padded_size);
        let work = (2 * ffn + 2 * hidden) * 4;
        let (free, _) = gpu.mem_info()?;
        let reserve = 256 << 20; // cuBLAS workspace, staging events, fragmentation
        let budget = match cfg.budget {
            Some(b) => b,
            None if cfg.mapped => total * (high_bytes + low_bytes.unwrap_or(0)),
            None => free.saturating_sub(reserve + work),
        };
        let used: Vec<usize> = std::iter::once(plan.high).chain(plan.low).collect();
        let pinned = if cfg.tier == Tier::Memory && !cfg.mapped && cfg.pin_file {
            pin_file(&gpu, file, &used)
        } else {
            None
        };
        // Split experts: an arena of one high expert, out of the budget.
        let split_bytes = if cfg.cpu_experts.is_some()
            && cfg.split != Split::Off
            && pinned.is_some()
            && file.variants()[plan.high].kind.is_float()
            && budget >= 2 * high_bytes
        {
            high_bytes
        } else {
            0
        };
        let budget = budget - split_bytes;
        let (mut high_slots, mut low_slots) = match low_bytes {
            Some(lb) => pool_slots(budget as u64, high_bytes as u64, lb as u64, cfg.low_share),
            None => (budget / high_bytes, 0),
        };
        high_slots = high_slots.min(total);
        low_slots = low_slots.min(total);
        if high_slots < 1 {
            return Err(Error::Invalid(format!(
                "CUDA: the expert cache needs at least one {} slot of {:.1} MiB; the budget allows none ({:.1} MiB free on {})",
                file.variants()[plan.high],
                high_bytes as f64 / (1 << 20) as f64,
                free as f64 / (1 << 20) as f64,
                gpu.name
            )));
        }
        let arena_bytes = high_slots * high_bytes + low_slots * low_bytes.unwrap_or(0);
        if !cfg.mapped && arena_bytes + reserve > free {
            return Err(Error::Invalid(format!(
                "CUDA: an expert cache of {high_slots} + {low_slots} slots ({:.2} GiB) does not fit in the {:.2} GiB free on {}; lower --expert-cache",
                arena_bytes as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64,
                gpu.name
            )));
        }
        let make_pool = |variant: usize, slots: usize| -> crate::Result<Option<Pool>> {
            if slots == 0 {
                return Ok(None);
            }
            let layout = file.expert_layout(variant).clone();
            let slot_bytes = layout.padded_size;
            let arena = if cfg.mapped {
                // SAFETY: page-locked host memory mapped into the device's address space; the
                // CPU writes it only from the loader (into slots no kernel is reading) and
                // never reads it.
                let host = unsafe {
                    gpu.ctx.alloc_pinned_with_flags::<u8>(
                        slots * slot_bytes,
                        cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP,
                    )
                }
                .map_err(cuda_err)?;
                let hp = host.as_ptr().map_err(cuda_err)? as *mut std::ffi::c_void;
                let mut dptr = 0u64;
                // SAFETY: hp is the start of a live DEVICEMAP allocation.
                unsafe {
                    cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dptr, hp, 0)
                        .result()
                        .map_err(cuda_err)?;
                }
                Arena::Mapped(host, dptr)
            } else {
                Arena::Device(gpu.alloc::<u8>(slots * slot_bytes, "the expert cache")?)
            };
            Ok(Some(Pool {
                variant,
                layout,
                slot_bytes,
                arena,
                pending: (0..slots).map(|_| None).collect(),
                parts: (0..slots).map(|_| Vec::new()).collect(),
                prefetched: vec![false; slots],
                abort: (0..slots).map(|_| None).collect(),
                due: vec![None; slots],
            }))
        };
        let pools = [
            make_pool(plan.high, high_slots)?,
            match plan.low {
                Some(l) => make_pool(l, low_slots)?,
                None => None,
            },
        ];
        let copy = gpu.ctx.new_stream().map_err(cuda_err)?;
        let staging = (0..if cfg.mapped { 0 } else { STAGING_BUFFERS })
            .map(|_| {
                // SAFETY: write-combined pinned memory, only ever written by the CPU (copied into
                // from the mmap or the SSD) and read by the copy engine.
                let host =
                    unsafe { gpu.ctx.alloc_pinned::<u8>(STAGING_CHUNK) }.map_err(cuda_err)?;
                Ok((host, None))
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let disk = match cfg.tier {
            Tier::Disk => {
                let r = open_reader(file.path(), true)?;
                log::info!("expert loads read {} from the SSD", file.path().display());
                Some(r)
            }
            Tier::Memory => None,
        };
        if cfg.tier == Tier::Memory && pinned.is_none() {
            populate(file, &used);
        }
        let direct_loads = pinned.is_some();
        let link = match (cfg.pace_bytes_per_s, direct_loads) {
            (Some(bytes_per_s), true) => Some(LinkClock {
                clock: gpu.alloc::<u64>(1, "the link clock")?,
                start: gpu.kernels.link_start.clone(),
                wait: gpu.kernels.link_wait.clone(),
                bytes_per_s,
            }),
            _ => None,
        };
        let split_arena = if split_bytes > 0 {
            Some(gpu.alloc::<u8>(split_bytes, "split experts")?)
        } else {
            None
        };
        let counters = Arc::new(LoadCounters::default());
        let loader = Scheduler::spawn(Loader {
            ctx: gpu.ctx.clone(),
            bound: false,
            map: file.shared_map(),
            copy,
            staging,
            next: 0,
            pace: cfg.pace_bytes_per_s,
            link_free: Instant::now(),
            disk,
            fill_pool: rayon::ThreadPoolBuilder::new()
                .num_threads(FILL_THREADS)
                .thread_name(|i| format!("hob-fill-{i}"))
                .build()
                .map_err(|e| {
                    Error::Loader(format!("cannot start the loader's copy threads: {e}"))
                })?,
            counters: counters.clone(),
            pinned,
            in_flight: std::collections::VecDeque::new(),
            link,
        })?;
        let predictor = if cfg.prefetch > 0 && n_layers > 1 {
            let routers: Vec<Matrix<'_>> =
                model.weights().layers.iter().map(|l| l.router).collect();
            let p = Predictor::new(&routers, cfg.prefetch, model.cfg.top_k)?;
            let stacked = gpu.alloc::<u8>(
                (cfg.prefetch * n_experts * hidden * 4) * n_layers,
                "stacked gates",
            )?;
            for l in 0..n_layers {
                if let Some(m) = p.stacked(l) {
                    let dst = ptr(&stacked, &gpu.stream)
                        + (l * cfg.prefetch * n_experts * hidden * 4) as u64;
                    // SAFETY: dst addresses layer l's region of `stacked`, sized for `prefetch`
                    // routers; the copy is synchronous (the stream is synchronized below).
                    unsafe {
                        cudarc::driver::result::memcpy_htod_async(
                            dst,
                            m.codes,
                            gpu.stream.cu_stream(),
                        )
                        .map_err(cuda_err)?;
                    }
                    gpu.sync()?;
                }
            }
            let logits = gpu.alloc::<f32>(cfg.prefetch * n_experts, "stacked gate logits")?;
            Some((p, stacked, logits))
        } else {
            None
        };
        let cpu = match cfg.cpu_experts {
            Some(threads) => Some((
                Arc::new(CpuBackend::new(threads)?),
                CostModel {
                    cpu_s: vec![None; file.variants().len()],
                    since_cpu: vec![0; file.variants().len()],
                },
            )),
            None => None,
        };
        let nv = file.variants().len();
        let mut me = CudaExperts {
            file,
            plan,
            cache: ExpertCache::new(cfg.policy, n_layers, n_experts, high_slots, low_slots),
            pools,
            loader: Some(loader),
            counters,
            substitute_low: cfg.substitute_low,
            upgrade_low: cfg.upgrade_low,
            predictor,
            protected: vec![Vec::new(); n_layers],
            cpu,
            trace: cfg.trace.take(),
            pace: cfg.pace_bytes_per_s,
            tier: cfg.tier.clone(),
            mapped: cfg.mapped,
            layer_plan: LayerPlan::default(),
            cap_t: 1,
            gate: gpu.alloc(ffn, "expert activations")?,
            up: gpu.alloc(ffn, "expert activations")?,
            down: gpu.alloc(hidden, "expert activations")?,
            xs: gpu.alloc(hidden, "expert activations")?,
            idx: gpu.alloc(1, "expert routes")?,
            wts: gpu.alloc(1, "expert routes")?,
            host_x: vec![0.0; hidden],
            gpu,
            hits: vec![0; nv],
            misses: vec![0; nv],
            skipped: 0,
            substituted: 0,
            cpu_computed: 0,
            prefetch_issued: 0,
            prefetch_used: 0,
            prefetch_cancelled: 0,
            prefetch_min_weight: cfg.prefetch_min_weight,
            cancel_wrong: std::env::var("HOB_PREFETCH_CANCEL").as_deref() != Ok("0"),
            wait: Duration::ZERO,
            gpu_waits: Vec::new(),
            cpu_wait: Duration::ZERO,
            cpu_gaps: [Duration::ZERO; 4],
            pass_base: PassStats::default(),
            cpu_mark: None,
            base_bytes: (0, 0, 0),
            cpu_busy: 0.0,
            decoded: 0,
            link_due: Instant::now(),
            layer_s: None,
            layer_started: None,
            late_to_cpu: 0,
            load_behind: cfg.load_behind,
            behind: LoadBehind::default(),
            loaded_behind: 0,
            behind_chances: 0,
            cpu_bytes: 0,
            direct_loads,
            split: cfg.split,
            split_arena,
            split_experts: 0,
            split_bytes: 0,
            top_k: model.cfg.top_k,
            device_allowed: false,
            device: None,
            device_token: false,
            device_pending: false,
            routes_queued: false,
            routes_held: false,
            device_tokens: 0,
            device_account: Duration::ZERO,
            routed_slots: cfg.routed_slots
                && std::env::var("HOB_ROUTED_SLOTS").as_deref() != Ok("0"),
            slot_kinds: [None; 2],
            slot_work: None,
            slot_layers: 0,
            hits_first: std::env::var("HOB_HITS_FIRST").as_deref() != Ok("0"),
            early_layers: 0,
            replayed_pred: None,
            ffn_q4h: std::env::var("HOB_EXPERT_Q4H").as_deref() != Ok("0"),
        };
        // (A trace that records the stacked gates' predictions needs each layer's gate input on
        // the host: such runs route on the host.)
        me.device_allowed = cfg.device_routing
            && me.plan.is_exact()
            && me.plan.low.is_none()
            && me.cpu.is_none()
            && high_slots == total
            && !me.trace.as_ref().is_some_and(TraceWriter::wants_inputs);
        if cfg.preload {
            me.preload()?;
        }
        me.calibrate_cpu(&used);
        Ok(me)
    }

    /// Cooperative mode: time one expert of each used variant on the CPU helpers (the second
    /// of two runs, so thread start-up is not charged), the cost model's first estimates.
    fn calibrate_cpu(&mut self, variants: &[usize]) {
        let Some((cpu, cost)) = self.cpu.as_mut() else {
            return;
        };
        let (h, f) = self.file.expert_dims();
        let x = vec![0.01f32; h];
        for &v in variants {
            let jobs = [CpuJob {
                expert: 0,
                variant: v,
                weight: 1.0,
                rows: f,
            }];
            let mut secs = 0.0;
            let est = cost.cpu_s.clone();
            for _ in 0..2 {
                let (_, times) =
                    cpu.install(|| Self::cpu_compute(self.file, cpu, &jobs, 0, &x, &est));
                secs = times.first().map_or(0.0, |t| t.1);
            }
            cost.cpu_s[v] = Some(secs);
            log::info!(
                "CPU experts: one {} expert in {:.2} ms ({:.1} GB/s)",
                self.file.variants()[v],
                secs * 1e3,
                self.file.expert_layout(v).size as f64 / secs.max(1e-9) / 1e9
            );
        }
    }

    /// Fill both pools in layer order, then forget the loads in the counters.
    fn preload(&mut self) -> crate::Result<()> {
        let (nl, ne) = (self.file.n_layers(), self.file.n_experts());
        for kind in [PoolKind::High, PoolKind::Low] {
            let cap = self.cache.capacity(kind);
            'outer: for l in 0..nl {
                for e in 0..ne {
                    if self.cache.len(kind) >= cap {
                        break 'outer;
                    }
                    let s = self.claim(kind, (l, e))?.ok_or_else(|| {
                        Error::Invalid("expert cache: no free slot while preloading".into())
                    })?;
                    self.submit(kind, (l, e), s, Priority::Demand)?;
                }
            }
        }
        for kind in [PoolKind::High, PoolKind::Low] {
            for s in 0..self.cache.capacity(kind) {
                self.ready(kind, s)?;
            }
        }
        self.gpu.sync()?;
        self.reset_stats();
        Ok(())
    }

    fn pool(&self, kind: PoolKind) -> &Pool {
        self.pools[kind as usize]
            .as_ref()
            .expect("a pool with slots exists for every kind the cache has capacity in")
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut Pool {
        self.pools[kind as usize]
            .as_mut()
            .expect("a pool with slots exists for every kind the cache has capacity in")
    }

    /// Slots of each pool.
    pub fn slots(&self) -> (usize, usize) {
        (
            self.cache.capacity(PoolKind::High),
            self.cache.capacity(PoolKind::Low),
        )
    }

    /// Bytes of both arenas.
    pub fn arena_bytes(&self) -> usize {
        self.pools
            .iter()
            .flatten()
            .map(|p| p.slot_bytes * p.pending.len())
            .sum()
    }

    /// A slot for `key` in pool `kind`: evicts by the policy; None when every slot is protected.
    /// Waits for a load still filling the victim slot (it must not land after the new one).
    fn claim(&mut self, kind: PoolKind, key: (usize, usize)) -> crate::Result<Option<usize>> {
        Ok(self.claim_evicting(kind, key)?.map(|ins| ins.slot))
    }

    /// `claim`, saying which expert it evicted.
    fn claim_evicting(
        &mut self,
        kind: PoolKind,
        key: (usize, usize),
    ) -> crate::Result<Option<Insertion>> {
        let Some(ins) = self.cache.insert(kind, key) else {
            return Ok(None);
        };
        if ins.evicted.is_some() {
            self.ready(kind, ins.slot)?;
        }
        let pool = self.pool_mut(kind);
        pool.prefetched[ins.slot] = false;
        Ok(Some(ins))
    }

    /// Queue the load of `key` into slot `s` of pool `kind`.
    fn submit(
        &mut self,
        kind: PoolKind,
        key: (usize, usize),
        s: usize,
        priority: Priority,
    ) -> crate::Result<()> {
        let mapped = self.mapped;
        let disk = self.tier == Tier::Disk;
        let pool = self.pool(kind);
        let variant = pool.variant;
        let offsets = [pool.layout.up_offset, pool.layout.down_offset];
        let src = self.file.blob_range(key.0, key.1, variant, disk);
        let dst = if mapped {
            (pool.host_base() + s * pool.slot_bytes) as u64
        } else {
            pool.base(&self.gpu) + (s * pool.slot_bytes) as u64
        };
        let now = Instant::now();
        let due = self.link_due.max(now)
            + Duration::from_secs_f64(src.len() as f64 / self.load_bandwidth());
        self.link_due = due;
        // Mapped slots (the GPU reads them where the loader writes them) load matrix by matrix:
        // parts end at the up and down matrices' offsets rounded up to BLOB_ALIGN (file offsets
        // stay aligned for O_DIRECT reads), so part i landed means matrix i is whole.
        let mut cuts = vec![src.start];
        if mapped {
            for off in offsets {
                let at = (src.start + off).next_multiple_of(BLOB_ALIGN);
                if at > *cuts.last().unwrap_or(&src.start) && at < src.end {
                    cuts.push(at);
                }
            }
        }
        cuts.push(src.end);
        let loader = self
            .loader
            .as_ref()
            .ok_or_else(|| Error::Invalid("expert loader already shut down".into()))?;
        let abort = (priority == Priority::Prefetch).then(|| Arc::new(AtomicBool::new(false)));
        let mut tickets = Vec::with_capacity(cuts.len() - 1);
        for w in cuts.windows(2) {
            let job = LoadJob {
                pieces: vec![Piece::blob(w[0]..w[1], dst + (w[0] - src.start) as u64)],
                mapped,
                after: self.gpu.stream.record_event(None).map_err(cuda_err)?,
                abort: abort.clone(),
            };
            tickets.push(loader.submit(job, priority)?);
        }
        let ticket = tickets
            .pop()
            .ok_or_else(|| Error::Invalid("an expert load of no parts".into()))?;
        let pool = self.pool_mut(kind);
        pool.parts[s] = tickets;
        pool.pending[s] = Some(ticket);
        pool.abort[s] = abort;
        pool.prefetched[s] = priority == Priority::Prefetch;
        pool.due[s] = Some(due);
        Ok(())
    }

    /// Make the compute stream wait for slot `s`'s load, if one is pending.
    fn ready(&mut self, kind: PoolKind, s: usize) -> crate::Result<()> {
        while self.ready_part(kind, s)? {}
        let Some(ticket) = self.pools[kind as usize]
            .as_mut()
            .and_then(|p| p.pending.get_mut(s))
            .and_then(Option::take)
        else {
            return Ok(());
        };
        self.wait_load(ticket)
    }

    /// Make the compute stream wait for the next part of slot `s`'s load (the matrices before the
    /// last, mapped mode); false when none is left.
    fn ready_part(&mut self, kind: PoolKind, s: usize) -> crate::Result<bool> {
        let Some(parts) = self.pools[kind as usize]
            .as_mut()
            .and_then(|p| p.parts.get_mut(s))
            .filter(|p| !p.is_empty())
        else {
            return Ok(false);
        };
        let ticket = parts.remove(0);
        self.wait_load(ticket)?;
        Ok(true)
    }

    /// Order the compute stream after one load job (waiting for it on the GPU where it can).
    fn wait_load(&mut self, ticket: Ticket<Option<CudaEvent>>) -> crate::Result<()> {
        let started = Instant::now();
        if self.cpu.is_none() && !landed(&ticket) {
            // The compute stream waits for the load on the GPU, so what follows runs the moment
            // it lands (a host wait would add its wake-up and the launches after it). Timed on
            // the GPU, from where the stream reached this wait to the load's last event.
            let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let reached = self.gpu.stream.record_event(timed).map_err(cuda_err)?;
            match ticket.wait()? {
                Some(ev) => {
                    self.gpu.stream.wait(&ev).map_err(cuda_err)?;
                    self.gpu_waits.push((reached, ev));
                }
                None => self.wait += started.elapsed(),
            }
            return Ok(());
        }
        if let Some(ev) = ticket.wait()? {
            // The job's chunks are queued (paced on the copy stream): the host sleeps until they
            // land (CPU experts need its cores), the time showing as waiting for loads, then
            // orders the compute stream after them.
            ev.synchronize().map_err(cuda_err)?;
            self.gpu.stream.wait(&ev).map_err(cuda_err)?;
        }
        self.wait += started.elapsed();
        Ok(())
    }

    /// A decode layer's routes are known: the prefetches made for it whose expert it does not
    /// route and whose load has not landed are dropped (their remaining chunks are skipped and
    /// the slot emptied), so they stop taking the link from the demand loads to come.
    fn drop_wrong_prefetches(&mut self, layer: usize, routes: &[Route]) {
        let protected = std::mem::take(&mut self.protected[layer]);
        let mut kept = Vec::with_capacity(protected.len());
        for (kind, key) in protected {
            let slot = self.cache.lookup(kind, key).filter(|&s| {
                let p = self.pool(kind);
                !routes.iter().any(|r| r.expert == key.1)
                    && p.prefetched[s]
                    && p.abort[s].is_some()
                    && !self.slot_landed(kind, s)
            });
            let Some(s) = slot else {
                kept.push((kind, key));
                continue;
            };
            let pool = self.pool_mut(kind);
            if let Some(a) = pool.abort[s].take() {
                a.store(true, Ordering::Release);
            }
            // Nothing will wait for the dropped load: a later load into the slot queues behind
            // its chunk in flight on the one loader thread (and copy stream).
            pool.pending[s] = None;
            pool.parts[s].clear();
            pool.prefetched[s] = false;
            pool.due[s] = None;
            self.cache.unprotect(kind, key);
            self.cache.remove(kind, key);
            self.prefetch_cancelled += 1;
        }
        self.protected[layer] = kept;
    }

    /// The cache's holds balance after layer `layer`: none left on its experts, no release of
    /// an unheld key (an error names the first; a bookkeeping bug, never the user's input).
    fn check_holds(&self, layer: usize) -> crate::Result<()> {
        for kind in [PoolKind::High, PoolKind::Low] {
            for e in 0..self.file.n_experts() {
                let n = self.cache.holds(kind, (layer, e));
                if n > 0 {
                    return Err(Error::Invalid(format!(
                        "expert engine: layer {layer} expert {e} still has {n} hold(s) in the {kind:?} pool after the layer"
                    )));
                }
            }
        }
        let n = self.cache.unmatched_releases();
        if n > 0 {
            return Err(Error::Invalid(format!(
                "expert engine: {n} release(s) of an expert nothing held (layer {layer})"
            )));
        }
        Ok(())
    }

    /// Slot `s` of pool `kind` holds its expert already (no load pending, or it has landed).
    fn slot_landed(&self, kind: PoolKind, s: usize) -> bool {
        self.pool(kind).pending[s].as_ref().is_none_or(landed)
    }

    /// Wait for slot `s`'s load (if any) before its use, counting a used prefetch.
    fn take_slot(&mut self, kind: PoolKind, s: usize) -> crate::Result<()> {
        self.ready(kind, s)?;
        let pool = self.pool_mut(kind);
        if std::mem::take(&mut pool.prefetched[s]) {
            self.prefetch_used += 1;
        }
        Ok(())
    }

    /// Compute group `g` (its routes from row `at` of the layer's) with the expert in `slot`
    /// (pool, index), adding into the layer output at `op`; then release the slot.
    #[allow(clippy::too_many_arguments)]
    fn run_slot(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        (kind, slot): (PoolKind, usize),
        g: &Group,
        at: usize,
        decode: bool,
        xp: u64,
        op: u64,
    ) -> crate::Result<()> {
        let (h, f) = self.file.expert_dims();
        let s = self.gpu.stream.clone();
        let (ip, wp, xsp) = (ptr(&self.idx, &s), ptr(&self.wts, &s), ptr(&self.xs, &s));
        let n = g.rows.len();
        let mats = self.mats(kind, slot);
        let (ia, wa) = (ip + 4 * at as u64, wp + 4 * at as u64);
        if decode {
            let dp = self.expert_ffn(b, &mats, xp, (n, 0), f)?;
            self.gpu.axpy(op, g.rows[0].1, dp, h)?;
        } else if !(self.ffn_q4h && self.expert_ffn_q4h(b, &mats, (xp, ia, wa), n, op)?) {
            self.gpu.gather_rows((xp, ia), xsp, h, n, false)?;
            let dp = self.expert_ffn(b, &mats, xsp, (n, 0), f)?;
            self.gpu.scatter_axpy(op, (ia, wa), dp, h, n, 1)?;
        }
        self.cache.unprotect(kind, (layer, g.expert));
        Ok(())
    }

    /// An expert's FFN on `n` tokens at `input`: gate and up ([`mats`](Self::mats) order, `ffn`
    /// rows each), SwiGLU, down. Returns the device address of its [n, hidden] output: row
    /// `row` of the down buffer onwards (decode's early experts each keep their own).
    fn expert_ffn(
        &self,
        b: &CudaBackend,
        mats: &[DevMat; 3],
        input: u64,
        (n, row): (usize, usize),
        ffn: usize,
    ) -> crate::Result<u64> {
        for step in 0..2 {
            self.ffn_step(b, mats, input, (n, row), ffn, step)?;
        }
        self.ffn_step(b, mats, input, (n, row), ffn, 2)
    }

    /// Step `step` of [`expert_ffn`](Self::expert_ffn): 0 the gate product, 1 the up product and
    /// SwiGLU, 2 the down product (returning the output's address). Each step reads only its
    /// own matrix, so a caller may run it as soon as that matrix has landed.
    fn ffn_step(
        &self,
        b: &CudaBackend,
        [wg, wu, wd]: &[DevMat; 3],
        input: u64,
        (n, row): (usize, usize),
        ffn: usize,
        step: usize,
    ) -> crate::Result<u64> {
        let s = &self.gpu.stream;
        let (hidden, _) = self.file.expert_dims();
        let (gp, up) = (ptr(&self.gate, s), ptr(&self.up, s));
        let dp = ptr(&self.down, s) + (row * hidden * 4) as u64;
        match step {
            0 => b.matmul_dev(wg, input, n, gp)?,
            1 => {
                b.matmul_dev(wu, input, n, up)?;
                self.gpu.swiglu(gp, up, n * ffn)?;
            }
            _ => b.matmul_dev(wd, gp, n, dp)?,
        }
        Ok(dp)
    }

    /// A prefill expert through gemm_q4h (int4 g64): its `n` tokens (rows `idx` of `x`) gathered
    /// as f16 once for gate and up, SwiGLU straight to f16 (down's input), down's parts of K
    /// added up by the weighted scatter into `out` — the arithmetic of matmul's to_half,
    /// sum_splits, swiglu and scatter_axpy in four fewer launches. Parts of K go to the
    /// scratch, as matmul's do. False (nothing launched) where gemm_q4h does not apply.
    fn expert_ffn_q4h(
        &self,
        b: &CudaBackend,
        [wg, wu, wd]: &[DevMat; 3],
        (x, idx, wts): (u64, u64, u64),
        n: usize,
        out: u64,
    ) -> crate::Result<bool> {
        let (h, f) = self.file.expert_dims();
        let (scratch, scratch_len) = b.scratch();
        // Scratch: the gathered tokens (f16), then gate's and up's parts of K; then (once
        // those are summed) the SwiGLU output (f16) and down's parts.
        let xh = scratch;
        let parts = scratch + align256(n * h * 2) as u64;
        let act = parts;
        let down_parts = act + align256(n * f * 2) as u64;
        let room = |at: u64| (scratch_len * 4).saturating_sub((at - scratch) as usize);
        if room(down_parts) < n * h * 4
            || room(parts) < n * f * 4
            || !self.gpu.gemm_q4h_applies(wd, act)
            || ![wg, wu].iter().all(|w| self.gpu.gemm_q4h_applies(w, xh))
        {
            return Ok(false);
        }
        let s = &self.gpu.stream;
        let (gp, up) = (ptr(&self.gate, s), ptr(&self.up, s));
        let q4 = |w: &DevMat, xh: u64, (direct, parts): (u64, u64), max: usize| {
            self.gpu
                .gemm_q4h(w, xh, n, (direct, parts), max)?
                .ok_or_else(|| Error::Invalid("gemm_q4h refused a checked matrix".into()))
        };
        self.gpu.gather_rows((x, idx), xh, h, n, true)?;
        for (w, dst) in [(wg, gp), (wu, up)] {
            let k = q4(w, xh, (dst, parts), room(parts) / (n * f * 4))?;
            if k > 1 {
                self.gpu.sum_splits(parts, dst, n * f, k)?;
            }
        }
        self.gpu.swiglu_half(gp, up, act, n * f)?;
        let k = q4(
            wd,
            act,
            (down_parts, down_parts),
            room(down_parts) / (n * h * 4),
        )?;
        self.gpu
            .scatter_axpy(out, (idx, wts), down_parts, h, n, k)?;
        Ok(true)
    }

    /// Add the GPU-side waits for loads to `wait`, once they have happened (spinning: no CPU
    /// experts run in this mode, and the logits read back next come later on the stream).
    fn time_gpu_waits(&mut self) -> crate::Result<()> {
        for (reached, landed) in std::mem::take(&mut self.gpu_waits) {
            let spin = Instant::now();
            while !(landed.is_complete() && reached.is_complete()) {
                if spin.elapsed() > Duration::from_millis(2) {
                    // Long (or failed: synchronize reports the error): sleep instead.
                    landed.synchronize().map_err(cuda_err)?;
                    reached.synchronize().map_err(cuda_err)?;
                    break;
                }
                std::hint::spin_loop();
            }
            let ms = reached.elapsed_ms(&landed).map_err(cuda_err)?;
            self.wait += Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3);
        }
        Ok(())
    }

    /// The three device matrices of the expert in slot `s` of pool `kind`.
    fn mats(&self, kind: PoolKind, s: usize) -> [DevMat; 3] {
        let pool = self.pool(kind);
        let view = self.file.expert(0, 0, pool.variant);
        let base = pool.base(&self.gpu) + (s * pool.slot_bytes) as u64;
        let l = &pool.layout;
        let dm = |off: usize, m: &crate::format::MatrixLayout, host: Matrix<'_>| {
            let b = base + off as u64;
            DevMat::new(
                &host,
                b + m.codes.start as u64,
                b + m.scales.start as u64,
                b + m.mins.start as u64,
            )
        };
        [
            dm(l.gate_offset, &l.gate, Matrix::from_view(view.gate())),
            dm(l.up_offset, &l.up, Matrix::from_view(view.up())),
            dm(l.down_offset, &l.down, Matrix::from_view(view.down())),
        ]
    }

    fn ensure_cap(&mut self, t: usize) -> crate::Result<()> {
        if t <= self.cap_t {
            return Ok(());
        }
        let (hidden, ffn) = self.file.expert_dims();
        let g = &self.gpu;
        self.gate = g.alloc(t * ffn, "expert activations")?;
        self.up = g.alloc(t * ffn, "expert activations")?;
        self.down = g.alloc(t * hidden, "expert activations")?;
        self.xs = g.alloc(t * hidden, "expert activations")?;
        self.cap_t = t;
        Ok(())
    }

    /// Room for `n` (token, weight) routes on the device.
    fn ensure_routes(&mut self, n: usize) -> crate::Result<()> {
        if self.idx.len() < n {
            self.idx = self.gpu.alloc(n, "expert routes")?;
            self.wts = self.gpu.alloc(n, "expert routes")?;
        }
        Ok(())
    }

    fn kind_of(&self, p: Precision) -> PoolKind {
        if p == Precision::Low && self.pools[PoolKind::Low as usize].is_some() {
            PoolKind::Low
        } else {
            PoolKind::High
        }
    }

    /// Decide where group `g` runs: a cached slot (hit, or substituted low copy), the CPU, or a
    /// newly claimed slot with its load queued. None: no slot can be claimed now.
    fn place(
        &mut self,
        layer: usize,
        g: &Group,
        top1: bool,
        decode: bool,
        load_busy: &mut f64,
        cpu_busy: &mut f64,
    ) -> crate::Result<Option<Place>> {
        let key = (layer, g.expert);
        let kind = self.kind_of(g.precision);
        let variant = self.pool(kind).variant;
        let mut held = None;
        if kind == PoolKind::Low && self.upgrade_low {
            held = self
                .cache
                .lookup(PoolKind::High, key)
                .map(|s| (PoolKind::High, s));
        }
        if held.is_none() {
            held = self.cache.lookup(kind, key).map(|s| (kind, s));
        }
        if let Some((k, s)) = held {
            if decode {
                if let Some(c) = self.cpu_before_load(k, s, variant, *cpu_busy) {
                    // Its load (a prefetch still queued or in flight) lands later than the CPU
                    // would finish: compute it there; the load goes on, for later tokens.
                    *cpu_busy += c;
                    self.misses[variant] += 1;
                    self.cpu_computed += 1;
                    self.cpu_bytes += self.file.expert_layout(variant).size as u64;
                    self.late_to_cpu += 1;
                    return Ok(Some(Place::Cpu));
                }
            }
            let v = self.pool(k).variant;
            self.hits[v] += g.rows.len() as u64;
            if decode {
                self.behind.hit(key, self.decoded);
            }
            return Ok(Some(Place::Slot(k, s)));
        }
        if kind == PoolKind::High && self.substitute_low && decode && !top1 {
            if let Some(s) = self.pools[PoolKind::Low as usize]
                .as_ref()
                .and_then(|_| self.cache.lookup(PoolKind::Low, key))
            {
                self.substituted += 1;
                let v = self.pool(PoolKind::Low).variant;
                self.hits[v] += 1;
                self.behind.hit(key, self.decoded);
                return Ok(Some(Place::Slot(PoolKind::Low, s)));
            }
        }
        if decode {
            self.behind.miss(key, self.decoded);
        }
        if decode && self.cpu.is_some() {
            // Greedy: the miss goes to whichever of the link and the CPU frees up first.
            let bytes = self.pool(kind).slot_bytes as f64;
            let load_s = bytes / self.load_bandwidth();
            let to_cpu = self
                .cpu
                .as_ref()
                .is_some_and(|(_, cost)| match cost.cpu_s[variant] {
                    None => true, // measure once
                    Some(_) if cost.since_cpu[variant] >= CPU_PROBE_EVERY => true,
                    Some(c) => *cpu_busy + c < *load_busy + load_s,
                });
            if to_cpu {
                self.count_cpu(variant, cpu_busy);
                // Into an idle link only: behind a demand load it would delay the next
                // miss the link takes. The slot is claimed by the policy like any miss's
                // (this layer's placed experts are protected), so the cache follows the
                // routing for the tokens that reuse the expert, while that pays
                // (experts::behind).
                if self.load_behind && !self.link_busy() && self.behind.wanted() {
                    self.behind_chances += 1;
                    if let Some(ins) = self.claim_evicting(kind, key)? {
                        self.submit(kind, key, ins.slot, Priority::Prefetch)?;
                        // Not a prediction: kept out of the prefetch accuracy.
                        self.pool_mut(kind).prefetched[ins.slot] = false;
                        self.behind.loaded(key, ins.evicted, self.decoded);
                        self.loaded_behind += 1;
                    }
                }
                return Ok(Some(Place::Cpu));
            }
            if let Some((_, cost)) = self.cpu.as_mut() {
                cost.since_cpu[variant] += 1;
            }
            *load_busy += load_s;
        }
        let Some(s) = self.claim(kind, key)? else {
            return Ok(None);
        };
        self.misses[variant] += g.rows.len() as u64;
        self.submit(kind, key, s, Priority::Demand)?;
        Ok(Some(Place::Slot(kind, s)))
    }

    /// Count a miss computed on the CPU (as `variant`), its expected seconds added to `cpu_busy`.
    fn count_cpu(&mut self, variant: usize, cpu_busy: &mut f64) {
        if let Some((_, cost)) = self.cpu.as_mut() {
            cost.since_cpu[variant] = 0;
            *cpu_busy += cost.cpu_s[variant].unwrap_or(0.0);
        }
        self.misses[variant] += 1;
        self.cpu_computed += 1;
        self.cpu_bytes += self.file.expert_layout(variant).size as u64;
    }

    /// Cooperative mode: Some(CPU seconds) when slot `s` of pool `kind` is still loading and the
    /// CPU, busy for `cpu_busy` seconds already, would compute the expert (as `variant`) before
    /// the load is expected to land.
    fn cpu_before_load(
        &self,
        kind: PoolKind,
        s: usize,
        variant: usize,
        cpu_busy: f64,
    ) -> Option<f64> {
        let (_, cost) = self.cpu.as_ref()?;
        let pool = self.pool(kind);
        let ticket = pool.pending[s].as_ref()?;
        if landed(ticket) {
            return None;
        }
        let c = cost.cpu_s[variant]?;
        let left = pool.due[s]?
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        (cpu_busy + c < left).then_some(c)
    }

    /// A demand load or a prefetch is queued or in flight.
    fn link_busy(&self) -> bool {
        self.pools
            .iter()
            .flatten()
            .any(|p| p.pending.iter().flatten().any(|t| !landed(t)))
    }

    /// Seconds before a demand load queued now would take the link: the loads still queued,
    /// at most the chunks a demand load goes behind (loads of earlier layers have landed by
    /// now; prefetches and loads behind CPU experts it overtakes between chunks).
    fn link_backlog(&self) -> f64 {
        let bw = self.load_bandwidth();
        let queued = self
            .link_due
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        queued.min((DIRECT_IN_FLIGHT * STAGING_CHUNK) as f64 / bw)
    }

    /// Measured loader bandwidth, bytes/s (a profile's pace, or 10 GB/s, before any load).
    fn load_bandwidth(&self) -> f64 {
        let b = self.counters.bytes.load(Ordering::Relaxed) as f64;
        let n = self.counters.nanos.load(Ordering::Relaxed) as f64;
        if b > 0.0 && n > 0.0 {
            b / n * 1e9
        } else {
            self.pace.unwrap_or(10e9)
        }
    }

    /// Predict the next layers from this layer's gate input and prefetch the first one with a
    /// predicted miss.
    fn prefetch(&mut self, layer: usize, x: u64, b: &CudaBackend) -> crate::Result<()> {
        let predicted = {
            let Some((pred, stacked, logits)) = self.predictor.as_mut() else {
                return Ok(());
            };
            if let Some(given) = self.replayed_pred.take() {
                pred.given(layer, given)
            } else {
                let Some(m) = pred.stacked(layer) else {
                    return Ok(());
                };
                let s = &self.gpu.stream;
                // Layer l's stacked routers start at l x (depth x n_experts x hidden x 4) bytes.
                let region = pred.depth() * self.file.n_experts() * m.cols * 4;
                let dm = DevMat::new(&m, ptr(stacked, s) + (layer * region) as u64, 0, 0);
                let lp = ptr(logits, s);
                let rows = m.rows;
                b.matmul_dev(&dm, x, 1, lp)?;
                let mut host = vec![0.0f32; rows];
                self.gpu.download_f32(lp, &mut host)?;
                pred.predict(layer, &host)
            }
        };
        let k = predicted.first().map_or(0, |p| p.1.len());
        let mut decisions = vec![Precision::High; k];
        let mut weights = vec![0.0; k];
        // Prefetch only into an idle link: on a link-bound card a queued prefetch delays the
        // demand loads behind it by its wasted bytes when wrong (and a correct one saves no
        // bytes), while an idle link costs nothing to use.
        let link_busy = self.link_busy();
        let bandwidth = self.load_bandwidth();
        for (target, routes) in predicted {
            self.plan.apply(&routes, &mut decisions, &mut weights);
            let wanted: Vec<(PoolKind, (usize, usize))> = routes
                .iter()
                .zip(&decisions)
                .filter(|(r, d)| **d != Precision::Skip && r.weight >= self.prefetch_min_weight)
                .map(|(r, d)| (self.kind_of(*d), (target, r.expert)))
                .collect();
            let mut missing = Vec::new();
            for &(kind, key) in &wanted {
                let held = if kind == PoolKind::Low
                    && self.upgrade_low
                    && self.cache.lookup(PoolKind::High, key).is_some()
                {
                    Some(PoolKind::High)
                } else {
                    self.cache.lookup(kind, key).map(|_| kind)
                };
                if let Some(k) = held {
                    self.cache.protect(k, key);
                    self.protected[target].push((k, key));
                } else {
                    missing.push((kind, key));
                }
            }
            if missing.is_empty() {
                continue;
            }
            if link_busy {
                break;
            }
            if self.cpu.is_some() {
                // Cooperative: a load that lands after its layer started is computed by the CPU
                // anyway; keep the loads that can land in time, else aim further ahead.
                let until = (target - layer) as f64 * self.layer_s.unwrap_or(0.0);
                let mut t = 0.0;
                missing.retain(|(kind, _)| {
                    let secs = self.pool(*kind).slot_bytes as f64 / bandwidth;
                    let fits = t + secs <= until;
                    if fits {
                        t += secs;
                    }
                    fits
                });
                if missing.is_empty() {
                    continue;
                }
            }
            for (kind, key) in missing {
                let Some(s) = self.claim(kind, key)? else {
                    break;
                };
                self.submit(kind, key, s, Priority::Prefetch)?;
                self.cache.protect(kind, key);
                self.protected[target].push((kind, key));
                self.prefetch_issued += 1;
            }
            break;
        }
        Ok(())
    }

    /// CPU helper threads compute `jobs` (decode: one row each, the leading `rows` of each
    /// expert's ffn) from the mapped file; returns their weighted outputs summed, [hidden]
    /// (`CpuBackend::ffn_decode`). `est` (seconds per whole expert, per variant) apportions the
    /// measured time among jobs.
    fn cpu_compute(
        file: &HobFile,
        cpu: &CpuBackend,
        jobs: &[CpuJob],
        layer: usize,
        x: &[f32],
        est: &[Option<f64>],
    ) -> (Vec<f32>, CpuTimes) {
        let started = Instant::now();
        let f = file.expert_dims().1;
        let ffn: Vec<FfnJob<'_>> = jobs
            .iter()
            .map(|j| {
                let v = file.expert(layer, j.expert, j.variant);
                FfnJob {
                    mats: [
                        Matrix::from_view(v.gate()),
                        Matrix::from_view(v.up()),
                        Matrix::from_view(v.down()),
                    ],
                    rows: j.rows,
                    weight: j.weight,
                }
            })
            .collect();
        let out = cpu.ffn_decode(&ffn, x);
        let secs = started.elapsed().as_secs_f64();
        let share = |j: &CpuJob| j.rows as f64 / f as f64;
        let guess = |j: &CpuJob| {
            share(j) * est[j.variant].unwrap_or(file.expert_layout(j.variant).size as f64)
        };
        let total: f64 = jobs.iter().map(guess).sum();
        let times = jobs
            .iter()
            .map(|j| (j.variant, secs * guess(j) / total.max(1e-30), share(j)))
            .collect();
        (out, times)
    }

    /// Compute `jobs` on the CPU helpers from `host_x`, adding into `acc` ([hidden] once
    /// non-empty), and refresh the cost model.
    fn run_cpu(&mut self, jobs: &[CpuJob], layer: usize, acc: &mut Vec<f32>) -> crate::Result<()> {
        let started = Instant::now();
        let Some((cpu, cost)) = self.cpu.as_ref() else {
            return Ok(());
        };
        let (cpu, est) = (cpu.clone(), cost.cpu_s.clone());
        let file = self.file;
        let x = &self.host_x;
        let (res, times) = cpu.install(|| Self::cpu_compute(file, &cpu, jobs, layer, x, &est));
        self.cpu_wait += started.elapsed();
        self.absorb_cpu(res, times, acc);
        Ok(())
    }

    /// Add CPU results `res` into `acc` ([hidden] once non-empty) and refresh the cost model
    /// with the seconds each job took (scaled to a whole expert).
    fn absorb_cpu(&mut self, res: Vec<f32>, times: CpuTimes, acc: &mut Vec<f32>) {
        if let Some((_, cost)) = self.cpu.as_mut() {
            for (v, secs, share) in times {
                self.cpu_busy += secs;
                let whole = secs / share.max(1e-3);
                cost.cpu_s[v] = Some(match cost.cpu_s[v] {
                    Some(old) => 0.8 * old + 0.2 * whole,
                    None => whole,
                });
            }
        }
        if acc.is_empty() {
            *acc = res;
        } else {
            for (a, r) in acc.iter_mut().zip(&res) {
                *a += r;
            }
        }
    }

    /// Cooperative decode: give the GPU the last rows of this layer's dense CPU experts (their
    /// loads queued now, into the split arena), so the link works while the CPU computes the
    /// rest. Shrinks `jobs[i].rows` accordingly; returns the GPU's parts.
    fn plan_splits(&mut self, layer: usize, jobs: &mut [CpuJob]) -> crate::Result<Vec<SplitJob>> {
        let (Some(arena), Some((_, cost))) = (self.split_arena.as_ref(), self.cpu.as_ref()) else {
            return Ok(Vec::new());
        };
        let file = self.file;
        let (h, f) = file.expert_dims();
        let dense = |v: usize| file.variants()[v].kind.is_float();
        let secs = |v: usize| cost.cpu_s[v].unwrap_or(0.0);
        let c_all: f64 = jobs.iter().map(|j| secs(j.variant)).sum();
        let (c_dense, s_dense) =
            jobs.iter()
                .filter(|j| dense(j.variant))
                .fold((0.0, 0.0), |(c, b), j| {
                    (
                        c + secs(j.variant),
                        b + file.expert_layout(j.variant).size as f64,
                    )
                });
        if s_dense == 0.0 {
            return Ok(Vec::new());
        }
        let bw = self.load_bandwidth();
        let share = match self.split {
            Split::Off => return Ok(Vec::new()),
            Split::Share(x) => x,
            Split::Auto => {
                // The CPU's time left, (c_all - share * c_dense), against the link's,
                // backlog + share * bytes / bw: equal at this share.
                let backlog = self
                    .link_due
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64();
                ((c_all - backlog) / (c_dense + s_dense / bw)).clamp(0.0, 0.5)
            }
        };
        let mut rows = (share * f as f64) as usize / SPLIT_ROWS * SPLIT_ROWS;
        if matches!(self.split, Split::Share(_)) {
            rows = rows.max(SPLIT_ROWS);
        }
        rows = rows.min(f.saturating_sub(SPLIT_ROWS));
        if rows == 0 || (self.split == Split::Auto && rows < SPLIT_MIN_ROWS) {
            return Ok(Vec::new());
        }
        let (cap, base) = (arena.len(), ptr(arena, &self.gpu.stream));
        let map_base = file.shared_map().as_ptr() as usize;
        let from = f - rows;
        let mut at = 0usize;
        let mut out = Vec::new();
        for job in jobs.iter_mut().filter(|j| dense(j.variant)) {
            let view = file.expert(layer, job.expert, job.variant);
            let (g, u, d) = (
                Matrix::from_view(view.gate()),
                Matrix::from_view(view.up()),
                Matrix::from_view(view.down()),
            );
            let (rb, esz) = (g.row_bytes(), d.row_bytes() / f);
            let part = [rows * rb, rows * rb, h * rows * esz];
            let need: usize = part.iter().map(|&n| align256(n)).sum();
            if at + need > cap {
                break;
            }
            let dst = [
                base + at as u64,
                base + (at + align256(part[0])) as u64,
                base + (at + align256(part[0]) + align256(part[1])) as u64,
            ];
            let off = |codes: &[u8]| codes.as_ptr() as usize - map_base;
            let pieces = vec![
                Piece::blob(off(g.codes) + from * rb..off(g.codes) + f * rb, dst[0]),
                Piece::blob(off(u.codes) + from * rb..off(u.codes) + f * rb, dst[1]),
                Piece {
                    src: off(d.codes) + from * esz,
                    pitch: d.row_bytes(),
                    width: rows * esz,
                    rows: h,
                    dst: dst[2],
                },
            ];
            let bytes: usize = part.iter().sum();
            let now = Instant::now();
            self.link_due = self.link_due.max(now) + Duration::from_secs_f64(bytes as f64 / bw);
            let after = self.gpu.stream.record_event(None).map_err(cuda_err)?;
            let ticket = self
                .loader
                .as_ref()
                .ok_or_else(|| Error::Invalid("expert loader already shut down".into()))?
                .submit(
                    LoadJob {
                        pieces,
                        mapped: false,
                        after,
                        abort: None,
                    },
                    Priority::Demand,
                )?;
            job.rows = from;
            self.split_experts += 1;
            self.split_bytes += bytes as u64;
            let size = file.expert_layout(job.variant).size as u64;
            self.cpu_bytes -= size * rows as u64 / f as u64;
            out.push(SplitJob {
                expert: job.expert,
                variant: job.variant,
                weight: job.weight,
                from,
                at: dst,
                ticket,
            });
            at += need;
        }
        Ok(out)
    }

    /// The GPU's rows of split experts, once loaded: added into the layer output `op`.
    fn run_splits(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        splits: Vec<SplitJob>,
        xp: u64,
        op: u64,
    ) -> crate::Result<()> {
        let (h, f) = self.file.expert_dims();
        for sj in splits {
            let started = Instant::now();
            if let Some(ev) = sj.ticket.wait()? {
                ev.synchronize().map_err(cuda_err)?;
                self.gpu.stream.wait(&ev).map_err(cuda_err)?;
            }
            self.wait += started.elapsed();
            let view = self.file.expert(layer, sj.expert, sj.variant);
            let n = f - sj.from;
            let g = Matrix::from_view(view.gate());
            let u = Matrix::from_view(view.up());
            let d = Matrix::from_view(view.down());
            // Shapes of the packed parts (DevMat reads only shapes from the host matrices).
            let gm = DevMat::new(&Matrix { rows: n, ..g }, sj.at[0], 0, 0);
            let um = DevMat::new(&Matrix { rows: n, ..u }, sj.at[1], 0, 0);
            let dm = DevMat::new(&Matrix { cols: n, ..d }, sj.at[2], 0, 0);
            let dp = self.expert_ffn(b, &[gm, um, dm], xp, (1, 0), n)?;
            self.gpu.axpy(op, sj.weight, dp, h)?;
        }
        Ok(())
    }

    /// Whether this decode token can route on the device: allowed, and every expert resident
    /// (the first time: wait for their loads and build the tables).
    fn device_ready(&mut self) -> crate::Result<bool> {
        if !self.device_allowed {
            return Ok(false);
        }
        if self.device.is_some() {
            return Ok(true);
        }
        let (nl, ne) = (self.file.n_layers(), self.file.n_experts());
        if self.cache.len(PoolKind::High) < nl * ne {
            return Ok(false);
        }
        for slot in 0..self.cache.capacity(PoolKind::High) {
            self.ready(PoolKind::High, slot)?;
        }
        let mut table = Vec::with_capacity(nl * ne * 3);
        for l in 0..nl {
            for e in 0..ne {
                let slot = self.cache.lookup(PoolKind::High, (l, e)).ok_or_else(|| {
                    Error::Invalid(format!(
                        "expert cache: layer {l} expert {e} missing from a full cache"
                    ))
                })?;
                table.extend(self.mats(PoolKind::High, slot));
            }
        }
        let (h, f) = self.file.expert_dims();
        if h % 4 != 0 || f % 4 != 0 || !table.iter().all(|m| self.gpu.sel_supports(m)) {
            log::info!(
                "decode routes on the host: the experts' layout does not suit the routed kernels"
            );
            self.device_allowed = false;
            return Ok(false);
        }
        let k = self.top_k;
        let g = &self.gpu;
        let dev = DeviceRouting {
            table: g.stream.clone_htod(&table).map_err(cuda_err)?,
            routes: g.alloc(nl * 2 * k, "device routes")?,
            work: g.alloc(2 * k * f + (k * h).max(ne), "routed expert activations")?,
            gate: table[0],
            down: table[2],
            host: vec![0.0; nl * 2 * k],
            read: match std::env::var("HOB_ROUTES_QUEUED").as_deref() {
                Ok("0") => None,
                _ => Some(g.alloc_read(nl * 2 * k)?),
            },
        };
        log::info!("every expert is resident: decode routes on the device");
        self.device = Some(dev);
        Ok(true)
    }

    /// After a device-routed token: its routes to the host (checked), then counted and recorded
    /// as `forward` would (hits, the cache's use counters, the trace) at once, or, without a
    /// trace to write, held and counted once the next token's launches are queued
    /// (count_held: the device then computes while the host counts).
    fn account_device(&mut self, hold: bool) -> crate::Result<()> {
        self.fetch_device_routes()?;
        if hold && self.trace.is_none() {
            self.routes_held = true;
            Ok(())
        } else {
            self.count_device_routes()
        }
    }

    /// Count the routes account_device held, if any (before anything that reads or resets what
    /// they count).
    fn count_held(&mut self) -> crate::Result<()> {
        if std::mem::take(&mut self.routes_held) {
            self.count_device_routes()?;
        }
        Ok(())
    }

    /// A device-routed token's routes into DeviceRouting::host (the queued read's, or read now),
    /// every expert index checked.
    fn fetch_device_routes(&mut self) -> crate::Result<()> {
        let Some(d) = self.device.as_mut() else {
            return Ok(());
        };
        let (ne, k) = (self.file.n_experts(), self.top_k);
        match d.read.as_mut() {
            Some(q) => {
                let got = q.wait()?.ok_or_else(|| {
                    Error::Invalid("device routes: counted before they were read back".into())
                })?;
                d.host.copy_from_slice(got);
            }
            None => {
                let rp = ptr(&d.routes, &self.gpu.stream);
                self.gpu.download_f32(rp, &mut d.host)?;
            }
        }
        let bad = d
            .host
            .chunks_exact(2 * k)
            .position(|lr| lr[..k].iter().any(|e| e.to_bits() as usize >= ne));
        match bad {
            Some(l) => Err(Error::Invalid(format!(
                "routing: layer {l} found no expert among {ne} (router logits not finite?)"
            ))),
            None => Ok(()),
        }
    }

    /// Count the routes in DeviceRouting::host (fetch_device_routes) as `forward` would.
    fn count_device_routes(&mut self) -> crate::Result<()> {
        let Some(d) = self.device.as_mut() else {
            return Ok(());
        };
        let (ne, k) = (self.file.n_experts(), self.top_k);
        let arrived = Instant::now();
        let host = std::mem::take(&mut d.host);
        self.decoded += 1;
        self.device_tokens += 1;
        self.cache.begin_token();
        let high = self.pool(PoolKind::High).variant;
        let mut routes = vec![
            Route {
                expert: 0,
                weight: 0.0
            };
            k
        ];
        let mut lp = std::mem::take(&mut self.layer_plan);
        for (l, lr) in host.chunks_exact(2 * k).enumerate() {
            for (j, r) in routes.iter_mut().enumerate() {
                // (Checked by fetch_device_routes.)
                let expert = lr[j].to_bits() as usize;
                *r = Route {
                    expert: expert.min(ne - 1),
                    weight: lr[k + j],
                };
            }
            self.cache.set_layer(l);
            self.plan.plan_layer(&routes, 1, &mut lp);
            self.layer_plan = lp;
            self.record(l, &routes, 1, None)?;
            lp = std::mem::take(&mut self.layer_plan);
            for (r, dec) in routes.iter().zip(&lp.decisions) {
                self.cache.record_use((l, r.expert), *dec);
            }
            self.hits[high] += k as u64;
        }
        self.layer_plan = lp;
        if let Some(d) = self.device.as_mut() {
            d.host = host;
        }
        self.device_account += arrived.elapsed();
        Ok(())
    }

    /// The pool whose slots hold every expert of a decode layer placed as `places`, when the
    /// routed kernels can compute them there (forward_slots); None otherwise (CPU experts, two
    /// pools, more experts than the table takes, or matrices those kernels do not take).
    fn slot_pool(&mut self, places: &[Option<Place>]) -> Option<PoolKind> {
        if !self.routed_slots || places.is_empty() || places.len() > SLOTS_MAX_K {
            return None;
        }
        let kind = match places[0] {
            Some(Place::Slot(kind, _)) => kind,
            _ => return None,
        };
        if !places
            .iter()
            .all(|p| matches!(p, Some(Place::Slot(k, _)) if *k == kind))
        {
            return None;
        }
        if let Some(ok) = self.slot_kinds[kind as usize] {
            return ok.then_some(kind);
        }
        let (h, f) = self.file.expert_dims();
        let ok =
            h % 4 == 0 && f % 4 == 0 && self.mats(kind, 0).iter().all(|m| self.gpu.sel_supports(m));
        if !ok {
            log::info!(
                "host-routed decode runs experts one at a time: the {:?} pool's layout does not suit the routed kernels",
                kind
            );
        }
        self.slot_kinds[kind as usize] = Some(ok);
        ok.then_some(kind)
    }

    /// A decode layer (no CPU helpers) with some of its slots still loading and some ready:
    /// the ready experts are computed first, while the loads land, then each loading one
    /// after its load (in the order they were queued); each expert's output keeps its own row
    /// of the down buffer, and `out` += their weighted sum in group order afterwards, as
    /// run_slot adds them, so the result is the same to the bit.
    fn early_layer(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        groups: &[Group],
        places: &[Option<Place>],
        xp: u64,
        op: u64,
    ) -> crate::Result<()> {
        let (h, f) = self.file.expert_dims();
        let slots: Vec<(usize, PoolKind, usize)> = places
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Some(Place::Slot(kind, s)) => Some((i, *kind, *s)),
                _ => None,
            })
            .collect();
        let (ready, loading): (Vec<_>, Vec<_>) = slots
            .iter()
            .partition(|&&(_, kind, s)| self.slot_landed(kind, s));
        let mut outs = vec![0u64; groups.len()];
        for &(i, kind, s) in ready.iter().chain(&loading) {
            let mats = self.mats(kind, s);
            // Loading matrix by matrix (mapped mode: two parts before the last), each product
            // once its matrix is whole; else once the whole load has landed.
            let staged = self.pool(kind).parts[s].len() == 2;
            if !staged {
                self.take_slot(kind, s)?;
            }
            for step in 0..3 {
                if staged && step < 2 {
                    self.ready_part(kind, s)?;
                } else if staged {
                    self.take_slot(kind, s)?;
                }
                outs[i] = self.ffn_step(b, &mats, xp, (1, i), f, step)?;
            }
            self.cache.unprotect(kind, (layer, groups[i].expert));
        }
        for &(i, _, _) in &slots {
            self.gpu.axpy(op, groups[i].rows[0].1, outs[i], h)?;
        }
        self.early_layers += 1;
        Ok(())
    }

    /// One decode token's experts, each (index, weight, slot) in pool `kind` with its load
    /// waited for, through the routed kernels: `put_slots` writes their table and routes on
    /// the stream, then gate and up of all (one launch), down of all, and out += their
    /// weighted sum (out: the residual, or a zeroed buffer), in ascending expert order as the
    /// per-expert path sums them.
    fn forward_slots(
        &mut self,
        kind: PoolKind,
        experts: &[(usize, f32, usize)],
        x: u64,
        out: u64,
    ) -> crate::Result<()> {
        let (h, f) = self.file.expert_dims();
        let k = experts.len();
        let list: Vec<(usize, f32, [DevMat; 3])> = experts
            .iter()
            .map(|&(e, w, s)| (e, w, self.mats(kind, s)))
            .collect();
        let args = SlotArgs::new(&list)?;
        if self.slot_work.is_none() {
            let g = &self.gpu;
            self.slot_work = Some(SlotWork {
                tab: g.alloc(
                    3 * SLOTS_MAX_K * std::mem::size_of::<DevMat>(),
                    "the routed expert table",
                )?,
                routes: g.alloc(2 * SLOTS_MAX_K, "the routed expert table")?,
                work: g.alloc(SLOTS_MAX_K * (2 * f + h), "routed expert activations")?,
            });
        }
        let Some(w) = self.slot_work.as_ref() else {
            return Ok(());
        };
        let (gpu, s) = (&self.gpu, &self.gpu.stream);
        let (tab, rp, g) = (ptr(&w.tab, s), ptr(&w.routes, s), ptr(&w.work, s));
        let dn = g + (2 * k * f * 4) as u64;
        gpu.put_slots(&args, tab, rp)?;
        let (gate, down) = (list[0].2[0], list[0].2[2]);
        if gate.kind < 3 {
            gpu.moe_gate_up(&gate, tab, rp, k, x, g)?;
            gpu.moe_down(&down, tab, rp, k, g, out)?;
        } else {
            gpu.routed_ffn((&gate, &down), tab, rp, k, x, (g, dn), (h, f))?;
            gpu.moe_combine(out, dn, rp, (k, h), None)?;
        }
        self.slot_layers += 1;
        Ok(())
    }

    /// Decode tokens that routed on the device (every expert resident).
    pub fn device_routed_tokens(&self) -> u64 {
        self.device_tokens
    }

    /// Record one layer's decisions in the trace file, token by token.
    /// Write a layer's routing to the trace; `xs`: its gate inputs on the device ([t, hidden]),
    /// for the stacked gates' predictions where the trace records them.
    fn record(
        &mut self,
        layer: usize,
        routes: &[Route],
        t: usize,
        xs: Option<u64>,
    ) -> crate::Result<()> {
        let Some(tw) = self.trace.as_mut() else {
            return Ok(());
        };
        let x = match xs {
            Some(p) if tw.wants_inputs() => {
                let mut v = vec![0.0f32; t * self.file.expert_dims().0];
                self.gpu.download_f32(p, &mut v)?;
                Some(v)
            }
            _ => None,
        };
        tw.record_layer(layer, routes, &self.layer_plan.decisions, t, x.as_deref())
    }
}

impl ExpertExecutor<CudaBackend> for CudaExperts<'_> {
    fn begin_sequence(&mut self) -> crate::Result<()> {
        self.count_held()?;
        self.cache.reset_sequence();
        if let Some(tw) = self.trace.as_mut() {
            tw.begin_sequence();
        }
        if let Some((p, _, _)) = self.predictor.as_mut() {
            p.forget();
        }
        Ok(())
    }

    fn forward_on_device(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        (norm, eps): (&[f32], f32),
        xs: &mut CudaSlice<f32>,
        router: &Matrix<'_>,
        x: &mut CudaSlice<f32>,
        next: Option<(&[f32], f32)>,
    ) -> crate::Result<OnDevice> {
        if layer == 0 {
            self.device_token = self.device_ready()?;
        }
        if !self.device_token {
            return Ok(OnDevice::No);
        }
        let Some(d) = self.device.as_ref() else {
            return Ok(OnDevice::No);
        };
        let (ne, k) = (self.file.n_experts(), self.top_k);
        let (h, f) = self.file.expert_dims();
        let s = &self.gpu.stream;
        let routes = ptr(&d.routes, s) + (layer * 2 * k * 4) as u64;
        let tab = ptr(&d.table, s) + (layer * ne * 3 * std::mem::size_of::<DevMat>()) as u64;
        let g = ptr(&d.work, s);
        let dn = g + (2 * k * f * 4) as u64;
        let gpu = &self.gpu;
        let (xsp, xp) = (ptr(xs, s), ptr(x, s));
        let rw = b.mat(router)?;
        let mut normed = false;
        if !gpu.moe_route_norm(rw, xp, (b.vector(norm)?, eps), xsp, k, routes)? {
            crate::model::Backend::rms_norm(b, x, 0..1, norm, eps, xs)?;
            gpu.moe_route(rw, xsp, k, routes, dn)?;
        }
        if d.gate.kind < 3 {
            // Float kinds: gate and up with SwiGLU in one launch, down with the weighted sum
            // and the residual add in another.
            gpu.moe_gate_up(&d.gate, tab, routes, k, xsp, g)?;
            gpu.moe_down(&d.down, tab, routes, k, g, xp)?;
        } else {
            // Integer kinds: gate and up of the k experts in one launch, their SwiGLU, down of
            // all k (Gpu::routed_ffn), then the weighted sum and residual add.
            gpu.routed_ffn((&d.gate, &d.down), tab, routes, k, xsp, (g, dn), (h, f))?;
            // The weighted sum, with the norm that follows where it folds in.
            let norm = match next {
                Some((nw, neps)) => Some(((b.vector(nw)?, neps), xsp)),
                None => None,
            };
            normed = gpu.moe_combine(xp, dn, routes, (k, h), norm)?;
        }
        if layer + 1 == self.file.n_layers() {
            // Read back in end_forward, once the output head is launched too.
            self.device_pending = true;
        }
        Ok(if normed {
            OnDevice::DoneNormed
        } else {
            OnDevice::Done
        })
    }

    fn replayed_predictions(&mut self, _layer: usize, predicted: Vec<(usize, Vec<Route>)>) {
        self.replayed_pred = Some(predicted);
    }

    fn decode_on_device(&mut self, _b: &CudaBackend) -> crate::Result<bool> {
        self.device_token = self.device_ready()?;
        // A replayed token skips forward_on_device: its routes are read back all the same.
        self.device_pending |= self.device_token;
        Ok(self.device_token)
    }

    fn end_forward(&mut self, _b: &CudaBackend) -> crate::Result<()> {
        // The last token's routes, while the device computes this one.
        self.count_held()?;
        if std::mem::take(&mut self.device_pending) {
            match self.device.as_mut() {
                // Counted in after_forward: the logits' read waits for both.
                Some(DeviceRouting {
                    routes,
                    read: Some(q),
                    ..
                }) => {
                    self.gpu.queue_read(ptr(routes, &self.gpu.stream), q)?;
                    self.routes_queued = true;
                }
                _ => self.account_device(false)?,
            }
        }
        // The logits are read back next (after every load this pass waited for).
        self.time_gpu_waits()
    }

    fn after_forward(&mut self, _b: &CudaBackend) -> crate::Result<()> {
        if std::mem::take(&mut self.routes_queued) {
            self.account_device(true)?;
        }
        Ok(())
    }

    fn forward(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        xs: &CudaSlice<f32>,
        t: usize,
        routes: &[Route],
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        self.run_layer(b, layer, xs, t, routes, out, None)
            .map(|_| ())
    }

    fn forward_add(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        (xs, hidden): (&CudaSlice<f32>, usize),
        t: usize,
        routes: &[Route],
        out: &mut CudaSlice<f32>,
        x: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let xp = ptr(x, &self.gpu.stream);
        if !self.run_layer(b, layer, xs, t, routes, out, Some(xp))? {
            crate::model::Backend::add_assign(b, x, out, t * hidden)?;
        }
        Ok(())
    }
}

impl<'f> CudaExperts<'f> {
    /// `forward`; with `residual` (x, [t, hidden]), the layer may add its output into x itself
    /// (the routed-kernel path of a decode layer) and returns whether it did.
    #[allow(clippy::too_many_arguments)]
    fn run_layer(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        xs: &CudaSlice<f32>,
        t: usize,
        routes: &[Route],
        out: &mut CudaSlice<f32>,
        residual: Option<u64>,
    ) -> crate::Result<bool> {
        let (h, f) = self.file.expert_dims();
        let decode = t == 1;
        // The cache's counters first take a device-routed token before this one.
        self.count_held()?;
        // A decode layer's experts may each keep a row of the down buffer (early_layer).
        self.ensure_cap(if decode { routes.len().max(1) } else { t })?;
        let entered = Instant::now();
        if decode {
            let now = entered;
            if let Some((l, at)) = self.layer_started {
                if l + 1 == layer {
                    let secs = now.duration_since(at).as_secs_f64();
                    self.layer_s = Some(self.layer_s.map_or(secs, |old| 0.9 * old + 0.1 * secs));
                }
            }
            self.layer_started = Some((layer, now));
        } else {
            self.layer_started = None;
        }
        if layer == 0 {
            for _ in 0..t {
                self.cache.begin_token();
            }
            if decode {
                self.decoded += 1;
            }
        }
        self.cache.set_layer(layer);
        let mut lp = std::mem::take(&mut self.layer_plan);
        self.plan.plan_layer(routes, t, &mut lp);
        self.layer_plan = lp;
        self.record(layer, routes, t, Some(ptr(xs, &self.gpu.stream)))?;
        let lp = std::mem::take(&mut self.layer_plan);
        self.skipped += lp.skipped as u64;
        let k = routes.len() / t.max(1);
        for (r, d) in routes.iter().zip(&lp.decisions) {
            let _ = k;
            self.cache.record_use((layer, r.expert), *d);
        }
        if let Some((p, _, _)) = self.predictor.as_mut() {
            if decode {
                p.observe(layer, routes);
            } else {
                p.forget();
            }
            if decode && self.cancel_wrong {
                self.drop_wrong_prefetches(layer, routes);
            }
        }
        // The top-1 expert of a decode token (never substituted).
        let top1 = routes
            .iter()
            .max_by(|a, b| a.weight.total_cmp(&b.weight).then(b.expert.cmp(&a.expert)))
            .map(|r| r.expert);

        let s = self.gpu.stream.clone();
        let (xp, op) = (ptr(xs, &s), ptr(out, &s));
        // A decode layer that may add into the residual directly zeroes `out` only once it
        // knows it will not.
        let defer_zero = decode && residual.is_some() && self.routed_slots;
        if !defer_zero || lp.groups.is_empty() {
            self.gpu.zero(op, t * h * 4)?;
        }
        let dp = ptr(&self.down, &s);
        if t > 1 {
            let idx: Vec<i32> = lp
                .groups
                .iter()
                .flat_map(|g| g.rows.iter().map(|&(i, _)| i as i32))
                .collect();
            let wts: Vec<f32> = lp
                .groups
                .iter()
                .flat_map(|g| g.rows.iter().map(|&(_, w)| w))
                .collect();
            self.ensure_routes(idx.len())?;
            let (ip, wp) = (ptr(&self.idx, &s), ptr(&self.wts, &s));
            self.gpu.upload_i32_queued(&idx, ip)?;
            self.gpu.upload_f32_queued(&wts, wp)?;
        }

        // This layer's experts stay put until computed.
        let mut places: Vec<Option<Place>> = vec![None; lp.groups.len()];
        let (mut load_busy, mut cpu_busy) = (self.link_backlog(), 0.0f64);
        let mut placed = 0usize;
        let mut prefetched = false;
        let mut cpu_jobs: Vec<CpuJob> = Vec::new();
        let mut splits: Vec<SplitJob> = Vec::new();
        let mut cpu_out: Vec<f32> = Vec::new();
        // A decode layer whose experts all sit in slots of one pool: the routed kernels
        // (forward_slots) once their loads have landed.
        let mut slot_mode: Option<PoolKind> = None;
        let mut slot_list: Vec<(usize, f32, usize)> = Vec::new();
        let (mut spawned, mut cpu_span) = (entered, None);
        // The CPU helpers get this layer's experts as one task on their own pool (no thread
        // started per layer); this thread goes on launching the cached experts and waiting for
        // loads, then takes the CPU's result from `done`.
        let helpers = self.cpu.as_ref().map(|(cpu, _)| cpu.clone());
        let mut body = |scope: Option<&rayon::Scope<'f>>| -> crate::Result<()> {
            let mut background = None;
            let mut at = 0usize;
            let mut cpu_handed = 0usize;
            // Slot groups (index, first route row) computed after the CPU helpers' result.
            let mut deferred: Vec<(usize, usize)> = Vec::new();
            for i in 0..lp.groups.len() {
                // Place as many groups ahead as slots allow (their loads queue up together).
                while placed < lp.groups.len() {
                    let g = &lp.groups[placed];
                    // A second try once this token's predictions are given up, where every
                    // slot is protected and no group of the layer is placed ahead.
                    let mut p = None;
                    for retry in [false, true] {
                        if retry {
                            if placed > i {
                                break;
                            }
                            // (The predictions' holds only: this layer's placements whose
                            // kernels are not queued yet keep theirs.)
                            for l in 0..self.protected.len() {
                                for (kind, key) in std::mem::take(&mut self.protected[l]) {
                                    self.cache.unprotect(kind, key);
                                }
                            }
                        }
                        p = self.place(
                            layer,
                            g,
                            top1 == Some(g.expert),
                            decode,
                            &mut load_busy,
                            &mut cpu_busy,
                        )?;
                        if p.is_some() {
                            break;
                        }
                    }
                    let p = match p {
                        Some(p) => p,
                        None if placed > i => break,
                        // This layer's own placements hold every slot (some deferred behind
                        // the CPU): the CPU computes this one too.
                        None if decode && self.cpu.is_some() => {
                            let v = self.pool(self.kind_of(g.precision)).variant;
                            self.count_cpu(v, &mut cpu_busy);
                            Place::Cpu
                        }
                        None => {
                            return Err(Error::Invalid(format!(
                                "expert cache: no slot can be freed for layer {layer} expert {} (pools of {} / {} slots)",
                                g.expert,
                                self.cache.capacity(PoolKind::High),
                                self.cache.capacity(PoolKind::Low)
                            )))
                        }
                    };
                    // Either way the same bookkeeping: a slot placement holds its slot until its
                    // group's kernels are queued (a hold each: an expert's high and low routes in
                    // one prefill slot, the low ones upgraded to its high copy, are two), a CPU
                    // placement becomes a CPU job. (The retry once recorded only
                    // the placement: an expert it sent to the CPU was computed nowhere, its
                    // output missing from the layer — a rare decode NMSE of 3e-2 in the GPU
                    // test's cooperative case, 2026-11-27.)
                    if let Place::Slot(kind, _) = p {
                        self.cache.protect(kind, (layer, g.expert));
                    }
                    if p == Place::Cpu {
                        let v = self.pool(self.kind_of(g.precision)).variant;
                        cpu_jobs.push(CpuJob {
                            expert: g.expert,
                            variant: v,
                            weight: g.rows[0].1,
                            rows: f,
                        });
                    }
                    places[placed] = Some(p);
                    placed += 1;
                }
                if !prefetched && decode {
                    // Demand loads are queued; now predict and queue prefetches behind them, then
                    // let the CPU compute its experts while the loader and the GPU work.
                    prefetched = true;
                    self.prefetch(layer, xp, b)?;
                    if !cpu_jobs.is_empty() {
                        // The CPU helpers work on their pool while this thread launches the
                        // cached experts and waits for loads.
                        self.gpu.download_f32(xp, &mut self.host_x)?;
                        let mut jobs = std::mem::take(&mut cpu_jobs);
                        cpu_handed += jobs.len();
                        splits = self.plan_splits(layer, &mut jobs)?;
                        let x = self.host_x.clone();
                        if let (Some((cpu, cost)), Some(scope)) = (self.cpu.as_ref(), scope) {
                            let (cpu, est) = (cpu.clone(), cost.cpu_s.clone());
                            let file = self.file;
                            let (tx, done) = crossbeam_channel::bounded(1);
                            spawned = Instant::now();
                            scope.spawn(move |_| {
                                let start = Instant::now();
                                let (res, times) =
                                    Self::cpu_compute(file, &cpu, &jobs, layer, &x, &est);
                                // The receiver waits for this unless the layer failed first.
                                let _ = tx.send((res, times, start, Instant::now()));
                            });
                            background = Some(done);
                        }
                    }
                }
                // Cached experts first while some loads are still landing (early_layer).
                let mut early = false;
                if i == 0 && decode && placed == lp.groups.len() {
                    let slots = places.iter().filter_map(|p| match p {
                        Some(Place::Slot(kind, s)) => Some(self.slot_landed(*kind, *s)),
                        _ => None,
                    });
                    let (mut ready, mut loading) = (false, false);
                    for landed in slots {
                        ready |= landed;
                        loading |= !landed;
                    }
                    // (Mapped slots load matrix by matrix: worth it with no slot ready too.)
                    early = self.hits_first
                        && background.is_none()
                        && loading
                        && (ready || self.mapped);
                    if !early {
                        slot_mode = self.slot_pool(&places);
                    }
                }
                if i == 0 && defer_zero && slot_mode.is_none() {
                    self.gpu.zero(op, t * h * 4)?;
                }
                if early {
                    self.early_layer(b, layer, &lp.groups, &places, xp, op)?;
                    break;
                }
                let g = &lp.groups[i];
                let n = g.rows.len();
                match places[i] {
                    Some(Place::Slot(kind, slot))
                        if background.is_some()
                            && slot_mode.is_none()
                            && !self.slot_landed(kind, slot) =>
                    {
                        // Its load lands while the CPU helpers work: computed once their
                        // result is back, so this thread is not woken for it while they
                        // hold every core.
                        deferred.push((i, at));
                    }
                    Some(Place::Slot(kind, slot)) => {
                        self.take_slot(kind, slot)?;
                        if slot_mode.is_some() {
                            slot_list.push((g.expert, g.rows[0].1, slot));
                            at += n;
                            continue;
                        }
                        self.run_slot(b, layer, (kind, slot), g, at, decode, xp, op)?;
                    }
                    Some(Place::Cpu) | None => {}
                }
                at += n;
            }
            if let Some(kind) = slot_mode {
                self.forward_slots(kind, &slot_list, xp, residual.unwrap_or(op))?;
                for &(e, _, _) in &slot_list {
                    self.cache.unprotect(kind, (layer, e));
                }
            }
            self.run_splits(b, layer, std::mem::take(&mut splits), xp, op)?;
            // Predicted experts of this layer have been used or proven wrong.
            for (kind, key) in std::mem::take(&mut self.protected[layer]) {
                self.cache.unprotect(kind, key);
            }
            if let Some(done) = background {
                let started = Instant::now();
                let (res, times, start, end) = done
                    .recv()
                    .map_err(|_| Error::Invalid("a CPU expert task failed".into()))?;
                self.cpu_wait += started.elapsed();
                self.absorb_cpu(res, times, &mut cpu_out);
                cpu_span = Some((start, end));
            }
            for (i, at) in deferred {
                if let Some(Place::Slot(kind, slot)) = places[i] {
                    self.take_slot(kind, slot)?;
                    self.run_slot(b, layer, (kind, slot), &lp.groups[i], at, decode, xp, op)?;
                }
            }
            if !cpu_jobs.is_empty() {
                self.gpu.download_f32(xp, &mut self.host_x)?;
                self.run_cpu(&cpu_jobs, layer, &mut cpu_out)?;
                cpu_handed += cpu_jobs.len();
            }
            // Every group placed on the CPU was computed there (else its output would be
            // missing from the layer, silently).
            let on_cpu = places.iter().filter(|p| **p == Some(Place::Cpu)).count();
            if on_cpu != cpu_handed {
                return Err(Error::Invalid(format!(
                    "expert engine: layer {layer} placed {on_cpu} experts on the CPU but computed {cpu_handed} there"
                )));
            }
            // Every hold on this layer's experts is released by now (its placements' once their
            // kernels are queued, its predictions' above); one left would keep a slot from
            // eviction for good, one released twice would have let a slot go early.
            self.check_holds(layer)?;
            Ok(())
        };
        match helpers {
            Some(cpu) => cpu.in_place_scope(|scope| body(Some(scope)))?,
            None => body(None)?,
        }
        if !cpu_out.is_empty() {
            // CPU results are added last (so cooperative mode rounds differently from the
            // all-GPU order; the sum is the same up to float rounding).
            self.gpu.upload_f32(&cpu_out, dp)?;
            self.gpu.axpy(op, 1.0, dp, h)?;
        }
        self.layer_plan = lp;
        if let Some((start, end)) = cpu_span {
            if let Some((l, prev_end, prev_exit)) = self.cpu_mark {
                if l + 1 == layer {
                    let parts = [
                        prev_exit.saturating_duration_since(prev_end),
                        entered.saturating_duration_since(prev_exit),
                        spawned.saturating_duration_since(entered),
                        start.saturating_duration_since(spawned),
                    ];
                    for (g, p) in self.cpu_gaps.iter_mut().zip(parts) {
                        *g += p;
                    }
                }
            }
            self.cpu_mark = Some((layer, end, Instant::now()));
        } else {
            self.cpu_mark = None;
        }
        self.replayed_pred = None;
        Ok(slot_mode.is_some() && residual.is_some())
    }
}

impl Drop for CudaExperts<'_> {
    fn drop(&mut self) {
        // The loader writes into the arenas: stop it before they are freed.
        if let Some(l) = self.loader.take() {
            if let Err(e) = l.shutdown() {
                log::warn!("expert loader: {e}");
            }
        }
        if let Some(tw) = self.trace.take() {
            if let Err(e) = tw.finish() {
                log::warn!("{e}");
            }
        }
    }
}

impl ExpertReport for CudaExperts<'_> {
    fn describe(&self) -> String {
        let v = self.file.variants();
        let (hs, ls) = self.slots();
        let total = self.file.n_layers() * self.file.n_experts();
        let mut s = format!(
            "{} in a GPU cache of {hs} slots ({:.0}% of {total} experts)",
            v[self.plan.high],
            100.0 * hs as f64 / total as f64,
        );
        if let Some(l) = self.plan.low {
            s += &format!(
                " + {} in {ls} slots (T1 {}, T2 {})",
                v[l], self.plan.thresholds.t1, self.plan.thresholds.t2
            );
        }
        s += &format!(
            ", {:.2} GiB{}, policy {:?}",
            self.arena_bytes() as f64 / (1u64 << 30) as f64,
            if self.mapped {
                " of mapped host memory"
            } else {
                ""
            },
            self.cache.policy()
        );
        if let Some((p, _, _)) = &self.predictor {
            s += &format!(", prefetch {} layers", p.depth());
            if self.prefetch_min_weight > 0.0 {
                s += &format!(" (predicted weight >= {})", self.prefetch_min_weight);
            }
        }
        if self.device_allowed {
            s += ", decode routed on the device";
        }
        if let Some((c, _)) = &self.cpu {
            s += &format!(", CPU experts on {} threads", c.threads());
            if let Some(a) = &self.split_arena {
                s += &format!(
                    " (split with the GPU: {:?}, {:.0} MiB arena)",
                    self.split,
                    a.len() as f64 / (1 << 20) as f64
                );
            }
        }
        if self.tier == Tier::Disk {
            s += ", loads from the SSD";
        } else if self.direct_loads {
            s += ", loads by DMA from page-locked file pages";
        } else if !self.mapped {
            s += ", loads through pinned staging";
        }
        if let Some(bw) = self.pace {
            s += &format!(", loads paced to {:.1} GB/s", bw / 1e9);
        }
        s
    }

    fn stats(&self) -> ExpertStats {
        // A device-routed token whose routes are held (account_device) counts as counted: every
        // one of its expert uses a hit in the high pool.
        let held = u64::from(self.routes_held);
        let high = match (&self.pools[PoolKind::High as usize], held) {
            (Some(p), 1) => p.variant,
            _ => usize::MAX,
        };
        let held_hits = held * (self.file.n_layers() * self.top_k) as u64;
        let per_variant = self
            .file
            .variants()
            .iter()
            .enumerate()
            .map(|(i, v)| VariantStats {
                name: v.to_string(),
                hits: self.hits[i] + if i == high { held_hits } else { 0 },
                misses: self.misses[i],
            })
            .collect();
        let prediction = self
            .predictor
            .as_ref()
            .map(|(p, _, _)| {
                p.accuracy()
                    .iter()
                    .map(|a| (a.predicted, a.correct))
                    .collect()
            })
            .unwrap_or_default();
        let passes = self
            .cpu
            .as_ref()
            .map(|(cpu, _)| cpu.pass_stats().since(self.pass_base))
            .unwrap_or_default();
        ExpertStats {
            per_variant,
            cpu_passes: passes.passes,
            cpu_pass_threads: passes.threads,
            cpu_pass_spread_seconds: passes.spread_seconds,
            skipped: self.skipped,
            substituted: self.substituted,
            cpu_computed: self.cpu_computed,
            bytes_loaded: self.counters.bytes.load(Ordering::Relaxed) - self.base_bytes.0,
            bytes_from_disk: self.counters.disk_bytes.load(Ordering::Relaxed) - self.base_bytes.1,
            load_seconds: self.wait.as_secs_f64(),
            cpu_wait_seconds: self.cpu_wait.as_secs_f64(),
            cpu_gaps: self.cpu_gaps.map(|d| d.as_secs_f64()),
            prefetch_issued: self.prefetch_issued,
            prefetch_used: self.prefetch_used,
            prefetch_cancelled: self.prefetch_cancelled,
            late_to_cpu: self.late_to_cpu,
            loaded_behind: self.loaded_behind,
            behind_chances: self.behind_chances,
            cpu_bytes: self.cpu_bytes,
            link_seconds: (self.counters.nanos.load(Ordering::Relaxed) - self.base_bytes.2) as f64
                / 1e9,
            cpu_seconds: self.cpu_busy,
            split_experts: self.split_experts,
            split_bytes: self.split_bytes,
            prediction,
            device_routed: self.device_tokens + held,
            device_account_seconds: self.device_account.as_secs_f64(),
            slot_routed_layers: self.slot_layers,
            early_layers: self.early_layers,
            // The session fills in the backend's host times.
            ..ExpertStats::default()
        }
    }

    fn reset_stats(&mut self) {
        // A held token belongs to the counts being cleared (count_held cannot fail here: the
        // routes were checked when they arrived, and no trace is written while one is held).
        if let Err(e) = self.count_held() {
            log::warn!("expert engine: counting the last device-routed token: {e}");
        }
        self.hits.fill(0);
        self.misses.fill(0);
        self.device_tokens = 0;
        self.device_account = Duration::ZERO;
        self.slot_layers = 0;
        self.early_layers = 0;
        self.skipped = 0;
        self.substituted = 0;
        self.cpu_computed = 0;
        self.prefetch_issued = 0;
        self.prefetch_used = 0;
        self.prefetch_cancelled = 0;
        self.late_to_cpu = 0;
        self.loaded_behind = 0;
        self.behind_chances = 0;
        self.cpu_bytes = 0;
        self.wait = Duration::ZERO;
        self.cpu_wait = Duration::ZERO;
        self.cpu_gaps = [Duration::ZERO; 4];
        if let Some((cpu, _)) = self.cpu.as_ref() {
            self.pass_base = cpu.pass_stats();
        }
        self.cpu_mark = None;
        self.cpu_busy = 0.0;
        self.split_experts = 0;
        self.split_bytes = 0;
        self.base_bytes = (
            self.counters.bytes.load(Ordering::Relaxed),
            self.counters.disk_bytes.load(Ordering::Relaxed),
            self.counters.nanos.load(Ordering::Relaxed),
        );
        if let Some((p, _, _)) = self.predictor.as_mut() {
            p.reset_stats();
        }
    }
}
