//! Gated decode on the CUDA device (cuda/gate.cu): the resident table as a directory of the
//! cached experts, a presence flag per expert, a mailbox per layer in mapped page-locked memory
//! (the routes, for the host to follow behind), a gate per layer, and the stream the host opens
//! gates on (after the loads a miss needs). What the engine does with it: src/experts/engine/gated.rs.

use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, PinnedHostSlice, PushKernelArg,
};

use super::{cuda_err, ptr, CudaBackend, DevMat};
use crate::Error;

/// gate.cu `struct GateEntry`: a table index, whether the expert is present, its matrices.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GateEntry {
    index: i32,
    present: i32,
    pad: [i32; 2],
    m: [DevMat; 3],
}
const _: () = assert!(std::mem::size_of::<GateEntry>() == 160);
// SAFETY: repr(C) plain integers (DevMat's are), laid out as gate.cu's struct; all-zero bytes
// are a valid value (an absent entry of index 0).
unsafe impl cudarc::driver::DeviceRepr for GateEntry {}
// SAFETY: as above.
unsafe impl cudarc::driver::ValidAsZeroBits for GateEntry {}

/// Page-locked host memory mapped into the device's address space: its host address (kept as
/// an integer: the allocation is owned here and lives as long as this), its device address.
struct Mapped<T> {
    _alloc: PinnedHostSlice<T>,
    host: usize,
    len: usize,
    device: u64,
}

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default> Mapped<T> {
    fn new(b: &CudaBackend, n: usize) -> crate::Result<Self> {
        let n = n.max(1);
        // SAFETY: page-locked host memory mapped into the device's address space; the host
        // writes it only where no kernel reads it (the comments at each write).
        let mut alloc = unsafe {
            b.gpu
                .ctx
                .alloc_pinned_with_flags::<T>(n, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .map_err(cuda_err)?;
        let hp = alloc.as_mut_ptr().map_err(cuda_err)?;
        for i in 0..n {
            // SAFETY: i < n, inside the allocation; nothing else uses it yet.
            unsafe { hp.add(i).write(T::default()) };
        }
        let mut device = 0u64;
        // SAFETY: hp is the start of a live DEVICEMAP allocation.
        unsafe {
            cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut device, hp.cast(), 0)
                .result()
                .map_err(cuda_err)?;
        }
        Ok(Mapped {
            _alloc: alloc,
            host: hp as usize,
            len: n,
            device,
        })
    }

    /// Element `i`, read volatile (the device may have written it).
    fn read(&self, i: usize) -> T {
        assert!(i < self.len, "mapped read past its buffer");
        // SAFETY: i < len, inside the live allocation; T is plain data.
        unsafe { std::ptr::read_volatile((self.host as *const T).add(i)) }
    }

    /// Element `i` written volatile (the device reads it later).
    fn write(&mut self, i: usize, v: T) {
        assert!(i < self.len, "mapped write past its buffer");
        // SAFETY: i < len, inside the live allocation; T is plain data.
        unsafe { std::ptr::write_volatile((self.host as *mut T).add(i), v) }
    }
}

/// The device side of gated decode.
pub struct CudaGate {
    n_experts: usize,
    top_k: usize,
    present: CudaSlice<i32>,
    gates: CudaSlice<i32>,
    /// Replayed routes (hob bench --replay-trace): a flag word (1: replaying), then per layer 2k.
    replay: CudaSlice<f32>,
    replaying: bool,
    /// Every gate was opened after a failure: they are closed again before the next token.
    opened: bool,
    /// With CPU experts: the hidden size (a miss's x in the mailbox), the CPU results per layer
    /// on the device (hidden + 4 floats: the values, a flag), and their staging (per layer the
    /// 2k routes, the hidden values and the flag).
    hidden: usize,
    extra: CudaSlice<f32>,
    stage: Mapped<f32>,
    /// Per layer: a state word (0 empty, 1 all present, 2 a miss) and the 2k routes.
    mail: Mapped<f32>,
    /// Where moe_gate gave up a gate the host left shut too long: that layer + 1, else 0.
    abandoned: Mapped<i32>,
    /// Directory changes: a region per layer (REGION entries), then one for between tokens.
    updates: Mapped<GateEntry>,
    /// The gates' stream: waits for a miss's loads, applies its changes, opens the gate.
    side: Arc<CudaStream>,
    apply: CudaFunction,
}

/// gate.cu's GATE_TIMEOUT_NS: how long a layer waits at its gate before it gives up.
const GATE_TIMEOUT_S: u64 = 120;

/// Directory changes one gated layer makes at most: per route its expert now, and the one it
/// evicted.
fn region(top_k: usize) -> usize {
    4 * top_k + 8
}

impl CudaGate {
    /// For `n_layers` of `n_experts`, `top_k` routes a token; `hidden` > 0: with CPU experts.
    pub(super) fn new(
        b: &CudaBackend,
        (n_layers, n_experts, top_k): (usize, usize, usize),
        hidden: usize,
    ) -> crate::Result<CudaGate> {
        let g = &b.gpu;
        let entries = n_layers * region(top_k) + n_layers * n_experts;
        let cpu = |n: usize| if hidden > 0 { n } else { 1 };
        Ok(CudaGate {
            n_experts,
            top_k,
            present: g.alloc(n_layers * n_experts, "the expert directory")?,
            gates: g.alloc(n_layers, "the expert directory")?,
            replay: g.alloc(1 + n_layers * 2 * top_k, "replayed routes")?,
            replaying: false,
            opened: false,
            hidden,
            extra: g.alloc(cpu(n_layers * (hidden + 4)), "CPU experts' results")?,
            stage: Mapped::new(b, cpu(n_layers * (2 * top_k + hidden + 1)))?,
            mail: Mapped::new(b, n_layers * (2 * top_k + 1 + hidden))?,
            abandoned: Mapped::new(b, 1)?,
            updates: Mapped::new(b, entries)?,
            side: g.ctx.new_stream().map_err(cuda_err)?,
            apply: g.kernels.moe_gate_apply.clone(),
        })
    }

    fn stride(&self) -> usize {
        2 * self.top_k + 1 + self.hidden
    }

    /// Layer `layer`'s CPU result on the device (0: no CPU experts).
    pub(super) fn extra_ptr(&self, b: &CudaBackend, layer: usize) -> u64 {
        match self.hidden {
            0 => 0,
            h => ptr(&self.extra, &b.gpu.stream) + (layer * (h + 4) * 4) as u64,
        }
    }

    /// Layer `layer`'s input x from its mailbox (written with a miss's state).
    pub(super) fn read_x(&self, layer: usize, x: &mut [f32]) -> crate::Result<()> {
        if x.len() != self.hidden {
            return Err(Error::Invalid(format!(
                "expert directory: x of {} values asked, the mailbox holds {}",
                x.len(),
                self.hidden
            )));
        }
        let at = layer * self.stride() + 1 + 2 * self.top_k;
        for (i, v) in x.iter_mut().enumerate() {
            *v = self.mail.read(at + i);
        }
        Ok(())
    }

    /// Before layer `layer`'s gate opens, on the gates' stream: its routes (`routes`, to device
    /// address `at`) and its CPU result `extra`, with the flag that makes moe_combine add it.
    pub(super) fn cpu(
        &mut self,
        layer: usize,
        (routes, at): (&[f32], u64),
        extra: &[f32],
    ) -> crate::Result<()> {
        let (k2, h) = (2 * self.top_k, self.hidden);
        if h == 0 || routes.len() != k2 || extra.len() != h {
            return Err(Error::Invalid(format!(
                "expert directory: a CPU result of {} values and {} routes for {h} and {k2}",
                extra.len(),
                routes.len()
            )));
        }
        // (This layer's staging was last read by its copies in the token before, long done.)
        let first = layer * (k2 + h + 1);
        for (i, &v) in routes
            .iter()
            .chain(extra)
            .chain([1.0f32].iter())
            .enumerate()
        {
            self.stage.write(first + i, v);
        }
        let dev = ptr(&self.extra, &self.side) + (layer * (h + 4) * 4) as u64;
        let copies = [(at, first, k2), (dev, first + k2, h + 1)];
        for (dst, from, n) in copies {
            // SAFETY: `from..from + n` lies inside the page-locked staging buffer (checked
            // lengths above), written before this copy is queued and not again until it has
            // run; dst addresses n floats of a live device buffer.
            unsafe {
                let src = std::slice::from_raw_parts((self.stage.host as *const f32).add(from), n);
                cudarc::driver::result::memcpy_htod_async(dst, src, self.side.cu_stream())
                    .map_err(cuda_err)?;
            }
        }
        Ok(())
    }

    /// moe_gate's arguments for layer `layer`: (present, mailbox, gate) device addresses.
    pub(super) fn layer_args(&self, b: &CudaBackend, layer: usize) -> (u64, u64, u64) {
        let s = &b.gpu.stream;
        (
            ptr(&self.present, s) + (layer * self.n_experts * 4) as u64,
            self.mail.device + (layer * self.stride() * 4) as u64,
            ptr(&self.gates, s) + (layer * 4) as u64,
        )
    }

    /// Every mailbox emptied (before a token; no kernel writes them now), and the gates closed
    /// where a failure opened them all.
    pub(super) fn reset(&mut self, b: &CudaBackend) -> crate::Result<()> {
        // A gate given up may be opened late by the host: closed again like the rest.
        let given_up = self.abandoned.read(0) != 0;
        if given_up {
            // Its late opening, on the gates' stream, lands before the gates close.
            self.side.synchronize().map_err(cuda_err)?;
            self.abandoned.write(0, 0);
        }
        if std::mem::take(&mut self.opened) || given_up {
            let p = ptr(&self.gates, &b.gpu.stream);
            // SAFETY: `gates` holds n_layers i32s; the memset is queued on the compute stream
            // before the token's launches.
            unsafe {
                cudarc::driver::sys::cuMemsetD32Async(
                    p,
                    0,
                    self.gates.len(),
                    b.gpu.stream.cu_stream(),
                )
                .result()
                .map_err(cuda_err)?;
            }
        }
        let stride = self.stride();
        for l in 0..self.gates.len() {
            self.mail.write(l * stride, 0.0);
        }
        Ok(())
    }

    /// Layer `layer`'s mailbox: None while empty, else whether the device found a miss, its
    /// routes copied into `routes` (2k).
    pub(super) fn mail(&self, layer: usize, routes: &mut [f32]) -> crate::Result<Option<bool>> {
        let gave_up = self.abandoned.read(0);
        if gave_up != 0 {
            return Err(Error::Invalid(format!(
                "expert directory: layer {} waited {GATE_TIMEOUT_S} s at its gate for the host, \
                 which did not answer (blocked elsewhere); this token's output is lost",
                gave_up - 1
            )));
        }
        let at = layer * self.stride();
        // moe_gate writes the routes, a system fence, then the state: the state first here.
        let state = self.mail.read(at).to_bits();
        if state == 0 {
            return Ok(None);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        for (i, d) in routes.iter_mut().take(2 * self.top_k).enumerate() {
            *d = self.mail.read(at + 1 + i);
        }
        Ok(Some(state == 2))
    }

    /// Queue directory `changes` (table index, the expert now there or None), then open layer
    /// `layer`'s gate, on the gates' stream after `after`; or (`layer` None) between tokens,
    /// on the compute stream.
    pub(super) fn update(
        &mut self,
        b: &CudaBackend,
        table: &CudaSlice<DevMat>,
        changes: &[(usize, Option<[DevMat; 3]>)],
        layer: Option<usize>,
        after: &[&CudaEvent],
    ) -> crate::Result<()> {
        let n_layers = self.gates.len();
        let cap = match layer {
            Some(_) => region(self.top_k),
            None => n_layers * self.n_experts,
        };
        let first = layer.map_or(n_layers * region(self.top_k), |l| l * region(self.top_k));
        let total = n_layers * self.n_experts;
        if changes.len() > cap || changes.iter().any(|c| c.0 >= total) {
            return Err(Error::Invalid(format!(
                "expert directory: {} changes for room of {cap} (a bookkeeping bug)",
                changes.len()
            )));
        }
        // (No kernel reads this region now: its last use, this layer's in the token before,
        // or the last between-token update, has run.)
        for (i, &(index, m)) in changes.iter().enumerate() {
            let e = GateEntry {
                index: index as i32,
                present: i32::from(m.is_some()),
                pad: [0; 2],
                m: m.unwrap_or_default(),
            };
            self.updates.write(first + i, e);
        }
        let size = std::mem::size_of::<GateEntry>();
        let stream = match layer {
            Some(_) => &self.side,
            None => &b.gpu.stream,
        };
        for ev in after {
            stream.wait(ev).map_err(cuda_err)?;
        }
        let src = self.updates.device + (first * size) as u64;
        let (tab, pres) = (ptr(table, stream), ptr(&self.present, stream));
        let gate = layer.map_or(0u64, |l| ptr(&self.gates, stream) + (l * 4) as u64);
        let n = changes.len() as i32;
        let mut lb = stream.launch_builder(&self.apply);
        lb.arg(&src).arg(&n).arg(&tab).arg(&pres).arg(&gate);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: moe_gate_apply(const GateEntry*, int, MatEntry*, int*, int*): n entries at
        // src (mapped, written above), indices checked within the table and the flags, the
        // gate a live int of `gates` or null.
        unsafe { lb.launch(cfg) }.map(|_| ()).map_err(cuda_err)
    }

    /// The next token's routes replayed (per layer k indices as f32 bits, then k weights), or
    /// (None) the router's again; queued on the compute stream before the token.
    pub(super) fn replay(&mut self, b: &CudaBackend, routes: Option<&[f32]>) -> crate::Result<()> {
        let base = ptr(&self.replay, &b.gpu.stream);
        match routes {
            Some(r) => {
                if r.len() + 1 != self.replay.len() {
                    return Err(Error::Invalid(format!(
                        "replayed routes: {} values for room of {}",
                        r.len(),
                        self.replay.len() - 1
                    )));
                }
                let mut v = Vec::with_capacity(r.len() + 1);
                v.push(f32::from_bits(1));
                v.extend_from_slice(r);
                b.gpu.upload_f32_queued(&v, base)?;
                self.replaying = true;
            }
            None if self.replaying => {
                b.gpu.upload_f32_queued(&[0.0], base)?;
                self.replaying = false;
            }
            None => {}
        }
        Ok(())
    }

    /// Open every gate (after a failure: what the device computes is thrown away).
    pub(super) fn open_all(&mut self) -> crate::Result<()> {
        self.opened = true;
        let p = ptr(&self.gates, &self.side);
        // SAFETY: `gates` holds n_layers i32s; the memset is queued on the gates' stream.
        unsafe {
            cudarc::driver::sys::cuMemsetD32Async(p, 1, self.gates.len(), self.side.cu_stream())
                .result()
                .map_err(cuda_err)
        }
    }
}

impl CudaBackend {
    /// moe_gate after layer `layer`'s routes (`routes`: k indices, then k weights) from `xs`.
    pub(super) fn gate_layer(
        &self,
        g: &CudaGate,
        layer: usize,
        routes: u64,
        xs: u64,
    ) -> crate::Result<()> {
        let (present, mail, gate) = g.layer_args(self, layer);
        let flag = ptr(&g.replay, &self.gpu.stream);
        let replay = flag + ((1 + layer * 2 * g.top_k) * 4) as u64;
        let (k, ne, h) = (g.top_k as i32, g.n_experts as i32, g.hidden as i32);
        let extra = match g.extra_ptr(self, layer) {
            0 => 0,
            e => e + (g.hidden * 4) as u64,
        };
        let c = super::gpu::cfg(1, 32);
        let (abandoned, l) = (g.abandoned.device, layer as i32);
        launch!(self.gpu, self.gpu.kernels.moe_gate, c; routes, present, k, ne, mail, gate, flag, replay, xs, h, extra, abandoned, l)
    }
}
