//! What the expert engine counts: `ExpertStats` (per variant hits and misses, loads, CPU
//! experts, prefetch accuracy, host time), summed over runs and printed by `--stats`.

use std::fmt::Write;

/// Expert-engine counters since the last reset, per variant in the file's order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    /// (variant name, expert uses served from the cache or memory, uses that needed a load).
    pub per_variant: Vec<VariantStats>,
    /// Routes the precision scorer skipped.
    pub skipped: u64,
    /// Routes scored high that ran in the low variant because only it was cached.
    pub substituted: u64,
    /// Missing experts computed by CPU helper threads instead of being loaded.
    pub cpu_computed: u64,
    /// Bytes copied into the expert cache (demand and prefetch).
    pub bytes_loaded: u64,
    /// Bytes read from the slow tier (the SSD) rather than host memory.
    pub bytes_from_disk: u64,
    /// High loads that completed a cached low copy's planes (nested ap8 widths), and the bytes
    /// they took from it slot to slot instead of over the link.
    pub upgraded: u64,
    pub upgrade_bytes: u64,
    /// Wall time spent waiting for loads, in seconds.
    pub load_seconds: f64,
    /// Wall time the compute thread spent waiting for CPU-computed experts, in seconds.
    pub cpu_wait_seconds: f64,
    /// Cooperative decode: seconds the CPU helpers sat idle between two consecutive layers'
    /// jobs of one token, in four parts: the finished layer's results going back to the device,
    /// the device's work between the layers, placing the next layer's experts, and the helper
    /// task starting.
    pub cpu_gaps: [f64; 4],
    /// The placing part (`cpu_gaps[2]`) in four: planning, the experts placed (loads queued),
    /// the next layers predicted (the stacked gates' product and its read-back), x's read-back and the
    /// hand-over.
    pub cpu_placing: [f64; 4],
    /// Cooperative decode: the CPU helpers' parallel passes, the helper threads that took part
    /// in them (summed over passes), and their ragged ends (seconds, summed).
    pub cpu_passes: u64,
    pub cpu_pass_threads: u64,
    pub cpu_pass_spread_seconds: f64,
    /// Prefetch loads issued, and how many of them were used before eviction.
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    /// Prefetches dropped while loading: their layer did not route their expert.
    pub prefetch_cancelled: u64,
    /// Cooperative mode: experts whose load had not landed when needed, computed by the CPU
    /// (counted in `cpu_computed` too).
    pub late_to_cpu: u64,
    /// Cooperative mode: CPU-computed misses also loaded into the cache over an idle link, and
    /// the misses that found the link idle and load-behind wanted.
    pub loaded_behind: u64,
    pub behind_chances: u64,
    /// Bytes of the experts the CPU computed, each at its variant's size.
    pub cpu_bytes: u64,
    /// Seconds the loader spent moving `bytes_loaded` (its link busy time).
    pub link_seconds: f64,
    /// Seconds CPU helpers spent computing experts (their busy time).
    pub cpu_seconds: f64,
    /// Per prediction distance d = 1, 2, ...: (experts predicted, of those actually routed).
    pub prediction: Vec<(u64, u64)>,
    /// Decode tokens routed and computed on the device with no host round trip per layer.
    pub device_routed: u64,
    /// Host seconds spent counting those tokens' routes after they arrived.
    pub device_account_seconds: f64,
    /// Host-routed decode layers whose experts ran through the routed kernels.
    pub slot_routed_layers: u64,
    /// Decode layers with experts on the CPU whose cached experts ran through the routed
    /// kernels.
    pub slot_part_layers: u64,
    /// Prefill layers whose experts ran grouped (a launch a product for all of them).
    pub grouped_layers: u64,
    /// Decode layers whose cached experts were computed while their other experts' loads landed.
    pub early_layers: u64,
    /// Host-routed decode layers, and the host's seconds in the engine for them: in all (a wait
    /// for the layer's CPU experts included), and before their experts' launches began
    /// (planning, placing, predicting, the CPU hand-over).
    pub host_layers: u64,
    pub host_layer_seconds: f64,
    pub host_before_launch_seconds: f64,
    /// Gated decode tokens (routed on the device with part of the experts cached), the layers
    /// held at their gate for a miss, the host's seconds placing those misses, and its seconds
    /// following the tokens behind the device (those included).
    pub gated_tokens: u64,
    pub gated_stalls: u64,
    pub gated_stall_seconds: f64,
    pub gated_follow_seconds: f64,
    /// Host seconds submitting recorded decode steps (CUDA graph launches).
    pub graph_launch_seconds: f64,
    /// Host seconds reading results back (logits, device routes), waiting for the device
    /// included.
    pub read_back_seconds: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct VariantStats {
    pub name: String,
    pub hits: u64,
    pub misses: u64,
}

/// What an expert executor reports about itself.
pub trait ExpertReport {
    fn describe(&self) -> String;
    fn stats(&self) -> ExpertStats {
        ExpertStats::default()
    }
    fn reset_stats(&mut self) {}
}

impl ExpertStats {
    pub fn uses(&self) -> u64 {
        self.per_variant.iter().map(|v| v.hits + v.misses).sum()
    }
    pub fn misses(&self) -> u64 {
        self.per_variant.iter().map(|v| v.misses).sum()
    }

    /// Add `s` into self (per-variant rows matched by position).
    pub fn accumulate(&mut self, s: &ExpertStats) {
        if self.per_variant.is_empty() {
            self.per_variant = s
                .per_variant
                .iter()
                .map(|v| VariantStats {
                    name: v.name.clone(),
                    ..Default::default()
                })
                .collect();
        }
        for (t, v) in self.per_variant.iter_mut().zip(&s.per_variant) {
            t.hits += v.hits;
            t.misses += v.misses;
        }
        if self.prediction.len() < s.prediction.len() {
            self.prediction.resize(s.prediction.len(), (0, 0));
        }
        for (t, v) in self.prediction.iter_mut().zip(&s.prediction) {
            t.0 += v.0;
            t.1 += v.1;
        }
        for (a, b) in self.cpu_gaps.iter_mut().zip(s.cpu_gaps) {
            *a += b;
        }
        for (a, b) in self.cpu_placing.iter_mut().zip(s.cpu_placing) {
            *a += b;
        }
        let counts = [
            (&mut self.skipped, s.skipped),
            (&mut self.substituted, s.substituted),
            (&mut self.cpu_computed, s.cpu_computed),
            (&mut self.bytes_loaded, s.bytes_loaded),
            (&mut self.bytes_from_disk, s.bytes_from_disk),
            (&mut self.upgraded, s.upgraded),
            (&mut self.upgrade_bytes, s.upgrade_bytes),
            (&mut self.cpu_passes, s.cpu_passes),
            (&mut self.cpu_pass_threads, s.cpu_pass_threads),
            (&mut self.prefetch_issued, s.prefetch_issued),
            (&mut self.prefetch_used, s.prefetch_used),
            (&mut self.prefetch_cancelled, s.prefetch_cancelled),
            (&mut self.late_to_cpu, s.late_to_cpu),
            (&mut self.loaded_behind, s.loaded_behind),
            (&mut self.behind_chances, s.behind_chances),
            (&mut self.cpu_bytes, s.cpu_bytes),
            (&mut self.device_routed, s.device_routed),
            (&mut self.slot_routed_layers, s.slot_routed_layers),
            (&mut self.slot_part_layers, s.slot_part_layers),
            (&mut self.grouped_layers, s.grouped_layers),
            (&mut self.early_layers, s.early_layers),
            (&mut self.host_layers, s.host_layers),
            (&mut self.gated_tokens, s.gated_tokens),
            (&mut self.gated_stalls, s.gated_stalls),
        ];
        for (a, b) in counts {
            *a += b;
        }
        let seconds = [
            (&mut self.load_seconds, s.load_seconds),
            (&mut self.cpu_wait_seconds, s.cpu_wait_seconds),
            (&mut self.cpu_pass_spread_seconds, s.cpu_pass_spread_seconds),
            (&mut self.link_seconds, s.link_seconds),
            (&mut self.cpu_seconds, s.cpu_seconds),
            (&mut self.device_account_seconds, s.device_account_seconds),
            (&mut self.graph_launch_seconds, s.graph_launch_seconds),
            (&mut self.read_back_seconds, s.read_back_seconds),
            (&mut self.host_layer_seconds, s.host_layer_seconds),
            (&mut self.gated_stall_seconds, s.gated_stall_seconds),
            (&mut self.gated_follow_seconds, s.gated_follow_seconds),
            (
                &mut self.host_before_launch_seconds,
                s.host_before_launch_seconds,
            ),
        ];
        for (a, b) in seconds {
            *a += b;
        }
    }

    /// `--stats`: what the engine did over `tokens` decoded tokens taking `seconds`, as lines.
    pub fn report(&self, tokens: usize, seconds: f64) -> String {
        let mut out = String::new();
        // (Writing into a String cannot fail.)
        let _ = self.report_loads(&mut out, tokens, seconds);
        let _ = self.report_device(&mut out, tokens);
        out
    }

    fn report_loads(&self, out: &mut String, tokens: usize, seconds: f64) -> std::fmt::Result {
        let s = self;
        let n = tokens.max(1) as f64;
        let ms = |x: f64| 1e3 * x / n;
        writeln!(out, "expert engine, per decoded token ({tokens} tokens):")?;
        writeln!(
            out,
            "  time {:.2} ms = waiting for loads {:.2} + waiting for CPU experts {:.2} + compute (attention, routing, cached experts) {:.2}",
            ms(seconds),
            ms(s.load_seconds),
            ms(s.cpu_wait_seconds),
            ms((seconds - s.load_seconds - s.cpu_wait_seconds).max(0.0))
        )?;
        for v in s.per_variant.iter().filter(|v| v.hits + v.misses > 0) {
            writeln!(
                out,
                "  {:<10} uses {:.2}  hits {:.2}  misses {:.2}  (hit rate {:.1}%)",
                v.name,
                (v.hits + v.misses) as f64 / n,
                v.hits as f64 / n,
                v.misses as f64 / n,
                100.0 * v.hits as f64 / (v.hits + v.misses).max(1) as f64
            )?;
        }
        writeln!(
            out,
            "  skipped {:.2}  high->low substitutions {:.2}  computed on the CPU {:.2} ({:.2} while their load was in flight; {:.2} loaded behind them, of {:.2} with the link idle and load-behind wanted)",
            s.skipped as f64 / n,
            s.substituted as f64 / n,
            s.cpu_computed as f64 / n,
            s.late_to_cpu as f64 / n,
            s.loaded_behind as f64 / n,
            s.behind_chances as f64 / n
        )?;
        let issued = s.prefetch_issued.max(1) as f64;
        writeln!(
            out,
            "  bytes loaded {:.1} MB ({:.1} MB from the SSD), streamed by CPU experts {:.1} MB; prefetches {:.2} ({:.0}% used, {:.0}% dropped while loading: their layer did not route them)",
            s.bytes_loaded as f64 / n / 1e6,
            s.bytes_from_disk as f64 / n / 1e6,
            s.cpu_bytes as f64 / n / 1e6,
            s.prefetch_issued as f64 / n,
            100.0 * s.prefetch_used as f64 / issued,
            100.0 * s.prefetch_cancelled as f64 / issued
        )?;
        if s.upgraded > 0 {
            writeln!(
                out,
                "  high loads completing a cached low copy's planes {:.2} ({:.1} MB taken from it, not loaded)",
                s.upgraded as f64 / n,
                s.upgrade_bytes as f64 / n / 1e6
            )?;
        }
        let rate = |bytes: u64, secs: f64| {
            if secs > 0.0 {
                format!("{:.1} GB/s", bytes as f64 / secs / 1e9)
            } else {
                "-".into()
            }
        };
        writeln!(
            out,
            "  link busy {:.2} ms ({}); CPU experts busy {:.2} ms ({} of weights)",
            ms(s.link_seconds),
            rate(s.bytes_loaded, s.link_seconds),
            ms(s.cpu_seconds),
            rate(s.cpu_bytes, s.cpu_seconds)
        )?;
        let g = s.cpu_gaps;
        if g.iter().sum::<f64>() > 0.0 {
            writeln!(
                out,
                "  CPU experts idle between layers {:.2} ms = results back {:.2} + attention and routing {:.2} + placing {:.2} + task start {:.2}",
                ms(g.iter().sum()),
                ms(g[0]),
                ms(g[1]),
                ms(g[2]),
                ms(g[3])
            )?;
            let p = s.cpu_placing;
            writeln!(
                out,
                "  placing {:.2} ms = planning {:.2} + experts placed, loads queued {:.2} + next layers predicted {:.2} + x read back and handed over {:.2}",
                ms(g[2]),
                ms(p[0]),
                ms(p[1]),
                ms(p[2]),
                ms(p[3])
            )?;
        }
        if s.cpu_passes > 0 {
            let p = s.cpu_passes as f64;
            writeln!(
                out,
                "  CPU passes {:.1} per token: {:.1} helper threads took part in each; the last finished {:.3} ms after the first",
                p / n,
                s.cpu_pass_threads as f64 / p,
                1e3 * s.cpu_pass_spread_seconds / p
            )?;
        }
        Ok(())
    }

    fn report_device(&self, out: &mut String, tokens: usize) -> std::fmt::Result {
        let s = self;
        let n = tokens.max(1) as f64;
        if s.device_routed > 0 {
            writeln!(
                out,
                "  routed on the device (every expert resident): {} of {tokens} tokens; counting their routes on the host took {:.1} us a token",
                s.device_routed,
                1e6 * s.device_account_seconds / s.device_routed as f64
            )?;
        }
        if s.gated_tokens > 0 {
            let per = |v: f64| v / s.gated_tokens as f64;
            writeln!(
                out,
                "  gated on the device (part of the experts cached, a layer held for the host on a miss): {} of {tokens} tokens; {:.2} layers held a token, the host {:.1} us placing each; following a token took the host {:.1} us",
                s.gated_tokens,
                per(s.gated_stalls as f64),
                1e6 * s.gated_stall_seconds / s.gated_stalls.max(1) as f64,
                1e6 * per(s.gated_follow_seconds)
            )?;
        }
        if s.graph_launch_seconds > 0.0 || s.read_back_seconds > 0.0 {
            writeln!(
                out,
                "  host per token: {:.1} us submitting recorded decode steps (CUDA graphs), {:.1} us reading results back (waiting for the device included)",
                1e6 * s.graph_launch_seconds / n,
                1e6 * s.read_back_seconds / n
            )?;
        }
        if s.slot_routed_layers > 0 {
            writeln!(
                out,
                "  host-routed layers through the routed kernels (experts in slots of one precision): {:.2} per token",
                s.slot_routed_layers as f64 / n
            )?;
        }
        if s.slot_part_layers > 0 {
            writeln!(
                out,
                "  layers with CPU experts whose cached ones ran through the routed kernels: {:.2} per token",
                s.slot_part_layers as f64 / n
            )?;
        }
        if s.early_layers > 0 {
            writeln!(
                out,
                "  layers computing cached experts while the others load: {:.2} per token",
                s.early_layers as f64 / n
            )?;
        }
        if s.host_layers > 0 {
            let per = |secs: f64| 1e6 * secs / s.host_layers as f64;
            writeln!(
                out,
                "  host in the engine per host-routed decode layer: {:.1} us, {:.1} us of it before the layer's experts are launched",
                per(s.host_layer_seconds),
                per(s.host_before_launch_seconds)
            )?;
        }
        for (d, (p, c)) in s.prediction.iter().enumerate() {
            if *p > 0 {
                writeln!(
                    out,
                    "  prediction {} layer(s) ahead: {:.1}% of predicted experts routed",
                    d + 1,
                    100.0 * *c as f64 / *p as f64
                )?;
            }
        }
        Ok(())
    }
}

impl<D: crate::model::ExpertDevice> ExpertReport for super::Engine<'_, D> {
    fn describe(&self) -> String {
        let v = self.file.variants();
        let (hs, ls) = self.slots();
        let total = self.file.n_layers() * self.file.n_experts();
        let mut s = format!(
            "{} in a device cache of {hs} slots ({:.0}% of {total} experts)",
            v[self.plan.high],
            100.0 * hs as f64 / total as f64,
        );
        if let Some(l) = self.plan.low {
            let th = self.plan.thresholds;
            s += &format!(" + {} in {ls} slots (T1 {}, T2 {})", v[l], th.t1, th.t2);
        }
        let mapped = if self.slots.mapped() {
            " of mapped host memory"
        } else {
            ""
        };
        s += &format!(
            ", {}{mapped}, policy {:?}",
            super::config::size(self.slots.arena_bytes()),
            self.slots.cache.policy()
        );
        if let Some(p) = &self.prefetch {
            s += &format!(", prefetch {} layers", p.predictor.depth());
            if p.min_weight() > 0.0 {
                s += &format!(" (predicted weight >= {})", p.min_weight());
            }
        }
        if self.routing.allowed {
            s += ", decode routed on the device";
        }
        if let Some(c) = &self.coop {
            s += &format!(", CPU experts on {} threads", c.pool.threads());
        }
        if self.tier == super::Tier::Disk {
            s += ", loads from the SSD";
        } else if self.direct {
            s += ", loads by DMA from page-locked file pages";
        } else if !self.slots.mapped() {
            s += ", loads through pinned staging";
        }
        if let Some(bw) = self.pace {
            s += &format!(", loads paced to {:.1} GB/s", bw / 1e9);
        }
        s
    }

    fn stats(&self) -> ExpertStats {
        use crate::experts::cache::PoolKind;
        use std::sync::atomic::Ordering;
        // A device-routed token whose routes are held counts as counted: every one of its
        // expert uses a hit in the high pool.
        let held = u64::from(self.routing.held);
        let high = self.slots.pool(PoolKind::High).variant;
        let held_hits = held * (self.file.n_layers() * self.top_k) as u64;
        let c = &self.count;
        let per_variant = self
            .file
            .variants()
            .iter()
            .enumerate()
            .map(|(i, v)| VariantStats {
                name: v.to_string(),
                hits: c.hits[i] + if i == high { held_hits } else { 0 },
                misses: c.misses[i],
            })
            .collect();
        let prediction = self
            .prefetch
            .as_ref()
            .map(|p| {
                let acc = p.predictor.accuracy();
                acc.iter().map(|a| (a.predicted, a.correct)).collect()
            })
            .unwrap_or_default();
        let passes = self.coop.as_ref().map(|c| c.passes()).unwrap_or_default();
        let lc = &self.slots.counters;
        let load = |a: &std::sync::atomic::AtomicU64, base: u64| a.load(Ordering::Relaxed) - base;
        let secs = |d: std::time::Duration| d.as_secs_f64();
        ExpertStats {
            per_variant,
            cpu_passes: passes.passes,
            cpu_pass_threads: passes.threads,
            cpu_pass_spread_seconds: passes.spread_seconds,
            skipped: c.skipped,
            substituted: c.substituted,
            cpu_computed: c.cpu_computed,
            bytes_loaded: load(&lc.bytes, c.base.0),
            bytes_from_disk: load(&lc.disk_bytes, c.base.1),
            upgraded: self.slots.upgrades.0,
            upgrade_bytes: self.slots.upgrades.1,
            load_seconds: secs(self.slots.wait),
            cpu_wait_seconds: self.coop.as_ref().map_or(0.0, |c| secs(c.wait)),
            cpu_gaps: self
                .coop
                .as_ref()
                .map_or([0.0; 4], |c| c.gaps.map(|d| d.as_secs_f64())),
            cpu_placing: self
                .coop
                .as_ref()
                .map_or([0.0; 4], |c| c.placing.map(|d| d.as_secs_f64())),
            prefetch_issued: self.prefetch.as_ref().map_or(0, |p| p.issued),
            prefetch_used: c.prefetch_used,
            prefetch_cancelled: self.prefetch.as_ref().map_or(0, |p| p.cancelled),
            late_to_cpu: c.late_to_cpu,
            loaded_behind: c.loaded_behind,
            behind_chances: c.behind_chances,
            cpu_bytes: c.cpu_bytes,
            link_seconds: load(&lc.nanos, c.base.2) as f64 / 1e9,
            cpu_seconds: self.coop.as_ref().map_or(0.0, |c| c.busy),
            prediction,
            device_routed: self.routing.tokens + held,
            device_account_seconds: secs(self.routing.account),
            slot_routed_layers: c.slot_layers,
            slot_part_layers: c.slot_part_layers,
            grouped_layers: c.grouped_layers,
            early_layers: c.early_layers,
            host_layers: c.host_layers,
            host_layer_seconds: secs(c.host_in),
            host_before_launch_seconds: secs(c.host_before),
            gated_tokens: c.gated_tokens,
            gated_stalls: c.gated_stalls,
            gated_stall_seconds: secs(c.gated_stall_host),
            gated_follow_seconds: secs(c.gated_follow),
            // The session fills in the backend's host times.
            ..ExpertStats::default()
        }
    }

    fn reset_stats(&mut self) {
        use std::sync::atomic::Ordering;
        // A held token belongs to the counts being cleared (counting it cannot fail here: its
        // routes were checked when they arrived, and no trace is written while one is held).
        if let Err(e) = self.count_held() {
            log::warn!("expert engine: counting the last device-routed token: {e}");
        }
        let lc = &self.slots.counters;
        let nv = self.file.variants().len();
        self.count = super::Counters {
            hits: vec![0; nv],
            misses: vec![0; nv],
            base: (
                lc.bytes.load(Ordering::Relaxed),
                lc.disk_bytes.load(Ordering::Relaxed),
                lc.nanos.load(Ordering::Relaxed),
            ),
            ..super::Counters::default()
        };
        self.routing.tokens = 0;
        self.routing.account = std::time::Duration::ZERO;
        self.slots.wait = std::time::Duration::ZERO;
        self.slots.upgrades = (0, 0);
        if let Some(c) = self.coop.as_mut() {
            c.reset();
        }
        if let Some(p) = self.prefetch.as_mut() {
            p.issued = 0;
            p.cancelled = 0;
            p.predictor.reset_stats();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ExpertStats;

    /// The CPU helpers' idle time is reported per token in its four parts, and the placing part
    /// again in its own four; neither line without cooperative decode.
    #[test]
    fn idle_time_and_placing_are_reported_per_token_in_parts() {
        let mut s = ExpertStats {
            cpu_gaps: [0.002, 0.004, 0.008, 0.002],
            cpu_placing: [0.001, 0.002, 0.004, 0.001],
            ..ExpertStats::default()
        };
        let r = s.report(2, 0.1);
        assert!(
            r.contains("CPU experts idle between layers 8.00 ms = results back 1.00 + attention and routing 2.00 + placing 4.00 + task start 1.00"),
            "{r}"
        );
        assert!(
            r.contains("placing 4.00 ms = planning 0.50 + experts placed, loads queued 1.00 + next layers predicted 2.00 + x read back and handed over 0.50"),
            "{r}"
        );
        let twice = {
            let mut t = s.clone();
            t.accumulate(&s);
            t
        };
        assert_eq!(twice.cpu_placing, [0.002, 0.004, 0.008, 0.002]);
        s.cpu_gaps = [0.0; 4];
        assert!(!s.report(2, 0.1).contains("placing"));
    }

    /// Gated decode reports its tokens, the layers held a token and the host's time at them.
    #[test]
    fn gated_tokens_report_their_held_layers() {
        let s = ExpertStats {
            gated_tokens: 4,
            gated_stalls: 6,
            gated_stall_seconds: 6.0 * 150e-6,
            gated_follow_seconds: 4.0 * 2e-3,
            ..ExpertStats::default()
        };
        let r = s.report(4, 0.1);
        assert!(
            r.contains("4 of 4 tokens; 1.50 layers held a token, the host 150.0 us placing each; following a token took the host 2000.0 us"),
            "{r}"
        );
        let mut twice = s.clone();
        twice.accumulate(&s);
        assert_eq!((twice.gated_tokens, twice.gated_stalls), (8, 12));
        assert!(!ExpertStats::default().report(4, 0.1).contains("gated"));
    }

    /// The host's time in the engine is reported per host-routed decode layer, and summed when
    /// stats accumulate.
    #[test]
    fn host_time_is_reported_per_host_routed_layer() {
        let s = ExpertStats {
            host_layers: 96,
            host_layer_seconds: 96.0 * 20e-6,
            host_before_launch_seconds: 96.0 * 12e-6,
            ..ExpertStats::default()
        };
        let r = s.report(2, 0.1);
        assert!(
            r.contains("host in the engine per host-routed decode layer: 20.0 us, 12.0 us of it before the layer's experts are launched"),
            "{r}"
        );
        let mut twice = s.clone();
        twice.accumulate(&s);
        assert_eq!(twice.host_layers, 192);
        assert!(twice.report(4, 0.1).contains("20.0 us, 12.0 us"));
        assert!(!ExpertStats::default()
            .report(2, 0.1)
            .contains("host in the engine"));
    }
}
