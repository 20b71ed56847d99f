//! The CUDA backend: cudarc with dynamic loading (the binary runs where no CUDA is installed),
//! kernels from cuda/*.cu compiled by NVRTC, dense weights and the KV cache (f16) resident
//! on the device, activations in device buffers, prefill products through cuBLAS.
//!
//! All device work goes to one compute stream in order, so buffers need no further
//! synchronization; the expert engine's loads add a copy stream ordered by events (copier.rs).
//! `unsafe` here is the CUDA launch and raw-pointer copy surface, each with a SAFETY note.
//!
//! - `gpu`: the device, its streams, kernels, memory; `plan`: the integer matvecs' launch plans;
//!   `matvec`, `gemm`: kernel launchers; `transfer`: host <-> device copies.
//! - `backend` and `resident`: `CudaBackend`, the forward pass's ops (model::ops::Backend) on
//!   weights kept resident.
//! - `experts` and `copier`: the device the expert engine drives (model::ExpertDevice).
//! - `kernels`: NVRTC compilation and the kernel handles; `clock`: per-kernel GPU time.

/// Launch `f` on the compute stream with the given arguments (locals, borrowed until launch).
macro_rules! launch {
    ($gpu:expr, $f:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        let f = &$f;
        let mut params = [$( (&$arg) as *const _ as *mut ::std::ffi::c_void ),*];
        let t0 = $gpu.clock.start(&$gpu.stream)?;
        // SAFETY: the argument list matches the kernel's signature in cuda/*.cu (each
        // parameter a pointer to a live local of the kernel parameter's type), and every pointer
        // argument addresses a live device allocation of at least the extent the kernel reads or
        // writes for the given sizes (checked by the callers).
        unsafe { $gpu.launch_raw(f, $cfg, &mut params) }?;
        $gpu.clock.stop(&$gpu.stream, f, t0)
    }};
}

mod backend;
mod clock;
mod copier;
mod experts;
mod gate;
mod gemm;
mod gpu;
mod kernels;
mod kv;
mod matvec;
mod mla;
mod plan;
mod resident;
mod routing;
mod transfer;

pub use backend::CudaBackend;
pub use copier::CudaCopier;
pub use experts::{CudaArena, CudaResident, CudaWork};
pub use gpu::Gpu;
pub use kernels::{Kernels, QFamily, QKernel};
pub use kv::CudaKv;
pub use matvec::Routed;
pub use plan::{c32_split, q_plan, q_smem, ring_ok, QLimits, QPlan, QShape, QM_QUADS_PER_STEP};
pub use transfer::{PinnedFloats, QueuedRead};

use backend::*;
use gpu::*;

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
    embed_rows, embed_via_host, qk_norm_then_rope_kv, AttentionShape, AttnPrep, Backend,
    DecodeStep, KernelTime, MlaInputs, MlaShape, QkvStep, Route, RouteOut, RouteReads, Telemetry,
};
use crate::model::Model;
use crate::model::MoeBlock;
use crate::quant::{Matrix, WeightKind};
use crate::Error;

pub(crate) fn cuda_err(e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("CUDA: {e}"))
}

/// A refused page-locked host allocation, naming its size and use.
pub(crate) fn pinned_err(bytes: usize, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!(
        "CUDA: cannot page-lock {} of host memory for {what}: {e}",
        size(bytes)
    ))
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

/// Kind codes shared with cuda/*.cu.
fn kind_code(kind: WeightKind) -> i32 {
    match kind {
        WeightKind::F32 => 0,
        WeightKind::F16 => 1,
        WeightKind::Bf16 => 2,
        WeightKind::Int8 => 3,
        WeightKind::Int4 => 4,
        WeightKind::Int2 => 5,
        WeightKind::Mxfp4 => 6,
        WeightKind::Int3 => 7,
        WeightKind::Int4k => 8,
        WeightKind::Int2k => 9,
        WeightKind::Ap8 { .. } => 10,
    }
}

/// A matrix in device memory, as the kernels take it (`struct Mat` in cuda/common.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
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
// cuda/*.cu (the kernels ignore the trailing `kind`); as a table entry it is moe.cu's
// `struct MatEntry` (Mat, kind, pad: 48 bytes, checked below).
unsafe impl DeviceRepr for DevMat {}
const _: () = assert!(std::mem::size_of::<DevMat>() == 48);

/// dequant.cu `struct QGroup`: one expert of a layer's grouped prefill, its tokens rows
/// [row0, row0 + n) of the gathered inputs and of the outputs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QGroup {
    pub mats: [DevMat; 3],
    pub row0: i32,
    pub n: i32,
    _pad: [i32; 2],
}

impl QGroup {
    pub fn new(mats: [DevMat; 3], row0: usize, n: usize) -> QGroup {
        QGroup {
            mats,
            row0: row0 as i32,
            n: n as i32,
            _pad: [0; 2],
        }
    }
}

// SAFETY: QGroup is #[repr(C)] of DevMats (moe.cu's MatEntry) and integers, laid out as
// dequant.cu's `struct QGroup` (160 bytes, checked below).
unsafe impl DeviceRepr for QGroup {}
const _: () = assert!(std::mem::size_of::<QGroup>() == 160);

/// (query, head) rows of one prefill attention block (attention.cu ATP_ROWS).
const ATP_ROWS: usize = 32;
/// attention.cu's ATL_ROWS and ATL_SMEM: attention_prefill_latent's (query, head) rows a block
/// and its dynamic shared memory (16 rows of 576 f32, 32 rows of 289 words).
const ATL_ROWS: usize = 16;
const ATL_SMEM: usize = ATL_ROWS * 576 * 4 + 32 * 289 * 4;

/// The most routed experts `Gpu::put_slots` takes (moe.cu SLOTS_MAX_K).
pub const SLOTS_MAX_K: usize = 8;
/// The floats of the routes buffer `put_slots` writes: ranks and weights, then real indices.
pub const SLOT_ROUTES_LEN: usize = 3 * SLOTS_MAX_K;

/// moe.cu `struct SlotArgs`: the routed experts of one host-routed decode layer, passed by
/// value to `put_slots`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotArgs {
    /// gate, up, down of each routed expert, by rank.
    pub mats: [DevMat; 3 * SLOTS_MAX_K],
    /// n ranks (as f32 bits), then n weights.
    pub routes: [f32; 2 * SLOTS_MAX_K],
    /// The real expert index of each rank (as f32 bits): `put_slots` writes them after the
    /// routes' room, at routes + 2 * SLOTS_MAX_K, for the kernels that read biases by expert.
    pub ids: [f32; SLOTS_MAX_K],
    pub n: i32,
    _pad: i32,
}

// SAFETY: #[repr(C)], plain integers and floats, laid out as moe.cu's `struct SlotArgs`
// (48-byte entries, then 24 floats and two ints: 1256 bytes, checked below).
unsafe impl DeviceRepr for SlotArgs {}
const _: () = assert!(std::mem::size_of::<SlotArgs>() == 1256);

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
            ids: [0.0; SLOTS_MAX_K],
            n: n as i32,
            _pad: 0,
        };
        for (rank, &j) in order.iter().enumerate() {
            let (e, w, m) = experts[j];
            a.mats[3 * rank..3 * rank + 3].copy_from_slice(&m);
            a.routes[rank] = f32::from_bits(rank as u32);
            a.routes[n + rank] = w;
            a.ids[rank] = f32::from_bits(e as u32);
        }
        Ok(a)
    }
}

impl DevMat {
    /// Describe a matrix whose codes, scales and mins start at the given device addresses.
    /// An ap8 view's matrix: `codes` the blob's start, and in place of `row_bytes` its width
    /// and part (width | part << 8, as cuda/ap8.cu `ap8_part` reads them).
    pub fn new(m: &Matrix<'_>, codes: u64, scales: u64, mins: u64) -> DevMat {
        let row_bytes = match m.kind {
            WeightKind::Ap8 { width, part } => i32::from(width) | i32::from(part) << 8,
            _ => m.row_bytes() as i32,
        };
        DevMat {
            codes,
            scales,
            mins,
            rows: m.rows as i32,
            cols: m.cols as i32,
            group: m.group_size as i32,
            row_bytes,
            kind: kind_code(m.kind),
            _pad: 0,
        }
    }

    /// f32 rows [rows, cols] at `codes` (a copy made on the device's side of the load).
    pub fn f32_rows(codes: u64, rows: usize, cols: usize) -> DevMat {
        DevMat {
            codes,
            scales: 0,
            mins: 0,
            rows: rows as i32,
            cols: cols as i32,
            group: cols as i32,
            row_bytes: (cols * 4) as i32,
            kind: 0,
            _pad: 0,
        }
    }

    /// An integer kind (int8, int4, int2: the matvec_q families and their plans).
    pub fn is_int(&self) -> bool {
        (3..=5).contains(&self.kind)
    }

    /// MXFP4 (mxfp4.cu): routed like the integer kinds, through its own kernels.
    pub fn is_mxfp4(&self) -> bool {
        self.kind == 6
    }

    /// int3: routed like the integer kinds, through its own dp4a kernels (matvec_qd_int3*).
    pub fn is_int3(&self) -> bool {
        self.kind == 7
    }

    /// int4k: int4's codes under 8-bit sub-scales, through its own dp4a kernels
    /// (matvec_qd_int4k*).
    pub fn is_int4k(&self) -> bool {
        self.kind == 8
    }

    /// int2k: int2's codes under 4-bit sub-scales, through its own scalar kernels
    /// (matvec_q_int2k*).
    pub fn is_int2k(&self) -> bool {
        self.kind == 9
    }

    /// An ap8 view (cuda/ap8.cu): its own plain, routed and prefill kernels.
    pub fn is_ap8(&self) -> bool {
        self.kind == 10
    }

    /// Multiplied and routed by the integer matvec loops (matvec_q.cu): int8, int4, int2
    /// (`is_int`), int3, int4k or int2k.
    pub fn is_packed_int(&self) -> bool {
        self.is_int() || self.is_int3() || self.is_int4k() || self.is_int2k()
    }

    /// The 16-byte vector kernel applies (the other layouts take matvec_any).
    pub fn vectorizable(&self) -> bool {
        !self.is_ap8() && self.row_bytes % 16 == 0 && self.codes.is_multiple_of(16)
    }

    /// Bytes of a row's 16-byte chunks, as the integer kernels and their plans walk them: the
    /// row, or int3's low bits (its high bits ride along with each chunk).
    pub fn chunk_bytes(&self) -> i32 {
        if self.is_int3() {
            self.cols / 4
        } else {
            self.row_bytes
        }
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

use crate::error::size;

fn check_len(what: &str, have: usize, need: usize) -> crate::Result<()> {
    if have < need {
        return Err(Error::Invalid(format!(
            "CUDA backend: {what} holds {have} values, {need} needed"
        )));
    }
    Ok(())
}
