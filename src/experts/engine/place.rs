//! Where one group of a layer runs: a cached slot (a hit, or a high miss whose low copy is
//! cached), the CPU helpers (cooperative decode, by the cost model), or a slot claimed by the
//! policy with its load queued now.

use super::layer::{Place, Run};
use super::Engine;
use crate::experts::cache::PoolKind;
use crate::experts::scheduler::Priority;
use crate::experts::{Group, Precision};
use crate::model::ExpertDevice;

impl<D: ExpertDevice> Engine<'_, D> {
    /// Decide where group `g` runs; None: no slot can be claimed now.
    pub(super) fn place(
        &mut self,
        dev: &D,
        layer: usize,
        g: &Group,
        run: &mut Run,
    ) -> crate::Result<Option<Place>> {
        let key = (layer, g.expert);
        let kind = self.slots.kind_of(g.precision == Precision::Low);
        let variant = self.slots.pool(kind).variant;
        // A low route whose high copy is cached runs in high precision.
        let upgrade = kind == PoolKind::Low && self.tuning.upgrade_low;
        let held = [PoolKind::High, kind]
            .into_iter()
            .filter(|&k| k == kind || upgrade)
            .find_map(|k| self.slots.cache.lookup(k, key).map(|s| (k, s)));
        if let Some((k, s)) = held {
            if run.decode {
                if let Some(c) = self.cpu_before_load((k, s), variant, run.cpu_busy) {
                    // Its load (a prefetch still queued or in flight) lands later than the CPU
                    // would finish: computed there; the load goes on, for later tokens.
                    run.cpu_busy += c;
                    self.count_cpu_miss(variant);
                    self.count.late_to_cpu += 1;
                    return Ok(Some(Place::Cpu));
                }
            }
            let v = self.slots.pool(k).variant;
            self.count.hits[v] += g.rows.len() as u64;
            if let (true, Some(c)) = (run.decode, self.coop.as_mut()) {
                c.behind.hit(key, self.decoded);
            }
            return Ok(Some(Place::Slot(k, s)));
        }
        let top1 = run.top1 == Some(g.expert);
        if kind == PoolKind::High && self.substitute_low && run.decode && !top1 {
            let low = self.slots.has_low().then_some(PoolKind::Low);
            if let Some(s) = low.and_then(|k| self.slots.cache.lookup(k, key)) {
                self.count.substituted += 1;
                self.count.hits[self.slots.pool(PoolKind::Low).variant] += 1;
                if let Some(c) = self.coop.as_mut() {
                    c.behind.hit(key, self.decoded);
                }
                return Ok(Some(Place::Slot(PoolKind::Low, s)));
            }
        }
        if run.decode && self.miss_to_cpu(dev, (kind, variant), key, run)? {
            return Ok(Some(Place::Cpu));
        }
        let Some(ins) = self.slots.claim(dev, kind, key)? else {
            return Ok(None);
        };
        self.count.misses[variant] += g.rows.len() as u64;
        self.slots
            .submit(dev, (kind, ins.slot), key, Priority::Demand)?;
        Ok(Some(Place::Slot(kind, ins.slot)))
    }

    /// Cooperative decode: a miss goes to whichever of the link and the CPU frees up first.
    /// True when the CPU takes it (and, when the link is idle and load-behind pays, its load is
    /// queued behind it, so the cache follows the routing for the tokens that reuse it).
    fn miss_to_cpu(
        &mut self,
        dev: &D,
        (kind, variant): (PoolKind, usize),
        key: (usize, usize),
        run: &mut Run,
    ) -> crate::Result<bool> {
        let load_s = self.slots.load_bytes(kind, key) as f64 / self.slots.load_bandwidth();
        let Some(c) = self.coop.as_mut() else {
            return Ok(false);
        };
        c.behind.miss(key, self.decoded);
        if !c.goes_to_cpu(variant, run.cpu_busy, run.load_busy, load_s) {
            run.load_busy += load_s;
            return Ok(false);
        }
        self.count_cpu(variant, &mut run.cpu_busy);
        // Into an idle link only: behind a demand load it would delay the next miss the link
        // takes. The slot is claimed by the policy like any miss's (this layer's placed experts
        // are protected).
        let idle = !self.slots.link_busy();
        let Some(c) = self.coop.as_mut() else {
            return Ok(true);
        };
        if c.load_behind && idle && c.behind.wanted() {
            self.count.behind_chances += 1;
            if let Some(ins) = self.slots.claim(dev, kind, key)? {
                self.slots
                    .submit(dev, (kind, ins.slot), key, Priority::Prefetch)?;
                // Not a prediction: kept out of the prefetch accuracy.
                self.slots.not_prefetched(kind, ins.slot);
                if let Some(c) = self.coop.as_mut() {
                    c.behind.loaded(key, ins.evicted, self.decoded);
                }
                self.count.loaded_behind += 1;
            }
        }
        Ok(true)
    }

    /// Count a miss computed on the CPU (as `variant`), its expected seconds added to
    /// `cpu_busy`.
    pub(super) fn count_cpu(&mut self, variant: usize, cpu_busy: &mut f64) {
        if let Some(c) = self.coop.as_mut() {
            *cpu_busy += c.take(variant);
        }
        self.count_cpu_miss(variant);
    }

    fn count_cpu_miss(&mut self, variant: usize) {
        self.count.misses[variant] += 1;
        self.count.cpu_computed += 1;
        self.count.cpu_bytes += self.file.expert_layout(variant).size as u64;
    }

    /// Cooperative decode: Some(CPU seconds) when the slot is still loading and the CPU, busy
    /// for `cpu_busy` seconds already, would compute the expert (as `variant`) before the load
    /// is expected to land.
    fn cpu_before_load(
        &self,
        (kind, s): (PoolKind, usize),
        variant: usize,
        cpu_busy: f64,
    ) -> Option<f64> {
        let c = self.coop.as_ref()?.estimate(variant)?;
        let left = self.slots.due_in(kind, s)?;
        (cpu_busy + c < left).then_some(c)
    }
}
