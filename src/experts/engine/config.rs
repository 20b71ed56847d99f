//! The engine's configuration, built once from the flags and the platform profile, and the one
//! calculation of the expert cache's size.

use crate::experts::cache::{Policy, DEFAULT_LOW_SHARE};
use crate::experts::trace::TraceWriter;
use crate::experts::PrecisionPlan;
use crate::model::ModelConfig;
use crate::Error;

/// Where a missed expert's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The mapped file (host RAM through the page cache).
    Memory,
    /// The SSD, read with io_uring + O_DIRECT (pread where unavailable).
    Disk,
}

/// How big the expert cache is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// Exactly this many bytes (`--expert-cache`), rounded down to whole slots.
    Bytes(usize),
    /// What this much device memory in total leaves after the resident weights, the KV cache
    /// and the work buffers (`--gpu-mem`).
    DeviceTotal(usize),
    /// What the device has free, less the same (room for every expert with mapped slots).
    Free,
}

/// Paths of the engine that tests switch; the defaults are the decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Decode routes and computes on the device once every expert is resident in one precision
    /// (off: every layer's routes come to the host).
    pub device_routing: bool,
    /// Decode with part of the experts cached routes on the device too, a layer held at its gate
    /// for the host only on a miss (gated.rs; off: every layer's routes come to the host).
    /// benches/results/2026-12-07-h100-issue50-gated-decode.md
    pub gated_decode: bool,
    /// A host-routed decode layer whose experts all sit in slots of one pool runs them through
    /// the routed kernels (off: one expert at a time; the same sums).
    pub routed_slots: bool,
    /// A prefill layer whose experts all sit in slots of one pool runs them grouped, a launch a
    /// product (`ExpertDevice::experts_grouped`; off: one expert at a time; the same sums).
    pub grouped_prefill: bool,
    /// Fill the pools in layer order before the first token (off: the cache starts empty).
    pub preload: bool,
    /// A low-precision route whose high copy is cached runs in high precision (low precision is
    /// for misses; off to compare with a fixed per-route choice).
    pub upgrade_low: bool,
    /// A high-precision demand load whose low copy is cached, both widths of one ap8 blob, copies
    /// the low copy's planes slot to slot and loads only the missing ones (off: the whole blob).
    pub upgrade_planes: bool,
    /// A gated token launched as it runs (not replayed from a CUDA graph: kernels timed, or a
    /// graph refused) is followed this many layers behind its launches, not after them all: a
    /// layer held at its gate must not wait for a host blocked in a launch once the device's
    /// queue of launches is full. 0: each layer right after its own launches.
    pub gated_follow_lag: usize,
    /// A load whose loader thread makes no progress this long is an error (a disk or device
    /// that stopped answering), not a hang.
    pub load_stall: std::time::Duration,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            device_routing: true,
            gated_decode: true,
            routed_slots: true,
            grouped_prefill: true,
            preload: true,
            upgrade_low: true,
            upgrade_planes: true,
            gated_follow_lag: 4,
            load_stall: crate::experts::scheduler::DEFAULT_STALL,
        }
    }
}

/// Everything the engine is built from.
pub struct EngineConfig {
    pub plan: PrecisionPlan,
    pub policy: Policy,
    pub budget: Budget,
    /// The context the session holds (its KV cache counts against `Budget::DeviceTotal` and
    /// `Budget::Free`).
    pub ctx: usize,
    /// Share of the budget's bytes for the low-precision pool (when the plan has a low variant).
    pub low_share: f64,
    /// A high-precision miss whose low copy is cached runs in low precision (not the top-1).
    pub substitute_low: bool,
    /// Layers predicted ahead for prefetching (0: off).
    pub prefetch: usize,
    /// Only predicted experts with at least this gate weight are prefetched (0: all).
    pub prefetch_min_weight: f32,
    /// CPU threads computing missed decode experts (cooperative mode; 0: one per core).
    pub cpu_experts: Option<usize>,
    /// Cooperative mode: a miss the CPU computes is also loaded into the cache over an idle
    /// link, so that the cache keeps following the routing.
    pub load_behind: bool,
    pub tier: Tier,
    /// Slots in page-locked host memory the device reads in place (unified memory).
    pub mapped: bool,
    /// Page-lock the used variants' pages of the mapped file for direct copies (falls back to
    /// staging when they do not fit in half the RAM or the driver refuses).
    pub pin_file: bool,
    /// Pace loads to this many bytes per second (an emulated profile's link or SSD).
    pub pace_bytes_per_s: Option<f64>,
    pub tuning: Tuning,
    pub trace: Option<TraceWriter>,
}

/// Bytes kept free beside the expert cache: the cuBLAS workspace, events, fragmentation.
pub const RESERVE: usize = 256 << 20;

/// What the device holds besides the expert cache, bytes.
#[derive(Clone, Copy, Debug)]
pub struct DeviceMemory {
    /// Free now (the resident weights already uploaded).
    pub free: usize,
    /// The resident (non-expert) weights.
    pub resident: usize,
    /// Every expert in the plan's variants (high + low), padded.
    pub all_experts: usize,
}

impl EngineConfig {
    /// One variant, LRU, loads on demand from memory, the whole device free: the plain cache.
    pub fn simple(variant: usize, budget: Option<usize>) -> EngineConfig {
        EngineConfig {
            plan: PrecisionPlan::single(variant),
            policy: Policy::Lru,
            budget: budget.map_or(Budget::Free, Budget::Bytes),
            ctx: 0,
            low_share: DEFAULT_LOW_SHARE,
            substitute_low: false,
            prefetch: 0,
            prefetch_min_weight: 0.0,
            cpu_experts: None,
            load_behind: true,
            tier: Tier::Memory,
            mapped: false,
            pin_file: true,
            pace_bytes_per_s: None,
            tuning: Tuning::default(),
            trace: None,
        }
    }

    /// The expert cache's bytes for `model` on a device holding `mem`: the one place the
    /// budget is decided. Err names what does not fit.
    pub fn expert_budget(&self, model: &ModelConfig, mem: DeviceMemory) -> crate::Result<usize> {
        let others = mem.resident + kv_bytes(model, self.ctx) + work_bytes(model, self.ctx);
        match self.budget {
            Budget::Bytes(b) => Ok(b),
            Budget::DeviceTotal(total) => total.checked_sub(others).ok_or_else(|| {
                Error::Invalid(format!(
                    "--gpu-mem {}: the resident weights, KV cache and work buffers alone need {}",
                    size(total),
                    size(others)
                ))
            }),
            Budget::Free if self.mapped => Ok(mem.all_experts),
            Budget::Free => {
                let kept = RESERVE + kv_bytes(model, self.ctx) + work_bytes(model, self.ctx);
                Ok(mem.free.saturating_sub(kept))
            }
        }
    }
}

/// The KV cache of `ctx` positions in f16, bytes (keys and values; MLA's rows once).
pub fn kv_bytes(m: &ModelConfig, ctx: usize) -> usize {
    let copies = if m.values_are_keys() { 1 } else { 2 };
    m.n_layers * ctx * m.kv_dim() * 2 * copies
}

/// The forward pass's activation buffers for a prompt chunk of up to 512 tokens, bytes.
pub fn work_bytes(m: &ModelConfig, ctx: usize) -> usize {
    ctx.min(512) * (m.vocab + 8 * m.hidden + 4 * m.ffn) * 4
}

pub fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

pub use crate::error::size;

#[cfg(test)]
mod tests {
    use super::size;

    #[test]
    fn sizes_in_messages_pick_a_unit_that_shows_them() {
        assert_eq!(size(3 << 29), "1.50 GiB");
        assert_eq!(size(5 << 20), "5.0 MiB");
        assert_eq!(size(1536), "1.5 KiB");
    }
}
