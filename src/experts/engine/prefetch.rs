//! Stacked-gate prefetch (HOBBIT §3.3): at a decode layer, the next layers' routers applied to
//! its gate input predict their experts (experts::predictor); the first later layer with a
//! predicted miss gets its loads queued, into an idle link only, and its predicted experts are
//! held in the cache until that layer has run.

use super::slots::Slots;
use crate::experts::cache::PoolKind;
use crate::experts::predictor::Predictor;
use crate::experts::scheduler::Priority;
use crate::experts::{ExpertKey, Precision, PrecisionPlan};
use crate::model::{ExpertDevice, Route};

pub struct Prefetcher<D: ExpertDevice> {
    pub predictor: Predictor,
    /// The stacked product's logits on the device, and read back.
    logits: D::Buf,
    host: Vec<f32>,
    /// Experts held for a predicted layer: held[layer].
    held: Vec<Vec<(PoolKind, ExpertKey)>>,
    /// Only predicted experts of at least this gate weight are prefetched.
    min_weight: f32,
    /// A cached high copy serves a predicted low route (Tuning::upgrade_low).
    upgrade_low: bool,
    /// A replayed routing's predictions for the layer about to run: taken instead of the
    /// stacked gates' (which predict the model's own router).
    pub replayed: Option<Vec<(usize, Vec<Route>)>>,
    /// The layer whose stacked product `host` holds, read back with its routes (route_reads).
    read_with_routes: Option<usize>,
    /// Prefetches issued, and dropped while loading because their layer did not route them.
    pub issued: u64,
    pub cancelled: u64,
}

impl<D: ExpertDevice> Prefetcher<D> {
    /// Predict `depth` layers ahead from `routers` (every layer's), the stacked gates kept on
    /// the device.
    pub fn new(
        dev: &mut D,
        routers: &[crate::quant::Matrix<'_>],
        (depth, top_k): (usize, usize),
        min_weight: f32,
    ) -> crate::Result<Self> {
        let predictor = Predictor::new(routers, depth, top_k)?;
        let n_experts = routers.first().map_or(0, |r| r.rows);
        for l in 0..routers.len() {
            if let Some(m) = predictor.stacked(l) {
                dev.keep_resident(&m)?;
            }
        }
        Ok(Prefetcher {
            logits: dev.alloc(depth * n_experts)?,
            host: Vec::new(),
            held: vec![Vec::new(); routers.len()],
            predictor,
            min_weight,
            upgrade_low: true,
            replayed: None,
            read_with_routes: None,
            issued: 0,
            cancelled: 0,
        })
    }

    /// Whether a cached high copy serves a predicted low route.
    pub fn upgrading_low(mut self, on: bool) -> Self {
        self.upgrade_low = on;
        self
    }

    pub fn min_weight(&self) -> f32 {
        self.min_weight
    }

    /// A decode layer's routes are known: score the predictions made for it, and drop the
    /// prefetches made for it whose expert it does not route and whose load has not landed (so
    /// they stop taking the link from the demand loads to come).
    pub fn observe(&mut self, slots: &mut Slots<'_, D>, layer: usize, routes: &[Route]) {
        self.predictor.observe(layer, routes);
        let mut kept = Vec::new();
        for (kind, key) in std::mem::take(&mut self.held[layer]) {
            let routed = routes.iter().any(|r| r.expert == key.1);
            if !routed && slots.cancel_prefetch(kind, key) {
                self.cancelled += 1;
            } else {
                kept.push((kind, key));
            }
        }
        self.held[layer] = kept;
    }

    /// Release the holds of predictions for `layer` (it has run).
    pub fn release(&mut self, slots: &mut Slots<'_, D>, layer: usize) {
        for (kind, key) in std::mem::take(&mut self.held[layer]) {
            slots.cache.unprotect(kind, key);
        }
    }

    /// Release every prediction's hold (slots are needed for this layer's own experts).
    pub fn release_all(&mut self, slots: &mut Slots<'_, D>) {
        for l in 0..self.held.len() {
            self.release(slots, l);
        }
    }

    /// The stacked product at decode layer `layer` for the backend to compute and read back
    /// with the layer's routes (its input is the routes' xn, which `predict` is given): the
    /// matrix, its device output and host copy. None with a replayed routing's predictions.
    pub fn route_reads(
        &mut self,
        layer: usize,
    ) -> Option<(crate::quant::Matrix<'_>, &mut D::Buf, &mut [f32])> {
        self.read_with_routes = None;
        if self.replayed.is_some() {
            return None;
        }
        let m = self.predictor.stacked(layer)?;
        self.host.resize(m.rows, 0.0);
        self.read_with_routes = Some(layer);
        Some((m, &mut self.logits, &mut self.host[..]))
    }

    /// Forget a product read with routes that its layer did not use.
    pub fn drop_route_reads(&mut self) {
        self.read_with_routes = None;
    }

    /// The predictions at `layer` from its gate input `xs` (or the replayed ones).
    fn predict(
        &mut self,
        dev: &D,
        layer: usize,
        xs: &D::Buf,
    ) -> crate::Result<Vec<(usize, Vec<Route>)>> {
        if let Some(given) = self.replayed.take() {
            return Ok(self.predictor.given(layer, given));
        }
        let Some(m) = self.predictor.stacked(layer) else {
            return Ok(Vec::new());
        };
        if self.read_with_routes.take() != Some(layer) {
            self.host.resize(m.rows, 0.0);
            dev.matmul(&m, xs, 1, &mut self.logits)?;
            dev.download(&self.logits, &mut self.host)?;
        }
        let logits = std::mem::take(&mut self.host);
        let out = self.predictor.predict(layer, &logits);
        self.host = logits;
        Ok(out)
    }

    /// Predict the next layers from `layer`'s gate input and prefetch the first one with a
    /// predicted miss, in the precision the scorer would pick. Only into an idle link: on a
    /// link-bound card a queued prefetch delays the demand loads behind it by its wasted bytes
    /// when wrong, while an idle link costs nothing to use. `reach`, in cooperative mode: the
    /// seconds a layer takes (a load landing after its layer started is computed by the CPU
    /// anyway, so only loads that land in time are queued).
    pub fn prefetch(
        &mut self,
        (dev, slots): (&D, &mut Slots<'_, D>),
        plan: &PrecisionPlan,
        (layer, xs): (usize, &D::Buf),
        reach: Option<f64>,
    ) -> crate::Result<()> {
        let predicted = self.predict(dev, layer, xs)?;
        let k = predicted.first().map_or(0, |p| p.1.len());
        let mut decisions = vec![Precision::High; k];
        let mut weights = vec![0.0; k];
        let link_busy = slots.link_busy();
        let bandwidth = slots.load_bandwidth();
        for (target, routes) in predicted {
            plan.apply(&routes, &mut decisions, &mut weights);
            let mut missing = Vec::new();
            for (r, d) in routes.iter().zip(&decisions) {
                if *d == Precision::Skip || r.weight < self.min_weight {
                    continue;
                }
                let (kind, key) = (slots.kind_of(*d == Precision::Low), (target, r.expert));
                // A cached high copy serves a low route too.
                let upgrade = kind == PoolKind::Low && self.upgrade_low;
                let held = [PoolKind::High, kind]
                    .into_iter()
                    .filter(|&k| k == kind || upgrade)
                    .find(|&k| slots.cache.lookup(k, key).is_some());
                match held {
                    Some(k) => {
                        slots.cache.protect(k, key);
                        self.held[target].push((k, key));
                    }
                    None => missing.push((kind, key)),
                }
            }
            if missing.is_empty() {
                continue;
            }
            if link_busy {
                break;
            }
            if let Some(layer_s) = reach {
                let until = (target - layer) as f64 * layer_s;
                let mut t = 0.0;
                missing.retain(|(kind, _)| {
                    let secs = slots.pool(*kind).slot_bytes as f64 / bandwidth;
                    let fits = t + secs <= until;
                    if fits {
                        t += secs;
                    }
                    fits
                });
                if missing.is_empty() {
                    continue;
                }
            }
            for (kind, key) in missing {
                let Some(ins) = slots.claim(dev, kind, key)? else {
                    break;
                };
                slots.submit(dev, (kind, ins.slot), key, Priority::Prefetch)?;
                slots.cache.protect(kind, key);
                self.held[target].push((kind, key));
                self.issued += 1;
            }
            break;
        }
        Ok(())
    }
}
