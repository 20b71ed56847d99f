//! The device: context, compute stream, kernels and cuBLAS, memory, and the measurements of its
//! copy and host link that `hob bench` takes its limit from.

use super::*;

/// Input precision of a cuBLAS product.
#[derive(Clone, Copy, Debug)]
pub(super) enum Precision {
    F32,
    F16,
}

/// The device, its streams and kernels: shared by the backend and the expert cache.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    pub(super) blas: CudaBlas,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub q_limits: QLimits,
    /// The integer kinds (int8, int4, int2) whose matvecs take the tensor-core kernels
    /// (matvec_qm_*) where those apply (QM_KINDS; a field so that benches can compare).
    pub qm_kinds: [bool; 3],
    /// The integer kinds whose matvecs take the dp4a kernels (matvec_qd_*) where those apply
    /// (groups of whole chunks), before the tensor-core ones (QD_KINDS, from sm_61).
    pub qd_kinds: [bool; 3],
    /// Per-kernel GPU time while switched on (`hob bench --kernel-times`).
    pub clock: clock::KernelClock,
    /// Launch with programmatic dependent launch (sm_90 and later): a kernel may start while the
    /// one before it in the stream still runs, and waits for it inside (common.cu pdl_wait). Its
    /// blocks are then resident when the earlier kernel ends, and the products' first weight
    /// loads overlap that kernel's tail.
    pub pdl: bool,
    /// Nanoseconds the host spent in `download_f32` (for --stats): a copy into pageable memory
    /// returns once done, so this is where the host waits for the device's results.
    pub read_ns: AtomicU64,
    /// The page-locked buffer that results of at least PINNED_READ_MIN floats are read back
    /// through (the copy lands in it by DMA; a copy into pageable memory is staged by the driver
    /// in pieces).
    pub(super) readback: Mutex<Option<PinnedHostSlice<f32>>>,
    /// The page-locked buffer a prompt's embedding is converted into and copied from, with the
    /// event of its last copy (the buffer is rewritten only once that copy has finished).
    pub(super) stage: Mutex<Option<(PinnedHostSlice<f32>, CudaEvent)>>,
    /// Whether moe_route_norm loads the router's rows before it waits, into shared memory or (an
    /// f32 router of at most 8 rows) registers (moe.cu moe_route_norm_body, route_norm_regs;
    /// a switch tests compare both forms with).
    pub(super) router_preload: AtomicBool,
    /// Whether routed_ffn takes gate, up and SwiGLU in one launch where it applies
    /// (cuda/matvec_q.cu matvec_qd_*_gu; benches compare both forms). Both give the same results.
    pub(super) routed_gu: AtomicBool,
    /// moe_route_norm_wide's logits ([ROUTE_WIDE_MAX] f32) and its blocks' count (a u32 after
    /// them, zero between launches: the last block puts it back).
    pub(super) route_wide: CudaSlice<u32>,
}

/// The most router rows moe_route_norm's kernels take (moe.cu: `lg[256]`).
pub(super) const ROUTE_WIDE_MAX: usize = 256;
/// Routers of more rows than this take moe_route_norm_wide (Qwen3-MoE's 128, OLMoE's 64,
/// Qwen2-MoE's 60); Mixtral's 8 and Phi-3.5-MoE's 16 stay in one block with the rows preloaded.
pub(super) const ROUTE_WIDE_MIN: usize = 32;

/// The smallest read-back (in floats) that goes through Gpu's page-locked buffer.
pub(super) const PINNED_READ_MIN: usize = 1024;
/// Tokens from which an embedding goes through the page-locked stage (fewer: a queued pageable
/// copy, no wait for an earlier copy; a decode token with the table resident is embedded on the
/// device instead, stage_token).
pub(super) const STAGED_EMBED_MIN: usize = 16;

/// Where the tensor-core integer matvec is the faster one
/// (benches/results/2026-11-23-h100-int-matvec-mma.md): int2 only; int8 and int4 keep the scalar
/// kernels.
pub(super) const QM_KINDS: [bool; 3] = [false, false, true];

/// Where the dp4a integer matvec (matvec_qd_*) is taken for groups of whole chunks (int8, int4,
/// int2): every kind, faster than the scalar and tensor-core kernels
/// (benches/results/2026-11-24-h100-dp4a.md); sm_61 and later (dp4a).
pub(super) const QD_KINDS: [bool; 3] = [true, true, true];

pub(super) fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.max(1), 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads of a block that normalizes a row of n (elementwise.cu rms_norm_row): one per float4,
/// 32 to 1024. The sum of squares rounds by this shape, so every launch of that code uses it.
pub(super) fn rms_block(n: usize) -> u32 {
    (n.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32
}

pub(super) fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

impl Gpu {
    /// Open device `ordinal`: context, compute stream, kernels (NVRTC, cached), cuBLAS.
    pub fn open(ordinal: usize) -> crate::Result<Arc<Gpu>> {
        probe().map_err(|e| Error::Invalid(format!("CUDA unavailable: {e}")))?;
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        // SAFETY: hob orders all cross-stream work itself (one compute stream; the expert copy
        // stream is ordered by explicit events), so cudarc's per-buffer event tracking is off.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(cuda_err)?;
        let compute_capability = ctx.compute_capability().map_err(cuda_err)?;
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let kernels = Kernels::load(&ctx)?;
        let attr = |a| {
            ctx.attribute(a)
                .map(|v| v.max(0) as usize)
                .map_err(cuda_err)
        };
        let q_limits = QLimits {
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            smem_per_sm: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )?,
            smem_reserved: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            )?,
            smem_max: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            regs_per_sm: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            )?,
            threads_per_sm: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
            )?,
        };
        let blas = CudaBlas::new(stream.clone()).map_err(cuda_err)?;
        let route_wide = stream
            .alloc_zeros::<u32>(ROUTE_WIDE_MAX + 1)
            .map_err(cuda_err)?;
        let pdl = compute_capability.0 >= 9;
        log::info!(
            "CUDA device {ordinal}: {name} (sm_{}{}), kernels from {}, dependent launches {}",
            compute_capability.0,
            compute_capability.1,
            kernels.origin,
            if pdl { "on" } else { "off" }
        );
        let clock = clock::KernelClock::new(kernels.names.iter().cloned());
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            kernels,
            clock,
            blas,
            name,
            compute_capability,
            q_limits,
            qm_kinds: QM_KINDS,
            qd_kinds: if compute_capability < (6, 1) {
                [false; 3]
            } else {
                QD_KINDS
            },
            pdl,
            read_ns: AtomicU64::new(0),
            readback: Mutex::new(None),
            stage: Mutex::new(None),
            router_preload: AtomicBool::new(true),
            routed_gu: AtomicBool::new(true),
            route_wide,
        }))
    }

    /// Launch `f` on the compute stream, with programmatic dependent launch where `self.pdl`.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a live value of that parameter's
    /// type, and the kernel's memory accesses for these arguments stay inside live allocations.
    /// Every kernel of cuda/moe.cu and route.cu waits (pdl_wait) before it touches memory an earlier
    /// kernel may write or read, so it may be launched either way.
    pub unsafe fn launch_raw(
        &self,
        f: &cudarc::driver::CudaFunction,
        c: LaunchConfig,
        params: &mut [*mut std::ffi::c_void],
    ) -> crate::Result<()> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        if !self.pdl {
            // SAFETY: as this function's contract.
            return unsafe {
                cudarc::driver::result::launch_kernel(
                    f.cu_function(),
                    c.grid_dim,
                    c.block_dim,
                    c.shared_mem_bytes,
                    self.stream.cu_stream(),
                    params,
                )
            }
            .map_err(cuda_err);
        }
        // SAFETY: CUlaunchAttribute is a plain C struct (an id and a union of plain values), for
        // which all-zero bytes are valid.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: c.grid_dim.0,
            gridDimY: c.grid_dim.1,
            gridDimZ: c.grid_dim.2,
            blockDimX: c.block_dim.0,
            blockDimY: c.block_dim.1,
            blockDimZ: c.block_dim.2,
            sharedMemBytes: c.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: config and attr outlive the call; params as this function's contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(cuda_err)
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> crate::Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err)
    }

    /// Copy host -> device from page-locked memory in 16 MiB chunks, paced to `pace` bytes/s
    /// when given, from when `ready` is passed until `stop` is set; returns the rate reached,
    /// GB/s. What the link's DMA reads from host memory while the CPU streams experts (`hob
    /// bench` measures the two together: they may share the host's memory bandwidth).
    pub fn dma_until(
        &self,
        pace: Option<f64>,
        ready: &std::sync::Barrier,
        stop: &std::sync::atomic::AtomicBool,
    ) -> crate::Result<f64> {
        const CHUNK: usize = 16 << 20;
        const CHUNKS: usize = 32; // 512 MiB of host memory: more than any cache
        let setup = (|| -> crate::Result<_> {
            self.ctx.bind_to_thread().map_err(cuda_err)?;
            let stream = self.ctx.new_stream().map_err(cuda_err)?;
            // SAFETY: page-locked host memory the copy engine reads; the CPU never reads it.
            let host = unsafe { self.ctx.alloc_pinned::<u8>(CHUNK * CHUNKS) }.map_err(cuda_err)?;
            let dev = self.alloc::<u8>(CHUNK, "the link measurement")?;
            Ok((stream, host, dev))
        })();
        ready.wait();
        let (stream, host, dev) = setup?;
        let src = host.as_slice().map_err(cuda_err)?;
        let dst = dev.device_ptr(&stream).0;
        let started = std::time::Instant::now();
        let mut link_free = started;
        let mut bytes = 0usize;
        let mut i = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(bw) = pace {
                if let Some(rest) = link_free.checked_duration_since(std::time::Instant::now()) {
                    std::thread::sleep(rest);
                }
                link_free = link_free.max(std::time::Instant::now())
                    + std::time::Duration::from_secs_f64(CHUNK as f64 / bw);
            }
            let c = &src[(i % CHUNKS) * CHUNK..(i % CHUNKS + 1) * CHUNK];
            // SAFETY: dst holds CHUNK bytes; `c` is CHUNK bytes of live page-locked memory.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(dst, c, stream.cu_stream())
                    .map_err(cuda_err)?;
            }
            i += 1;
            bytes += CHUNK;
            if i % 4 == 0 {
                stream.synchronize().map_err(cuda_err)?;
            }
        }
        stream.synchronize().map_err(cuda_err)?;
        Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e9)
    }

    /// Bytes read + written per second by device-to-device copies of `bytes` (best of 10 after a
    /// warm-up), GB/s: the device memory's rate as the physical limit takes it (gpu_matvec's copy
    /// figure; shared/REFERENCE.md).
    pub fn copy_gbs(&self, bytes: usize) -> crate::Result<f64> {
        let a = self.alloc::<u8>(bytes, "the copy measurement's source")?;
        let mut b = self.alloc::<u8>(bytes, "the copy measurement's target")?;
        self.stream.memcpy_dtod(&a, &mut b).map_err(cuda_err)?;
        self.sync()?;
        let mut best = f64::INFINITY;
        for _ in 0..10 {
            let started = std::time::Instant::now();
            self.stream.memcpy_dtod(&a, &mut b).map_err(cuda_err)?;
            self.sync()?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best / 1e9)
    }

    /// Runs `f` on this thread while host -> device copies from page-locked memory run beside it
    /// (dma_until, paced to `pace` bytes/s when given): `f`'s result and the copies' GB/s.
    pub fn dma_during<R: Send>(
        &self,
        pace: Option<f64>,
        f: impl FnOnce() -> R,
    ) -> crate::Result<(R, f64)> {
        let ready = std::sync::Barrier::new(2);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let dma = s.spawn(|| self.dma_until(pace, &ready, &stop));
            ready.wait();
            let r = f();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let gbs = dma
                .join()
                .map_err(|_| Error::Invalid("the link measurement panicked".into()))??;
            Ok((r, gbs))
        })
    }

    /// Host -> device from page-locked memory for `time`, unpaced, GB/s: the rate of the link
    /// expert loads cross.
    pub fn link_gbs(&self, time: std::time::Duration) -> crate::Result<f64> {
        Ok(self.dma_during(None, || std::thread::sleep(time))?.1)
    }

    pub fn alloc<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
        what: &str,
    ) -> crate::Result<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(n.max(1)).map_err(|e| {
            Error::Invalid(format!(
                "CUDA: cannot allocate {} for {what}: {e}",
                crate::error::size(n.max(1) * std::mem::size_of::<T>())
            ))
        })
    }

    pub fn sync(&self) -> crate::Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }
}
