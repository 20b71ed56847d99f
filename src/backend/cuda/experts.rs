//! The CUDA device as the expert engine drives it (`model::ExpertDevice`): slot arenas in device
//! memory (or mapped page-locked host memory on unified-memory platforms), events on the compute
//! stream, and the expert products computed from slots: one expert at a time (prefill groups
//! gathered and scattered, decode step by step), a decode layer's experts through the routed
//! kernels, and decode routed on the device once every expert is resident.

use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};

use super::copier::{register_file, CudaCopier, LinkClock};
use super::gate::CudaGate;
use super::{
    cuda_err, ptr, CudaBackend, DevMat, QGroup, QueuedRead, Routed, SlotArgs, SLOTS_MAX_K,
    SLOT_ROUTES_LEN,
};
use crate::format::{ExpertView, MatrixLayout};
use crate::model::experts::ExpertFfn;
use crate::model::{
    ArenaBase, Backend, BeforeExperts, CopierSetup, DeviceEvent, ExpertDevice, MoeBlock, SlotExpert,
};
use crate::quant::Matrix;
use crate::Error;

mod ffn;

/// Slot memory of one pool.
pub enum CudaArena {
    Device(CudaSlice<u8>),
    /// Mapped page-locked host memory: (host allocation, device pointer of the same bytes, the
    /// offset of the arena's first page-aligned byte).
    Mapped(PinnedHostSlice<u8>, u64, usize),
}

/// Buffers of one layer's expert products, for `cap` rows: gate and up products ([cap, ffn]),
/// down outputs ([cap, hidden]), gathered inputs ([cap, hidden]); a prefill batch's routed rows;
/// and the routed kernels' table, routes and products.
pub struct CudaWork {
    hidden: usize,
    ffn: usize,
    cap: usize,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    down: CudaSlice<f32>,
    xs: CudaSlice<f32>,
    idx: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    routed: Option<RoutedWork>,
    /// A grouped prefill layer's buffers (`experts_grouped`), grown as needed.
    grouped: Option<CudaSlice<f32>>,
    /// The layer's expert activation and biases (`begin_layer`).
    act: FfnDev,
}

/// What a layer's experts compute beyond their products, where the kernels read it: gpt-oss's
/// activation (alpha, limit) and the layer's bias tables ([n_experts, ffn] for gate and up,
/// [n_experts, hidden] for down); None: SwiGLU without biases.
#[derive(Clone, Copy, Default)]
struct FfnDev {
    glu: Option<((f32, f32), [u64; 3])>,
}

/// What `put_slots` writes (a table of SLOTS_MAX_K experts and their routes) and the routed
/// kernels' gate/up products ([2k, ffn]) and down outputs ([k, hidden]).
struct RoutedWork {
    tab: CudaSlice<u8>,
    routes: CudaSlice<f32>,
    work: CudaSlice<f32>,
}

/// Every expert resident, for decode routed on the device.
pub struct CudaResident {
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
    n_experts: usize,
    top_k: usize,
    /// Where a token's routes land without a wait of their own (the logits' read waits).
    read: QueuedRead,
    /// Gated decode: the table is a directory of the cached experts (gate.rs).
    dir: Option<CudaGate>,
}

impl CudaResident {
    /// An expert's (ffn, hidden).
    fn dims(&self) -> (usize, usize) {
        (self.gate.rows as usize, self.gate.cols as usize)
    }
}

impl DeviceEvent for CudaEvent {
    fn is_complete(&self) -> bool {
        CudaEvent::is_complete(self)
    }
    fn synchronize(&self) -> crate::Result<()> {
        CudaEvent::synchronize(self).map_err(cuda_err)
    }
    fn seconds_until(&self, later: &Self) -> crate::Result<f64> {
        let ms = self.elapsed_ms(later).map_err(cuda_err)?;
        Ok(ms as f64 / 1e3)
    }
}

fn align256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

impl ExpertDevice for CudaBackend {
    type Expert = [DevMat; 3];
    type Arena = CudaArena;
    type Event = CudaEvent;
    type Copier = CudaCopier;
    type Work = CudaWork;
    type Resident = CudaResident;
    const ROUTED_MAX_K: usize = SLOTS_MAX_K;

    fn device_name(&self) -> String {
        self.gpu.name.clone()
    }

    fn free_memory(&self) -> crate::Result<usize> {
        Ok(self.gpu.mem_info()?.0)
    }

    fn resident_bytes(&self) -> usize {
        self.resident_bytes
    }

    fn alloc_arena(&self, bytes: usize, mapped: bool) -> crate::Result<CudaArena> {
        if !mapped {
            return Ok(CudaArena::Device(
                self.gpu.alloc::<u8>(bytes, "the expert cache")?,
            ));
        }
        // A page more than asked: the slots start on a page (O_DIRECT reads land in them), which
        // a driver need not give a small page-locked allocation.
        let page = crate::format::BLOB_ALIGN;
        // SAFETY: page-locked host memory mapped into the device's address space; the CPU writes
        // it only from the loader (into slots no kernel is reading) and never reads it.
        let host = unsafe {
            self.gpu.ctx.alloc_pinned_with_flags::<u8>(
                bytes + page,
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
        let off = (hp as usize).next_multiple_of(page) - hp as usize;
        Ok(CudaArena::Mapped(host, dptr, off))
    }

    fn arena_base(&self, arena: &CudaArena) -> ArenaBase {
        match arena {
            CudaArena::Device(a) => ArenaBase {
                device: ptr(a, &self.gpu.stream),
                host: 0,
            },
            CudaArena::Mapped(h, d, off) => ArenaBase {
                device: *d + *off as u64,
                host: h.as_ptr().map_or(0, |p| p as usize + off),
            },
        }
    }

    fn expert_at(&self, at: u64, view: &ExpertView<'_>) -> [DevMat; 3] {
        let l = view.layout;
        let dm = |off: usize, m: &MatrixLayout, host: Matrix<'_>| {
            let b = at + off as u64;
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

    fn copier(&self, setup: CopierSetup) -> crate::Result<(CudaCopier, bool)> {
        let gpu = &self.gpu;
        let pinned = match setup.pin {
            Some(ranges) => register_file(&gpu.ctx, setup.map.clone(), ranges),
            None => None,
        };
        let direct = pinned.is_some();
        let link = match (setup.pace, direct) {
            (Some(bytes_per_s), true) => Some(LinkClock {
                clock: gpu.alloc::<u64>(1, "the link clock")?,
                start: gpu.kernels.link_start.clone(),
                wait: gpu.kernels.link_wait.clone(),
                bytes_per_s,
            }),
            _ => None,
        };
        let copier = CudaCopier::new(&gpu.ctx, setup.staging && !direct, pinned, link)?;
        Ok((copier, direct))
    }

    fn record_event(&self, timed: bool) -> crate::Result<CudaEvent> {
        let flags = timed.then_some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        self.gpu.stream.record_event(flags).map_err(cuda_err)
    }

    fn wait_event(&self, ev: &CudaEvent) -> crate::Result<()> {
        self.gpu.stream.wait(ev).map_err(cuda_err)
    }

    fn done_event(&self) -> crate::Result<CudaEvent> {
        // Never recorded: a stream waiting for it waits for nothing (cuStreamWaitEvent).
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        self.gpu.ctx.new_event(flags).map_err(cuda_err)
    }

    fn synchronize(&self) -> crate::Result<()> {
        self.gpu.sync()
    }

    fn keep_resident(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        self.make_resident(m)
    }

    fn expert_work(&self, hidden: usize, ffn: usize) -> crate::Result<CudaWork> {
        let g = &self.gpu;
        Ok(CudaWork {
            hidden,
            ffn,
            cap: 1,
            gate: g.alloc(ffn, "expert activations")?,
            up: g.alloc(ffn, "expert activations")?,
            down: g.alloc(hidden, "expert activations")?,
            xs: g.alloc(hidden, "expert activations")?,
            idx: g.alloc(1, "expert routes")?,
            wts: g.alloc(1, "expert routes")?,
            routed: None,
            grouped: None,
            act: FfnDev::default(),
        })
    }

    fn zero(&self, out: &mut CudaSlice<f32>, n: usize) -> crate::Result<()> {
        self.gpu.zero(self.p(out), n * 4)
    }

    fn begin_layer(
        &self,
        w: &mut CudaWork,
        rows: usize,
        (idx, wts): (&[i32], &[f32]),
        ffn: &ExpertFfn,
    ) -> crate::Result<()> {
        w.act = self.ffn_dev(ffn)?;
        let g = &self.gpu;
        if rows > w.cap {
            w.gate = g.alloc(rows * w.ffn, "expert activations")?;
            w.up = g.alloc(rows * w.ffn, "expert activations")?;
            w.down = g.alloc(rows * w.hidden, "expert activations")?;
            w.xs = g.alloc(rows * w.hidden, "expert activations")?;
            w.cap = rows;
        }
        if idx.is_empty() {
            return Ok(());
        }
        if w.idx.len() < idx.len() {
            w.idx = g.alloc(idx.len(), "expert routes")?;
            w.wts = g.alloc(idx.len(), "expert routes")?;
        }
        g.upload_i32_queued(idx, ptr(&w.idx, &self.gpu.stream))?;
        g.upload_f32_queued(wts, self.p(&w.wts))
    }

    fn expert_rows(
        &self,
        w: &mut CudaWork,
        (e, expert): (&[DevMat; 3], usize),
        x: &CudaSlice<f32>,
        (at, n): (usize, usize),
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let h = w.hidden;
        let (xp, op) = (self.p(x), self.p(out));
        let (ia, wa) = (
            ptr(&w.idx, &self.gpu.stream) + 4 * at as u64,
            self.p(&w.wts) + 4 * at as u64,
        );
        if w.act.glu.is_none() && self.expert_q4h(w, e, (xp, ia, wa), n, op)? {
            return Ok(());
        }
        let xsp = self.p(&w.xs);
        self.gpu.gather_rows((xp, ia), xsp, h, n, false)?;
        for step in 0..3 {
            self.ffn_step(w, (e, expert), xsp, (n, 0), step)?;
        }
        self.gpu
            .scatter_axpy(op, (ia, wa), self.p(&w.down), h, n, 1)
    }

    fn experts_grouped(
        &self,
        w: &mut CudaWork,
        groups: &[(usize, usize, [DevMat; 3])],
        x: &CudaSlice<f32>,
        (t, k): (usize, usize),
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<bool> {
        let gpu = &self.gpu;
        let m: usize = groups.iter().map(|g| g.1).sum();
        let mut at = 0;
        let contiguous = groups.iter().all(|&(a, n, _)| {
            let ok = a == at && n > 0;
            at += n;
            ok
        });
        // gather_axpy takes at most 32 rows a token; 256-byte aligned buffers pass
        // gemm_q4h_applies' alignment.
        if groups.is_empty()
            || !contiguous
            || k > 32
            || gpu.kernels.gemm_q4h_grp.is_none()
            || !groups.iter().all(|(_, _, e)| {
                e.iter()
                    .all(|mat| gpu.gemm_q4h_applies(mat, 0) && mat.kind == groups[0].2[0].kind)
            })
        {
            return Ok(false);
        }
        let (h, f) = (w.hidden, w.ffn);
        // Bytes: the gathered tokens (f16), gate and up (f32), SwiGLU (f16), down (f32), table.
        let sizes = [
            m * h * 2,
            m * f * 4,
            m * f * 4,
            m * f * 2,
            m * h * 4,
            groups.len() * 160,
        ];
        let mut offs = [0usize; 6];
        let mut total = 0;
        for (o, sz) in offs.iter_mut().zip(sizes) {
            *o = total;
            total += align256(sz);
        }
        if w.grouped.as_ref().is_none_or(|b| b.len() * 4 < total) {
            w.grouped = Some(gpu.alloc(total.div_ceil(4), "grouped prefill experts")?);
        }
        let Some(buf) = w.grouped.as_ref() else {
            return Ok(false);
        };
        let base = self.p(buf);
        let [xh, gp, up, act, yp, tab] = offs.map(|o| base + o as u64);
        let table: Vec<QGroup> = groups
            .iter()
            .map(|&(a, n, e)| QGroup::new(e, a, n))
            .collect();
        gpu.upload_queued(&table, tab)?;
        let (ia, wa) = (ptr(&w.idx, &gpu.stream), self.p(&w.wts));
        let max_n = groups.iter().map(|g| g.1).max().unwrap_or(0);
        let gr = (tab, groups.len(), max_n);
        gpu.gather_rows((self.p(x), ia), xh, h, m, true)?;
        let int4k = groups[0].2[0].is_int4k();
        gpu.gemm_q4h_groups(gr, (0, int4k), (xh, gp), f)?;
        gpu.gemm_q4h_groups(gr, (1, int4k), (xh, up), f)?;
        gpu.swiglu_half(gp, up, act, m * f)?;
        gpu.gemm_q4h_groups(gr, (2, int4k), (act, yp), h)?;
        gpu.gather_axpy(self.p(out), (ia, wa), yp, (h, m, t))?;
        Ok(true)
    }

    fn expert_step(
        &self,
        w: &mut CudaWork,
        e: (&[DevMat; 3], usize),
        x: &CudaSlice<f32>,
        row: usize,
        step: usize,
    ) -> crate::Result<()> {
        self.ffn_step(w, e, self.p(x), (1, row), step)
    }

    fn add_row(
        &self,
        w: &CudaWork,
        row: usize,
        weight: f32,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let dp = self.p(&w.down) + (row * w.hidden * 4) as u64;
        self.gpu.axpy(self.p(out), weight, dp, w.hidden)
    }

    fn add_host(&self, w: &CudaWork, host: &[f32], out: &mut CudaSlice<f32>) -> crate::Result<()> {
        let dp = self.p(&w.down);
        self.gpu.upload_f32(host, dp)?;
        self.gpu.axpy(self.p(out), 1.0, dp, w.hidden)
    }

    fn routed_supports(&self, e: &[DevMat; 3]) -> bool {
        let (f, h) = (e[0].rows as usize, e[0].cols as usize);
        h % 4 == 0 && f % 4 == 0 && e.iter().all(|m| self.gpu.sel_supports(m))
    }

    fn experts_routed(
        &self,
        w: &mut CudaWork,
        experts: &[SlotExpert<[DevMat; 3]>],
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let (h, f, k) = (w.hidden, w.ffn, experts.len());
        let args = SlotArgs::new(experts)?;
        if w.routed.is_none() {
            let g = &self.gpu;
            let table = 3 * SLOTS_MAX_K * std::mem::size_of::<DevMat>();
            w.routed = Some(RoutedWork {
                tab: g.alloc(table, "the routed expert table")?,
                routes: g.alloc(SLOT_ROUTES_LEN, "the routed expert table")?,
                work: g.alloc(SLOTS_MAX_K * (2 * f + h), "routed expert activations")?,
            });
        }
        let Some(r) = w.routed.as_ref() else {
            return Ok(());
        };
        let (tab, rp, g) = (
            ptr(&r.tab, &self.gpu.stream),
            self.p(&r.routes),
            self.p(&r.work),
        );
        let dn = g + (2 * k * f * 4) as u64;
        let (gpu, xp, op) = (&self.gpu, self.p(x), self.p(out));
        gpu.put_slots(&args, tab, rp)?;
        let (gate, down) = (experts[0].2[0], experts[0].2[2]);
        let routed = Routed { tab, routes: rp, k };
        if let Some(glu) = w.act.glu {
            if gate.kind < 3 {
                return Err(Error::Invalid(
                    "CUDA: the routed kernels take biased experts in integer kinds or mxfp4 only"
                        .into(),
                ));
            }
            // Each rank's real index, for its biases (`put_slots`).
            let ids = rp + (2 * SLOTS_MAX_K * 4) as u64;
            self.routed_glu((&gate, &down), (routed, ids), xp, (g, dn), glu)?;
            return gpu.moe_combine(op, dn, rp, (k, h), None, 0).map(|_| ());
        }
        if gate.kind < 3 {
            // Float kinds; the integer kinds and mxfp4 take the routed kernels.
            gpu.moe_gate_up(&gate, routed, xp, g)?;
            gpu.moe_down(&down, routed, g, op)
        } else {
            gpu.routed_ffn((&gate, &down), routed, xp, (g, dn), (h, f))?;
            gpu.moe_combine(op, dn, rp, (k, h), None, 0).map(|_| ())
        }
    }

    fn resident(
        &self,
        experts: &[[DevMat; 3]],
        (n_experts, top_k): (usize, usize),
        gated: Option<usize>,
    ) -> crate::Result<Option<CudaResident>> {
        let Some(first) = experts.first() else {
            return Ok(None);
        };
        if !experts.iter().all(|e| self.routed_supports(e)) {
            return Ok(None);
        }
        let (f, h) = (first[0].rows as usize, first[0].cols as usize);
        let nl = experts.len() / n_experts.max(1);
        let table: Vec<DevMat> = experts.iter().flatten().copied().collect();
        let (g, k) = (&self.gpu, top_k);
        Ok(Some(CudaResident {
            table: g.stream.clone_htod(&table).map_err(cuda_err)?,
            routes: g.alloc(nl * 2 * k, "device routes")?,
            work: g.alloc(
                2 * k * f + (k * h).max(n_experts),
                "routed expert activations",
            )?,
            gate: first[0],
            down: first[2],
            n_experts,
            top_k,
            read: g.alloc_read(nl * 2 * k)?,
            dir: match gated {
                Some(x) => Some(CudaGate::new(self, (nl, n_experts, k), x)?),
                None => None,
            },
        }))
    }

    fn routed_layer(
        &self,
        r: &CudaResident,
        layer: usize,
        block: &MoeBlock<'_>,
        (xs, x): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        before: BeforeExperts<'_, Self>,
    ) -> crate::Result<bool> {
        if !block.ffn.is_plain() {
            return self.routed_layer_glu(r, layer, block, (xs, x), before);
        }
        let (k, (f, h)) = (r.top_k, r.dims());
        let (routes, tab, g, dn) = self.routed_room(r, layer);
        let (gpu, xsp, xp, eps) = (&self.gpu, self.p(xs), self.p(x), block.eps);
        self.route_token(block, (xs, x), (routes, dn), (k, r.n_experts))?;
        if let Some(g) = r.dir.as_ref() {
            self.gate_layer(g, layer, routes, xsp)?;
        }
        before(xs, x)?;
        let routed = Routed { tab, routes, k };
        if r.gate.kind < 3 {
            // Float kinds: gate and up with SwiGLU in one launch, down with the weighted sum
            // and the residual add in another.
            gpu.moe_gate_up(&r.gate, routed, xsp, g)?;
            gpu.moe_down(&r.down, routed, g, xp)?;
            return Ok(false);
        }
        // Integer kinds: gate and up of the k experts in one launch, their SwiGLU, down of all
        // k, then the weighted sum and residual add, with the norm that follows folded in.
        gpu.routed_ffn((&r.gate, &r.down), routed, xsp, (g, dn), (h, f))?;
        // The next norm folded in where it is an RMSNorm (a LayerNorm follows on its own).
        let norm = match (block.next, block.norm_bias) {
            (Some(nw), None) => Some(((self.vector(nw)?, eps), xsp)),
            _ => None,
        };
        let extra = r.dir.as_ref().map_or(0, |g| g.extra_ptr(self, layer));
        gpu.moe_combine(xp, dn, routes, (k, h), norm, extra)
    }

    fn queue_routes(&self, r: &mut CudaResident) -> crate::Result<()> {
        let src = self.p(&r.routes);
        self.gpu.queue_read(src, &mut r.read)
    }

    fn read_routes<'r>(&self, r: &'r mut CudaResident) -> crate::Result<&'r [f32]> {
        r.read.wait()?.ok_or_else(|| {
            Error::Invalid("device routes: counted before they were read back".into())
        })
    }

    fn gate_update(
        &self,
        r: &mut CudaResident,
        changes: &[(usize, Option<[DevMat; 3]>)],
        layer: Option<usize>,
        after: &[&CudaEvent],
    ) -> crate::Result<()> {
        match r.dir.as_mut() {
            Some(g) => g.update(self, &r.table, changes, layer, after),
            None => Err(not_gated()),
        }
    }

    fn gate_replay(&self, r: &mut CudaResident, routes: Option<&[f32]>) -> crate::Result<()> {
        r.dir.as_mut().ok_or_else(not_gated)?.replay(self, routes)
    }

    fn gate_reset(&self, r: &mut CudaResident) -> crate::Result<()> {
        r.dir.as_mut().ok_or_else(not_gated)?.reset(self)
    }

    fn gate_mail(
        &self,
        r: &CudaResident,
        layer: usize,
        routes: &mut [f32],
    ) -> crate::Result<Option<bool>> {
        r.dir.as_ref().ok_or_else(not_gated)?.mail(layer, routes)
    }

    fn gate_x(&self, r: &CudaResident, layer: usize, x: &mut [f32]) -> crate::Result<()> {
        r.dir.as_ref().ok_or_else(not_gated)?.read_x(layer, x)
    }

    fn gate_cpu(
        &self,
        r: &mut CudaResident,
        layer: usize,
        routes: &[f32],
        extra: &[f32],
    ) -> crate::Result<()> {
        let at = self.p(&r.routes) + (layer * 2 * r.top_k * 4) as u64;
        r.dir
            .as_mut()
            .ok_or_else(not_gated)?
            .cpu(layer, (routes, at), extra)
    }

    fn gate_open_all(&self, r: &mut CudaResident) -> crate::Result<()> {
        r.dir.as_mut().ok_or_else(not_gated)?.open_all()
    }
}

fn not_gated() -> Error {
    Error::Invalid("expert directory: asked of a table of resident experts".into())
}

impl CudaBackend {
    /// `routed_layer` for experts with gpt-oss's activation and biases (integer kinds): the
    /// host-routed path's launches in routed form (the norm, the router and its bias, `route`;
    /// the products as `matvec` sums them, expert_glu, the down bias), so that both give the
    /// same bits; then the weighted sum as for every family.
    fn routed_layer_glu(
        &self,
        r: &CudaResident,
        layer: usize,
        block: &MoeBlock<'_>,
        (xs, x): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        before: BeforeExperts<'_, Self>,
    ) -> crate::Result<bool> {
        let (ne, k, h) = (r.n_experts, r.top_k, r.dims().1);
        let (Some(glu), true) = (self.ffn_dev(block.ffn)?.glu, r.gate.kind >= 3) else {
            return Err(Error::Invalid(
                "CUDA: device routing takes biased experts in integer kinds or mxfp4 only".into(),
            ));
        };
        let (routes, tab, g, dn) = self.routed_room(r, layer);
        let (gpu, xsp, xp, eps) = (&self.gpu, self.p(xs), self.p(x), block.eps);
        self.route_token(block, (xs, x), (routes, dn), (k, ne))?;
        if let Some(g) = r.dir.as_ref() {
            self.gate_layer(g, layer, routes, xsp)?;
        }
        before(xs, x)?;
        let routed = Routed { tab, routes, k };
        self.routed_glu((&r.gate, &r.down), (routed, routes), xsp, (g, dn), glu)?;
        let norm = match (block.next, block.norm_bias) {
            (Some(nw), None) => Some(((self.vector(nw)?, eps), xsp)),
            _ => None,
        };
        gpu.moe_combine(xp, dn, routes, (k, h), norm, 0)
    }

    /// The k routed experts' products with gpt-oss's activation and biases: gate and up into
    /// g ([2k, ffn]), expert_glu, down into dn ([k, hidden]) with its bias, each as the
    /// one-expert path sums it (`ffn_step`), so that both give the same bits. `ids`: each
    /// route's real expert index (f32 bits), where the bias tables are read.
    fn routed_glu(
        &self,
        (gate, down): (&DevMat, &DevMat),
        (routed, ids): (Routed, u64),
        x: u64,
        (g, dn): (u64, u64),
        (act, [bg, bu, bd]): ((f32, f32), [u64; 3]),
    ) -> crate::Result<()> {
        let (gpu, k) = (&self.gpu, routed.k);
        let (f, h) = (gate.rows as usize, gate.cols as usize);
        gpu.matvec_sel(gate, routed, (0, 2 * k), (x, 0, false), (g, f))?;
        gpu.expert_glu_routed((g, ids, k, f), (bg, bu), act)?;
        gpu.matvec_sel(down, routed, (2, k), (g, f, false), (dn, h))?;
        gpu.add_routed_rows(dn, ids, bd, (k, h))
    }

    /// A decode token's norm, router and routing rule, the routes into `routes`: one launch
    /// (moe_route_norm: the rule, a router bias or a grouped rule's selection bias) where it
    /// applies; else the norm, then the router and the rule's own kernel (the logits in the down
    /// outputs' room `dn`, routed before those are written).
    fn route_token(
        &self,
        block: &MoeBlock<'_>,
        (xs, x): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        (routes, dn): (u64, u64),
        (k, ne): (usize, usize),
    ) -> crate::Result<()> {
        use crate::model::routing::Routing;
        let (gpu, xsp, xp, eps) = (&self.gpu, self.p(xs), self.p(x), block.eps);
        let rw = self.mat(block.router)?;
        let pick = (k, block.routing);
        let bias = match block.routing {
            Routing::Grouped { bias, .. } => self.bias_ptr(bias, ne, "score-correction bias")?,
            _ => self.bias_ptr(block.router_bias, ne, "router bias")?,
        };
        let g = (self.vector(block.norm)?, eps);
        if block.norm_bias.is_none()
            && gpu.moe_route_norm(rw, (xp, xsp), g, pick, (bias, routes))?
        {
            return Ok(());
        }
        match block.norm_bias {
            Some(b) => self.layer_norm(x, 0..1, (block.norm, b), eps, xs)?,
            None => self.rms_norm(x, 0..1, block.norm, eps, xs)?,
        }
        match block.routing {
            Routing::Grouped { rule, .. } => {
                self.matmul_dev(rw, xsp, 1, dn)?;
                gpu.route_grouped(dn, (1, ne, bias), (k, rule), routes)
            }
            // No bias: the router and top-k in one launch where the router allows.
            _ if bias == 0 => gpu.moe_route(rw, xsp, pick, routes, dn),
            _ => {
                self.matmul_dev(rw, xsp, 1, dn)?;
                gpu.route_biased(dn, (1, ne, bias), pick, routes)
            }
        }
    }

    /// Where layer `layer`'s device routing works: its routes, its slice of the expert table,
    /// the gate/up products ([2k, ffn]) and the down outputs ([k, hidden]).
    fn routed_room(&self, r: &CudaResident, layer: usize) -> (u64, u64, u64, u64) {
        let (ne, k, (f, _)) = (r.n_experts, r.top_k, r.dims());
        let routes = self.p(&r.routes) + (layer * 2 * k * 4) as u64;
        let tab = ptr(&r.table, &self.gpu.stream)
            + (layer * ne * 3 * std::mem::size_of::<DevMat>()) as u64;
        let g = self.p(&r.work);
        (routes, tab, g, g + (2 * k * f * 4) as u64)
    }
}
