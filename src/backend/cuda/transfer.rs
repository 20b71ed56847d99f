//! Copies between host and device on the compute stream: uploads, read-backs (through a
//! page-locked buffer, or queued to land with a later wait) and the staged embedding upload.

use super::*;

impl Gpu {
    /// Host-to-device copy of f32 values on the compute stream (src stays borrowed until the
    /// copy is done: this waits for it).
    pub fn upload_f32(&self, src: &[f32], dst: u64) -> crate::Result<()> {
        // SAFETY: dst addresses at least src.len() floats; the copy is synchronous with respect
        // to `src` because the stream is synchronized before returning.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream())
                .map_err(cuda_err)?;
        }
        self.sync()
    }

    /// Host-to-device copy of f32 values queued on the compute stream, without waiting for it:
    /// a copy from pageable memory is staged before the call returns (CUDA's synchronization
    /// rules for cuMemcpyHtoDAsync), so `src` may change at once. Decode's per-token embedding
    /// row takes this path (no wait between the host's token and its launches).
    pub fn upload_f32_queued(&self, src: &[f32], dst: u64) -> crate::Result<()> {
        // SAFETY: dst addresses at least src.len() floats; src is staged before the call returns
        // (pageable memory) and the stream orders the copy before later launches.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream())
                .map_err(cuda_err)
        }
    }

    /// Device-to-host copy of f32 values (waits for the compute stream).
    pub fn download_f32(&self, src: u64, dst: &mut [f32]) -> crate::Result<()> {
        if dst.len() >= PINNED_READ_MIN {
            self.timed_read(|| self.download_pinned(&self.readback, src, dst))
        } else {
            self.read_direct(src, dst)
        }
    }

    /// A copy of dst.len() floats from `src` straight into `dst`, and a wait for it (into
    /// page-locked memory: by DMA; into pageable memory: staged by the driver in pieces).
    pub fn read_direct(&self, src: u64, dst: &mut [f32]) -> crate::Result<()> {
        self.timed_read(|| {
            // SAFETY: src addresses at least dst.len() floats; the stream is synchronized
            // before dst is read.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
                .map_err(cuda_err)
                .and_then(|()| self.sync())
        })
    }

    /// `read`, its time added to read_ns (--stats: the host waiting for results).
    fn timed_read(&self, read: impl FnOnce() -> crate::Result<()>) -> crate::Result<()> {
        let t = Instant::now();
        let r = read();
        self.read_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// download_f32 through the page-locked buffer `rb` (grown to dst's length).
    fn download_pinned(
        &self,
        rb: &Mutex<Option<PinnedHostSlice<f32>>>,
        src: u64,
        dst: &mut [f32],
    ) -> crate::Result<()> {
        self.download_parts_through(rb, &mut [(src, dst)])
    }

    /// Device-to-host copies of f32 values (each (device address, destination)) queued
    /// together, and one wait for the compute stream: one round trip for them all.
    pub fn download_parts(&self, parts: &mut [(u64, &mut [f32])]) -> crate::Result<()> {
        self.timed_read(|| self.download_parts_through(&self.readback, parts))
    }

    /// download_parts through the page-locked buffer `rb` (grown to the parts' total length).
    fn download_parts_through(
        &self,
        rb: &Mutex<Option<PinnedHostSlice<f32>>>,
        parts: &mut [(u64, &mut [f32])],
    ) -> crate::Result<()> {
        let total: usize = parts.iter().map(|(_, d)| d.len()).sum();
        let mut rb = rb.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match rb.take() {
            Some(b) if b.len() >= total => rb.insert(b),
            // SAFETY: page-locked host memory of `total` floats, written only by the copies
            // below and read after the stream is synchronized.
            _ => rb.insert(unsafe { self.alloc_readable::<f32>(total) }?),
        };
        let host = &mut buf.as_mut_slice().map_err(cuda_err)?[..total];
        let mut rest = &mut host[..];
        for (src, dst) in parts.iter() {
            let (part, after) = rest.split_at_mut(dst.len());
            // SAFETY: src addresses at least dst.len() floats, part holds as many; the stream
            // is synchronized before part is read.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(part, *src, self.stream.cu_stream())
                    .map_err(cuda_err)?;
            }
            rest = after;
        }
        self.sync()?;
        let mut at = 0;
        for (_, dst) in parts.iter_mut() {
            dst.copy_from_slice(&host[at..at + dst.len()]);
            at += dst.len();
        }
        Ok(())
    }

    /// Page-locked host memory the CPU reads: cached, unlike cudarc's `alloc_pinned`, which is
    /// write-combined (its reads bypass the caches: a 128 KB logits scan took ~25 us a token,
    /// benches/results/2026-12-01-h200-issue49.md).
    ///
    /// # Safety
    /// The memory is uninitialized: write it (or copy into it) before reading.
    unsafe fn alloc_readable<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
    ) -> crate::Result<PinnedHostSlice<T>> {
        // SAFETY: the caller initializes the memory before reading it (this fn's contract).
        unsafe { self.ctx.alloc_pinned_with_flags::<T>(n, 0) }
            .map_err(|e| pinned_err(n * std::mem::size_of::<T>(), "reading results back", e))
    }

    /// Page-locked host memory of `n` floats (zeroed) that results are read back into.
    pub fn alloc_floats(&self, n: usize) -> crate::Result<PinnedFloats> {
        // SAFETY: page-locked host memory of n floats, zeroed below before any read.
        let mut buf = unsafe { self.alloc_readable::<f32>(n.max(1)) }?;
        buf.as_mut_slice().map_err(cuda_err)?.fill(0.0);
        let at = buf.as_mut_ptr().map_err(cuda_err)?;
        Ok(PinnedFloats { buf, at })
    }

    /// A page-locked buffer of `n` floats for `queue_read`.
    pub fn alloc_read(&self, n: usize) -> crate::Result<QueuedRead> {
        // SAFETY: page-locked host memory of n floats, written only by the copies queue_read
        // queues and read only after their event has completed (QueuedRead::wait).
        let buf = unsafe { self.alloc_readable::<f32>(n) }?;
        let done = self.ctx.new_event(None).map_err(cuda_err)?;
        Ok(QueuedRead {
            buf,
            done,
            queued: false,
        })
    }

    /// Queue a copy of `q`'s length in floats from `src` into `q` after the stream's work,
    /// without waiting for it (a result read back together with a later one: one wait for both).
    pub fn queue_read(&self, src: u64, q: &mut QueuedRead) -> crate::Result<()> {
        if std::mem::take(&mut q.queued) {
            // (Not collected: the buffer is rewritten only once that copy has landed.)
            q.done.synchronize().map_err(cuda_err)?;
        }
        let host = q.buf.as_mut_slice().map_err(cuda_err)?;
        // SAFETY: src addresses at least host.len() floats; host is page-locked and read only
        // once the event recorded below has completed.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(host, src, self.stream.cu_stream())
                .map_err(cuda_err)?;
        }
        q.done.record(&self.stream).map_err(cuda_err)?;
        q.queued = true;
        Ok(())
    }

    /// Host-to-device copy of `n` f32 values that `fill` writes into a page-locked buffer (a
    /// prompt's embedding: converted in place, then one DMA at the link's full speed where a
    /// pageable copy would be staged by the driver first). Queued on the compute stream.
    pub fn upload_staged(
        &self,
        n: usize,
        dst: u64,
        fill: impl FnOnce(&mut [f32]),
    ) -> crate::Result<()> {
        let mut st = self.stage.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = match st.take() {
            Some((b, done)) => {
                // (A buffer too small is freed only once its last copy has finished.)
                done.synchronize().map_err(cuda_err)?;
                if b.len() >= n {
                    b
                } else {
                    self.alloc_stage(n)?
                }
            }
            None => self.alloc_stage(n)?,
        };
        let host = &mut buf.as_mut_slice().map_err(cuda_err)?[..n];
        fill(host);
        // SAFETY: dst addresses at least n floats; host (page-locked, n floats) is not written
        // again before the event recorded below has completed.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, &*host, self.stream.cu_stream())
                .map_err(cuda_err)?;
        }
        let done = self.stream.record_event(None).map_err(cuda_err)?;
        *st = Some((buf, done));
        Ok(())
    }

    fn alloc_stage(&self, n: usize) -> crate::Result<PinnedHostSlice<f32>> {
        // SAFETY: page-locked host memory of n floats, written by upload_staged's fill before
        // any copy reads it.
        unsafe { self.ctx.alloc_pinned::<f32>(n) }
            .map_err(|e| pinned_err(n * 4, "staging an upload", e))
    }

    /// Host-to-device copy of i32 values queued on the compute stream, without waiting (as
    /// upload_f32_queued: a pageable source is staged before the call returns).
    /// Host-to-device copy of a table of `T` queued as upload_f32_queued's (dst 16-byte
    /// aligned, room for src.len() values).
    pub fn upload_queued<T: DeviceRepr>(&self, src: &[T], dst: u64) -> crate::Result<()> {
        // SAFETY: as upload_f32_queued; T is a plain #[repr(C)] value (DeviceRepr).
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream())
                .map_err(cuda_err)
        }
    }

    pub fn upload_i32_queued(&self, src: &[i32], dst: u64) -> crate::Result<()> {
        // SAFETY: as upload_f32_queued.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream())
                .map_err(cuda_err)
        }
    }
}

/// Page-locked host memory of f32 values that device-to-host copies land in by DMA, with no
/// second copy (the CUDA backend's `Backend::Host`: a forward call's logits).
pub struct PinnedFloats {
    buf: PinnedHostSlice<f32>,
    /// The buffer's first value (taken once: PinnedHostSlice's accessors wait on an event).
    at: *mut f32,
}

// SAFETY: `at` points into `buf`'s allocation, which PinnedHostSlice (Send + Sync) owns and
// frees; PinnedFloats hands it out only as slices borrowed from itself.
unsafe impl Send for PinnedFloats {}
// SAFETY: as Send; shared access only reads.
unsafe impl Sync for PinnedFloats {}

impl std::ops::Deref for PinnedFloats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `at` is the start of buf's buf.len() initialized floats (zeroed by
        // alloc_floats), alive as long as self; copies into it (download_host) hold &mut self
        // until the stream is synchronized.
        unsafe { std::slice::from_raw_parts(self.at, self.buf.len()) }
    }
}

impl std::ops::DerefMut for PinnedFloats {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as deref, borrowed mutably from self.
        unsafe { std::slice::from_raw_parts_mut(self.at, self.buf.len()) }
    }
}

/// A result read back without a wait (`Gpu::queue_read`): the page-locked buffer it lands in
/// and the event recorded after the copy.
pub struct QueuedRead {
    buf: PinnedHostSlice<f32>,
    /// Recorded after each copy (one event, recorded again each time).
    done: CudaEvent,
    queued: bool,
}

impl QueuedRead {
    /// The values of the copy queued last, once it has landed; None when none is queued (or it
    /// was collected already).
    pub fn wait(&mut self) -> crate::Result<Option<&[f32]>> {
        if !std::mem::take(&mut self.queued) {
            return Ok(None);
        }
        self.done.synchronize().map_err(cuda_err)?;
        Ok(Some(self.buf.as_slice().map_err(cuda_err)?))
    }
}
