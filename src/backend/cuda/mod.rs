//! The CUDA backend: cudarc with dynamic loading (the binary runs where no CUDA is installed),
//! kernels from cuda/kernels.cu compiled by NVRTC, dense weights and the KV cache (f16) resident
//! on the device, activations in device buffers, prefill products through cuBLAS.
//!
//! All device work goes to one compute stream in order, so buffers need no further
//! synchronization; the expert cache (experts.rs) adds a copy stream ordered by events.
//! `unsafe` here is the CUDA launch and raw-pointer copy surface, each with a SAFETY note.

mod clock;
mod copier;
mod experts;
mod kernels;

pub use copier::CudaCopier;
pub use experts::{CudaArena, CudaResident, CudaWork};
pub use kernels::{Kernels, QFamily, QKernel};

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::cublas::{sys as cublas_sys, CudaBlas};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PinnedHostSlice,
};

use crate::model::ops::{
    embed_rows, embed_via_host, AttentionShape, Backend, DecodeStep, KernelTime, QkvStep, Route,
    RouteOut, Telemetry,
};
use crate::model::MoeBlock;
use crate::model::Model;
use crate::quant::{Matrix, WeightKind};
use crate::Error;

pub(crate) fn cuda_err(e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("CUDA: {e}"))
}

/// Why CUDA cannot be used here, or Ok when a device is present and its libraries load.
pub fn probe() -> Result<(), String> {
    // SAFETY: these only try to dlopen the libraries by name; no symbol is called.
    let (driver, nvrtc, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err("no CUDA driver (libcuda.so) found".into());
    }
    if !nvrtc {
        return Err(
            "the CUDA driver is present but NVRTC (libnvrtc.so) is not: install the CUDA toolkit's \
             NVRTC or add its lib64 directory to LD_LIBRARY_PATH"
                .into(),
        );
    }
    if !blas {
        return Err(
            "the CUDA driver is present but cuBLAS (libcublas.so) is not: install it or add its \
             directory to LD_LIBRARY_PATH"
                .into(),
        );
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err("the CUDA driver reports no device".into()),
        Err(e) => Err(format!("the CUDA driver failed to start: {e}")),
    }
}

/// Kind codes shared with cuda/kernels.cu.
fn kind_code(kind: WeightKind) -> i32 {
    match kind {
        WeightKind::F32 => 0,
        WeightKind::F16 => 1,
        WeightKind::Bf16 => 2,
        WeightKind::Int8 => 3,
        WeightKind::Int4 => 4,
        WeightKind::Int2 => 5,
    }
}

/// A matrix in device memory, as the kernels take it (`struct Mat` in kernels.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DevMat {
    pub codes: u64,
    pub scales: u64,
    pub mins: u64,
    pub rows: i32,
    pub cols: i32,
    pub group: i32,
    pub row_bytes: i32,
    /// Not part of the kernel struct's fields that the kernels read first; kept last.
    kind: i32,
    _pad: i32,
}

// SAFETY: DevMat is #[repr(C)], plain integers, and its leading fields match `struct Mat` in
// cuda/kernels.cu (the kernels ignore the trailing `kind`); as a table entry it is kernels.cu's
// `struct MatEntry` (Mat, kind, pad: 48 bytes, checked below).
unsafe impl DeviceRepr for DevMat {}
const _: () = assert!(std::mem::size_of::<DevMat>() == 48);

/// (query, head) rows of one prefill attention block (kernels.cu ATP_ROWS).
const ATP_ROWS: usize = 32;

/// The most routed experts `Gpu::put_slots` takes (kernels.cu SLOTS_MAX_K).
pub const SLOTS_MAX_K: usize = 8;

/// kernels.cu `struct SlotArgs`: the routed experts of one host-routed decode layer, passed by
/// value to `put_slots`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotArgs {
    /// gate, up, down of each routed expert, by rank.
    pub mats: [DevMat; 3 * SLOTS_MAX_K],
    /// n ranks (as f32 bits), then n weights.
    pub routes: [f32; 2 * SLOTS_MAX_K],
    pub n: i32,
    _pad: i32,
}

// SAFETY: #[repr(C)], plain integers and floats, laid out as kernels.cu's `struct SlotArgs`
// (48-byte entries, then 16 floats and two ints: 1224 bytes, checked below).
unsafe impl DeviceRepr for SlotArgs {}
const _: () = assert!(std::mem::size_of::<SlotArgs>() == 1224);

impl SlotArgs {
    /// The table and routes of `experts` ((expert index, weight, its three matrices), at most
    /// SLOTS_MAX_K, distinct indices): entry j is the expert of rank j by index, so that
    /// kernels walking routes in ascending index order walk them in the same order.
    pub fn new(experts: &[(usize, f32, [DevMat; 3])]) -> crate::Result<SlotArgs> {
        let n = experts.len();
        if n == 0 || n > SLOTS_MAX_K {
            return Err(Error::Invalid(format!(
                "CUDA: {n} routed experts for the slot table (1 to {SLOTS_MAX_K})"
            )));
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&j| experts[j].0);
        let mut a = SlotArgs {
            mats: [experts[0].2[0]; 3 * SLOTS_MAX_K],
            routes: [0.0; 2 * SLOTS_MAX_K],
            n: n as i32,
            _pad: 0,
        };
        for (rank, &j) in order.iter().enumerate() {
            let (_, w, m) = experts[j];
            a.mats[3 * rank..3 * rank + 3].copy_from_slice(&m);
            a.routes[rank] = f32::from_bits(rank as u32);
            a.routes[n + rank] = w;
        }
        Ok(a)
    }
}

impl DevMat {
    /// Describe a matrix whose codes, scales and mins start at the given device addresses.
    pub fn new(m: &Matrix<'_>, codes: u64, scales: u64, mins: u64) -> DevMat {
        DevMat {
            codes,
            scales,
            mins,
            rows: m.rows as i32,
            cols: m.cols as i32,
            group: m.group_size as i32,
            row_bytes: m.row_bytes() as i32,
            kind: kind_code(m.kind),
            _pad: 0,
        }
    }

    /// The 16-byte vector kernel applies (the other layouts take matvec_any).
    fn vectorizable(&self) -> bool {
        self.row_bytes % 16 == 0 && self.codes.is_multiple_of(16)
    }
}

/// Shared memory an integer matvec block stages x into, at most (x of a column tile, scaled, and
/// its 16-column sums): 96 KiB holds 23k columns (Mixtral's 14336 take 61 KB in one tile).
const Q_XS_CAP: usize = 96 << 10;

/// Warps per block the integer matvec plans try, most first.
const Q_WARPS: [usize; 4] = [16, 12, 8, 4];

/// What an SM offers the integer matvec kernels.
#[derive(Clone, Copy, Debug)]
pub struct QLimits {
    pub sm_count: usize,
    /// Shared memory per SM, and what the hardware keeps per block out of it.
    pub smem_per_sm: usize,
    pub smem_reserved: usize,
    /// Dynamic shared memory a block may have (opted in at load: kernels.rs).
    pub smem_max: usize,
    pub regs_per_sm: usize,
    pub threads_per_sm: usize,
}

/// The shape of an integer matvec kernel (kernels.cu matvec_q_* or matvec_qm_*).
#[derive(Clone, Copy, Debug)]
pub struct QShape {
    /// Kind code: 3 int8, 4 int4, 5 int2.
    pub kind: i32,
    /// Rows per warp: R for matvec_q_*, 16 for matvec_qm_* (an mma's rows).
    pub rows: usize,
    /// Registers per thread.
    pub regs: usize,
    /// The tensor-core kernel (matvec_qm_*): its quads (four 16-byte chunks of each of a warp's
    /// rows) per step, U. 0: the scalar kernel (matvec_q_*).
    pub quads: usize,
    /// The dp4a kernel (matvec_qd_*): x's byte planes (kernels.cu QD_PARTS); 0 for the others.
    pub dp_parts: usize,
    /// The dp4a kernel's steps in its shared-memory ring (kernels.cu QD_RING_*, matvec_q_body
    /// RING); 0: loads in registers (and for the other kernels).
    pub ring: usize,
}

/// matvec_qm_*'s U (kernels.cu).
pub const QM_QUADS_PER_STEP: usize = 2;

impl QShape {
    /// Columns per 16-byte chunk of codes.
    fn chunk_cols(&self) -> usize {
        16usize << (self.kind - 3)
    }

    /// The tensor-core kernel (matvec_qm_*).
    pub fn mma(&self) -> bool {
        self.quads > 0
    }

    /// The NMSE bound of this kernel's products against the CPU backend (cuda/README.md): 1e-10
    /// where the products are exact and only the summation order differs (24-bit x planes
    /// included); 1e-8 for the dp4a kernel with x in two byte planes (x rounded to 16 bits of its
    /// chunk's largest |x|: measured up to 1.2e-9); 1e-3 with one plane (8-bit x: measured
    /// 1.1e-5 to 1.2e-5).
    pub fn nmse_bound(&self) -> f64 {
        match self.dp_parts {
            1 => 1e-3,
            2 => 1e-8,
            _ => 1e-10,
        }
    }

    /// Chunks of a row a warp reads per step: one per lane (matvec_q_*), or U quads.
    pub fn step_chunks(&self) -> usize {
        if self.mma() {
            4 * self.quads
        } else {
            32
        }
    }

    /// Shared memory per staged chunk of x.
    fn staged_per_chunk(&self) -> usize {
        let cc = self.chunk_cols();
        if self.mma() {
            // Two f16 parts per column, the chunk's sum, and its quad's scale (4 bytes a quad).
            cc * 4 + 4 + 1
        } else if self.dp_parts > 0 {
            // A byte per column per plane, and the chunk's power of two and sum.
            cc * self.dp_parts + 8
        } else {
            // The scaled f32 x, and its 16-column sums.
            cc * 4 + cc / 16 * 4
        }
    }
}

/// Dynamic shared memory of an integer matvec block (the layouts at the top of kernels.cu's
/// matvec_q_body and matvec_qm_body): staged x for `tchunks` chunks (padded to 32), then the
/// warps' partial sums (two tiles) and flags, then (from a 16-byte boundary) each warp's ring of
/// `ring` steps: a chunk of each of its rows a lane, and 128 bytes of scales and mins a row.
pub fn q_smem(k: &QShape, warps: usize, tchunks: usize) -> usize {
    let tpad = tchunks.div_ceil(32) * 32;
    let staged = tpad * k.staged_per_chunk();
    if k.mma() {
        staged + 2 * warps * 16 * 4
    } else {
        let sums = staged + 2 * warps * k.rows * 4 + 2 * warps * 4;
        if k.ring > 0 {
            sums.next_multiple_of(16) + warps * k.ring * (k.rows * 512 + k.rows * 128)
        } else {
            sums
        }
    }
}

/// Whether the ring form of the dp4a kernels (QShape::ring) takes `w`: its groups are 1, 2 or 4
/// chunks (a step's 32 chunks then have whole 16-byte pieces of scales and mins), its rows' groups
/// a multiple of 8 and its scales and mins 16-byte aligned (kernels.cu matvec_q_body's `issue`).
pub fn ring_ok(w: &DevMat) -> bool {
    let cc = 16 << (w.kind - 3).clamp(0, 2);
    let cpg = if w.group > 0 && w.group % cc == 0 {
        w.group / cc
    } else {
        0
    };
    let gpr = if w.group > 0 { w.cols / w.group } else { 0 };
    matches!(cpg, 1 | 2 | 4)
        && gpr > 0
        && gpr % 8 == 0
        && w.scales.is_multiple_of(16)
        && (w.kind == 3 || w.mins.is_multiple_of(16))
}

/// How an integer matvec is launched: kernels.cu matvec_q_* (w, x, y, split, tchunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QPlan {
    pub grid: u32,
    pub block: u32,
    pub smem: u32,
    /// Warps sharing a row group (each takes a slice of the row's chunks): a power of two (the
    /// kernels shift by it).
    pub split: i32,
    /// 16-byte chunks per column tile (x is staged one tile at a time).
    pub tchunks: i32,
}

/// Plan an integer matvec of `rows` rows of `row_bytes` bytes (a multiple of 16) for kernel `k`:
/// the most warps per block whose shared memory holds the whole x (else the most that hold a tile
/// of 32 chunks), a grid of as many blocks as the SMs take at once, each looping over tiles of
/// rows, and the `split` with the fewest steps for the busiest block, a tile counting one step more
/// (its reduction; measured on the H100, this picks within 2% of the best split and block size
/// for Mixtral's shapes); the smallest split on a tie. None where no block fits the GPU's shared
/// memory (matvec_any then).
pub fn q_plan(k: &QShape, rows: usize, row_bytes: usize, lim: &QLimits) -> Option<QPlan> {
    let n = (row_bytes / 16).max(1);
    let per_chunk = k.staged_per_chunk();
    // A block's registers (allocated per warp in units of 256) must fit an SM's.
    let regs_per_warp = (k.regs.max(1) * 32).div_ceil(256) * 256;
    let ok = |warps: usize, t: usize| {
        q_smem(k, warps, t) <= lim.smem_max
            && t * per_chunk <= Q_XS_CAP
            && regs_per_warp * warps <= lim.regs_per_sm
    };
    let fit = |warps: usize| -> Option<usize> {
        if ok(warps, n) {
            return Some(n);
        }
        (1..)
            .map(|i| 32 * i)
            .take_while(|&t| t < n && ok(warps, t))
            .last()
    };
    let (warps, tchunks) = Q_WARPS
        .iter()
        .find_map(|&w| fit(w).filter(|&t| t == n).map(|t| (w, t)))
        .or_else(|| Q_WARPS.iter().find_map(|&w| fit(w).map(|t| (w, t))))?;
    let smem = q_smem(k, warps, tchunks);
    let block = 32 * warps;
    let per_sm = (lim.regs_per_sm / (regs_per_warp * warps))
        .min(lim.threads_per_sm / block)
        .min(lim.smem_per_sm / (smem + lim.smem_reserved))
        .max(1);
    let cap = (lim.sm_count * per_sm).max(1);
    let tn = tchunks.min(n);
    let sc = k.step_chunks();
    let mut best: Option<(usize, usize, usize)> = None; // (cost, split, grid)
    for split in (0..5).map(|i| 1usize << i) {
        if warps % split != 0 || (split > 1 && sc * split > tn) {
            continue;
        }
        let tiles = rows.div_ceil(warps / split * k.rows).max(1);
        let grid = tiles.min(cap);
        let cost = tiles.div_ceil(grid) * (tn.div_ceil(sc * split) + 1);
        if best.is_none_or(|(c, _, _)| cost < c) {
            best = Some((cost, split, grid));
        }
    }
    let (_, split, grid) = best?;
    Some(QPlan {
        grid: grid as u32,
        block: block as u32,
        smem: smem as u32,
        split: split as i32,
        tchunks: tchunks as i32,
    })
}

/// Input precision of a cuBLAS product.
#[derive(Clone, Copy, Debug)]
enum Precision {
    F32,
    F16,
}

/// The device, its streams and kernels: shared by the backend and the expert cache.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    blas: CudaBlas,
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
    /// Launch with programmatic dependent launch (sm_90 and later): a kernel may start while the one before it in the stream still runs, and waits for it inside
    /// (kernels.cu pdl_wait). Its blocks are then resident when the earlier kernel ends, and the
    /// products' first weight loads overlap that kernel's tail.
    pub pdl: bool,
    /// Nanoseconds the host spent in `download_f32` (for --stats): a copy into pageable memory
    /// returns once done, so this is where the host waits for the device's results.
    pub read_ns: AtomicU64,
    /// The page-locked buffer that results of at least PINNED_READ_MIN floats are read back
    /// through (the copy lands in it by DMA; a copy into pageable memory is staged by the driver
    /// in pieces).
    readback: Mutex<Option<PinnedHostSlice<f32>>>,
    /// The page-locked buffer a prompt's embedding is converted into and copied from, with the
    /// event of its last copy (the buffer is rewritten only once that copy has finished).
    stage: Mutex<Option<(PinnedHostSlice<f32>, CudaEvent)>>,
    /// Whether moe_route_norm loads the router's rows before it waits, into shared memory or (an
    /// f32 router of at most 8 rows) registers (kernels.cu moe_route_norm_body, route_norm_regs;
    /// a switch tests compare both forms with).
    router_preload: AtomicBool,
    /// Whether routed_ffn takes gate, up and SwiGLU in one launch where it applies (kernels.cu
    /// matvec_qd_*_gu; benches compare both forms). Both give the same results.
    routed_gu: AtomicBool,
}

/// The smallest read-back (in floats) that goes through Gpu's page-locked buffer.
const PINNED_READ_MIN: usize = 1024;
/// Tokens from which an embedding goes through the page-locked stage (fewer: a queued pageable
/// copy, no wait for an earlier copy; a decode token with the table resident is embedded on the
/// device instead, stage_token).
const STAGED_EMBED_MIN: usize = 16;

/// Where the tensor-core integer matvec is the faster one, measured on the H100
/// (benches/results/2026-11-23-h100-int-matvec-mma.md): int2 only; int8 and int4 keep the scalar
/// kernels.
const QM_KINDS: [bool; 3] = [false, false, true];

/// Where the dp4a integer matvec (matvec_qd_*) is taken for groups of whole chunks (int8, int4,
/// int2): every kind, measured faster than the scalar and tensor-core kernels on the H100
/// (benches/results/2026-11-24-h100-dp4a.md); sm_61 and later (dp4a).
const QD_KINDS: [bool; 3] = [true, true, true];

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.max(1), 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads of a block that normalizes a row of n (kernels.cu rms_norm_row): one per float4, 32 to
/// 1024. The sum of squares rounds by this shape, so every launch of that code uses it.
fn rms_block(n: usize) -> u32 {
    (n.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// Launch `f` on the compute stream with the given arguments (locals, borrowed until launch).
macro_rules! launch {
    ($gpu:expr, $f:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        let f = &$f;
        let mut params = [$( (&$arg) as *const _ as *mut ::std::ffi::c_void ),*];
        let t0 = $gpu.clock.start(&$gpu.stream)?;
        // SAFETY: the argument list matches the kernel's signature in cuda/kernels.cu (each
        // parameter a pointer to a live local of the kernel parameter's type), and every pointer
        // argument addresses a live device allocation of at least the extent the kernel reads or
        // writes for the given sizes (checked by the callers).
        unsafe { $gpu.launch_raw(f, $cfg, &mut params) }?;
        $gpu.clock.stop(&$gpu.stream, f, t0)
    }};
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
        }))
    }

    /// Launch `f` on the compute stream, with programmatic dependent launch where `self.pdl`.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a live value of that parameter's
    /// type, and the kernel's memory accesses for these arguments stay inside live allocations.
    /// Every kernel of cuda/kernels.cu waits (pdl_wait) before it touches memory an earlier
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
                "CUDA: cannot allocate {} MiB for {what}: {e}",
                (n * std::mem::size_of::<T>()) >> 20
            ))
        })
    }

    pub fn sync(&self) -> crate::Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }

    /// y[rows] = W · x for one token (pointers to device memory).
    pub fn matvec(&self, w: &DevMat, x: u64, y: u64) -> crate::Result<()> {
        let w = *w;
        if w.vectorizable() && x.is_multiple_of(16) {
            if w.kind >= 3 {
                if self.matvec_int(&w, self.q_kernels(&w).0, x, y)? {
                    return Ok(());
                }
            } else {
                // Float kinds: one row per warp, 8 warps per block.
                let c = cfg(blocks(w.rows as usize, 8), 256);
                return launch!(self, self.kernels.matvec[w.kind as usize], c; w, x, y);
            }
        }
        let c = cfg(blocks(w.rows as usize, 8), 256);
        let kind = w.kind;
        launch!(self, self.kernels.matvec_any, c; w, kind, x, y)
    }

    /// y = W · x through the integer kernel `q` (matvec_q_* or matvec_qm_* of w's kind, for a
    /// vectorizable w) with its plan; false (nothing launched) where no plan fits.
    pub fn matvec_int(&self, w: &DevMat, q: &QKernel, x: u64, y: u64) -> crate::Result<bool> {
        let Some(p) = self.q_plan_for(q, w) else {
            return Ok(false);
        };
        let c = LaunchConfig {
            grid_dim: (p.grid, 1, 1),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: p.smem,
        };
        let (w, split, tchunks) = (*w, p.split, p.tchunks);
        launch!(self, q.f, c; w, x, y, split, tchunks)?;
        Ok(true)
    }

    /// The integer matvec kernels for `w` (plain, selecting): for groups of whole 16-byte chunks
    /// the dp4a ones (matvec_qd_*) where `qd_kinds` has the kind, else the tensor-core ones where
    /// the GPU has them and the groups are 1, 2 or a multiple of 4 chunks (kernels.cu
    /// matvec_qm_body) and `qm_kinds` has the kind, else matvec_q_*.
    pub fn q_kernels(&self, w: &DevMat) -> (&QKernel, &QKernel) {
        let i = (w.kind - 3) as usize;
        let cc = 16 << (w.kind - 3);
        let cpg = w.group / cc;
        let chunks = w.group > 0 && w.group % cc == 0;
        let ring = self.kernels.matvec_qd[i].shape.ring;
        if chunks && self.qd_kinds[i] && (ring == 0 || ring_ok(w)) {
            return (&self.kernels.matvec_qd[i], &self.kernels.matvec_qd_sel[i]);
        }
        let whole = chunks && (cpg <= 2 || cpg % 4 == 0);
        match (&self.kernels.matvec_qm, &self.kernels.matvec_qm_sel) {
            (Some(p), Some(s)) if whole && self.qm_kinds[i] => (&p[i], &s[i]),
            _ => (&self.kernels.matvec_q[i], &self.kernels.matvec_q_sel[i]),
        }
    }

    /// Integer-kind matrices of the routed experts of one token, `ny` of them in one launch
    /// (kernels.cu matvec_q_*_sel): matrix `which0 + j / k` of expert `routes[j % k]` from the
    /// device table `tab` ([experts][3] DevMat: gate, up, down) times x + (j % k) * xs floats,
    /// into y + j * ys floats; with `glu`, times SwiGLU(x + (j % k) * xs, x + (j % k + k) * xs)
    /// instead (k gate products, then k up products). `w` is any one of those matrices (they
    /// share kind and shape). A launch with which0 > 0 reads the routes and the table before it
    /// waits for the kernel before it (kernels.cu sel_mat, "Ordering"): it must follow the
    /// which0 = 0 launch of the same routes, as in `routed_ffn`.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_sel(
        &self,
        w: &DevMat,
        tab: u64,
        routes: u64,
        k: usize,
        which0: i32,
        ny: usize,
        (x, xs, glu): (u64, usize, bool),
        (y, ys): (u64, usize),
    ) -> crate::Result<()> {
        if w.kind < 3 {
            return Err(Error::Invalid(
                "CUDA: matvec_sel takes integer kinds (float kinds: moe_gate_up, moe_down)".into(),
            ));
        }
        let (ki, xsi, ysi, glui) = (k as i32, xs as i32, ys as i32, i32::from(glu));
        // The plain kernel's plan (the same split and column tiles: the same sums as
        // `matvec`). Its grid fills the GPU once; the ny matrices share it (a block loops over
        // its matrix's row tiles, so any grid computes the same sums).
        let q = self.q_kernels(w).1;
        let p = self.routed_plan(w, q).ok_or_else(|| {
            Error::Invalid("CUDA: no integer matvec plan for a routed expert".into())
        })?;
        let c = LaunchConfig {
            grid_dim: (p.grid.div_ceil(ny as u32).max(1), ny as u32, 1),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: p.smem,
        };
        let (split, tchunks) = (p.split, p.tchunks);
        launch!(self, q.f, c; tab, routes, ki, which0, x, xsi, glui, y, ysi, split, tchunks)
    }

    /// One decode token's routed experts from the table `tab` (integer kinds, every matrix like
    /// `gate` / `down`), through the routed kernels: gate and up of the k experts in one launch
    /// into g ([2k, f]: k gate rows, then k up rows), their SwiGLU, and down of all k into dn
    /// ([k, h]).
    #[allow(clippy::too_many_arguments)]
    pub fn routed_ffn(
        &self,
        (gate, down): (&DevMat, &DevMat),
        tab: u64,
        routes: u64,
        k: usize,
        x: u64,
        (g, dn): (u64, u64),
        (h, f): (usize, usize),
    ) -> crate::Result<()> {
        self.routed_gate_up(gate, tab, routes, k, x, (g, f))?;
        self.matvec_sel(down, tab, routes, k, 2, k, (g, f, false), (dn, h))
    }

    /// SwiGLU(gate x, up x) of one token's k routed experts (integer kinds, every gate matrix
    /// like `gate`) into the first k rows of g ([2k, f]; the other k are scratch): one launch
    /// where matvec_qd_*_gu applies (Gpu::gu_launch), else the routed gate and up launch and the
    /// swiglu launch. The same bits either way.
    #[allow(clippy::too_many_arguments)]
    pub fn routed_gate_up(
        &self,
        gate: &DevMat,
        tab: u64,
        routes: u64,
        k: usize,
        x: u64,
        (g, f): (u64, usize),
    ) -> crate::Result<()> {
        if let Some((q, c, split, tchunks)) = self.gu_launch(gate, k) {
            let (ki, fi) = (k as i32, f as i32);
            return launch!(self, q.f, c; tab, routes, ki, x, g, fi, split, tchunks);
        }
        self.matvec_sel(gate, tab, routes, k, 0, 2 * k, (x, 0, false), (g, f))?;
        // SwiGLU in its own launch: each block of the down launch staging it measured slower
        // (benches/results/2026-11-24-h100-routed.md), as did staging its x once for the
        // launch (benches/results/2026-11-24-h100-decode-host.md).
        self.swiglu(g, g + (k * f * 4) as u64, k * f)
    }

    /// Whether routed_ffn may take gate, up and SwiGLU in one launch (the default). Both forms
    /// give the same results.
    pub fn set_routed_gu(&self, on: bool) {
        self.routed_gu.store(on, Ordering::Relaxed);
    }

    /// The launch of kernels.cu matvec_qd_*_gu for k routed experts whose gate matrices are like
    /// `gate`: where the dp4a kernels serve it and the plain plan's x is one column tile. The
    /// plain plan's split: each row's sum is the plain kernel's.
    fn gu_launch(&self, gate: &DevMat, k: usize) -> Option<(&QKernel, LaunchConfig, i32, i32)> {
        if !self.routed_gu.load(Ordering::Relaxed) || !(3..=5).contains(&gate.kind) {
            return None;
        }
        let i = (gate.kind - 3) as usize;
        let plain = self.q_kernels(gate).0;
        if !std::ptr::eq(plain, &self.kernels.matvec_qd[i]) {
            return None;
        }
        let q = &self.kernels.matvec_qd_gu[i];
        let p = self.routed_plan(gate, q)?;
        let whole = p.tchunks as usize == (gate.row_bytes.max(0) as usize / 16).max(1);
        if !whole {
            return None;
        }
        let c = LaunchConfig {
            grid_dim: (p.grid.div_ceil(k as u32).max(1), k as u32, 1),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: p.smem,
        };
        Some((q, c, p.split, p.tchunks))
    }

    /// One token's routes ([k] experts then [k] weights at `routes`) from the router `w` and
    /// x: one launch for a float-kind router of at most 256 rows (kernels.cu moe_route_*), else
    /// the product into `logits` ([w.rows]) and route_topk. The same routes either way.
    pub fn moe_route(
        &self,
        w: &DevMat,
        x: u64,
        k: usize,
        routes: u64,
        logits: u64,
    ) -> crate::Result<()> {
        let small = w.rows <= 256 && k <= 16 && k <= w.rows as usize;
        if w.kind >= 3 || !w.vectorizable() || !x.is_multiple_of(16) || !small {
            self.matvec(w, x, logits)?;
            return self.route(logits, 1, w.rows as usize, k, routes);
        }
        let warps = (w.rows as u32).clamp(1, 32);
        let (wm, ki) = (*w, k as i32);
        launch!(self, self.kernels.moe_route[w.kind as usize], cfg(1, 32 * warps); wm, x, ki, routes)
    }

    /// Whether later routing launches may copy the router into the block before they wait (the
    /// default). Both forms give the same results.
    pub fn set_router_preload(&self, on: bool) {
        self.router_preload.store(on, Ordering::Relaxed);
    }

    /// The MoE block's RMSNorm and routing of one token in one launch (kernels.cu
    /// moe_route_norm_*): xn = RMSNorm(x) * g as `rms_norm` writes it, and the routes as
    /// `moe_route` computes them from xn. Ok(false), nothing launched, where that kernel does not
    /// apply (the caller then launches the two).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route_norm(
        &self,
        w: &DevMat,
        x: u64,
        (g, eps): (u64, f32),
        xn: u64,
        k: usize,
        routes: u64,
    ) -> crate::Result<bool> {
        let n = w.cols as usize;
        let small = w.rows <= 256 && k <= 16 && k <= w.rows as usize;
        // The row in shared memory within the 48 KB a launch gets without opting in.
        if w.kind >= 3 || !w.vectorizable() || !small || n * 4 > 48 << 10 {
            return Ok(false);
        }
        // The router's rows and the norm's weights loaded before the kernel waits (into shared
        // memory, or registers: kernels.cu route_norm_regs), where they fit beside x.
        let rows_bytes = w.rows as usize * w.row_bytes as usize;
        let pre = self.router_preload.load(Ordering::Relaxed)
            && n.is_multiple_of(4)
            && 2 * n * 4 + rows_bytes <= self.kernels.route_norm_smem;
        let c = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (rms_block(n), 1, 1),
            // x, then with `pre` the router's rows and the norm's weights.
            shared_mem_bytes: (n * 4 + if pre { rows_bytes + n * 4 } else { 0 }) as u32,
        };
        let (wm, ki, prei) = (*w, k as i32, i32::from(pre));
        launch!(self, self.kernels.moe_route_norm[w.kind as usize], c; wm, x, g, eps, xn, ki, routes, prei)?;
        Ok(true)
    }

    /// Float-kind experts of one token from the table `tab`: h ([k, ffn]) = SwiGLU of the
    /// routed experts' gate and up rows (`gate` is one of those gate matrices: kind and shape).
    pub fn moe_gate_up(
        &self,
        gate: &DevMat,
        tab: u64,
        routes: u64,
        k: usize,
        x: u64,
        h: u64,
    ) -> crate::Result<()> {
        let c = LaunchConfig {
            grid_dim: (blocks(gate.rows as usize, 8), k as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let ki = k as i32;
        launch!(self, self.kernels.moe_gate_up[gate.kind as usize], c; tab, routes, ki, x, h)
    }

    /// Float-kind experts of one token: x += the routed experts' down rows times h, weighted
    /// and summed in ascending expert order (`down` is one of those down matrices).
    pub fn moe_down(
        &self,
        down: &DevMat,
        tab: u64,
        routes: u64,
        k: usize,
        h: u64,
        x: u64,
    ) -> crate::Result<()> {
        let ki = k as i32;
        let c = cfg(blocks(down.rows as usize, 8), 256);
        launch!(self, self.kernels.moe_down[down.kind as usize], c; tab, routes, ki, h, x)
    }

    /// Whether decode's routed-expert kernels take matrices like `w`: a vectorizable layout
    /// (and for integer kinds, a plan for matvec_sel).
    pub fn sel_supports(&self, w: &DevMat) -> bool {
        if !w.vectorizable() {
            return false;
        }
        if w.kind < 3 {
            return true;
        }
        self.routed_plan(w, self.q_kernels(w).1).is_some()
    }

    /// The plan of a routed launch (`q`: a _sel or _gu kernel) of matrices like `w`: the plain
    /// kernel's block, split and column tiles (each row's sum is the plain kernel's), with `q`'s
    /// own shared memory (its ring may be deeper than the plain kernel's: QShape::ring). None
    /// where `q`'s registers or shared memory do not allow that block.
    pub fn routed_plan(&self, w: &DevMat, q: &QKernel) -> Option<QPlan> {
        let p = self.q_plan(w)?;
        let warps = p.block as usize / 32;
        let regs_per_warp = (q.shape.regs.max(1) * 32).div_ceil(256) * 256;
        let smem = q_smem(&q.shape, warps, p.tchunks as usize);
        let fits =
            regs_per_warp * warps <= self.q_limits.regs_per_sm && smem <= self.q_limits.smem_max;
        fits.then_some(QPlan {
            smem: smem as u32,
            ..p
        })
    }

    /// Mixtral routing of t tokens from router logits ([t, ne] at `logits`) into `routes`:
    /// [t, k] expert indices (i32) then [t, k] weights (kernels.cu route_topk).
    pub fn route(
        &self,
        logits: u64,
        t: usize,
        ne: usize,
        k: usize,
        routes: u64,
    ) -> crate::Result<()> {
        if k == 0 || k > 16 || k > ne {
            return Err(Error::Invalid(format!(
                "CUDA: routing to {k} of {ne} experts (the kernel takes 1 to 16)"
            )));
        }
        let (nei, ki, ti) = (ne as i32, k as i32, t as i32);
        launch!(self, self.kernels.route_topk, cfg(blocks(t, 128), 128); logits, nei, ki, ti, routes)
    }

    /// Write `a`'s table ([n][gate, up, down] at `tab`) and routes (n ranks then n weights at
    /// `routes`) on the compute stream.
    pub fn put_slots(&self, a: &SlotArgs, tab: u64, routes: u64) -> crate::Result<()> {
        let a = *a;
        launch!(self, self.kernels.put_slots, cfg(1, (3 * SLOTS_MAX_K) as u32); a, tab, routes)
    }

    /// x[:n] += the k routed experts' outputs d ([k, n]) weighted by `routes` (one token), summed
    /// in ascending expert order with the roundings of zero + axpy per expert + add. With `norm`
    /// = ((g, eps), xn), also xn = RMSNorm(x) * g (as `rms_norm` computes it) in the same launch
    /// where that kernel applies (n % 4 == 0, every pointer 16-byte aligned); returns whether xn
    /// was written (if not, the caller normalizes). With `norm`, it must follow `routed_ffn` of
    /// the same routes: that kernel reads the routes and x before it waits (kernels.cu
    /// moe_combine_norm).
    pub fn moe_combine(
        &self,
        x: u64,
        d: u64,
        routes: u64,
        (k, n): (usize, usize),
        norm: Option<((u64, f32), u64)>,
    ) -> crate::Result<bool> {
        let (ki, ni) = (k as i32, n as i32);
        if let Some(((g, eps), xn)) = norm {
            if n.is_multiple_of(4) && ((x | d | g | xn) & 15) == 0 {
                launch!(self, self.kernels.moe_combine_norm, cfg(1, rms_block(n)); x, d, routes, ki, ni, g, eps, xn)?;
                return Ok(true);
            }
        }
        launch!(self, self.kernels.moe_combine, cfg(blocks(n, 256), 256); x, d, routes, ki, ni)?;
        Ok(false)
    }

    /// The NMSE bound of a one-token product (`matvec`) of `m` against the CPU backend: the
    /// integer kernel's (QShape::nmse_bound), 1e-10 for the rest.
    pub fn matvec_nmse_bound(&self, m: &Matrix<'_>) -> f64 {
        let d = DevMat::new(m, 0, 0, 0);
        if d.kind >= 3 && d.row_bytes % 16 == 0 {
            self.q_kernels(&d).0.shape.nmse_bound()
        } else {
            1e-10
        }
    }

    /// The plan of an integer matvec (kind 3..=5, vectorizable) on this GPU, for the kernel
    /// `matvec` runs.
    pub fn q_plan(&self, w: &DevMat) -> Option<QPlan> {
        self.q_plan_for(self.q_kernels(w).0, w)
    }

    /// The plan of an integer matvec through kernel `q`.
    pub fn q_plan_for(&self, q: &QKernel, w: &DevMat) -> Option<QPlan> {
        q_plan(
            &q.shape,
            w.rows.max(0) as usize,
            w.row_bytes.max(0) as usize,
            &self.q_limits,
        )
    }

    /// out[t, rows] = x[t, cols] · Wᵀ for t > 1, through cuBLAS. f32 weights: SGEMM on the
    /// weights as stored (exact f32). Every other kind: the tokens rounded to f16 once, the weights
    /// in f16 (f16 as stored; the others dequantized to f16 row tiles in `scratch`), a tensor-core
    /// GEMM accumulating in f32. `scratch` holds `scratch_len` floats.
    pub fn matmul(
        &self,
        w: &DevMat,
        x: u64,
        t: usize,
        out: u64,
        scratch: u64,
        scratch_len: usize,
    ) -> crate::Result<()> {
        if t == 1 {
            return self.matvec(w, x, out);
        }
        let (rows, cols) = (w.rows as usize, w.cols as usize);
        if w.kind == 0 {
            return self.gemm(w.codes, Precision::F32, x, t, out, rows, cols, 0, rows);
        }
        // scratch as f16: [tokens (chunk x cols) | weight tile]
        let halves = scratch_len * 2;
        let chunk = (halves / 2 / cols).clamp(1, t);
        let tile_rows = prefill_tile_rows((halves - chunk * cols) / cols, rows);
        let xh = scratch;
        let tile = scratch + (chunk * cols * 2) as u64;
        let (kind, wm) = (w.kind, *w);
        // Integer kinds a code word per thread where the layout allows (kernels.cu
        // dequant_words_h): 4-byte aligned words, 16-byte aligned output rows, one group a word.
        let per_word = match kind {
            3 => 4,
            4 => 8,
            _ => 16,
        };
        let words = kind >= 3
            && w.codes.is_multiple_of(4)
            && w.row_bytes % 4 == 0
            && cols % 8 == 0
            && w.group > 0
            && w.group % per_word == 0
            && w.cols % w.group == 0;
        let mut t0 = 0;
        while t0 < t {
            let tn = chunk.min(t - t0);
            let (src, n) = (x + (t0 * cols * 4) as u64, (tn * cols) as i32);
            // to_half: four values a thread.
            let c = cfg(blocks((tn * cols).div_ceil(4), 256), 256);
            launch!(self, self.kernels.to_half, c; src, xh, n)?;
            let dst = out + (t0 * rows * 4) as u64;
            // The partials of gemm_q4h's parts of K go after the tokens in the scratch.
            let part = scratch + ((chunk * cols * 2).div_ceil(256) * 256) as u64;
            let room = (scratch_len * 4).saturating_sub((part - scratch) as usize);
            let fit = room / (tn * rows * 4).max(1);
            if let Some(splits) = self.gemm_q4h(w, xh, tn, (dst, part), fit)? {
                if splits > 1 {
                    self.sum_splits(part, dst, tn * rows, splits)?;
                }
            } else if kind == 1 {
                self.gemm(w.codes, Precision::F16, xh, tn, dst, rows, cols, 0, rows)?;
            } else {
                let mut r0 = 0;
                while r0 < rows {
                    let n = tile_rows.min(rows - r0);
                    let (r0i, ni) = (r0 as i32, n as i32);
                    if words {
                        let grid = LaunchConfig {
                            grid_dim: (blocks(wm.row_bytes as usize / 4, 128), n as u32, 1),
                            block_dim: (128, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        launch!(self, self.kernels.dequant_words_h, grid; wm, kind, tile, r0i, ni)?;
                    } else {
                        let grid = LaunchConfig {
                            grid_dim: (blocks(cols, 256), n as u32, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        launch!(self, self.kernels.dequant_rows_h, grid; wm, kind, tile, r0i, ni)?;
                    }
                    self.gemm(tile, Precision::F16, xh, tn, dst, n, cols, r0, rows)?;
                    r0 += n;
                }
            }
            t0 += tn;
        }
        Ok(())
    }

    /// out[token, r0 + i] = sum_c A[i, c] B[token, c] for i < n, token < t: A a row-major
    /// [n, cols] weight block, B the tokens [t, cols], out rows `ld_out` wide (the whole matrix's
    /// rows). Column-major for cuBLAS: C (n x t, ld ld_out, from row r0) = Aᵀ (cols x n)ᵀ · B.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        a: u64,
        p: Precision,
        b: u64,
        t: usize,
        out: u64,
        n: usize,
        cols: usize,
        r0: usize,
        ld_out: usize,
    ) -> crate::Result<()> {
        use cublas_sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        let (alpha, beta) = (1.0f32, 0.0f32);
        let dt = match p {
            Precision::F32 => cudaDataType::CUDA_R_32F,
            Precision::F16 => cudaDataType::CUDA_R_16F,
        };
        // SAFETY: a holds n * cols values of `dt`, b holds t * cols, out holds t * ld_out floats
        // from row r0 on; the handle is bound to the compute stream, after the tile and tokens.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                t as i32,
                cols as i32,
                &alpha as *const f32 as *const _,
                a as *const _,
                dt,
                cols as i32,
                b as *const _,
                dt,
                cols as i32,
                &beta as *const f32 as *const _,
                (out as *mut f32).add(r0) as *mut _,
                cudaDataType::CUDA_R_32F,
                ld_out as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda_err)
    }

    /// True where gemm_q4h computes `w`'s products from f16 tokens at `xh` (int4 g64, 16-byte
    /// aligned rows).
    pub fn gemm_q4h_applies(&self, w: &DevMat, xh: u64) -> bool {
        self.kernels.gemm_q4h.is_some()
            && w.kind == 4
            && w.group == 64
            && (w.cols as usize).is_multiple_of(64)
            && w.row_bytes % 16 == 0
            && w.codes.is_multiple_of(16)
            && xh.is_multiple_of(16)
    }

    /// int4 g64 `w` times the `tn` f16 tokens at `xh` through gemm_q4h, f32 [tn, rows] out: at
    /// `direct` in one launch over K, or as the partial sums of K's parts at `parts` + z·tn·rows
    /// (at most `max_parts` of them) where the grid is short of two waves. Returns the number
    /// of parts (1: the product is at `direct`), None where the kernel does not apply.
    pub fn gemm_q4h(
        &self,
        w: &DevMat,
        xh: u64,
        tn: usize,
        (direct, parts): (u64, u64),
        max_parts: usize,
    ) -> crate::Result<Option<usize>> {
        let Some(fs) = self.kernels.gemm_q4h.as_ref() else {
            return Ok(None);
        };
        if !self.gemm_q4h_applies(w, xh) {
            return Ok(None);
        }
        let (rows, cols) = (w.rows as usize, w.cols as usize);
        // 128 tokens a block above 64 (64 a block measured 3-5% slower at pp512).
        let (f, bn) = if tn > 64 { (&fs[1], 128) } else { (&fs[0], 64) };
        // K in 4 parts where the grid is short of two waves (Mixtral's 14336-row gate and up:
        // 112 blocks, its 4096-row down: 32): measured best of 1-8 parts and of parts sized to
        // the SM count (benches/results/2026-11-24-h100-prefill.md).
        let grid = rows.div_ceil(128) * tn.div_ceil(bn);
        let steps = cols / 64;
        let mut splits = if grid < 2 * self.q_limits.sm_count {
            4.min(steps)
        } else {
            1
        };
        if splits > max_parts {
            splits = 1;
        }
        let ksteps = steps.div_ceil(splits);
        let splits = steps.div_ceil(ksteps);
        let c = LaunchConfig {
            grid_dim: (
                rows.div_ceil(128) as u32,
                tn.div_ceil(bn) as u32,
                splits as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ti, ld, ks) = (tn as i32, rows as i32, ksteps as i32);
        let out = if splits == 1 { direct } else { parts };
        let wm = *w;
        launch!(self, f, c; wm, xh, ti, out, ld, ks)?;
        Ok(Some(splits))
    }

    /// out[..n] = the sum of the `splits` partials at parts, n apart, in order.
    pub fn sum_splits(&self, parts: u64, out: u64, n: usize, splits: usize) -> crate::Result<()> {
        let (ni, si) = (n as i32, splits as i32);
        launch!(self, self.kernels.sum_splits, cfg(blocks(n, 256), 256); parts, out, ni, si)
    }

    /// act = f16(silu(g) · u) over n values.
    pub fn swiglu_half(&self, g: u64, u: u64, act: u64, n: usize) -> crate::Result<()> {
        let ni = n as i32;
        launch!(self, self.kernels.swiglu_half, cfg(blocks(n, 256), 256); g, u, act, ni)
    }

    pub fn swiglu(&self, g: u64, u: u64, n: usize) -> crate::Result<()> {
        let ni = n as i32;
        launch!(self, self.kernels.swiglu, cfg(blocks(n, 256), 256); g, u, ni)
    }

    /// dst[j, :] = src[idx[j], :] for j < m, rows of n, stored as f16 where `half` (else f32).
    pub fn gather_rows(
        &self,
        (src, idx): (u64, u64),
        dst: u64,
        n: usize,
        m: usize,
        half: bool,
    ) -> crate::Result<()> {
        let (ni, mi) = (n as i32, m as i32);
        let f = if half {
            &self.kernels.gather_rows_half
        } else {
            &self.kernels.gather_rows
        };
        launch!(self, f, cfg(blocks(n * m, 256), 256); src, idx, dst, ni, mi)
    }

    /// out[idx[j], :] += w[j] · y[j, :] for j < m, rows of n, y the sum of `splits` partials
    /// (gemm_q4h's parts of K) n·m apart.
    pub fn scatter_axpy(
        &self,
        out: u64,
        (idx, w): (u64, u64),
        y: u64,
        n: usize,
        m: usize,
        splits: usize,
    ) -> crate::Result<()> {
        let (ni, mi, si) = (n as i32, m as i32, splits as i32);
        launch!(self, self.kernels.scatter_axpy, cfg(blocks(n * m, 256), 256); out, idx, w, y, ni, mi, si)
    }

    pub fn axpy(&self, out: u64, w: f32, y: u64, n: usize) -> crate::Result<()> {
        let ni = n as i32;
        launch!(self, self.kernels.axpy, cfg(blocks(n, 256), 256); out, w, y, ni)
    }

    pub fn zero(&self, ptr: u64, bytes: usize) -> crate::Result<()> {
        // SAFETY: callers pass a live device allocation of at least `bytes` bytes.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(cuda_err)
    }

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
        let mut rb = rb.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match rb.take() {
            Some(b) if b.len() >= dst.len() => rb.insert(b),
            // SAFETY: page-locked host memory of dst.len() floats, written only by the copy
            // below and read after the stream is synchronized.
            _ => rb.insert(unsafe { self.ctx.alloc_pinned::<f32>(dst.len()) }.map_err(cuda_err)?),
        };
        let host = &mut buf.as_mut_slice().map_err(cuda_err)?[..dst.len()];
        // SAFETY: src addresses at least dst.len() floats, host holds as many; the stream is
        // synchronized before host is read.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(host, src, self.stream.cu_stream())
                .map_err(cuda_err)?;
        }
        self.sync()?;
        dst.copy_from_slice(host);
        Ok(())
    }

    /// Page-locked host memory of `n` floats (zeroed) that results are read back into.
    pub fn alloc_floats(&self, n: usize) -> crate::Result<PinnedFloats> {
        // SAFETY: page-locked host memory of n floats, zeroed below before any read.
        let mut buf = unsafe { self.ctx.alloc_pinned::<f32>(n.max(1)) }.map_err(cuda_err)?;
        buf.as_mut_slice().map_err(cuda_err)?.fill(0.0);
        let at = buf.as_mut_ptr().map_err(cuda_err)?;
        Ok(PinnedFloats { buf, at })
    }

    /// A page-locked buffer of `n` floats for `queue_read`.
    pub fn alloc_read(&self, n: usize) -> crate::Result<QueuedRead> {
        // SAFETY: page-locked host memory of n floats, written only by the copies queue_read
        // queues and read only after their event has completed (QueuedRead::wait).
        let buf = unsafe { self.ctx.alloc_pinned::<f32>(n) }.map_err(cuda_err)?;
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
        unsafe { self.ctx.alloc_pinned::<f32>(n) }.map_err(cuda_err)
    }

    /// Host-to-device copy of i32 values queued on the compute stream, without waiting (as
    /// upload_f32_queued: a pageable source is staged before the call returns).
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

/// A decode position as the kernels read it (an i32).
fn step_pos(pos: usize) -> crate::Result<u32> {
    i32::try_from(pos)
        .map(|v| v as u32)
        .map_err(|_| Error::Invalid(format!("CUDA backend: position {pos} past i32")))
}

/// Device pointer of a slice (event tracking is off, so nothing is recorded).
pub fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// The KV cache on the device: (layer, ctx, kv_dim) f16 keys and values.
pub struct CudaKv {
    ctx: usize,
    kv_dim: usize,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
}

impl CudaKv {
    /// Device addresses of `layer`'s key and value rows for positions start..start + t.
    fn rows(
        &self,
        layer: usize,
        start: usize,
        t: usize,
        s: &CudaStream,
    ) -> crate::Result<(u64, u64)> {
        if start + t > self.ctx {
            return Err(Error::Invalid(format!(
                "CUDA backend: KV write past the context ({} > {})",
                start + t,
                self.ctx
            )));
        }
        let at = ((layer * self.ctx + start) * self.kv_dim * 2) as u64;
        Ok((ptr(&self.k, s) + at, ptr(&self.v, s) + at))
    }
}

/// Dense weights resident on the device, found by the host address of their mmap bytes.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    mats: HashMap<usize, (DevMat, CudaSlice<u8>)>,
    vectors: HashMap<usize, CudaSlice<f32>>,
    scratch: CudaSlice<f32>,
    scratch_len: usize,
    resident_bytes: usize,
    /// A decode step's position and (stage_token) its token's id, in device memory (read by its
    /// attention, RoPE and embedding launches, so that one recording serves every token), and
    /// the position last written there.
    step: CudaSlice<i32>,
    pos_now: Mutex<Option<usize>>,
    /// The recorded decode step (a CUDA graph) and its key; None: that key's steps run direct.
    graph: Mutex<Option<(u64, Option<DecodeGraph>)>>,
    /// A launch since the recording began took the decode position as an argument.
    baked: AtomicBool,
    /// Decode steps run from the recording.
    replays: AtomicU64,
    /// Nanoseconds spent submitting them (for --stats).
    launch_ns: AtomicU64,
    /// The last q/k/v launch was matvec3_rope, which lets later kernels start only after its
    /// own wait: the o projection that follows may read the residual before it waits
    /// (kernels.cu matvec_body `early`). Taken by that projection (matmul_add).
    qkv_settled: AtomicBool,
}

/// A CUDA graph of one decode step.
struct DecodeGraph(cudarc::driver::CudaGraph);

// SAFETY: a CUgraph/CUgraphExec may be used from any thread as long as calls on it are
// serialized; DecodeGraph is only reached through CudaBackend's Mutex.
unsafe impl Send for DecodeGraph {}

/// Rows of an integer matrix dequantized per prefill tile when `fit` rows fit the scratch: all
/// of them if they fit, else a multiple of 256. On the H100 (cuBLAS 13) tiles of 8064 + 6272 rows
/// (Mixtral's 14336 in 64 MiB) and 2212 + 1884 (its 4096-row down matrices) got Turing-era
/// `cutlass_75_tensorop_s1688gemm` kernels at ~117 us a tile, where 256-row multiples get the
/// sm_90 kernels the f16 experts' full matrices get: int4 pp512 8291 -> 13122 tok/s
/// (benches/results/2026-11-24-h100-prefill.md).
fn prefill_tile_rows(fit: usize, rows: usize) -> usize {
    // A launch's grid takes at most 65535 row tiles (kernels.cu dequant_*_h: one row a y block).
    if fit >= rows && rows <= 65535 {
        return rows.max(1);
    }
    let fit = fit.min(65535);
    if fit >= 256 {
        fit - fit % 256
    } else {
        fit.max(1)
    }
}

/// Floats of the dequantization tile used by prefill products (64 MiB).
const SCRATCH_FLOATS: usize = 16 << 20;

impl CudaBackend {
    /// Upload every dense weight of `model` (matrices in their stored dtype, norms and RoPE
    /// frequencies in f32).
    pub fn new(gpu: Arc<Gpu>, model: &Model<'_>) -> crate::Result<CudaBackend> {
        let w = model.weights();
        let mut mats: Vec<&Matrix> = vec![&w.token_embd, &w.output];
        let mut vectors: Vec<&[f32]> = vec![&w.output_norm, model.inv_freq()];
        for l in &w.layers {
            mats.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.router]);
            vectors.extend([l.attn_norm.as_slice(), l.ffn_norm.as_slice()]);
        }
        let needed: usize = mats
            .iter()
            .map(|m| m.codes.len() + m.scales.len() + m.mins.len())
            .sum::<usize>()
            + vectors.iter().map(|v| v.len() * 4).sum::<usize>()
            + SCRATCH_FLOATS * 4;
        let (free, total) = gpu.mem_info()?;
        if needed > free {
            return Err(Error::Invalid(format!(
                "CUDA: the model's non-expert weights need {:.2} GiB on {} but only {:.2} GiB of {:.2} GiB is free",
                gib(needed),
                gpu.name,
                gib(free),
                gib(total)
            )));
        }
        let mut b = CudaBackend::empty(gpu)?;
        for m in mats {
            b.upload_matrix(m)?;
        }
        for v in vectors {
            let key = v.as_ptr() as usize;
            if !b.vectors.contains_key(&key) {
                let d = b.gpu.stream.clone_htod(v).map_err(cuda_err)?;
                b.resident_bytes += v.len() * 4;
                b.vectors.insert(key, d);
            }
        }
        b.gpu.sync()?;
        Ok(b)
    }

    /// A backend with nothing resident yet (weights come with `make_resident`).
    pub fn empty(gpu: Arc<Gpu>) -> crate::Result<CudaBackend> {
        Ok(CudaBackend {
            scratch: gpu.alloc::<f32>(SCRATCH_FLOATS, "the prefill tile")?,
            scratch_len: SCRATCH_FLOATS,
            step: gpu.alloc::<i32>(2, "the decode position and token")?,
            pos_now: Mutex::new(None),
            qkv_settled: AtomicBool::new(false),
            graph: Mutex::new(None),
            baked: AtomicBool::new(false),
            replays: AtomicU64::new(0),
            launch_ns: AtomicU64::new(0),
            gpu,
            mats: HashMap::new(),
            vectors: HashMap::new(),
            resident_bytes: 0,
        })
    }

    /// The device address holding decode position `pos`, written there first if it holds
    /// another (never while a step is recorded: decode_step writes it before).
    fn pos_ptr(&self, pos: usize) -> crate::Result<u64> {
        let p = ptr(&self.step, &self.gpu.stream);
        let mut now = self.pos_now.lock().unwrap_or_else(|e| e.into_inner());
        if *now != Some(pos) {
            let v = step_pos(pos)?;
            // SAFETY: p holds an i32, set by a memset queued on the stream (no host buffer: no
            // staging copy), ordered before the launches that read it.
            unsafe {
                cudarc::driver::sys::cuMemsetD32Async(p, v, 1, self.gpu.stream.cu_stream())
                    .result()
                    .map_err(cuda_err)?;
            }
            *now = Some(pos);
        }
        Ok(p)
    }

    /// Copy a host matrix to the device; later calls with the same view find it.
    pub fn make_resident(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        self.upload_matrix(m)
    }

    /// Copy a host f32 vector (a norm, RoPE frequencies) to the device.
    pub fn make_resident_vector(&mut self, v: &[f32]) -> crate::Result<()> {
        let key = v.as_ptr() as usize;
        if !self.vectors.contains_key(&key) {
            let d = self.gpu.stream.clone_htod(v).map_err(cuda_err)?;
            self.resident_bytes += v.len() * 4;
            self.vectors.insert(key, d);
        }
        Ok(())
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Bytes of dense weights on the device.
    pub fn resident_bytes(&self) -> usize {
        self.resident_bytes
    }

    fn upload_matrix(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        let key = m.codes.as_ptr() as usize;
        if self.mats.contains_key(&key) {
            return Ok(());
        }
        // codes | scales | mins, each starting on a 256-byte boundary.
        let a = |n: usize| n.div_ceil(256) * 256;
        let (sc, mn) = (a(m.codes.len()), a(m.codes.len()) + a(m.scales.len()));
        let total = mn + m.mins.len();
        let mut host = vec![0u8; total];
        host[..m.codes.len()].copy_from_slice(m.codes);
        host[sc..sc + m.scales.len()].copy_from_slice(m.scales);
        host[mn..mn + m.mins.len()].copy_from_slice(m.mins);
        let dev = self.gpu.stream.clone_htod(&host).map_err(cuda_err)?;
        let base = ptr(&dev, &self.gpu.stream);
        let dm = DevMat::new(m, base, base + sc as u64, base + mn as u64);
        self.resident_bytes += total;
        self.mats.insert(key, (dm, dev));
        Ok(())
    }

    fn mat(&self, w: &Matrix<'_>) -> crate::Result<&DevMat> {
        self.mats
            .get(&(w.codes.as_ptr() as usize))
            .map(|(d, _)| d)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "CUDA backend: a [{}, {}] matrix was never uploaded",
                    w.rows, w.cols
                ))
            })
    }

    fn vector(&self, v: &[f32]) -> crate::Result<u64> {
        self.vectors
            .get(&(v.as_ptr() as usize))
            .map(|d| ptr(d, &self.gpu.stream))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "CUDA backend: a vector of {} was never uploaded",
                    v.len()
                ))
            })
    }

    /// The three matrices of one token's fused products (matvec3_*): resident float kinds, all
    /// one kind, 16-byte rows and x, the buffers long enough; None where the fused kernels do
    /// not apply.
    fn one_token_floats(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        t: usize,
        out: [&CudaSlice<f32>; 3],
    ) -> crate::Result<Option<[DevMat; 3]>> {
        let m = [*self.mat(w[0])?, *self.mat(w[1])?, *self.mat(w[2])?];
        let fused = t == 1
            && self.p(x).is_multiple_of(16)
            && m.iter()
                .all(|d| d.kind < 3 && d.kind == m[0].kind && d.vectorizable());
        if !fused {
            return Ok(None);
        }
        for (w, o) in w.iter().zip(out) {
            check_len("matmul input", x.len(), w.cols)?;
            check_len("matmul output", o.len(), w.rows)?;
        }
        Ok(Some(m))
    }

    fn p(&self, s: &CudaSlice<f32>) -> u64 {
        ptr(s, &self.gpu.stream)
    }

    /// Routes of t tokens as Gpu::route writes them at `dev` ([t, k] indices, then weights),
    /// read back into `routes` ([t, k]); `host` is room for them.
    fn routes_back(
        &self,
        dev: u64,
        t: usize,
        n_experts: usize,
        routes: &mut [Route],
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let k = routes.len() / t.max(1);
        host.resize(2 * t * k, 0.0);
        self.gpu.download_f32(dev, &mut host[..2 * t * k])?;
        let (ids, wts) = host.split_at(t * k);
        for (i, ((r, id), w)) in routes.iter_mut().zip(ids).zip(wts).enumerate() {
            let expert = id.to_bits() as usize;
            if expert >= n_experts {
                return Err(Error::Invalid(format!(
                    "routing: token {} found no expert among {n_experts} (router logits not finite?)",
                    i / k.max(1)
                )));
            }
            *r = Route { expert, weight: *w };
        }
        Ok(())
    }

    /// Multiply by a device matrix (e.g. an expert in the cache).
    /// The prefill scratch: its device address and length in floats.
    pub fn scratch(&self) -> (u64, usize) {
        (self.p(&self.scratch), self.scratch_len)
    }

    pub fn matmul_dev(&self, w: &DevMat, x: u64, t: usize, out: u64) -> crate::Result<()> {
        let scratch = self.p(&self.scratch);
        self.gpu.matmul(w, x, t, out, scratch, self.scratch_len)
    }
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn check_len(what: &str, have: usize, need: usize) -> crate::Result<()> {
    if have < need {
        return Err(Error::Invalid(format!(
            "CUDA backend: {what} holds {have} values, {need} needed"
        )));
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Host = PinnedFloats;
    type Kv = CudaKv;

    fn alloc(&self, n: usize) -> crate::Result<CudaSlice<f32>> {
        self.gpu.alloc(n, "activations")
    }

    fn alloc_kv(&self, layers: usize, ctx: usize, kv_dim: usize) -> crate::Result<CudaKv> {
        let n = layers * ctx * kv_dim;
        Ok(CudaKv {
            ctx,
            kv_dim,
            k: self.gpu.alloc(n, "the KV cache")?,
            v: self.gpu.alloc(n, "the KV cache")?,
        })
    }

    fn upload(&self, src: &[f32], dst: &mut CudaSlice<f32>) -> crate::Result<()> {
        check_len("upload destination", dst.len(), src.len())?;
        self.gpu.upload_f32_queued(src, self.p(dst))
    }

    fn embed(
        &self,
        table: &Matrix<'_>,
        tokens: &[u32],
        dst: &mut CudaSlice<f32>,
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let n = tokens.len() * table.cols;
        check_len("embedding destination", dst.len(), n)?;
        if tokens.len() < STAGED_EMBED_MIN {
            // (upload: a queued pageable copy)
            return embed_via_host(self, table, tokens, dst, host);
        }
        self.gpu
            .upload_staged(n, self.p(dst), |out| embed_rows(table, tokens, out))
    }

    fn stage_token(&self, table: &Matrix<'_>, token: u32, pos: usize) -> crate::Result<bool> {
        if self.mat(table).is_err() {
            return Ok(false);
        }
        if token as usize >= table.rows {
            return Err(Error::Invalid(format!(
                "embedding: token {token} past the table's {} rows",
                table.rows
            )));
        }
        let p = step_pos(pos)?;
        let at = ptr(&self.step, &self.gpu.stream);
        let s = self.gpu.stream.cu_stream();
        let mut now = self.pos_now.lock().unwrap_or_else(|e| e.into_inner());
        // (A 64-bit cuStreamWriteValue64_v2 of both was refused on the H100 under CUDA 13:
        // CUDA_ERROR_INVALID_VALUE.)
        for (i, v) in [p, token].into_iter().enumerate() {
            if i == 0 && *now == Some(pos) {
                continue;
            }
            // SAFETY: `step` holds two i32, each set by a memset queued on the stream (no host
            // buffer), ordered before the launches that read them.
            unsafe { cudarc::driver::sys::cuMemsetD32Async(at + 4 * i as u64, v, 1, s) }
                .result()
                .map_err(cuda_err)?;
        }
        *now = Some(pos);
        Ok(true)
    }

    fn embed_staged(&self, table: &Matrix<'_>, dst: &mut CudaSlice<f32>) -> crate::Result<()> {
        check_len("embedding destination", dst.len(), table.cols)?;
        let w = *self.mat(table)?;
        let tp = ptr(&self.step, &self.gpu.stream) + 4;
        let (kind, dp) = (w.kind, self.p(dst));
        let c = cfg(blocks(table.cols, 256), 256);
        launch!(self.gpu, self.gpu.kernels.embed_token, c; w, kind, tp, dp)
    }

    fn alloc_host(&self, n: usize) -> crate::Result<PinnedFloats> {
        self.gpu.alloc_floats(n)
    }

    fn download_host(
        &self,
        src: &CudaSlice<f32>,
        dst: &mut PinnedFloats,
        n: usize,
    ) -> crate::Result<()> {
        check_len("download source", src.len(), n)?;
        check_len("download destination", dst.len(), n)?;
        // (Page-locked: the copy lands by DMA, nothing to copy out after.)
        self.gpu.read_direct(self.p(src), &mut dst[..n])
    }

    fn download(&self, src: &CudaSlice<f32>, dst: &mut [f32]) -> crate::Result<()> {
        check_len("download source", src.len(), dst.len())?;
        self.gpu.download_f32(self.p(src), dst)
    }

    fn matmul(
        &self,
        w: &Matrix<'_>,
        x: &CudaSlice<f32>,
        t: usize,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        check_len("matmul input", x.len(), t * w.cols)?;
        check_len("matmul output", out.len(), t * w.rows)?;
        let dm = *self.mat(w)?;
        self.matmul_dev(&dm, self.p(x), t, self.p(out))
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        rows: Range<usize>,
        w: &[f32],
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let n = w.len();
        check_len("rms_norm input", x.len(), rows.end * n)?;
        check_len("rms_norm output", out.len(), rows.len() * n)?;
        let (xp, wp, op) = (self.p(x), self.vector(w)?, self.p(out));
        let (ni, r0) = (n as i32, rows.start as i32);
        launch!(self.gpu, self.gpu.kernels.rms_norm, cfg(rows.len() as u32, rms_block(n)); xp, wp, op, ni, r0, eps)
    }

    fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        t: usize,
        width: usize,
        start_pos: usize,
        inv_freq: &[f32],
    ) -> crate::Result<()> {
        // The position is an argument here: a recorded decode step cannot replay this.
        self.baked.store(true, Ordering::Relaxed);
        check_len("rope input", x.len(), t * width)?;
        let half = inv_freq.len();
        let (xp, fp) = (self.p(x), self.vector(inv_freq)?);
        let (ti, wi, hi, si) = (t as i32, width as i32, half as i32, start_pos as i32);
        let n = t * width / 2;
        launch!(self.gpu, self.gpu.kernels.rope, cfg(blocks(n, 256), 256); xp, fp, ti, wi, hi, si)
    }

    fn add_assign(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> crate::Result<()> {
        check_len("add input", x.len().min(y.len()), n)?;
        let (xp, yp, ni) = (self.p(x), self.p(y), n as i32);
        launch!(self.gpu, self.gpu.kernels.add_assign, cfg(blocks(n, 256), 256); xp, yp, ni)
    }

    fn kv_write(
        &self,
        kv: &mut CudaKv,
        (layer, start): (usize, usize),
        t: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> crate::Result<()> {
        // The position is an argument here: a recorded decode step cannot replay this.
        self.baked.store(true, Ordering::Relaxed);
        let n = t * kv.kv_dim;
        check_len("kv_write input", k.len().min(v.len()), n)?;
        let (kd, vd) = kv.rows(layer, start, t, &self.gpu.stream)?;
        let (kp, vp, ni) = (self.p(k), self.p(v), n as i32);
        // to_half: four values a thread.
        let c = cfg(blocks(n.div_ceil(4), 256), 256);
        launch!(self.gpu, self.gpu.kernels.to_half, c; kp, kd, ni)?;
        launch!(self.gpu, self.gpu.kernels.to_half, c; vp, vd, ni)
    }

    fn attention(
        &self,
        shape: AttentionShape,
        q: &CudaSlice<f32>,
        kv: &CudaKv,
        layer: usize,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        if shape.head_dim > 256 {
            return Err(Error::Invalid(format!(
                "CUDA backend: head_dim {} is above the attention kernel's 256",
                shape.head_dim
            )));
        }
        let qd = shape.n_heads * shape.head_dim;
        check_len("attention input", q.len(), shape.t * qd)?;
        check_len("attention output", out.len(), shape.t * qd)?;
        let base = (layer * kv.ctx * kv.kv_dim * 2) as u64;
        let s = &self.gpu.stream;
        let (kp, vp) = (ptr(&kv.k, s) + base, ptr(&kv.v, s) + base);
        let (qp, op) = (self.p(q), self.p(out));
        let (nh, nkv, hd, sp) = (
            shape.n_heads as i32,
            shape.n_kv_heads as i32,
            shape.head_dim as i32,
            shape.start_pos as i32,
        );
        let window = shape.window.map_or(0, |w| w as i32);
        // Prefill: a block per ATP_ROWS (query, head) rows of one KV head (kernels.cu
        // attention_prefill_*), for head_dim 32, 64 or 128 and groups that divide ATP_ROWS.
        let group = shape.n_heads / shape.n_kv_heads.max(1);
        let dpl = match shape.head_dim {
            32 => Some(0),
            64 => Some(1),
            128 => Some(2),
            _ => None,
        };
        if let Some(i) = dpl.filter(|_| {
            shape.t > 1
                && shape.n_kv_heads > 0
                && shape.n_heads.is_multiple_of(shape.n_kv_heads)
                && ATP_ROWS.is_multiple_of(group)
        }) {
            let (t, qpb) = (shape.t as i32, ATP_ROWS / group);
            let c = LaunchConfig {
                grid_dim: (shape.n_kv_heads as u32, shape.t.div_ceil(qpb) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let f = &self.gpu.kernels.attention_prefill[i];
            return launch!(self.gpu, f, c; qp, kp, vp, op, nh, nkv, t, sp, window);
        }
        // Decode: 16 warps share a head's positions (latency-bound); prefill: 4 per query.
        let c = LaunchConfig {
            grid_dim: (shape.n_heads as u32, shape.t as u32, 1),
            block_dim: (if shape.t == 1 { 512 } else { 128 }, 1, 1),
            shared_mem_bytes: 0,
        };
        let posp = if shape.t == 1 {
            self.pos_ptr(shape.start_pos)?
        } else {
            0u64
        };
        launch!(self.gpu, self.gpu.kernels.attention, c; qp, kp, vp, op, nh, nkv, hd, sp, window, posp)
    }

    /// One token: one launch for the three products when they are float kinds (matvec3_*).
    fn matmul_qkv(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        t: usize,
        out: [&mut CudaSlice<f32>; 3],
    ) -> crate::Result<()> {
        let [q, k, v] = out;
        let Some(m) = self.one_token_floats(w, x, t, [&*q, &*k, &*v])? else {
            self.matmul(w[0], x, t, q)?;
            self.matmul(w[1], x, t, k)?;
            return self.matmul(w[2], x, t, v);
        };
        let xp = self.p(x);
        let (yq, yk, yv) = (self.p(q), self.p(k), self.p(v));
        let rows = m.iter().map(|d| d.rows as usize).max().unwrap_or(0);
        let c = LaunchConfig {
            grid_dim: (blocks(rows, 8), 3, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.gpu.kernels.matvec3[m[0].kind as usize];
        let [a, b, d] = m;
        launch!(self.gpu, f, c; a, b, d, xp, yq, yk, yv)
    }

    /// One token with float weights: the three products, RoPE and the KV store in one launch
    /// (matvec3_rope_*); otherwise matmul_qkv and rope_kv_write.
    fn qkv_rope_kv(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        [q, k, v]: [&mut CudaSlice<f32>; 3],
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        let (t, q_width, kv_width) = (step.t, step.q_width, step.kv_width);
        let (start, inv_freq, layer) = (step.start, step.inv_freq, step.layer);
        self.qkv_settled.store(false, Ordering::Relaxed);
        let half = inv_freq.len();
        let m = self
            .one_token_floats(w, x, t, [&*q, &*k, &*v])?
            .filter(|m| {
                half > 0
                    && m[0].rows as usize == q_width
                    && m[1].rows as usize == kv_width
                    && m[2].rows as usize == kv_width
                    && q_width % (2 * half) == 0
                    && kv_width % (2 * half) == 0
                    && kv_width == kv.kv_dim
            });
        let Some(m) = m else {
            self.matmul_qkv(w, x, t, [&mut *q, &mut *k, &mut *v])?;
            return self.rope_kv_write([q, k, v], step, kv);
        };
        let xp = self.p(x);
        // The layer's cache rows from position 0: the kernel adds the position it reads.
        kv.rows(layer, start, 1, &self.gpu.stream)?;
        let (kd, vd) = kv.rows(layer, 0, 1, &self.gpu.stream)?;
        let posp = self.pos_ptr(start)?;
        let (yq, yk, yv, fp) = (self.p(q), self.p(k), self.p(v), self.vector(inv_freq)?);
        // q and k: 4 rotation pairs per block of 8 warps; v: 8 rows.
        let grid = blocks(q_width / 2, 4)
            .max(blocks(kv_width / 2, 4))
            .max(blocks(kv_width, 8));
        let c = LaunchConfig {
            grid_dim: (grid, 3, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.gpu.kernels.matvec3_rope[m[0].kind as usize];
        let [a, b, d] = m;
        let hi = half as i32;
        launch!(self.gpu, f, c; a, b, d, xp, yq, yk, yv, fp, hi, posp, kd, vd)?;
        self.qkv_settled.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// RoPE and the KV store in one launch (rope_kv).
    fn rope_kv_write(
        &self,
        [q, k, v]: [&mut CudaSlice<f32>; 3],
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        let (t, q_width, kv_width) = (step.t, step.q_width, step.kv_width);
        let (start, inv_freq, layer) = (step.start, step.inv_freq, step.layer);
        // The position is an argument here: a recorded decode step cannot replay this.
        self.baked.store(true, Ordering::Relaxed);
        check_len("rope input", q.len(), t * q_width)?;
        check_len("kv_write input", k.len().min(v.len()), t * kv_width)?;
        if kv_width != kv.kv_dim {
            return Err(Error::Invalid(format!(
                "CUDA backend: keys of {kv_width} values for a cache of {}",
                kv.kv_dim
            )));
        }
        let (kd, vd) = kv.rows(layer, start, t, &self.gpu.stream)?;
        let (qp, kp, vp, fp) = (self.p(q), self.p(k), self.p(v), self.vector(inv_freq)?);
        let n = t * (q_width / 2 + kv_width / 2 + kv_width);
        let (ti, qw, kw, hi, si) = (
            t as i32,
            q_width as i32,
            kv_width as i32,
            inv_freq.len() as i32,
            start as i32,
        );
        launch!(self.gpu, self.gpu.kernels.rope_kv, cfg(blocks(n, 256), 256); qp, kp, vp, fp, ti, qw, kw, hi, si, kd, vd)
    }

    /// One token with float weights: the residual add inside the product (matvec_add_*).
    fn matmul_add(
        &self,
        w: &Matrix<'_>,
        x: &CudaSlice<f32>,
        t: usize,
        tmp: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let early = i32::from(self.qkv_settled.swap(false, Ordering::Relaxed));
        let d = *self.mat(w)?;
        let xp = self.p(x);
        if t != 1 || d.kind >= 3 || !d.vectorizable() || !xp.is_multiple_of(16) {
            self.matmul(w, x, t, tmp)?;
            return self.add_assign(out, tmp, t * w.rows);
        }
        check_len("matmul input", x.len(), w.cols)?;
        check_len("matmul output", out.len(), w.rows)?;
        let yp = self.p(out);
        let c = cfg(blocks(w.rows, 8), 256);
        launch!(self.gpu, self.gpu.kernels.matvec_add[d.kind as usize], c; d, xp, yp, early)
    }

    /// Routing on the device (Gpu::route, into the prefill tile's scratch), the routes copied
    /// to the host: the same routes as the engine's device-routed decode.
    fn route(
        &self,
        logits: &CudaSlice<f32>,
        t: usize,
        n_experts: usize,
        routes: &mut [Route],
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let k = routes.len() / t.max(1);
        check_len("route input", logits.len(), t * n_experts)?;
        check_len("route scratch", self.scratch_len, 2 * t * k)?;
        let scratch = self.p(&self.scratch);
        self.gpu.route(self.p(logits), t, n_experts, k, scratch)?;
        self.routes_back(scratch, t, n_experts, routes, host)
    }

    fn norm_route(
        &self,
        x: &CudaSlice<f32>,
        t: usize,
        block: &MoeBlock<'_>,
        out: RouteOut<'_, Self>,
    ) -> crate::Result<()> {
        let (norm, eps, router) = (block.norm, block.eps, block.router);
        let (n, ne, k) = (router.cols, router.rows, out.routes.len());
        if t == 1 && k <= self.scratch_len / 2 {
            // One token: RMSNorm, the router and top-k in one launch (the same results as the
            // three launches: moe_route_norm).
            check_len("norm_route input", x.len(), n)?;
            check_len("norm_route output", out.xn.len(), n)?;
            check_len("norm_route weights", norm.len(), n)?;
            let scratch = self.p(&self.scratch);
            let rw = *self.mat(router)?;
            let g = (self.vector(norm)?, eps);
            if self
                .gpu
                .moe_route_norm(&rw, self.p(x), g, self.p(out.xn), k, scratch)?
            {
                return self.routes_back(scratch, 1, ne, out.routes, out.host);
            }
        }
        self.rms_norm(x, 0..t, norm, eps, out.xn)?;
        self.matmul(router, out.xn, t, out.logits)?;
        self.route(out.logits, t, ne, out.routes, out.host)
    }

    fn decode_step(&self, key: u64, pos: usize) -> crate::Result<DecodeStep> {
        self.pos_ptr(pos)?;
        // Kernel timing records events around each launch: those steps run direct.
        if self.gpu.clock.on() {
            return Ok(DecodeStep::Direct);
        }
        let mut graph = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        match graph.as_ref() {
            Some((k, Some(g))) if *k == key => {
                let t = Instant::now();
                g.0.launch().map_err(cuda_err)?;
                self.launch_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                self.replays.fetch_add(1, Ordering::Relaxed);
                return Ok(DecodeStep::Replayed);
            }
            Some((k, None)) if *k == key => return Ok(DecodeStep::Direct),
            _ => {}
        }
        *graph = None;
        self.baked.store(false, Ordering::Relaxed);
        self.gpu
            .stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cuda_err)?;
        Ok(DecodeStep::Recording)
    }

    fn record_end(&self, key: u64, recorded: crate::Result<()>) -> crate::Result<bool> {
        let g = self
            .gpu
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags_enum(0));
        let mut graph = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        // Until a new key: the steps of this one run direct unless recorded below.
        *graph = Some((key, None));
        let why = match (recorded, g) {
            (Err(e), _) => format!("a launch failed while recording: {e}"),
            (Ok(()), Err(e)) => format!("{e}"),
            (Ok(()), Ok(None)) => "nothing was recorded".into(),
            // A launch took this token's position as an argument: replays would repeat it.
            (Ok(()), Ok(Some(_))) if self.baked.load(Ordering::Relaxed) => {
                "an op of this model takes the position as an argument".into()
            }
            (Ok(()), Ok(Some(g))) => {
                g.launch().map_err(cuda_err)?;
                self.replays.fetch_add(1, Ordering::Relaxed);
                *graph = Some((key, Some(DecodeGraph(g))));
                return Ok(true);
            }
        };
        log::info!("decode steps run without a CUDA graph: {why}");
        Ok(false)
    }

}

impl Telemetry for CudaBackend {
    fn decode_replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }

    fn host_times(&self) -> (f64, f64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        (s(&self.launch_ns), s(&self.gpu.read_ns))
    }

    fn reset_host_times(&self) {
        self.launch_ns.store(0, Ordering::Relaxed);
        self.gpu.read_ns.store(0, Ordering::Relaxed);
    }

    fn kernel_clock(&self, on: bool) -> bool {
        self.gpu.clock.set(on);
        true
    }

    fn kernel_times(&self) -> crate::Result<Vec<KernelTime>> {
        self.gpu.clock.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H100's figures (sm_90: 228 KB per SM, 1 KB kept per block, 227 KB per block).
    const H100: QLimits = QLimits {
        sm_count: 132,
        smem_per_sm: 233_472,
        smem_reserved: 1024,
        smem_max: 232_448,
        regs_per_sm: 65536,
        threads_per_sm: 2048,
    };

    /// Prefill tiles: the whole matrix when it fits, else a multiple of 256 rows (Mixtral's shapes
    /// in the 64 MiB scratch), never zero rows.
    #[test]
    fn prefill_tiles_are_whole_matrices_or_256_row_multiples() {
        assert_eq!(prefill_tile_rows(20000, 14336), 14336);
        assert_eq!(prefill_tile_rows(8064, 14336), 7936);
        assert_eq!(prefill_tile_rows(2212, 4096), 2048);
        assert_eq!(prefill_tile_rows(300, 4096), 256);
        assert_eq!(prefill_tile_rows(100, 4096), 100);
        assert_eq!(prefill_tile_rows(0, 4096), 1);
        assert_eq!(prefill_tile_rows(70000, 100000), 65280);
        assert_eq!(prefill_tile_rows(65535, 65535), 65535);
    }

    /// The ring form takes exactly the layouts its copies can serve: groups of 1, 2 or 4 chunks, a
    /// multiple of 8 groups a row, 16-byte aligned scales and mins (int8 has no mins).
    #[test]
    fn ring_takes_whole_pieces_of_scales_only() {
        let m = |kind: i32, cols: i32, group: i32, scales: u64, mins: u64| DevMat {
            codes: 0,
            scales,
            mins,
            rows: 64,
            cols,
            group,
            row_bytes: cols * [8, 4, 2][(kind - 3) as usize] / 8,
            kind,
            _pad: 0,
        };
        // Mixtral's defaults: int2/g64 (1 chunk a group), int4/g64 (2), int8/g64 (4).
        assert!(ring_ok(&m(5, 4096, 64, 1 << 20, 2 << 20)));
        assert!(ring_ok(&m(4, 14336, 64, 1 << 20, 2 << 20)));
        assert!(ring_ok(&m(3, 4096, 64, 1 << 20, 0)));
        // Groups splitting a chunk, or of 8 chunks.
        assert!(!ring_ok(&m(4, 4096, 16, 1 << 20, 2 << 20)));
        assert!(!ring_ok(&m(3, 4096, 128, 1 << 20, 0)));
        // 7 groups a row: a row's scales are not 16-byte aligned.
        assert!(!ring_ok(&m(5, 448, 64, 1 << 20, 2 << 20)));
        // Unaligned scales or mins.
        assert!(!ring_ok(&m(5, 4096, 64, (1 << 20) + 2, 2 << 20)));
        assert!(!ring_ok(&m(4, 4096, 64, 1 << 20, (2 << 20) + 8)));
    }

    /// Every plan gives the kernel the shared memory its layout needs, column tiles of whole warps
    /// of chunks, a split that divides the block's warps and leaves no warp without chunks, and no
    /// block without a tile.
    #[test]
    fn integer_matvec_plans_fit_the_kernel() {
        let limits = [
            H100,
            // Jetson Orin (sm_87) and the RTX 4090 (sm_89).
            QLimits {
                sm_count: 16,
                smem_per_sm: 167_936,
                smem_max: 166_912,
                ..H100
            },
            QLimits {
                sm_count: 128,
                smem_per_sm: 102_400,
                smem_max: 101_376,
                threads_per_sm: 1536,
                ..H100
            },
        ];
        let shapes = [
            (14336, 4096),
            (4096, 14336),
            (1, 64),
            (5, 128),
            (8203, 128),
            (4096, 28672),
            (333, 65536),
            (1536, 2048),
        ];
        for lim in &limits {
            for kind in 3..=5i32 {
                for &(rows, cols) in &shapes {
                    let row_bytes = cols * [8, 4, 2][(kind - 3) as usize] / 8;
                    let n = row_bytes / 16;
                    for (r, regs, mma, dp_parts, ring) in [
                        (4, 128, false, 0, 0),
                        (2, 64, false, 0, 0),
                        (8, 168, false, 0, 0),
                        (16, 96, true, 0, 0),
                        (4, 128, false, 3, 0),
                        (4, 96, false, 2, 0),
                        // The shared-memory ring (QD_RING_*): a deep one must still fit.
                        (4, 96, false, 2, 4),
                        (4, 96, false, 1, 8),
                        // More than 128 registers: a 512-thread block cannot launch.
                        (4, 255, false, 0, 0),
                    ] {
                        let k = QShape {
                            kind,
                            rows: r,
                            regs,
                            quads: if mma { QM_QUADS_PER_STEP } else { 0 },
                            dp_parts,
                            ring,
                        };
                        let p = q_plan(&k, rows, row_bytes, lim).expect("a plan");
                        let (split, tchunks, warps) =
                            (p.split as usize, p.tchunks as usize, p.block as usize / 32);
                        let what = format!("kind {kind} [{rows}, {cols}] {k:?}: {p:?}");
                        assert_eq!(q_smem(&k, warps, tchunks), p.smem as usize, "{what}");
                        assert!(p.smem as usize <= lim.smem_max, "{what}");
                        assert!(tchunks == n || (tchunks % 32 == 0 && tchunks < n), "{what}");
                        // kernels.cu matvec_q_body shifts by the split (QD_NODIV).
                        assert!(split.is_power_of_two(), "{what}");
                        assert!(warps % split == 0 && p.block.is_multiple_of(32), "{what}");
                        assert!(
                            (regs * 32).div_ceil(256) * 256 * warps <= lim.regs_per_sm,
                            "{what}"
                        );
                        assert!(
                            split == 1 || k.step_chunks() * split <= tchunks.min(n),
                            "{what}"
                        );
                        let tiles = rows.div_ceil(warps / split * r);
                        assert!(p.grid >= 1 && p.grid as usize <= tiles, "{what}");
                    }
                }
            }
        }
        // Mixtral's expert shapes on the H100: x in one column tile, (nearly) every SM busy.
        for (kind, rows, row_bytes) in [(3, 14336, 4096), (4, 4096, 7168), (5, 14336, 1024)] {
            for (r, mma, dp_parts) in [(4, false, 0), (16, true, 0), (4, false, 3)] {
                let k = QShape {
                    kind,
                    rows: r,
                    regs: 128,
                    quads: if mma { QM_QUADS_PER_STEP } else { 0 },
                    dp_parts,
                    ring: 0,
                };
                let p = q_plan(&k, rows, row_bytes, &H100).expect("a plan");
                assert_eq!(p.tchunks as usize, row_bytes / 16);
                // 16-row tiles leave fewer tiles than SMs at some splits; the cost model may
                // take one of those.
                assert!(p.grid >= if mma { 100 } else { 128 }, "{p:?}");
            }
        }
    }
}
