//! Gated decode: an offloaded decode token routed on the device, with no host round trip in a
//! layer whose experts are all cached. The device keeps a directory of the cached experts (the
//! resident table, with a presence flag per expert). Each layer's routes go to a mailbox the
//! host reads behind the device; a layer with an absent expert holds the compute stream at its
//! gate until the host has placed the miss (its load queued, the directory changed on the
//! gate's stream after the load) and opened it. The host follows every layer as the host-routed
//! path would count it (the cache's use counters, the trace), so the cache and its policy are
//! the same; it only no longer stands between the layers.
//!
//! Taken for one precision without prefetch (a prefetch would change the cache under layers
//! already queued), device slots, and the routed kernels' layouts; with CPU experts, a held
//! layer's misses may be computed on the CPU from the x its mailbox brings (integer SwiGLU
//! experts: their result joins the routed kernels' sum on the device), and loaded behind it:
//! the gate does not wait for such a load, which joins the directory before the next token
//! (no later layer of this token routes its expert).

use std::time::{Duration, Instant};

use super::coop::CpuJob;
use super::layer::{top1_of, Place, Run};
use super::Engine;
use crate::experts::cache::PoolKind;
use crate::model::experts::ExpertFfn;
use crate::model::{ExpertDevice, ModelError, Route};
use crate::Error;

/// How long the host waits for a layer's routes before it calls the device stuck.
const MAIL_TIMEOUT: Duration = Duration::from_secs(60);

impl<D: ExpertDevice> Engine<'_, D> {
    /// Before a gated token's launches: the directory brought level with the cache (what
    /// changed since the last token: prefill's misses; the compute stream waits for their
    /// loads first), the token's routes where they are `replayed` ([layers][k]), every mailbox
    /// emptied; the token is followed in end_forward.
    pub(super) fn gate_begin(&mut self, dev: &D, replayed: Option<&[Route]>) -> crate::Result<()> {
        if self.routing.follow {
            // The last gated token failed before it was followed: its gates opened, its work
            // ended, before this one.
            self.abandon(dev)?;
        }
        self.count_held()?;
        let changes = self.directory_changes(dev, None)?;
        let k = self.top_k;
        let r = self
            .routing
            .resident
            .as_mut()
            .ok_or_else(|| Error::Invalid("gated decode without its directory".into()))?;
        if !changes.0.is_empty() {
            dev.gate_update(r, &changes.0, None, &[])?;
        }
        let floats = replayed.map(|routes| {
            let mut v = Vec::with_capacity(2 * routes.len());
            for lr in routes.chunks(k.max(1)) {
                v.extend(lr.iter().map(|r| f32::from_bits(r.expert as u32)));
                v.extend(lr.iter().map(|r| r.weight));
            }
            v
        });
        dev.gate_replay(r, floats.as_deref())?;
        dev.gate_reset(r)?;
        self.routing.follow = true;
        Ok(())
    }

    /// After a gated token's launches: follow the layers not followed yet (`follow_until`),
    /// then check that the last layer's gate was not given up after its mailbox was read.
    pub(super) fn gate_follow(&mut self, dev: &D) -> crate::Result<()> {
        let nl = self.file.n_layers();
        self.follow_until(dev, nl)?;
        self.routing.followed = 0;
        let mut mail = vec![0.0f32; 2 * self.top_k];
        let last = match nl.checked_sub(1) {
            Some(last) => self.wait_mail(dev, last, &mut mail).map(|_| ()),
            None => Ok(()),
        };
        if last.is_err() {
            self.abandon(dev)?;
        }
        last
    }

    /// A failed gated token: every gate opened (its work ends and is thrown away), and the
    /// device waited for, before the error returns.
    fn abandon(&mut self, dev: &D) -> crate::Result<()> {
        self.routing.follow = false;
        self.routing.followed = 0;
        if let Some(r) = self.routing.resident.as_mut() {
            dev.gate_open_all(r)?;
        }
        dev.synchronize()
    }

    /// Follow the gated token's layers `followed..end`, counting their routes and placing the
    /// misses of the layers that wait. A token launched as it runs (not from a CUDA graph) is
    /// followed while it launches, `Tuning::gated_follow_lag` layers behind: a held gate must
    /// not wait for a host blocked in a launch (the device's queue of launches is finite). On a
    /// failure, `abandon`.
    pub(super) fn follow_until(&mut self, dev: &D, end: usize) -> crate::Result<()> {
        let arrived = Instant::now();
        let followed = self.follow_layers(dev, end);
        self.slots.compute_free = false;
        self.count.gated_follow += arrived.elapsed();
        if followed.is_err() {
            self.abandon(dev)?;
        }
        followed
    }

    fn follow_layers(&mut self, dev: &D, end: usize) -> crate::Result<()> {
        let (ne, k) = (self.file.n_experts(), self.top_k);
        let from = self.routing.followed;
        if from >= end {
            return Ok(());
        }
        if from == 0 {
            self.decoded += 1;
            self.count.gated_tokens += 1;
            self.slots.cache.begin_token();
        }
        let high = self.slots.pool(PoolKind::High).variant;
        let mut mail = vec![0.0f32; 2 * k];
        let mut routes = vec![Route::default(); k];
        let mut lp = std::mem::take(&mut self.layer_plan);
        let followed = (from..end).try_for_each(|l| {
            self.routing.followed = l;
            let miss = self.wait_mail(dev, l, &mut mail)?;
            for (j, r) in routes.iter_mut().enumerate() {
                let expert = mail[j].to_bits() as usize;
                let weight = mail[k + j];
                if expert >= ne || !weight.is_finite() {
                    return Err(
                        ModelError::non_finite(self.file.path(), Some(l), "router logits").into(),
                    );
                }
                *r = Route { expert, weight };
            }
            self.count_routed_layer(l, &routes, &mut lp)?;
            if miss {
                let started = Instant::now();
                self.gated_layer(dev, l, &routes, &lp)?;
                self.count.gated_stalls += 1;
                self.count.gated_stall_host += started.elapsed();
                return Ok(());
            }
            if let Some(r) = routes.iter().find(|r| {
                self.slots
                    .cache
                    .lookup(PoolKind::High, (l, r.expert))
                    .is_none()
            }) {
                return Err(Error::Invalid(format!(
                    "expert directory: layer {l} expert {} ran on the device but is not cached (a bookkeeping bug)",
                    r.expert
                )));
            }
            self.count.hits[high] += k as u64;
            if let Some(c) = self.coop.as_mut() {
                for r in &routes {
                    c.behind.hit((l, r.expert), self.decoded);
                }
            }
            Ok(())
        });
        self.layer_plan = lp;
        followed?;
        self.routing.followed = end;
        Ok(())
    }

    /// Spin until layer `layer`'s routes are in its mailbox; whether the device waits.
    fn wait_mail(&self, dev: &D, layer: usize, mail: &mut [f32]) -> crate::Result<bool> {
        let r = self
            .routing
            .resident
            .as_ref()
            .ok_or_else(|| Error::Invalid("gated decode without its directory".into()))?;
        let started = Instant::now();
        loop {
            if let Some(miss) = dev.gate_mail(r, layer, mail)? {
                return Ok(miss);
            }
            if started.elapsed() > MAIL_TIMEOUT {
                return Err(Error::Invalid(format!(
                    "{}: no routes from layer {layer} in {} s; the device stopped answering",
                    dev.device_name(),
                    MAIL_TIMEOUT.as_secs()
                )));
            }
            std::hint::spin_loop();
        }
    }

    /// A layer the device holds at its gate: every group placed as the host-routed path places
    /// it (a hit, or a slot claimed by the policy with its load queued), the directory changed
    /// after those loads and the gate opened, on the gate's stream.
    fn gated_layer(
        &mut self,
        dev: &D,
        layer: usize,
        routes: &[Route],
        lp: &crate::experts::LayerPlan,
    ) -> crate::Result<()> {
        let load_busy = self.slots.link_backlog();
        let mut run = Run::new(
            (true, self.file.expert_dims().0),
            top1_of(routes),
            lp.groups.len(),
            load_busy,
        );
        self.slots.compute_free = true;
        let mut placed = Vec::with_capacity(lp.groups.len());
        for g in &lp.groups {
            match self.place(dev, layer, g, &mut run)? {
                Some(Place::Slot(kind, _)) => {
                    self.slots.cache.protect(kind, (layer, g.expert));
                    placed.push((kind, g.expert));
                }
                Some(Place::Cpu) => run.cpu_jobs.push(CpuJob {
                    expert: g.expert,
                    variant: self.variant_of(g.precision),
                    weight: g.rows[0].1,
                }),
                // With CPU experts a miss no slot can take goes to the CPU.
                None if self.coop.is_some() => {
                    let v = self.variant_of(g.precision);
                    self.count_cpu(v, &mut run.cpu_busy);
                    run.cpu_jobs.push(CpuJob {
                        expert: g.expert,
                        variant: v,
                        weight: g.rows[0].1,
                    });
                }
                None => {
                    return Err(Error::Invalid(format!(
                        "expert cache: no slot can be freed for layer {layer} expert {} ({} slots)",
                        g.expert,
                        self.slots.cache.capacity(PoolKind::High)
                    )))
                }
            }
        }
        self.slots.compute_free = false;
        // A CPU expert that is cached now was loaded behind the CPU: present from the next token.
        for j in &run.cpu_jobs {
            let key = (layer, j.expert);
            if self.slots.cache.lookup(PoolKind::High, key).is_some() {
                self.routing.behind.push(key);
            }
        }
        let (changes, events) = self.directory_changes(dev, Some(layer))?;
        if !run.cpu_jobs.is_empty() {
            self.gated_cpu(dev, layer, routes, &run.cpu_jobs)?;
        }
        let r = self
            .routing
            .resident
            .as_mut()
            .ok_or_else(|| Error::Invalid("gated decode without its directory".into()))?;
        let after: Vec<&D::Event> = events.iter().collect();
        dev.gate_update(r, &changes, Some(layer), &after)?;
        for (kind, e) in placed {
            self.slots.cache.unprotect(kind, (layer, e));
        }
        self.check_holds(layer)
    }

    /// A held layer's experts placed on the CPU: computed now from the x its mailbox holds (the
    /// device waits at the gate anyway), their routes weighted 0 on the device (the routed
    /// kernels then add nothing for them) and their sum added to the layer's, before the gate
    /// opens.
    fn gated_cpu(
        &mut self,
        dev: &D,
        layer: usize,
        routes: &[Route],
        jobs: &[CpuJob],
    ) -> crate::Result<()> {
        let hidden = self.file.expert_dims().0;
        for j in jobs {
            self.file.verify_expert(layer, j.expert, j.variant)?;
        }
        let (Some(c), Some(r)) = (self.coop.as_mut(), self.routing.resident.as_mut()) else {
            return Err(Error::Invalid(
                "gated decode placed an expert on the CPU without CPU experts".into(),
            ));
        };
        let mut x = vec![0.0f32; hidden];
        dev.gate_x(r, layer, &mut x)?;
        c.set_x(layer, &x);
        let mut out = Vec::new();
        c.run(self.file, (jobs, &ExpertFfn::PLAIN), layer, &mut out)?;
        c.layer_done();
        out.resize(hidden, 0.0);
        let on_cpu = |e: usize| jobs.iter().any(|j| j.expert == e);
        let mut device: Vec<f32> = routes
            .iter()
            .map(|r| f32::from_bits(r.expert as u32))
            .collect();
        device.extend(
            routes
                .iter()
                .map(|r| if on_cpu(r.expert) { 0.0 } else { r.weight }),
        );
        dev.gate_cpu(r, layer, &device, &out)
    }

    /// The directory's changes since it was last brought level: every expert the cache placed
    /// or evicted since, present where it sits in a slot now. Between tokens (`layer` None) the
    /// compute stream waits for their loads, those loaded behind the CPU included; for a gated
    /// layer the loads' events come back, for the gate's stream to wait for, and the experts
    /// loaded behind the CPU wait for the next token.
    #[allow(clippy::type_complexity)]
    fn directory_changes(
        &mut self,
        dev: &D,
        layer: Option<usize>,
    ) -> crate::Result<(Vec<(usize, Option<D::Expert>)>, Vec<D::Event>)> {
        let ne = self.file.n_experts();
        let mut touched = self.slots.take_claims();
        match layer {
            None => touched.append(&mut self.routing.behind),
            Some(_) => touched.retain(|k| !self.routing.behind.contains(k)),
        }
        touched.sort_unstable();
        touched.dedup();
        let (mut changes, mut events) = (Vec::with_capacity(touched.len()), Vec::new());
        for key in touched {
            let at = match self.slots.cache.lookup(PoolKind::High, key) {
                Some(s) => {
                    match layer {
                        None => self.slots.ready(dev, PoolKind::High, s)?,
                        Some(_) => events.extend(self.slots.load_events(PoolKind::High, s)?),
                    }
                    Some(self.slots.expert(dev, PoolKind::High, s))
                }
                None => None,
            };
            changes.push((key.0 * ne + key.1, at));
        }
        Ok((changes, events))
    }
}
