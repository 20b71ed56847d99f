//! Decode routed on the device: once every expert is resident in one precision (exact plan, no
//! CPU experts), a decode token routes and computes its experts with no host round trip per
//! layer; its routes are read back once, after its logits, and counted as the host-routed path
//! counts them (hits, the cache policy's use counters, the trace).

use std::time::{Duration, Instant};

use crate::experts::cache::PoolKind;
use crate::model::{ExpertDevice, ModelError, Route};
use crate::Error;

pub struct DeviceRouting<D: ExpertDevice> {
    /// Allowed by the configuration (exact plan, one pool with room for every expert, no CPU
    /// experts, no trace that records the gate inputs).
    pub allowed: bool,
    /// Every expert resident, once they all have landed.
    pub resident: Option<D::Resident>,
    /// The current token takes it (decided at its first layer).
    pub token: bool,
    /// The current token's routes wait to be read back (end_forward).
    pub pending: bool,
    /// The last token's routes are queued for reading and not yet counted (after_forward).
    pub queued: bool,
    /// The last token's routes are read back and checked but not yet counted (counted once the
    /// next token's launches are queued: the device computes while the host counts).
    pub held: bool,
    /// Their copy: per layer, k expert indices (f32 bits) then k weights.
    pub host: Vec<f32>,
    /// Tokens that took this path, and the host time spent counting their routes.
    pub tokens: u64,
    pub account: Duration,
    /// Gated decode (gated.rs): the table is a directory of a cache of part of the experts.
    pub gated: bool,
    /// A gated token is launched and waits to be followed (end_forward).
    pub follow: bool,
    /// The current call's launches run as they are made (not recorded into a CUDA graph): a
    /// gated token's layers are then followed while its later layers are launched.
    pub now: bool,
    /// The gated token's layers followed so far.
    pub followed: usize,
    /// Gated decode: experts loaded behind the CPU this token, present in the directory from
    /// the next token on (no layer of this token routes them again).
    pub behind: Vec<crate::experts::ExpertKey>,
}

impl<D: ExpertDevice> DeviceRouting<D> {
    pub fn new(allowed: bool, gated: bool) -> Self {
        DeviceRouting {
            allowed,
            gated,
            follow: false,
            now: false,
            followed: 0,
            behind: Vec::new(),
            resident: None,
            token: false,
            pending: false,
            queued: false,
            held: false,
            host: Vec::new(),
            tokens: 0,
            account: Duration::ZERO,
        }
    }

    /// Read the queued routes into `host`, every expert index checked against `n_experts` and
    /// every gate weight checked finite: a layer whose router logits were not finite (the
    /// device's top-k found no expert, or their softmax is NaN) is an error naming the layer
    /// and `file`.
    pub fn fetch(
        &mut self,
        dev: &D,
        (n_experts, k): (usize, usize),
        file: &std::path::Path,
    ) -> crate::Result<()> {
        let Some(r) = self.resident.as_mut() else {
            return Ok(());
        };
        let got = dev.read_routes(r)?;
        self.host.clear();
        self.host.extend_from_slice(got);
        match bad_layer(&self.host, n_experts, k) {
            Some(l) => Err(ModelError::non_finite(file, Some(l), "router logits").into()),
            None => Ok(()),
        }
    }

    /// Time spent counting, from `arrived`.
    pub fn counted(&mut self, arrived: Instant) {
        self.tokens += 1;
        self.account += arrived.elapsed();
    }
}

/// The first layer of routes `host` (per layer: k expert indices as f32 bits, then k weights)
/// with an index outside `n_experts` or a non-finite weight.
fn bad_layer(host: &[f32], n_experts: usize, k: usize) -> Option<usize> {
    host.chunks_exact(2 * k.max(1)).position(|lr| {
        let (ids, weights) = lr.split_at(k);
        ids.iter().any(|e| e.to_bits() as usize >= n_experts)
            || weights.iter().any(|w| !w.is_finite())
    })
}

impl<D: ExpertDevice> super::Engine<'_, D> {
    /// Whether this decode token can route on the device: allowed, and every expert resident
    /// (the first time: wait for their loads and build the device's tables).
    pub(super) fn device_ready(&mut self, dev: &D) -> crate::Result<bool> {
        if !self.routing.allowed {
            return Ok(false);
        }
        if self.routing.resident.is_some() {
            return Ok(true);
        }
        let (nl, ne) = (self.file.n_layers(), self.file.n_experts());
        let gated = self.routing.gated;
        if !gated && self.slots.cache.len(PoolKind::High) < nl * ne {
            return Ok(false);
        }
        for slot in 0..self.slots.cache.capacity(PoolKind::High) {
            self.slots.ready(dev, PoolKind::High, slot)?;
        }
        // Gated: an absent expert's entry is any slot's (never computed: the gate holds it).
        let any = self.slots.expert(dev, PoolKind::High, 0);
        let (mut experts, mut present) = (Vec::with_capacity(nl * ne), Vec::new());
        for l in 0..nl {
            for e in 0..ne {
                match self.slots.cache.lookup(PoolKind::High, (l, e)) {
                    Some(slot) => {
                        let x = self.slots.expert(dev, PoolKind::High, slot);
                        experts.push(x);
                        present.push((l * ne + e, Some(x)));
                    }
                    None if gated => experts.push(any),
                    None => {
                        return Err(Error::Invalid(format!(
                            "expert cache: layer {l} expert {e} missing from a full cache"
                        )))
                    }
                }
            }
        }
        // With CPU experts a miss's x comes to the host in its layer's mailbox.
        let hidden = self.coop.as_ref().map_or(0, |_| self.file.expert_dims().0);
        match dev.resident(&experts, (ne, self.top_k), gated.then_some(hidden))? {
            Some(mut r) => {
                if gated {
                    dev.gate_update(&mut r, &present, None, &[])?;
                    self.slots.keep_claims();
                    log::info!("decode routes on the device, held at a layer's gate on a miss");
                } else {
                    log::info!("every expert is resident: decode routes on the device");
                }
                self.routing.resident = Some(r);
                Ok(true)
            }
            None => {
                log::info!(
                    "decode routes on the host: the experts' layout does not suit the routed kernels"
                );
                self.routing.allowed = false;
                Ok(false)
            }
        }
    }

    /// After a device-routed token: its routes to the host (checked), then counted as
    /// `forward` would count them at once, or, without a trace to write, held and counted once
    /// the next token's launches are queued.
    pub(super) fn account_device(&mut self, dev: &D, hold: bool) -> crate::Result<()> {
        let shape = (self.file.n_experts(), self.top_k);
        self.routing.fetch(dev, shape, self.file.path())?;
        if hold && self.trace.is_none() {
            self.routing.held = true;
            Ok(())
        } else {
            self.count_device_routes()
        }
    }

    /// Count the routes account_device held, if any (before anything that reads or resets what
    /// they count).
    pub(super) fn count_held(&mut self) -> crate::Result<()> {
        if std::mem::take(&mut self.routing.held) {
            self.count_device_routes()?;
        }
        Ok(())
    }

    /// Count the fetched routes as `forward` would: hits, the cache's use counters, the trace.
    fn count_device_routes(&mut self) -> crate::Result<()> {
        let (ne, k) = (self.file.n_experts(), self.top_k);
        let arrived = Instant::now();
        let host = std::mem::take(&mut self.routing.host);
        self.decoded += 1;
        self.slots.cache.begin_token();
        let high = self.slots.pool(PoolKind::High).variant;
        let mut routes = vec![
            Route {
                expert: 0,
                weight: 0.0
            };
            k
        ];
        let mut lp = std::mem::take(&mut self.layer_plan);
        for (l, lr) in host.chunks_exact(2 * k).enumerate() {
            for (j, r) in routes.iter_mut().enumerate() {
                // (Checked by fetch.)
                let expert = lr[j].to_bits() as usize;
                *r = Route {
                    expert: expert.min(ne - 1),
                    weight: lr[k + j],
                };
            }
            self.count_routed_layer(l, &routes, &mut lp)?;
            self.count.hits[high] += k as u64;
        }
        self.layer_plan = lp;
        self.routing.host = host;
        self.routing.counted(arrived);
        Ok(())
    }

    /// One device-routed decode layer's routes counted as the host-routed path's plan step
    /// counts them: the scorer's plan (into `lp`), the trace, the cache's use counters.
    pub(super) fn count_routed_layer(
        &mut self,
        l: usize,
        routes: &[Route],
        lp: &mut crate::experts::LayerPlan,
    ) -> crate::Result<()> {
        self.slots.cache.set_layer(l);
        self.plan.plan_layer(routes, 1, lp);
        if let Some(tw) = self.trace.as_mut() {
            tw.record_layer(l, routes, &lp.decisions, 1, None)?;
        }
        for (r, dec) in routes.iter().zip(&lp.decisions) {
            self.slots.cache.record_use((l, r.expert), *dec);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::bad_layer;

    #[test]
    fn routes_read_back_with_no_expert_or_a_nan_weight_name_their_layer() {
        let id = |e: u32| f32::from_bits(e);
        // Two layers of k = 2: (ids, weights).
        let good = [id(1), id(3), 0.75, 0.25, id(0), id(2), 0.5, 0.5];
        assert_eq!(bad_layer(&good, 4, 2), None);
        let mut no_expert = good;
        no_expert[4] = id(u32::MAX); // the device's -1: no expert beat -inf
        assert_eq!(bad_layer(&no_expert, 4, 2), Some(1));
        let mut nan = good;
        nan[3] = f32::NAN;
        assert_eq!(bad_layer(&nan, 4, 2), Some(0));
        let mut out_of_range = good;
        out_of_range[1] = id(4);
        assert_eq!(bad_layer(&out_of_range, 4, 2), Some(0));
    }
}
