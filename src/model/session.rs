//! A model bound to a backend and an expert executor, with one sequence's state: what the
//! commands (run, perplexity, bench) drive, whatever the device.

use super::forward::{Logits, Model, RunState};
use super::ops::{Backend, ExpertExecutor, KernelTime};
use super::ModelConfig;

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
    /// Wall time spent waiting for loads, in seconds.
    pub load_seconds: f64,
    /// Wall time the compute thread spent waiting for CPU-computed experts, in seconds.
    pub cpu_wait_seconds: f64,
    /// Cooperative decode: seconds the CPU helpers sat idle between two consecutive layers'
    /// jobs of one token, in four parts: the finished layer's results going back to the GPU
    /// (join, upload, add), the GPU's work between the layers (attention, routing and the
    /// routes' trip to the host), placing the next layer's experts (cache, loads, the input's
    /// trip to the host), and the helper thread starting.
    pub cpu_gaps: [f64; 4],
    /// Cooperative decode: the CPU helpers' parallel passes (two per layer with CPU experts),
    /// the helper threads that took part in them (summed over passes), and their ragged ends
    /// (the last helper's finish after the first's, seconds, summed).
    pub cpu_passes: u64,
    pub cpu_pass_threads: u64,
    pub cpu_pass_spread_seconds: f64,
    /// Prefetch loads issued, and how many of them were used before eviction.
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    /// Prefetches dropped while loading: their layer did not route their expert.
    pub prefetch_cancelled: u64,
    /// Cooperative mode: experts whose load (a prefetch) had not landed when needed, so the
    /// CPU computed them (counted in `cpu_computed` too).
    pub late_to_cpu: u64,
    /// Cooperative mode: CPU-computed misses also loaded into the cache over an idle link.
    pub loaded_behind: u64,
    /// Cooperative mode: CPU-computed misses that found the link idle and load-behind wanted
    /// (each loaded behind unless every slot it could take was protected).
    pub behind_chances: u64,
    /// Bytes of the experts the CPU computed, each at its variant's size.
    pub cpu_bytes: u64,
    /// Seconds the loader spent moving `bytes_loaded` (its link busy time).
    pub link_seconds: f64,
    /// Seconds CPU helpers spent computing experts (their busy time).
    pub cpu_seconds: f64,
    /// Cooperative mode: CPU experts split with the GPU, and the bytes of the GPU's rows
    /// (loaded, counted in `bytes_loaded` too).
    pub split_experts: u64,
    pub split_bytes: u64,
    /// Per prediction distance d = 1, 2, ...: (experts predicted, of those actually routed).
    pub prediction: Vec<(u64, u64)>,
    /// Decode tokens routed and computed on the device with no host round trip per layer
    /// (every expert resident in one precision).
    pub device_routed: u64,
    /// Host seconds spent counting those tokens' routes after they arrived (the GPU idles
    /// meanwhile: the next token's launch waits for it).
    pub device_account_seconds: f64,
    /// Host-routed decode layers whose experts (all in GPU cache slots of one precision) ran
    /// through the routed kernels, a table of their slots written on the stream.
    pub slot_routed_layers: u64,
    /// Decode layers whose cached experts were computed while their other experts' loads landed.
    pub early_layers: u64,
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
        self.skipped += s.skipped;
        self.substituted += s.substituted;
        self.cpu_computed += s.cpu_computed;
        self.bytes_loaded += s.bytes_loaded;
        self.bytes_from_disk += s.bytes_from_disk;
        self.load_seconds += s.load_seconds;
        self.cpu_wait_seconds += s.cpu_wait_seconds;
        for (a, b) in self.cpu_gaps.iter_mut().zip(s.cpu_gaps) {
            *a += b;
        }
        self.cpu_passes += s.cpu_passes;
        self.cpu_pass_threads += s.cpu_pass_threads;
        self.cpu_pass_spread_seconds += s.cpu_pass_spread_seconds;
        self.prefetch_issued += s.prefetch_issued;
        self.prefetch_used += s.prefetch_used;
        self.prefetch_cancelled += s.prefetch_cancelled;
        self.late_to_cpu += s.late_to_cpu;
        self.loaded_behind += s.loaded_behind;
        self.behind_chances += s.behind_chances;
        self.cpu_bytes += s.cpu_bytes;
        self.link_seconds += s.link_seconds;
        self.cpu_seconds += s.cpu_seconds;
        self.split_experts += s.split_experts;
        self.split_bytes += s.split_bytes;
        self.device_routed += s.device_routed;
        self.device_account_seconds += s.device_account_seconds;
        self.slot_routed_layers += s.slot_routed_layers;
        self.early_layers += s.early_layers;
        self.graph_launch_seconds += s.graph_launch_seconds;
        self.read_back_seconds += s.read_back_seconds;
    }
}

/// One sequence on one device, driven token by token.
pub trait Session {
    /// Run `tokens` after the cached ones and return the logits asked for.
    fn forward(&mut self, tokens: &[u32], want: Logits) -> crate::Result<&[f32]>;
    /// Tokens in the KV cache.
    fn pos(&self) -> usize;
    /// KV cache capacity.
    fn ctx(&self) -> usize;
    /// Drop cached tokens past `pos`.
    fn truncate(&mut self, pos: usize);
    fn config(&self) -> &ModelConfig;
    /// One line naming the device and its setup, for logs.
    fn describe(&self) -> String;
    /// Expert counters since the last `reset_stats`.
    fn expert_stats(&self) -> ExpertStats;
    fn reset_stats(&mut self);
    /// Decode steps the backend ran from a recording (CUDA graphs) so far.
    fn decode_replays(&self) -> u64 {
        0
    }
    /// Time every kernel launch from now on (true) or stop; false where the device cannot.
    fn kernel_clock(&mut self, _on: bool) -> bool {
        false
    }
    /// GPU time per kernel since the last call.
    fn kernel_times(&mut self) -> crate::Result<Vec<KernelTime>> {
        Ok(Vec::new())
    }
}

/// What an expert executor reports about itself.
pub trait ExpertReport {
    fn describe(&self) -> String;
    fn stats(&self) -> ExpertStats {
        ExpertStats::default()
    }
    fn reset_stats(&mut self) {}
}

/// An executor usable in a [`Bound`] session.
pub trait Experts<B: Backend>: ExpertExecutor<B> + ExpertReport {}
impl<B: Backend, T: ExpertExecutor<B> + ExpertReport> Experts<B> for T {}

/// A model, a backend, an expert executor and a run state, bound together.
pub struct Bound<'a, B: Backend> {
    model: &'a Model<'a>,
    backend: B,
    experts: Box<dyn Experts<B> + 'a>,
    st: RunState<B>,
    label: String,
}

impl<'a, B: Backend> Bound<'a, B> {
    /// `label` names the backend in `describe()`.
    pub fn new(
        model: &'a Model<'a>,
        backend: B,
        experts: Box<dyn Experts<B> + 'a>,
        ctx: usize,
        label: String,
    ) -> crate::Result<Self> {
        let st = model.new_state(&backend, ctx)?;
        Ok(Bound {
            model,
            backend,
            experts,
            st,
            label,
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> Session for Bound<'_, B> {
    fn forward(&mut self, tokens: &[u32], want: Logits) -> crate::Result<&[f32]> {
        let experts: &mut dyn ExpertExecutor<B> = &mut *self.experts;
        if self.st.pos() == 0 {
            experts.begin_sequence()?;
        }
        self.model
            .forward(&mut self.st, tokens, &self.backend, experts, want)
    }
    fn pos(&self) -> usize {
        self.st.pos()
    }
    fn ctx(&self) -> usize {
        self.st.ctx()
    }
    fn truncate(&mut self, pos: usize) {
        self.st.truncate(pos);
    }
    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }
    fn describe(&self) -> String {
        format!("{}, experts: {}", self.label, self.experts.describe())
    }
    fn expert_stats(&self) -> ExpertStats {
        let mut s = self.experts.stats();
        (s.graph_launch_seconds, s.read_back_seconds) = self.backend.host_times();
        s
    }
    fn reset_stats(&mut self) {
        self.experts.reset_stats();
        self.backend.reset_host_times();
    }
    fn decode_replays(&self) -> u64 {
        self.backend.decode_replays()
    }
    fn kernel_clock(&mut self, on: bool) -> bool {
        self.backend.kernel_clock(on)
    }
    fn kernel_times(&mut self) -> crate::Result<Vec<KernelTime>> {
        self.backend.kernel_times()
    }
}
