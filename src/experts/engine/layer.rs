//! One host-routed MoE layer through the engine, in four steps: plan (the scorer's decisions,
//! grouped by expert, and the cache's use counters), place (each group to a cached slot, a slot
//! whose load is queued now, or the CPU helpers), launch (the device's products from the slots,
//! the CPU's in the background), account (CPU results added last, holds checked, timings).

use std::time::Instant;

use super::coop::{compute, CpuJob, CpuResult};
use super::Engine;
use crate::experts::cache::PoolKind;
use crate::experts::{Group, LayerPlan, Precision};
use crate::model::experts::ExpertFfn;
use crate::model::{Batch, ExpertDevice, Route, SlotExpert};
use crate::Error;

/// Where one group of a layer runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Place {
    /// Slot of a pool.
    Slot(PoolKind, usize),
    /// CPU helper threads.
    Cpu,
}

/// A layer's state while it is placed and launched.
pub(super) struct Run {
    pub(super) decode: bool,
    /// Floats of the layer output (t x hidden).
    pub(super) n_out: usize,
    /// The top-1 expert of a decode token (never substituted).
    pub(super) top1: Option<usize>,
    pub(super) entered: Instant,
    /// Decode: when the layer was planned, its experts placed (loads queued), and the next
    /// layers predicted (the parts of --stats' "placing").
    pub(super) marks: [Instant; 3],
    pub(super) places: Vec<Option<Place>>,
    pub(super) placed: usize,
    /// Seconds the link and the CPU are busy with this layer's misses so far (cost model).
    pub(super) load_busy: f64,
    pub(super) cpu_busy: f64,
    pub(super) cpu_jobs: Vec<CpuJob>,
    pub(super) cpu_handed: usize,
    pub(super) cpu_out: Vec<f32>,
    /// The CPU helpers' background task for this layer, when it was handed over, and its run.
    pub(super) background: Option<crossbeam_channel::Receiver<CpuResult>>,
    pub(super) spawned: Instant,
    /// Decode: when the layer's placements, predictions and CPU hand-over were done and its
    /// experts' launches began.
    pub(super) launching: Option<Instant>,
    pub(super) cpu_span: Option<(Instant, Instant)>,
    /// A decode layer whose experts (`slot_take`: per group) sit in slots of one pool: the
    /// routed kernels compute them.
    pub(super) slot_mode: Option<PoolKind>,
    pub(super) slot_take: Vec<bool>,
    pub(super) slot_list: Vec<(usize, f32, usize)>,
    /// Slot groups (index, first route row) computed after the CPU helpers' result.
    pub(super) deferred: Vec<(usize, usize)>,
    /// `out` is zeroed only once it is known that the routed kernels do not add into x.
    pub(super) defer_zero: bool,
}

impl Run {
    /// A layer of `groups` groups about to be placed: (`decode`, `n_out` floats out), its top-1
    /// expert, and the link's backlog in seconds.
    pub(super) fn new(
        (decode, n_out): (bool, usize),
        top1: Option<usize>,
        groups: usize,
        load_busy: f64,
    ) -> Run {
        let entered = Instant::now();
        Run {
            decode,
            n_out,
            top1,
            entered,
            marks: [entered; 3],
            places: vec![None; groups],
            placed: 0,
            load_busy,
            cpu_busy: 0.0,
            cpu_jobs: Vec::new(),
            cpu_handed: 0,
            cpu_out: Vec::new(),
            background: None,
            spawned: entered,
            launching: None,
            cpu_span: None,
            slot_mode: None,
            slot_take: Vec::new(),
            slot_list: Vec::new(),
            deferred: Vec::new(),
            defer_zero: false,
        }
    }

    /// Whether the routed kernels compute every expert of the layer.
    fn slot_all(&self) -> bool {
        self.slot_mode.is_some() && self.slot_take.iter().all(|&t| t)
    }
}

/// The layer's input and outputs: xs, out, and the residual stream x that the routed kernels
/// may add into directly.
pub(super) struct Io<'a, B> {
    pub xs: &'a B,
    pub out: &'a mut B,
    pub residual: Option<&'a mut B>,
    /// What the layer's experts compute beyond their products (Batch::ffn).
    pub ffn: ExpertFfn,
}

impl<'f, D: ExpertDevice> Engine<'f, D> {
    /// `forward` of one layer; returns whether its output was added into the residual.
    pub(super) fn run_layer(
        &mut self,
        dev: &D,
        layer: usize,
        batch: &Batch<'_, D::Buf>,
        mut io: Io<'_, D::Buf>,
    ) -> crate::Result<bool> {
        let entered = Instant::now();
        let lp = self.plan_layer(dev, layer, batch)?;
        let decode = batch.t == 1;
        let mut run = Run::new(
            (decode, batch.t * batch.hidden),
            top1_of(batch.routes),
            lp.groups.len(),
            self.slots.link_backlog(),
        );
        run.entered = entered;
        run.defer_zero = decode && io.residual.is_some() && self.tuning.routed_slots;
        if !run.defer_zero || lp.groups.is_empty() {
            dev.zero(io.out, batch.t * batch.hidden)?;
        }
        let rows = if decode {
            batch.routes.len().max(1)
        } else {
            batch.t
        };
        let (idx, wts) = if decode {
            (Vec::new(), Vec::new())
        } else {
            grouped_rows(&lp)
        };
        dev.begin_layer(&mut self.work, rows, (&idx, &wts), &io.ffn)?;
        let ran = match self.coop.as_ref().map(|c| c.pool.clone()) {
            Some(pool) => pool.in_place_scope(|scope| {
                self.launch(dev, Some(scope), (layer, &lp), &mut run, &mut io)
            }),
            None => self.launch(dev, None, (layer, &lp), &mut run, &mut io),
        }
        .and_then(|()| self.account(dev, layer, &mut run, &mut io));
        // What was read back with this layer's routes is spent, used or not.
        if let Some(c) = self.coop.as_mut() {
            c.layer_done();
        }
        if let Some(p) = self.prefetch.as_mut() {
            p.drop_route_reads();
        }
        ran?;
        if let Some(at) = run.launching {
            self.count.host_layers += 1;
            self.count.host_before += at.saturating_duration_since(entered);
            self.count.host_in += entered.elapsed();
        }
        self.layer_plan = lp;
        Ok(run.slot_all() && io.residual.is_some())
    }

    /// Plan: decide and group the layer's routes, count them, record them, and score the
    /// predictions made for this layer.
    fn plan_layer(
        &mut self,
        dev: &D,
        layer: usize,
        batch: &Batch<'_, D::Buf>,
    ) -> crate::Result<LayerPlan> {
        let (t, routes) = (batch.t, batch.routes);
        let decode = t == 1;
        // The cache's counters first take a device-routed token before this one.
        self.count_held()?;
        self.time_layer(layer, decode);
        if layer == 0 {
            for _ in 0..t {
                self.slots.cache.begin_token();
            }
            if decode {
                self.decoded += 1;
            }
        }
        self.slots.cache.set_layer(layer);
        let mut lp = std::mem::take(&mut self.layer_plan);
        self.plan.plan_layer(routes, t, &mut lp);
        self.record(dev, layer, batch, &lp)?;
        self.count.skipped += lp.skipped as u64;
        for (r, d) in routes.iter().zip(&lp.decisions) {
            self.slots.cache.record_use((layer, r.expert), *d);
        }
        if let Some(p) = self.prefetch.as_mut() {
            if decode {
                p.observe(&mut self.slots, layer, routes);
            } else {
                p.predictor.forget();
            }
        }
        Ok(lp)
    }

    /// Place and launch every group; the CPU's share runs on the helpers' scope meanwhile.
    fn launch<'s>(
        &mut self,
        dev: &D,
        scope: Option<&rayon::Scope<'s>>,
        (layer, lp): (usize, &LayerPlan),
        run: &mut Run,
        io: &mut Io<'_, D::Buf>,
    ) -> crate::Result<()>
    where
        'f: 's,
    {
        let mut at = 0usize;
        for i in 0..lp.groups.len() {
            self.place_ahead(dev, (layer, lp), run, i)?;
            if i == 0 && !run.decode && self.grouped_layer(dev, (layer, lp), run, io)? {
                break;
            }
            if i == 0 && run.decode {
                // Demand loads are queued; now prefetch behind them, and hand the CPU its
                // experts while the loader and the device work.
                run.marks[1] = Instant::now();
                self.prefetch_after(dev, layer, io.xs)?;
                run.marks[2] = Instant::now();
                self.start_cpu(dev, scope, layer, run, (io.xs, &io.ffn))?;
                run.launching = Some(Instant::now());
            }
            let early = i == 0 && self.early(run);
            if i == 0 && !early && run.decode && run.placed == lp.groups.len() {
                if let Some((kind, take)) = self.slot_pool(dev, &run.places) {
                    run.slot_mode = Some(kind);
                    run.slot_take = take;
                }
            }
            if i == 0 && run.defer_zero && !run.slot_all() {
                dev.zero(io.out, run.n_out)?;
            }
            if early {
                self.early_layer(dev, (layer, &lp.groups), &run.places, io)?;
                break;
            }
            let g = &lp.groups[i];
            match run.places[i] {
                Some(Place::Slot(kind, slot)) if run.slot_take.get(i) == Some(&true) => {
                    self.take_slot(dev, kind, slot)?;
                    run.slot_list.push((g.expert, g.rows[0].1, slot));
                }
                Some(Place::Slot(kind, slot))
                    if run.background.is_some() && !self.slots.slot_landed(kind, slot) =>
                {
                    // Its load lands while the CPU helpers work: computed once their result is
                    // back, so this thread is not woken for it while they hold every core.
                    run.deferred.push((i, at));
                }
                Some(Place::Slot(kind, slot)) => {
                    self.take_slot(dev, kind, slot)?;
                    self.run_slot(dev, (layer, g), (kind, slot), (at, run.decode), io)?;
                }
                Some(Place::Cpu) | None => {}
            }
            at += g.rows.len();
        }
        self.finish_launch(dev, layer, lp, run, io)
    }

    /// Place as many groups ahead of group `i` as slots allow (their loads queue up together).
    fn place_ahead(
        &mut self,
        dev: &D,
        (layer, lp): (usize, &LayerPlan),
        run: &mut Run,
        i: usize,
    ) -> crate::Result<()> {
        while run.placed < lp.groups.len() {
            let g = &lp.groups[run.placed];
            let mut p = self.place(dev, layer, g, run)?;
            if p.is_none() && run.placed <= i {
                // A second try once this token's predictions are given up, where every slot is
                // protected and no group of the layer is placed ahead (this layer's placements
                // whose kernels are not queued yet keep their holds).
                if let Some(pf) = self.prefetch.as_mut() {
                    pf.release_all(&mut self.slots);
                }
                p = self.place(dev, layer, g, run)?;
            }
            let p = match p {
                Some(p) => p,
                None if run.placed > i => break,
                // This layer's own placements hold every slot (some deferred behind the CPU):
                // the CPU computes this one too.
                None if run.decode && self.coop.is_some() => {
                    let v = self.variant_of(g.precision);
                    self.count_cpu(v, &mut run.cpu_busy);
                    Place::Cpu
                }
                None => {
                    return Err(Error::Invalid(format!(
                        "expert cache: no slot can be freed for layer {layer} expert {} (pools of {} / {} slots)",
                        g.expert,
                        self.slots.cache.capacity(PoolKind::High),
                        self.slots.cache.capacity(PoolKind::Low)
                    )))
                }
            };
            // A slot placement holds its slot until its group's kernels are queued (a hold
            // each: an expert's high and low routes in one prefill slot are two); a CPU
            // placement becomes a CPU job.
            match p {
                Place::Slot(kind, _) => self.slots.cache.protect(kind, (layer, g.expert)),
                Place::Cpu => run.cpu_jobs.push(CpuJob {
                    expert: g.expert,
                    variant: self.variant_of(g.precision),
                    weight: g.rows[0].1,
                }),
            }
            run.places[run.placed] = Some(p);
            run.placed += 1;
        }
        Ok(())
    }

    fn prefetch_after(&mut self, dev: &D, layer: usize, xs: &D::Buf) -> crate::Result<()> {
        let reach = self.coop.as_ref().map(|_| self.layer_s.unwrap_or(0.0));
        if let Some(p) = self.prefetch.as_mut() {
            p.prefetch((dev, &mut self.slots), &self.plan, (layer, xs), reach)?;
        }
        Ok(())
    }

    /// Hand the CPU jobs placed so far to the helpers, on their pool, as one background task.
    fn start_cpu<'s>(
        &mut self,
        dev: &D,
        scope: Option<&rayon::Scope<'s>>,
        layer: usize,
        run: &mut Run,
        (xs, ffn): (&D::Buf, &ExpertFfn),
    ) -> crate::Result<()>
    where
        'f: 's,
    {
        let (Some(c), Some(scope)) = (self.coop.as_mut(), scope) else {
            return Ok(());
        };
        if run.cpu_jobs.is_empty() {
            return Ok(());
        }
        c.read_x(dev, layer, (xs, self.file.expert_dims().0))?;
        let jobs = std::mem::take(&mut run.cpu_jobs);
        // Each blob's checksum before its first use (a bit test after that).
        for j in &jobs {
            self.file.verify_expert(layer, j.expert, j.variant)?;
        }
        run.cpu_handed += jobs.len();
        let (pool, est, x, file) = (c.pool.clone(), c.estimates(), c.host_x.clone(), self.file);
        let ffn = ffn.clone();
        let (tx, done) = crossbeam_channel::bounded(1);
        run.spawned = Instant::now();
        scope.spawn(move |_| {
            let start = Instant::now();
            let (res, times) = compute(file, &pool, (&jobs, &ffn), (layer, &x), &est);
            // The receiver waits for this unless the layer failed first.
            let _ = tx.send((res, times, start, Instant::now()));
        });
        run.background = Some(done);
        Ok(())
    }

    /// Whether a decode layer computes its cached experts first while some loads are still
    /// landing (mapped slots load matrix by matrix: worth it with no slot ready too).
    fn early(&self, run: &Run) -> bool {
        if !run.decode || run.placed != run.places.len() || run.background.is_some() {
            return false;
        }
        let (mut ready, mut loading) = (false, false);
        for p in &run.places {
            if let Some(Place::Slot(kind, s)) = p {
                let landed = self.slots.slot_landed(*kind, *s);
                ready |= landed;
                loading |= !landed;
            }
        }
        loading && (ready || self.slots.mapped())
    }

    /// The pool whose slots the routed kernels compute a decode layer's experts (placed as
    /// `places`) from, and which groups they take: every group, where all sit in slots of one
    /// pool; in a layer with experts on the CPU (added last, so not the all-device order
    /// anyway), the groups whose loads have landed in the pool holding more of them, where
    /// that is two or more. None otherwise (two pools without CPU experts, more experts than
    /// the kernels take, or matrices they do not take).
    fn slot_pool(&mut self, dev: &D, places: &[Option<Place>]) -> Option<(PoolKind, Vec<bool>)> {
        if !self.tuning.routed_slots || places.is_empty() {
            return None;
        }
        let in_pool = |kind: PoolKind, landed: bool| -> Vec<bool> {
            let slot = |p: &Option<Place>| match *p {
                Some(Place::Slot(k, s)) => (k == kind).then_some(s),
                _ => None,
            };
            let taken = |s: usize| !landed || self.slots.slot_landed(kind, s);
            places.iter().map(|p| slot(p).is_some_and(taken)).collect()
        };
        let count = |take: &[bool]| take.iter().filter(|&&t| t).count();
        let mut pick = None;
        for kind in [PoolKind::High, PoolKind::Low] {
            let take = in_pool(kind, false);
            if count(&take) == places.len() {
                pick = Some((kind, take));
            }
        }
        if pick.is_none() && places.contains(&Some(Place::Cpu)) {
            let (high, low) = (in_pool(PoolKind::High, true), in_pool(PoolKind::Low, true));
            pick = Some(if count(&low) > count(&high) {
                (PoolKind::Low, low)
            } else {
                (PoolKind::High, high)
            })
            .filter(|(_, take)| count(take) >= 2);
        }
        let (kind, take) = pick?;
        if count(&take) > D::ROUTED_MAX_K || !self.pool_routed(dev, kind) {
            return None;
        }
        Some((kind, take))
    }

    /// Whether the routed kernels take the layout of pool `kind`'s experts (decided on first
    /// use).
    fn pool_routed(&mut self, dev: &D, kind: PoolKind) -> bool {
        if let Some(ok) = self.slot_kinds[kind as usize] {
            return ok;
        }
        let ok = dev.routed_supports(&self.slots.expert(dev, kind, 0));
        if !ok {
            log::info!(
                "host-routed decode runs experts one at a time: the {kind:?} pool's layout does not suit the routed kernels"
            );
        }
        self.slot_kinds[kind as usize] = Some(ok);
        ok
    }

    /// A prefill layer whose groups all sit in slots of one pool: every expert at once, a
    /// launch a product (`ExpertDevice::experts_grouped`, the sums of run_slot group by group).
    /// False (nothing computed) where that does not apply.
    fn grouped_layer(
        &mut self,
        dev: &D,
        (layer, lp): (usize, &LayerPlan),
        run: &mut Run,
        io: &mut Io<'_, D::Buf>,
    ) -> crate::Result<bool> {
        if !self.tuning.grouped_prefill || run.placed != lp.groups.len() {
            return Ok(false);
        }
        let Some(Some(Place::Slot(kind, _))) = run.places.first().copied() else {
            return Ok(false);
        };
        let (mut groups, mut at) = (Vec::with_capacity(lp.groups.len()), 0);
        let t = run.n_out / self.file.expert_dims().0.max(1);
        let mut per_token = vec![0usize; t];
        for (g, p) in lp.groups.iter().zip(&run.places) {
            let Some(Place::Slot(k, s)) = *p else {
                return Ok(false);
            };
            if k != kind {
                return Ok(false);
            }
            groups.push((at, g.rows.len(), self.slots.expert(dev, kind, s)));
            at += g.rows.len();
            for &(tok, _) in &g.rows {
                if let Some(c) = per_token.get_mut(tok) {
                    *c += 1;
                }
            }
        }
        // The device waits for each slot's load (if any) before the grouped launches.
        for p in &run.places {
            if let Some(Place::Slot(k, s)) = *p {
                self.take_slot(dev, k, s)?;
            }
        }
        let k = per_token.iter().copied().max().unwrap_or(0);
        if !dev.experts_grouped(&mut self.work, &groups, io.xs, (t, k), io.out)? {
            return Ok(false);
        }
        for g in &lp.groups {
            self.slots.cache.unprotect(kind, (layer, g.expert));
        }
        self.count.grouped_layers += 1;
        Ok(true)
    }

    /// Compute group `g` (its routes from row `at` of the layer's) with the expert in the
    /// slot, adding into the layer output; then release the slot.
    fn run_slot(
        &mut self,
        dev: &D,
        (layer, g): (usize, &Group),
        (kind, slot): (PoolKind, usize),
        (at, decode): (usize, bool),
        io: &mut Io<'_, D::Buf>,
    ) -> crate::Result<()> {
        let e = self.slots.expert(dev, kind, slot);
        if decode {
            for step in 0..3 {
                dev.expert_step(&mut self.work, (&e, g.expert), io.xs, 0, step)?;
            }
            dev.add_row(&self.work, 0, g.rows[0].1, io.out)?;
        } else {
            let rows = (at, g.rows.len());
            dev.expert_rows(&mut self.work, (&e, g.expert), io.xs, rows, io.out)?;
        }
        self.slots.cache.unprotect(kind, (layer, g.expert));
        Ok(())
    }

    /// A decode layer (no CPU helpers) with some slots still loading and some ready: the ready
    /// experts first, while the loads land, then each loading one after its load (in the order
    /// they were queued; a mapped slot's products as each matrix lands). Each expert's output
    /// keeps its own row of the work, and the outputs are added in group order afterwards, as
    /// run_slot adds them: the same result to the bit.
    fn early_layer(
        &mut self,
        dev: &D,
        (layer, groups): (usize, &[Group]),
        places: &[Option<Place>],
        io: &mut Io<'_, D::Buf>,
    ) -> crate::Result<()> {
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
            .partition(|&&(_, kind, s)| self.slots.slot_landed(kind, s));
        for &(i, kind, s) in ready.iter().chain(&loading) {
            let e = self.slots.expert(dev, kind, s);
            let in_parts = self.slots.loads_in_parts(kind, s);
            if !in_parts {
                self.take_slot(dev, kind, s)?;
            }
            for step in 0..3 {
                if in_parts && step < 2 {
                    self.slots.ready_part(dev, kind, s)?;
                } else if in_parts {
                    self.take_slot(dev, kind, s)?;
                }
                dev.expert_step(&mut self.work, (&e, groups[i].expert), io.xs, i, step)?;
            }
            self.slots.cache.unprotect(kind, (layer, groups[i].expert));
        }
        for &(i, _, _) in &slots {
            dev.add_row(&self.work, i, groups[i].rows[0].1, io.out)?;
        }
        self.count.early_layers += 1;
        Ok(())
    }

    /// After the groups' launches: the routed kernels' one launch, the predictions' holds
    /// released, the CPU's result taken, the deferred slots computed, late CPU jobs run, and
    /// the layer's bookkeeping checked.
    fn finish_launch(
        &mut self,
        dev: &D,
        layer: usize,
        lp: &LayerPlan,
        run: &mut Run,
        io: &mut Io<'_, D::Buf>,
    ) -> crate::Result<()> {
        if let Some(kind) = run.slot_mode {
            let list: Vec<SlotExpert<D::Expert>> = run
                .slot_list
                .iter()
                .map(|&(e, w, s)| (e, w, self.slots.expert(dev, kind, s)))
                .collect();
            // Into x directly only where no other expert adds to the layer's output.
            let target: &mut D::Buf = match io.residual.as_deref_mut() {
                Some(x) if run.slot_all() => x,
                _ => &mut *io.out,
            };
            dev.experts_routed(&mut self.work, &list, io.xs, target)?;
            if run.slot_all() {
                self.count.slot_layers += 1;
            } else {
                self.count.slot_part_layers += 1;
            }
            for &(e, _, _) in &run.slot_list {
                self.slots.cache.unprotect(kind, (layer, e));
            }
        }
        // Predicted experts of this layer have been used or proven wrong.
        if let Some(p) = self.prefetch.as_mut() {
            p.release(&mut self.slots, layer);
        }
        if let (Some(done), Some(c)) = (run.background.take(), self.coop.as_mut()) {
            let started = Instant::now();
            let (res, times, start, end) = done
                .recv()
                .map_err(|_| Error::Invalid("a CPU expert task failed".into()))?;
            c.wait += started.elapsed();
            c.absorb(res, times, &mut run.cpu_out);
            run.cpu_span = Some((start, end));
        }
        for (i, at) in std::mem::take(&mut run.deferred) {
            if let Some(Place::Slot(kind, slot)) = run.places[i] {
                self.take_slot(dev, kind, slot)?;
                self.run_slot(dev, (layer, &lp.groups[i]), (kind, slot), (at, true), io)?;
            }
        }
        if let (false, Some(c)) = (run.cpu_jobs.is_empty(), self.coop.as_mut()) {
            c.read_x(dev, layer, (io.xs, self.file.expert_dims().0))?;
            c.run(self.file, (&run.cpu_jobs, &io.ffn), layer, &mut run.cpu_out)?;
            run.cpu_handed += run.cpu_jobs.len();
        }
        // Every group placed on the CPU was computed there (else its output would be missing
        // from the layer, silently).
        let on_cpu = run
            .places
            .iter()
            .filter(|p| **p == Some(Place::Cpu))
            .count();
        if on_cpu != run.cpu_handed {
            return Err(Error::Invalid(format!(
                "expert engine: layer {layer} placed {on_cpu} experts on the CPU but computed {} there",
                run.cpu_handed
            )));
        }
        self.check_holds(layer)
    }

    /// Account: the CPU's results added last (so cooperative decode rounds differently from
    /// the all-device order), and the helpers' idle time between layers.
    fn account(
        &mut self,
        dev: &D,
        layer: usize,
        run: &mut Run,
        io: &mut Io<'_, D::Buf>,
    ) -> crate::Result<()> {
        if !run.cpu_out.is_empty() {
            dev.add_host(&self.work, &run.cpu_out, io.out)?;
        }
        if let Some(c) = self.coop.as_mut() {
            c.mark_layer(layer, (run.entered, run.marks, run.spawned), run.cpu_span);
        }
        if let Some(p) = self.prefetch.as_mut() {
            p.replayed = None;
        }
        Ok(())
    }

    /// Wait for slot `s`'s load (if any) before its use, counting a used prefetch.
    fn take_slot(&mut self, dev: &D, kind: PoolKind, s: usize) -> crate::Result<()> {
        if self.slots.take_slot(dev, kind, s)? {
            self.count.prefetch_used += 1;
        }
        Ok(())
    }

    /// The cache's holds balance after layer `layer`: none left on its experts, no release of
    /// an unheld key (an error names the first; a bookkeeping bug, never the user's input).
    pub(super) fn check_holds(&self, layer: usize) -> crate::Result<()> {
        let cache = &self.slots.cache;
        for kind in [PoolKind::High, PoolKind::Low] {
            for e in 0..self.file.n_experts() {
                let n = cache.holds(kind, (layer, e));
                if n > 0 {
                    return Err(Error::Invalid(format!(
                        "expert engine: layer {layer} expert {e} still has {n} hold(s) in the {kind:?} pool after the layer"
                    )));
                }
            }
        }
        let n = cache.unmatched_releases();
        if n > 0 {
            return Err(Error::Invalid(format!(
                "expert engine: {n} release(s) of an expert nothing held (layer {layer})"
            )));
        }
        Ok(())
    }

    /// The variant a decision of `precision` runs in.
    pub(super) fn variant_of(&self, precision: Precision) -> usize {
        let kind = self.slots.kind_of(precision == Precision::Low);
        self.slots.pool(kind).variant
    }
}

/// The top-1 expert of a decode token's routes (the highest weight, the lower index among
/// equal ones).
pub(super) fn top1_of(routes: &[Route]) -> Option<usize> {
    routes
        .iter()
        .max_by(|a, b| a.weight.total_cmp(&b.weight).then(b.expert.cmp(&a.expert)))
        .map(|r| r.expert)
}

/// A prefill layer's routed rows in group order: token indices and gate weights.
fn grouped_rows(lp: &LayerPlan) -> (Vec<i32>, Vec<f32>) {
    let rows = lp.groups.iter().flat_map(|g| g.rows.iter());
    rows.map(|&(i, w)| (i as i32, w)).unzip()
}
