//! Decode routed on the device: once every expert is resident in one precision (exact plan, no
//! CPU experts), a decode token routes and computes its experts with no host round trip per
//! layer; its routes are read back once, after its logits, and counted as the host-routed path
//! counts them (hits, the cache policy's use counters, the trace).

use std::time::{Duration, Instant};

use crate::experts::cache::PoolKind;
use crate::model::{ExpertDevice, Route};
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
}

impl<D: ExpertDevice> DeviceRouting<D> {
    pub fn new(allowed: bool) -> Self {
        DeviceRouting {
            allowed,
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

    /// Read the queued routes into `host`, every expert index checked against `n_experts`.
    pub fn fetch(&mut self, dev: &D, n_experts: usize, k: usize) -> crate::Result<()> {
        let Some(r) = self.resident.as_mut() else {
            return Ok(());
        };
        let got = dev.read_routes(r)?;
        self.host.clear();
        self.host.extend_from_slice(got);
        let bad = self
            .host
            .chunks_exact(2 * k)
            .position(|lr| lr[..k].iter().any(|e| e.to_bits() as usize >= n_experts));
        match bad {
            Some(l) => Err(Error::Invalid(format!(
                "routing: layer {l} found no expert among {n_experts} (router logits not finite?)"
            ))),
            None => Ok(()),
        }
    }

    /// Time spent counting, from `arrived`.
    pub fn counted(&mut self, arrived: Instant) {
        self.tokens += 1;
        self.account += arrived.elapsed();
    }
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
        if self.slots.cache.len(PoolKind::High) < nl * ne {
            return Ok(false);
        }
        for slot in 0..self.slots.cache.capacity(PoolKind::High) {
            self.slots.ready(dev, PoolKind::High, slot)?;
        }
        let mut experts = Vec::with_capacity(nl * ne);
        for l in 0..nl {
            for e in 0..ne {
                let slot = self
                    .slots
                    .cache
                    .lookup(PoolKind::High, (l, e))
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "expert cache: layer {l} expert {e} missing from a full cache"
                        ))
                    })?;
                experts.push(self.slots.expert(dev, PoolKind::High, slot));
            }
        }
        match dev.resident(&experts, ne, self.top_k)? {
            Some(r) => {
                log::info!("every expert is resident: decode routes on the device");
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
        self.routing.fetch(dev, self.file.n_experts(), self.top_k)?;
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
            self.slots.cache.set_layer(l);
            self.plan.plan_layer(&routes, 1, &mut lp);
            if let Some(tw) = self.trace.as_mut() {
                tw.record_layer(l, &routes, &lp.decisions, 1, None)?;
            }
            for (r, dec) in routes.iter().zip(&lp.decisions) {
                self.slots.cache.record_use((l, r.expert), *dec);
            }
            self.count.hits[high] += k as u64;
        }
        self.layer_plan = lp;
        self.routing.host = host;
        self.routing.counted(arrived);
        Ok(())
    }
}
