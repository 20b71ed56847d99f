//! The loader thread's copies on a CUDA device (`model::ChunkCopier`): a copy stream ordered by
//! events, and three ways a chunk gets there: by DMA straight from the page-locked pages of the
//! mapped model file (direct), through page-locked staging buffers, or written by the host into
//! a mapped arena the device reads in place (unified memory). An emulated link is paced on the
//! copy stream itself.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream};
use cudarc::driver::{PinnedHostSlice, PushKernelArg};
use memmap2::Mmap;

use super::{cuda_err, pinned_err};
use crate::model::ChunkCopier;

/// Bytes of a staging buffer (one chunk), and how many rotate.
const STAGING_CHUNK: usize = 16 << 20;
const STAGING_BUFFERS: usize = 4;
/// Chunks a direct load keeps queued on the copy stream: with the link paced on the device,
/// enough to keep it busy while the loader thread waits for a core.
const DIRECT_IN_FLIGHT: usize = 4;

pub struct CudaCopier {
    ctx: Arc<CudaContext>,
    bound: bool,
    copy: Arc<CudaStream>,
    /// Staging buffers, each with the event of its last copy.
    staging: Vec<(PinnedHostSlice<u8>, Option<CudaEvent>)>,
    next: usize,
    /// Direct loads: the page-locked file, and the events of the chunks still in flight (oldest
    /// first; bounded like the staging buffers, so a demand job is never queued behind more
    /// than that of a prefetch).
    _pinned: Option<PinnedFile>,
    in_flight: VecDeque<CudaEvent>,
    link: Option<LinkClock>,
}

impl CudaCopier {
    pub fn new(
        ctx: &Arc<CudaContext>,
        staging: bool,
        pinned: Option<PinnedFile>,
        link: Option<LinkClock>,
    ) -> crate::Result<CudaCopier> {
        let copy = ctx.new_stream().map_err(cuda_err)?;
        let staging = (0..if staging { STAGING_BUFFERS } else { 0 })
            .map(|_| {
                // SAFETY: write-combined pinned memory, only ever written by the CPU (filled from
                // the mmap or the SSD) and read by the copy engine.
                let host = unsafe { ctx.alloc_pinned::<u8>(STAGING_CHUNK) }
                    .map_err(|e| pinned_err(STAGING_CHUNK, "expert load staging", e))?;
                Ok((host, None))
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(CudaCopier {
            ctx: ctx.clone(),
            bound: false,
            copy,
            staging,
            next: 0,
            _pinned: pinned,
            in_flight: VecDeque::new(),
            link,
        })
    }

    fn bind(&mut self) -> crate::Result<()> {
        if !self.bound {
            self.ctx.bind_to_thread().map_err(cuda_err)?;
            self.bound = true;
        }
        Ok(())
    }
}

impl ChunkCopier for CudaCopier {
    type Event = CudaEvent;

    fn after(&mut self, ev: &CudaEvent, on_host: bool) -> crate::Result<()> {
        self.bind()?;
        if on_host {
            ev.synchronize().map_err(cuda_err)
        } else {
            self.copy.wait(ev).map_err(cuda_err)
        }
    }

    fn fill_mapped(
        &mut self,
        dst: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> crate::Result<()>,
    ) -> crate::Result<()> {
        // SAFETY: dst .. + len lies inside one slot of a live mapped arena (the engine stops the
        // loader before it frees the arenas), and no kernel reads the slot now (the job waited
        // for the compute that did, and the slot's next reader waits for this job).
        let dst = unsafe { std::slice::from_raw_parts_mut(dst as usize as *mut u8, len) };
        fill(dst)
    }

    fn copy_staged(
        &mut self,
        dst: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> crate::Result<()>,
    ) -> crate::Result<()> {
        self.bind()?;
        if self.staging.is_empty() {
            return Err(crate::Error::Loader(
                "a staged copy without staging buffers".into(),
            ));
        }
        let at = self.next;
        self.next = (at + 1) % self.staging.len();
        let (host, done) = &mut self.staging[at];
        if let Some(ev) = done.take() {
            ev.synchronize().map_err(cuda_err)?;
        }
        let host = &mut host.as_mut_slice().map_err(cuda_err)?[..len];
        fill(host)?;
        // SAFETY: dst .. + len lies inside the job's slot of the device arena; the staging
        // buffer is not written again before `done` is reached.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, &*host, self.copy.cu_stream())
                .map_err(cuda_err)?;
        }
        *done = Some(blocking_event(&self.copy)?);
        Ok(())
    }

    fn copy_direct(&mut self, src: &[u8], dst: u64) -> crate::Result<Option<Duration>> {
        self.bind()?;
        if self.in_flight.len() >= DIRECT_IN_FLIGHT {
            if let Some(ev) = self.in_flight.pop_front() {
                ev.synchronize().map_err(cuda_err)?;
            }
        }
        if let Some(l) = &self.link {
            l.start(&self.copy)?;
        }
        // SAFETY: dst .. + src.len() lies inside the job's destination in the device arena; the
        // source lies in page-locked pages of the mapping the loader holds.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, src, self.copy.cu_stream())
                .map_err(cuda_err)?;
        }
        let paced = match &self.link {
            Some(l) => Some(l.wait(&self.copy, src.len())?),
            None => None,
        };
        self.in_flight.push_back(blocking_event(&self.copy)?);
        Ok(paced)
    }

    fn copy_within(&mut self, from: u64, to: u64, len: usize, mapped: bool) -> crate::Result<()> {
        if mapped {
            // SAFETY: both ranges lie inside slots of live mapped arenas, different slots (the
            // engine copies a narrower copy into another pool's slot); the source has landed and
            // is not rewritten before this job ends (later loads queue behind it), and no kernel
            // reads the destination (the job waited for the compute that did).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    from as usize as *const u8,
                    to as usize as *mut u8,
                    len,
                )
            };
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges lie inside slots of the device arenas, different slots; the copy
        // stream orders this after the source's load and before any later load into either.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(to, from, len, self.copy.cu_stream())
                .map_err(cuda_err)?;
        }
        Ok(())
    }

    fn fence(&mut self) -> crate::Result<CudaEvent> {
        self.bind()?;
        blocking_event(&self.copy)
    }
}

/// An event the host sleeps on: waits for loads may overlap CPU experts, and a spinning wait
/// would take a core from them.
fn blocking_event(stream: &CudaStream) -> crate::Result<CudaEvent> {
    use cudarc::driver::sys::CUevent_flags;
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
        .map_err(cuda_err)
}

/// The emulated link paced on the copy stream itself (kernels link_start / link_wait): a
/// chunk's copy holds the stream for its bytes at the profile's rate.
pub struct LinkClock {
    pub clock: CudaSlice<u64>,
    pub start: CudaFunction,
    pub wait: CudaFunction,
    pub bytes_per_s: f64,
}

impl LinkClock {
    fn launch(&self, stream: &CudaStream, f: &CudaFunction, ns: Option<u64>) -> crate::Result<()> {
        use cudarc::driver::DevicePtr;
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

/// The expert pages of the mapped file, page-locked for the copy engine (a read-only
/// registration): a load goes from the page cache to the device by DMA, with no staging copy
/// and no CPU thread.
pub struct PinnedFile {
    ctx: Arc<CudaContext>,
    /// Registered (address, length) ranges of `_map`, which stays mapped while they are.
    ranges: Vec<(usize, usize)>,
    _map: Arc<Mmap>,
}

/// Page-lock `ranges` of `map` for direct loads; None (logged) when the driver refuses: loads
/// go through staging.
pub fn register_file(
    ctx: &Arc<CudaContext>,
    map: Arc<Mmap>,
    ranges: Vec<Range<usize>>,
) -> Option<PinnedFile> {
    let started = Instant::now();
    match PinnedFile::register(ctx, map, ranges) {
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
            // holds the mapping for as long as the registration lives), registered read-only:
            // the device only ever reads it.
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
