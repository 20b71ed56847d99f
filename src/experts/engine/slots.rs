//! The expert cache as the device holds it: two pools of slots (high and low precision) carved
//! once from the budget, which expert each slot holds (the precision-aware policy,
//! experts::cache), and the loads that fill them (the loader thread, experts::scheduler) with
//! the link model the engine decides with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::loader::{
    landed, Done, LoadCounters, LoadJob, Loader, SlotCopy, CHUNK, CHUNKS_IN_FLIGHT,
};
use crate::experts::cache::{ExpertCache, Insertion, PoolKind};
use crate::experts::scheduler::{Priority, Scheduler, Ticket};
use crate::experts::ExpertKey;
use crate::format::{ExpertView, HobFile, VariantKind, BLOB_ALIGN};
use crate::model::{ArenaBase, ChunkCopier, DeviceEvent, ExpertDevice};
use crate::Error;

/// The loads of one slot.
struct Load<E> {
    /// The load that fills the slot, until the compute stream has been told to wait for it.
    /// A mapped slot loads as three jobs, one per matrix (gate, up, down; this is the last), so
    /// a decode layer can start on a missed expert's first matrices while the rest land:
    /// `parts` holds the earlier ones' tickets, in order.
    pending: Option<Ticket<Done<E>>>,
    parts: Vec<Ticket<Done<E>>>,
    /// Filled by a prefetch and not used since.
    prefetched: bool,
    /// The flag that drops the rest of a pending prefetch.
    abort: Option<Arc<AtomicBool>>,
    /// When the engine expects the pending load done (its link model).
    due: Option<Instant>,
}

/// Slot memory of one precision.
pub struct Pool<'f, D: ExpertDevice> {
    pub variant: usize,
    pub slot_bytes: usize,
    /// Any expert of the variant: the layout (and shapes) every slot holds.
    view: ExpertView<'f>,
    _arena: D::Arena,
    base: ArenaBase,
    loads: Vec<Load<D::Event>>,
}

/// The slots, the policy deciding their contents, and the loader filling them.
pub struct Slots<'f, D: ExpertDevice> {
    file: &'f HobFile,
    pub cache: ExpertCache,
    pools: [Option<Pool<'f, D>>; 2],
    loader: Option<Scheduler<Loader<D::Copier>>>,
    pub counters: Arc<LoadCounters>,
    mapped: bool,
    /// Read blobs at their SSD offsets (O_DIRECT alignment).
    disk: bool,
    /// Waits for loads sleep on the host (CPU experts need the cores): no GPU-side waits.
    host_waits: bool,
    /// Bandwidth assumed before the loader has measured any (the profile's pace, or 10 GB/s).
    pace: Option<f64>,
    /// When the loader is expected to have finished everything queued so far.
    link_due: Instant,
    /// Slots whose load may still be in flight (each submitted since it was last found landed
    /// or taken): `link_busy` looks at these, not at every slot.
    in_flight: Vec<(PoolKind, usize)>,
    prune_at: usize,
    /// Loads the compute stream waits for on the device: (where the stream reached the wait,
    /// the load's last event), timed once both have completed.
    gpu_waits: Vec<(D::Event, D::Event)>,
    /// Time spent waiting for loads since the last reset.
    pub wait: Duration,
    /// Both pools hold widths of one ap8 blob: a high demand load whose low copy is cached takes
    /// this many bytes from it and loads only the rest (`nested_prefix`).
    nested: Option<usize>,
    /// High loads that completed a cached low copy's planes, and the bytes they took from it,
    /// since the last reset.
    pub upgrades: (u64, u64),
    /// Gated decode: the experts the high pool placed or evicted since the device's directory
    /// was last brought level (None: no directory is kept).
    claims: Option<Vec<ExpertKey>>,
    /// Gated decode: the compute stream holds at a gate, its earlier work done: a load waits
    /// for nothing on it (an event recorded there now would follow the held token). A victim's
    /// own load still lands first: gated decode queues demand loads only, in order on the
    /// loader's one copy stream.
    pub compute_free: bool,
}

/// `in_flight` is pruned on a submit once it holds this many, or twice what the last pruning
/// kept (where nothing asks `link_busy`).
const IN_FLIGHT_PRUNE: usize = 256;

/// Bytes of an expert's high-variant blob that its low-variant copy holds, when both variants
/// are widths of one ap8 blob and the low one is narrower: its prefix, cut to BLOB_ALIGN so that
/// the rest is read from an aligned file offset (O_DIRECT). None otherwise, or under one page.
pub fn nested_prefix(file: &HobFile, high: usize, low: usize) -> Option<usize> {
    let v = file.variants();
    let ap8 = |i: usize| v.get(i).is_some_and(|v| v.kind == VariantKind::Ap8);
    let (hs, ls) = (file.expert_layout(high).size, file.expert_layout(low).size);
    let same = file.blob_range(0, 0, high, false).start == file.blob_range(0, 0, low, false).start;
    let cut = ls / BLOB_ALIGN * BLOB_ALIGN;
    (ap8(high) && ap8(low) && same && ls < hs && cut > 0).then_some(cut)
}

/// How the slots are laid out and filled.
pub struct SlotsSetup<'f, C: ChunkCopier> {
    pub file: &'f HobFile,
    pub cache: ExpertCache,
    /// (variant, slots) of the high pool and of the low pool.
    pub pools: [Option<(usize, usize)>; 2],
    pub loader: Scheduler<Loader<C>>,
    pub counters: Arc<LoadCounters>,
    pub mapped: bool,
    pub disk: bool,
    pub host_waits: bool,
    pub pace: Option<f64>,
    /// A high demand load whose low copy is cached loads only its missing planes, where the
    /// pools' variants nest (`nested_prefix`).
    pub upgrade_planes: bool,
}

impl<'f, D: ExpertDevice> Slots<'f, D> {
    pub fn new(dev: &D, s: SlotsSetup<'f, D::Copier>) -> crate::Result<Self> {
        let make = |p: Option<(usize, usize)>| -> crate::Result<Option<Pool<'f, D>>> {
            let Some((variant, slots)) = p.filter(|p| p.1 > 0) else {
                return Ok(None);
            };
            let slot_bytes = s.file.expert_layout(variant).padded_size;
            let arena = dev.alloc_arena(slots * slot_bytes, s.mapped)?;
            let base = dev.arena_base(&arena);
            Ok(Some(Pool {
                variant,
                slot_bytes,
                view: s.file.expert(0, 0, variant),
                _arena: arena,
                base,
                loads: (0..slots)
                    .map(|_| Load {
                        pending: None,
                        parts: Vec::new(),
                        prefetched: false,
                        abort: None,
                        due: None,
                    })
                    .collect(),
            }))
        };
        Ok(Slots {
            file: s.file,
            cache: s.cache,
            pools: [make(s.pools[0])?, make(s.pools[1])?],
            loader: Some(s.loader),
            counters: s.counters,
            mapped: s.mapped,
            disk: s.disk,
            host_waits: s.host_waits,
            pace: s.pace,
            link_due: Instant::now(),
            in_flight: Vec::new(),
            prune_at: IN_FLIGHT_PRUNE,
            gpu_waits: Vec::new(),
            wait: Duration::ZERO,
            nested: match s.pools {
                [Some((h, _)), Some((l, _))] if s.upgrade_planes => nested_prefix(s.file, h, l),
                _ => None,
            },
            upgrades: (0, 0),
            claims: None,
            compute_free: false,
        })
    }

    pub fn pool(&self, kind: PoolKind) -> &Pool<'f, D> {
        self.pools[kind as usize]
            .as_ref()
            .expect("a pool with slots exists for every kind the cache has capacity in")
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut Pool<'f, D> {
        self.pools[kind as usize]
            .as_mut()
            .expect("a pool with slots exists for every kind the cache has capacity in")
    }

    pub fn has_low(&self) -> bool {
        self.pools[PoolKind::Low as usize].is_some()
    }

    /// The pool a route of precision `low` (true) or high runs from.
    pub fn kind_of(&self, low: bool) -> PoolKind {
        if low && self.has_low() {
            PoolKind::Low
        } else {
            PoolKind::High
        }
    }

    /// Bytes of both arenas.
    pub fn arena_bytes(&self) -> usize {
        self.pools
            .iter()
            .flatten()
            .map(|p| p.slot_bytes * p.loads.len())
            .sum()
    }

    pub fn mapped(&self) -> bool {
        self.mapped
    }

    /// The expert in slot `s` of pool `kind`, as the device reads it.
    pub fn expert(&self, dev: &D, kind: PoolKind, s: usize) -> D::Expert {
        let p = self.pool(kind);
        dev.expert_at(p.base.device + (s * p.slot_bytes) as u64, &p.view)
    }

    /// A slot for `key` in pool `kind`, saying which expert it evicted: None when every slot
    /// is protected. Waits for a load still filling the victim slot (it must not land after the
    /// new one).
    pub fn claim(
        &mut self,
        dev: &D,
        kind: PoolKind,
        key: ExpertKey,
    ) -> crate::Result<Option<Insertion>> {
        let Some(ins) = self.cache.insert(kind, key) else {
            return Ok(None);
        };
        if let (PoolKind::High, Some(c)) = (kind, self.claims.as_mut()) {
            c.push(key);
            c.extend(ins.evicted);
        }
        if ins.evicted.is_some() {
            self.ready(dev, kind, ins.slot)?;
        }
        self.pool_mut(kind).loads[ins.slot].prefetched = false;
        Ok(Some(ins))
    }

    /// A high demand load of `key` can take this many bytes from its low copy in this low slot:
    /// the pools nest and the copy has landed (its bytes are on the copy stream, or written,
    /// before the load's). Demand loads only: a later load into the low slot (FIFO behind a
    /// demand job) cannot overtake it, as a demand load would overtake a queued prefetch.
    fn upgrade_from(
        &self,
        kind: PoolKind,
        key: ExpertKey,
        priority: Priority,
    ) -> Option<(usize, usize)> {
        let demand = kind == PoolKind::High && priority == Priority::Demand;
        let cut = self.nested.filter(|_| demand)?;
        let ls = self.cache.lookup(PoolKind::Low, key)?;
        self.slot_landed(PoolKind::Low, ls).then_some((ls, cut))
    }

    /// Bytes a demand load of `key` into pool `kind` moves over the link now.
    pub fn load_bytes(&self, kind: PoolKind, key: ExpertKey) -> usize {
        let full = self.pool(kind).slot_bytes;
        full - self
            .upgrade_from(kind, key, Priority::Demand)
            .map_or(0, |u| u.1)
    }

    /// Queue the load of `key` into slot `s` of pool `kind` (a demand load where the low pool
    /// holds a narrower copy of the same ap8 blob: only its missing planes cross the link).
    pub fn submit(
        &mut self,
        dev: &D,
        (kind, s): (PoolKind, usize),
        key: ExpertKey,
        priority: Priority,
    ) -> crate::Result<()> {
        let mapped = self.mapped;
        let addr = |p: &Pool<'f, D>, s: usize| {
            let base = if mapped {
                p.base.host as u64
            } else {
                p.base.device
            };
            base + (s * p.slot_bytes) as u64
        };
        let pool = self.pool(kind);
        let layout = self.file.expert_layout(pool.variant);
        let offsets = [layout.up_offset, layout.down_offset];
        let mut src = self.file.blob_range(key.0, key.1, pool.variant, self.disk);
        let mut dst = addr(pool, s);
        let mut prefix = None;
        if let Some((ls, cut)) = self.upgrade_from(kind, key, priority) {
            let from = addr(self.pool(PoolKind::Low), ls);
            prefix = Some(SlotCopy {
                from,
                to: dst,
                len: cut,
            });
            src.start += cut;
            dst += cut as u64;
            self.upgrades.0 += 1;
            self.upgrades.1 += cut as u64;
        }
        let now = Instant::now();
        let due = self.link_due.max(now)
            + Duration::from_secs_f64(src.len() as f64 / self.load_bandwidth());
        self.link_due = due;
        // Mapped slots load matrix by matrix: parts end at the up and down matrices' offsets
        // rounded up to BLOB_ALIGN (file offsets stay aligned for O_DIRECT reads), so part i
        // landed means matrix i is whole.
        let mut cuts = vec![src.start];
        if mapped && prefix.is_none() {
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
            .ok_or_else(|| Error::Loader("already shut down".into()))?;
        let abort = (priority == Priority::Prefetch).then(|| Arc::new(AtomicBool::new(false)));
        let mut tickets = Vec::with_capacity(cuts.len() - 1);
        for w in cuts.windows(2) {
            let job = LoadJob {
                src: w[0]..w[1],
                dst: dst + (w[0] - src.start) as u64,
                mapped,
                prefix: prefix.take(),
                after: match self.compute_free {
                    true => dev.done_event()?,
                    false => dev.record_event(false)?,
                },
                abort: abort.clone(),
            };
            tickets.push(loader.submit(job, priority)?);
        }
        let ticket = tickets
            .pop()
            .ok_or_else(|| Error::Invalid("an expert load of no parts".into()))?;
        let load = &mut self.pool_mut(kind).loads[s];
        load.parts = tickets;
        load.pending = Some(ticket);
        load.abort = abort;
        load.prefetched = priority == Priority::Prefetch;
        load.due = Some(due);
        if self.in_flight.len() >= self.prune_at {
            self.prune_in_flight();
        }
        self.in_flight.push((kind, s));
        Ok(())
    }

    /// Make the compute stream wait for slot `s`'s load, if one is pending.
    pub fn ready(&mut self, dev: &D, kind: PoolKind, s: usize) -> crate::Result<()> {
        while self.ready_part(dev, kind, s)? {}
        let Some(ticket) = self.pools[kind as usize]
            .as_mut()
            .and_then(|p| p.loads.get_mut(s))
            .and_then(|l| l.pending.take())
        else {
            return Ok(());
        };
        self.wait_load(dev, ticket)
    }

    /// Make the compute stream wait for the next part of slot `s`'s load (the matrices before
    /// the last, mapped slots); false when none is left.
    pub fn ready_part(&mut self, dev: &D, kind: PoolKind, s: usize) -> crate::Result<bool> {
        let Some(parts) = self.pools[kind as usize]
            .as_mut()
            .and_then(|p| p.loads.get_mut(s))
            .map(|l| &mut l.parts)
            .filter(|p| !p.is_empty())
        else {
            return Ok(false);
        };
        let ticket = parts.remove(0);
        self.wait_load(dev, ticket)?;
        Ok(true)
    }

    /// Whether slot `s` loads matrix by matrix with its first two matrices still pending.
    pub fn loads_in_parts(&self, kind: PoolKind, s: usize) -> bool {
        self.pool(kind).loads[s].parts.len() == 2
    }

    /// Order the compute stream after one load job (waiting for it on the device where it can:
    /// what follows then runs the moment it lands, with no host wake-up in between).
    fn wait_load(&mut self, dev: &D, ticket: Ticket<Done<D::Event>>) -> crate::Result<()> {
        let started = Instant::now();
        if !self.host_waits && !landed(&ticket) {
            let reached = dev.record_event(true)?;
            match ticket.wait()? {
                Some(ev) => {
                    dev.wait_event(&ev)?;
                    self.gpu_waits.push((reached, ev));
                }
                None => self.wait += started.elapsed(),
            }
            return Ok(());
        }
        if let Some(ev) = ticket.wait()? {
            // The host sleeps until the chunks land (CPU experts need its cores), then orders
            // the compute stream after them.
            ev.synchronize()?;
            dev.wait_event(&ev)?;
        }
        self.wait += started.elapsed();
        Ok(())
    }

    /// Add the device-side waits for loads to `wait`, once they have happened (spinning
    /// briefly: the logits read back next come later on the stream anyway).
    pub fn time_gpu_waits(&mut self) -> crate::Result<()> {
        for (reached, landed) in std::mem::take(&mut self.gpu_waits) {
            let spin = Instant::now();
            while !(landed.is_complete() && reached.is_complete()) {
                if spin.elapsed() > Duration::from_millis(2) {
                    landed.synchronize()?;
                    reached.synchronize()?;
                    break;
                }
                std::hint::spin_loop();
            }
            let secs = reached.seconds_until(&landed)?;
            self.wait += Duration::from_secs_f64(secs.max(0.0));
        }
        Ok(())
    }

    /// Slot `s` of pool `kind` holds its expert already (no load pending, or it has landed).
    pub fn slot_landed(&self, kind: PoolKind, s: usize) -> bool {
        self.pool(kind).loads[s].pending.as_ref().is_none_or(landed)
    }

    /// Wait for slot `s`'s load (if any) before its use; true when a prefetch filled it (its
    /// first use).
    pub fn take_slot(&mut self, dev: &D, kind: PoolKind, s: usize) -> crate::Result<bool> {
        self.ready(dev, kind, s)?;
        Ok(std::mem::take(&mut self.pool_mut(kind).loads[s].prefetched))
    }

    /// A load queued as a prefetch into slot `s` is not one (load-behind).
    pub fn not_prefetched(&mut self, kind: PoolKind, s: usize) {
        self.pool_mut(kind).loads[s].prefetched = false;
    }

    /// Drop the pending prefetch of `key` in pool `kind` when it has not landed: its remaining
    /// chunks are skipped and the slot emptied. False (nothing done) otherwise.
    pub fn cancel_prefetch(&mut self, kind: PoolKind, key: ExpertKey) -> bool {
        let Some(s) = self.cache.lookup(kind, key) else {
            return false;
        };
        let l = &self.pool(kind).loads[s];
        if !(l.prefetched && l.abort.is_some()) || self.slot_landed(kind, s) {
            return false;
        }
        let l = &mut self.pool_mut(kind).loads[s];
        if let Some(a) = l.abort.take() {
            a.store(true, Ordering::Release);
        }
        // Nothing will wait for the dropped load: a later load into the slot queues behind its
        // chunk in flight on the one loader thread.
        l.pending = None;
        l.parts.clear();
        l.prefetched = false;
        l.due = None;
        self.cache.unprotect(kind, key);
        self.cache.remove(kind, key);
        if let (PoolKind::High, Some(c)) = (kind, self.claims.as_mut()) {
            c.push(key);
        }
        true
    }

    /// Gated decode: keep the experts the high pool places or evicts from now on.
    pub fn keep_claims(&mut self) {
        self.claims.get_or_insert_with(Vec::new);
    }

    /// Gated decode: the experts placed or evicted since the last call (in claim order).
    pub fn take_claims(&mut self) -> Vec<ExpertKey> {
        self.claims.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The events after the copies of slot `s`'s pending load (every part), for another stream
    /// to wait for; the slot counts as ready from here on (that stream's wait comes before any
    /// use of it).
    pub fn load_events(&mut self, kind: PoolKind, s: usize) -> crate::Result<Vec<D::Event>> {
        let load = &mut self.pool_mut(kind).loads[s];
        let tickets: Vec<_> = load.parts.drain(..).chain(load.pending.take()).collect();
        let mut events = Vec::with_capacity(tickets.len());
        for t in tickets {
            events.extend(t.wait()?);
        }
        Ok(events)
    }

    /// Seconds left until the pending load of slot `s` is expected to land (None: none pending,
    /// or it has landed).
    pub fn due_in(&self, kind: PoolKind, s: usize) -> Option<f64> {
        let l = &self.pool(kind).loads[s];
        if l.pending.as_ref().is_none_or(landed) {
            return None;
        }
        Some(
            l.due?
                .saturating_duration_since(Instant::now())
                .as_secs_f64(),
        )
    }

    /// A demand load or a prefetch is queued or in flight.
    pub fn link_busy(&mut self) -> bool {
        self.prune_in_flight();
        !self.in_flight.is_empty()
    }

    /// Keep the slots of `in_flight` whose load is pending and has not landed.
    fn prune_in_flight(&mut self) {
        let pools = &self.pools;
        self.in_flight.retain(|&(kind, s)| {
            pools[kind as usize]
                .as_ref()
                .and_then(|p| p.loads[s].pending.as_ref())
                .is_some_and(|t| !landed(t))
        });
        self.prune_at = (2 * self.in_flight.len()).max(IN_FLIGHT_PRUNE);
    }

    /// Seconds before a demand load queued now would take the link: the loads still queued, at
    /// most the chunks a demand load goes behind (it overtakes the rest between chunks).
    pub fn link_backlog(&self) -> f64 {
        let queued = self
            .link_due
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        queued.min((CHUNKS_IN_FLIGHT * CHUNK) as f64 / self.load_bandwidth())
    }

    /// Measured loader bandwidth, bytes/s (the profile's pace, or 10 GB/s, before any load).
    pub fn load_bandwidth(&self) -> f64 {
        let b = self.counters.bytes.load(Ordering::Relaxed) as f64;
        let n = self.counters.nanos.load(Ordering::Relaxed) as f64;
        if b > 0.0 && n > 0.0 {
            b / n * 1e9
        } else {
            self.pace.unwrap_or(10e9)
        }
    }

    /// Fill both pools in layer order (before the first token).
    pub fn preload(&mut self, dev: &D) -> crate::Result<()> {
        let (nl, ne) = (self.file.n_layers(), self.file.n_experts());
        for kind in [PoolKind::High, PoolKind::Low] {
            let cap = self.cache.capacity(kind);
            'fill: for l in 0..nl {
                for e in 0..ne {
                    if self.cache.len(kind) >= cap {
                        break 'fill;
                    }
                    let ins = self.claim(dev, kind, (l, e))?.ok_or_else(|| {
                        Error::Invalid("expert cache: no free slot while preloading".into())
                    })?;
                    self.submit(dev, (kind, ins.slot), (l, e), Priority::Demand)?;
                }
            }
        }
        for kind in [PoolKind::High, PoolKind::Low] {
            for s in 0..self.cache.capacity(kind) {
                self.ready(dev, kind, s)?;
            }
        }
        dev.synchronize()
    }

    /// Stop the loader (it writes into the arenas: before they are freed).
    pub fn shutdown(&mut self) {
        if let Some(l) = self.loader.take() {
            if let Err(e) = l.shutdown() {
                log::warn!("expert loader: {e}");
            }
        }
    }
}

impl<D: ExpertDevice> Drop for Slots<'_, D> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
