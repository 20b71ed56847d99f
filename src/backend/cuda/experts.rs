//! The GPU expert cache: one device arena allocated once from a byte budget, carved into slots
//! of one expert each (one variant per run for now: the HOBBIT mixed-precision pools come with
//! the scheduler), LRU eviction, and demand loads from the mmap through pinned staging buffers
//! on a copy stream ordered against the compute stream by events.
//!
//! A load is split into staging-sized chunks: the CPU copies chunk i+1 (several threads) while
//! the copy engine moves chunk i. Where a profile asks for it, loads are paced to the profile's
//! link bandwidth so an H100 can stand in for a slower card.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use rayon::prelude::*;

use super::{cuda_err, ptr, CudaBackend, DevMat, Gpu};
use crate::format::{ExpertLayout, HobFile};
use crate::model::ops::{group_by_expert, ExpertExecutor, Route};
use crate::model::{ExpertReport, ExpertStats, VariantStats};
use crate::quant::Matrix;
use crate::Error;

/// How much device memory the expert cache may take, and how loads behave.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Bytes for the expert arena (rounded down to whole slots); None: room for every expert.
    pub budget: Option<usize>,
    /// Pace host-to-device loads to this many bytes per second (profile emulation).
    pub pace_bytes_per_s: Option<f64>,
    /// Load every expert that fits before the first token.
    pub preload: bool,
}

const STAGING_CHUNK: usize = 16 << 20;
const STAGING_BUFFERS: usize = 4;

struct Staging {
    host: PinnedHostSlice<u8>,
    /// Recorded on the copy stream after the last copy out of this buffer.
    done: Option<CudaEvent>,
}

pub struct CudaExperts<'f> {
    file: &'f HobFile,
    gpu: Arc<Gpu>,
    variant: usize,
    layout: ExpertLayout,
    slot_bytes: usize,
    n_slots: usize,
    arena: CudaSlice<u8>,
    /// (layer, expert) -> slot
    slot_of: HashMap<(usize, usize), usize>,
    owner: Vec<Option<(usize, usize)>>,
    last_use: Vec<u64>,
    clock: u64,
    copy: Arc<CudaStream>,
    staging: Vec<Staging>,
    next_staging: usize,
    pace: Option<f64>,
    /// Work buffers, sized for `cap_t` tokens.
    cap_t: usize,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    down: CudaSlice<f32>,
    xs: CudaSlice<f32>,
    idx: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    groups: Vec<Vec<(usize, f32)>>,
    hits: u64,
    misses: u64,
    bytes_loaded: u64,
    load_time: Duration,
}

impl<'f> CudaExperts<'f> {
    pub fn new(
        file: &'f HobFile,
        backend: &CudaBackend,
        variant: usize,
        cfg: &CacheConfig,
    ) -> crate::Result<Self> {
        let gpu = backend.gpu().clone();
        let layout = file.expert_layout(variant).clone();
        let slot_bytes = layout.padded_size;
        let total = file.n_layers() * file.n_experts();
        let (hidden, ffn) = file.expert_dims();
        // Work buffers for one token; grown for prefill batches.
        let work = (2 * ffn + 2 * hidden) * 4;
        let (free, _) = gpu.mem_info()?;
        let reserve = 256 << 20; // cuBLAS workspace, staging events, fragmentation
        let n_slots = match cfg.budget {
            Some(b) => b / slot_bytes,
            None => total.min(free.saturating_sub(reserve + work) / slot_bytes),
        }
        .min(total);
        if n_slots < 1 {
            return Err(Error::Invalid(format!(
                "CUDA: the expert cache needs at least one {} slot of {:.1} MiB; the budget allows none ({:.1} MiB free on {})",
                file.variants()[variant],
                slot_bytes as f64 / (1 << 20) as f64,
                free as f64 / (1 << 20) as f64,
                gpu.name
            )));
        }
        if n_slots * slot_bytes + reserve > free {
            return Err(Error::Invalid(format!(
                "CUDA: an expert cache of {n_slots} slots ({:.2} GiB) does not fit in the {:.2} GiB free on {}; lower --expert-cache",
                (n_slots * slot_bytes) as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64,
                gpu.name
            )));
        }
        let arena = gpu.alloc::<u8>(n_slots * slot_bytes, "the expert cache")?;
        let copy = gpu.ctx.new_stream().map_err(cuda_err)?;
        let staging = (0..STAGING_BUFFERS)
            .map(|_| {
                // SAFETY: write-combined pinned memory, only ever written by the CPU (copied into
                // from the mmap) and read by the copy engine.
                let host =
                    unsafe { gpu.ctx.alloc_pinned::<u8>(STAGING_CHUNK) }.map_err(cuda_err)?;
                Ok(Staging { host, done: None })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let mut me = CudaExperts {
            file,
            variant,
            layout,
            slot_bytes,
            n_slots,
            arena,
            slot_of: HashMap::new(),
            owner: vec![None; n_slots],
            last_use: vec![0; n_slots],
            clock: 0,
            copy,
            staging,
            next_staging: 0,
            pace: cfg.pace_bytes_per_s,
            cap_t: 1,
            gate: gpu.alloc(ffn, "expert activations")?,
            up: gpu.alloc(ffn, "expert activations")?,
            down: gpu.alloc(hidden, "expert activations")?,
            xs: gpu.alloc(hidden, "expert activations")?,
            idx: gpu.alloc(1, "expert routes")?,
            wts: gpu.alloc(1, "expert routes")?,
            groups: vec![Vec::new(); file.n_experts()],
            gpu,
            hits: 0,
            misses: 0,
            bytes_loaded: 0,
            load_time: Duration::ZERO,
        };
        if cfg.preload {
            let fits = me.n_slots.min(total);
            'outer: for l in 0..file.n_layers() {
                for e in 0..file.n_experts() {
                    if me.slot_of.len() >= fits {
                        break 'outer;
                    }
                    me.slot(l, e)?;
                }
            }
            me.copy.synchronize().map_err(cuda_err)?;
            me.reset_stats();
        }
        Ok(me)
    }

    /// Slots in the arena.
    pub fn slots(&self) -> usize {
        self.n_slots
    }

    /// Bytes of the arena.
    pub fn arena_bytes(&self) -> usize {
        self.n_slots * self.slot_bytes
    }

    /// The slot holding (layer, expert), loading it first on a miss.
    fn slot(&mut self, layer: usize, expert: usize) -> crate::Result<usize> {
        self.clock += 1;
        if let Some(&s) = self.slot_of.get(&(layer, expert)) {
            self.hits += 1;
            self.last_use[s] = self.clock;
            return Ok(s);
        }
        self.misses += 1;
        let s = match self.owner.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                // LRU victim. Experts in use by the current layer were touched this call, so
                // they have the newest clocks and are never the victim while another slot exists.
                let victim = (0..self.n_slots)
                    .min_by_key(|&s| self.last_use[s])
                    .unwrap_or(0);
                if let Some(old) = self.owner[victim].take() {
                    self.slot_of.remove(&old);
                }
                victim
            }
        };
        self.load(layer, expert, s)?;
        self.owner[s] = Some((layer, expert));
        self.slot_of.insert((layer, expert), s);
        self.last_use[s] = self.clock;
        Ok(s)
    }

    /// Copy (layer, expert) into slot `s`: mmap -> pinned staging (CPU threads) -> device (copy
    /// stream). The compute stream waits for the copy; the copy waits for compute already
    /// queued (which may still read the slot's previous expert).
    fn load(&mut self, layer: usize, expert: usize, s: usize) -> crate::Result<()> {
        let started = Instant::now();
        let blob = self.file.expert(layer, expert, self.variant).data;
        let compute_done = self.gpu.stream.record_event(None).map_err(cuda_err)?;
        self.copy.wait(&compute_done).map_err(cuda_err)?;
        let dst0 = ptr(&self.arena, &self.copy) + (s * self.slot_bytes) as u64;
        for (i, chunk) in blob.chunks(STAGING_CHUNK).enumerate() {
            let st = &mut self.staging[self.next_staging];
            self.next_staging = (self.next_staging + 1) % STAGING_BUFFERS;
            if let Some(ev) = st.done.take() {
                ev.synchronize().map_err(cuda_err)?;
            }
            let host = st.host.as_mut_slice().map_err(cuda_err)?;
            let host = &mut host[..chunk.len()];
            host.par_chunks_mut(1 << 20)
                .zip(chunk.par_chunks(1 << 20))
                .for_each(|(d, s)| d.copy_from_slice(s));
            let dst = dst0 + (i * STAGING_CHUNK) as u64;
            // SAFETY: dst lies inside slot s of the arena (chunks cover blob.len() <= slot_bytes);
            // the staging buffer is not written again before `done` is reached.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(dst, &*host, self.copy.cu_stream())
                    .map_err(cuda_err)?;
            }
            st.done = Some(self.copy.record_event(None).map_err(cuda_err)?);
        }
        let loaded = self.copy.record_event(None).map_err(cuda_err)?;
        if let Some(bw) = self.pace {
            loaded.synchronize().map_err(cuda_err)?;
            let target = Duration::from_secs_f64(blob.len() as f64 / bw);
            if let Some(rest) = target.checked_sub(started.elapsed()) {
                std::thread::sleep(rest);
            }
        }
        self.gpu.stream.wait(&loaded).map_err(cuda_err)?;
        self.bytes_loaded += blob.len() as u64;
        self.load_time += started.elapsed();
        Ok(())
    }

    /// The three device matrices of the expert in slot `s`.
    fn mats(&self, s: usize) -> [DevMat; 3] {
        let view = self.file.expert(0, 0, self.variant);
        let base = ptr(&self.arena, &self.gpu.stream) + (s * self.slot_bytes) as u64;
        let l = &self.layout;
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
}

impl ExpertExecutor<CudaBackend> for CudaExperts<'_> {
    fn forward(
        &mut self,
        b: &CudaBackend,
        layer: usize,
        xs: &CudaSlice<f32>,
        t: usize,
        routes: &[Route],
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let (h, f) = self.file.expert_dims();
        self.ensure_cap(t)?;
        group_by_expert(routes, t, &mut self.groups);
        let s = self.gpu.stream.clone();
        let (xp, op) = (ptr(xs, &s), ptr(out, &s));
        self.gpu.zero(op, t * h * 4)?;
        let (gp, up, dp) = (ptr(&self.gate, &s), ptr(&self.up, &s), ptr(&self.down, &s));
        let xsp = ptr(&self.xs, &s);
        // A batch: every expert's token list, concatenated and uploaded once.
        if t > 1 {
            let idx: Vec<i32> = self
                .groups
                .iter()
                .flatten()
                .map(|&(i, _)| i as i32)
                .collect();
            let wts: Vec<f32> = self.groups.iter().flatten().map(|&(_, w)| w).collect();
            self.ensure_routes(idx.len())?;
            let (ip, wp) = (ptr(&self.idx, &s), ptr(&self.wts, &s));
            self.gpu.upload_i32(&idx, ip)?;
            self.gpu.upload_f32(&wts, wp)?;
        }
        let (ip, wp) = (ptr(&self.idx, &s), ptr(&self.wts, &s));
        // Experts in index order, as the CPU does: every token sums its experts in one order.
        let mut at = 0usize;
        for e in 0..self.groups.len() {
            let n = self.groups[e].len();
            if n == 0 {
                continue;
            }
            let slot = self.slot(layer, e)?;
            let [wg, wu, wd] = self.mats(slot);
            let input = if t == 1 {
                xp
            } else {
                self.gpu.gather_rows(xp, ip + 4 * at as u64, xsp, h, n)?;
                xsp
            };
            b.matmul_dev(&wg, input, n, gp)?;
            b.matmul_dev(&wu, input, n, up)?;
            self.gpu.swiglu(gp, up, n * f)?;
            b.matmul_dev(&wd, gp, n, dp)?;
            if t == 1 {
                self.gpu.axpy(op, self.groups[e][0].1, dp, h)?;
            } else {
                let (ia, wa) = (ip + 4 * at as u64, wp + 4 * at as u64);
                self.gpu.scatter_axpy(op, ia, wa, dp, h, n)?;
            }
            at += n;
        }
        Ok(())
    }
}

impl ExpertReport for CudaExperts<'_> {
    fn describe(&self) -> String {
        format!(
            "{} in a GPU cache of {} slots ({:.2} GiB, {:.0}% of {} experts){}",
            self.file.variants()[self.variant],
            self.n_slots,
            self.arena_bytes() as f64 / (1u64 << 30) as f64,
            100.0 * self.n_slots as f64 / (self.file.n_layers() * self.file.n_experts()) as f64,
            self.file.n_layers() * self.file.n_experts(),
            match self.pace {
                Some(bw) => format!(", loads paced to {:.1} GB/s", bw / 1e9),
                None => String::new(),
            }
        )
    }

    fn stats(&self) -> ExpertStats {
        let mut per_variant: Vec<VariantStats> = self
            .file
            .variants()
            .iter()
            .map(|v| VariantStats {
                name: v.to_string(),
                hits: 0,
                misses: 0,
            })
            .collect();
        per_variant[self.variant].hits = self.hits;
        per_variant[self.variant].misses = self.misses;
        ExpertStats {
            per_variant,
            bytes_loaded: self.bytes_loaded,
            load_seconds: self.load_time.as_secs_f64(),
            ..Default::default()
        }
    }

    fn reset_stats(&mut self) {
        self.hits = 0;
        self.misses = 0;
        self.bytes_loaded = 0;
        self.load_time = Duration::ZERO;
    }
}
