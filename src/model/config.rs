//! Hyper-parameters from the .hob metadata, for each supported architecture.

use super::config_keys::{glm_parts, long_rope, mla, sliding_layers};
use super::routing::{Grouped, Routing, MAX_GROUPS};
pub use super::yarn::Yarn;
use super::ModelError;
use crate::format::keys::{self, arch_key};
use crate::format::Metadata;

/// The architectures hob runs. Each is a variant with its named parts (its routing rule, its
/// extra tensors), not a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Mixtral: softmax over all router logits, top-k, renormalized over the top-k.
    Mixtral,
    /// Qwen3-MoE: Mixtral's block with an RMSNorm over each head of q and k before RoPE
    /// (QK-norm), and many small experts.
    Qwen3Moe,
    /// OLMoE: an RMSNorm over the whole q and k projections before RoPE; the top-k softmax
    /// weights are used as they are (not renormalized).
    Olmoe,
    /// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v biases, a shared expert beside the routed
    /// ones (scaled by a sigmoid gate), top-k weights not renormalized.
    Qwen2Moe,
    /// Phi-3.5-MoE: LayerNorm (with biases), biases on q/k/v/o and the output head, sparsemixer
    /// routing, LongRoPE.
    Phimoe,
    /// gpt-oss: biases on q/k/v/o, the router and the experts; attention sinks; sliding and
    /// full layers; YaRN; top-k of the router logits, then their softmax; a clamped SwiGLU.
    GptOss,
    /// GLM-4.5 (Glm4MoeForCausalLM): leading dense-MLP layers, q/k/v biases, optional QK-norm,
    /// partial rotary, an ungated shared expert, sigmoid routing in groups with a selection bias.
    Glm4Moe,
    /// DeepSeek-V2 (DeepseekV2ForCausalLM): multi-head latent attention (`ModelConfig::mla`),
    /// GLM-4.5's dense layers and ungated shared experts, softmax routing scaled.
    DeepseekV2,
}

/// Multi-head latent attention's shapes (DeepSeek-V2): q ([heads, nope + rope], from the input
/// or through a rank-`q_lora` bottleneck), the latent c ([kv_lora]) and one RoPE key ([rope])
/// per token, cached; heads' values of `v`. hob runs the absorbed form: each head's q_nope
/// maps into the latent (k_b), attention runs over the cached [c, k_rope] as one KV head of
/// kv_lora + rope (`head_dim`), and each head's output maps out of it (v_b).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mla {
    /// 0: q straight from the input.
    pub q_lora: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// YaRN's scale of the softmax (mscale(factor, mscale_all_dim)^2; 1 without YaRN).
    pub softmax_scale: f32,
}

/// What a routed expert computes between its gate/up products and its down product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertAct {
    /// silu(gate) * up.
    SiluGlu,
    /// gpt-oss's: with g = min(gate, limit) and u = clamp(up, -limit, limit),
    /// (u + 1) * g * sigmoid(alpha * g).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl ExpertAct {
    /// The activation of one gate/up pair, in f32 as transformers computes it.
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            ExpertAct::SiluGlu => gate / (1.0 + (-gate).exp()) * up,
            ExpertAct::ClampedSwiglu { alpha, limit } => {
                let g = gate.min(limit);
                let u = up.clamp(-limit, limit);
                let glu = g * (1.0 / (1.0 + (-(g * alpha)).exp()));
                (u + 1.0) * glu
            }
        }
    }
}

/// LongRoPE (Phi-3.5-MoE): per-dimension divisors of RoPE's frequencies and a scale of cos and
/// sin, short below `original_context` and long above it (chosen by the context size, as
/// llama.cpp does).
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    pub original_context: usize,
    pub short_factor: Vec<f32>,
    pub long_factor: Vec<f32>,
    pub short_mscale: f32,
    pub long_mscale: f32,
}

/// Where an architecture normalizes q and k before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// Each head's head_dim values, with one [head_dim] weight shared by the heads.
    PerHead,
    /// A token's whole q ([q_dim] weight) and whole k ([kv_dim] weight).
    Whole,
}

impl Architecture {
    pub const SUPPORTED: [(&'static str, Architecture); 8] = [
        ("mixtral", Architecture::Mixtral),
        ("qwen3moe", Architecture::Qwen3Moe),
        ("olmoe", Architecture::Olmoe),
        ("qwen2moe", Architecture::Qwen2Moe),
        ("phimoe", Architecture::Phimoe),
        ("gpt-oss", Architecture::GptOss),
        ("glm4moe", Architecture::Glm4Moe),
        ("deepseek2", Architecture::DeepseekV2),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Olmoe => "olmoe",
            Architecture::Qwen2Moe => "qwen2moe",
            Architecture::Phimoe => "phimoe",
            Architecture::GptOss => "gpt-oss",
            Architecture::Glm4Moe => "glm4moe",
            Architecture::DeepseekV2 => "deepseek2",
        }
    }

    /// The attention block's normalization of q and k, if any (GLM-4.5's per head where its
    /// metadata says so: `ModelConfig::qk_norm`).
    pub fn qk_norm(self) -> Option<QkNorm> {
        match self {
            Architecture::Mixtral => None,
            Architecture::Qwen3Moe => Some(QkNorm::PerHead),
            Architecture::Olmoe => Some(QkNorm::Whole),
            Architecture::Qwen2Moe
            | Architecture::Phimoe
            | Architecture::GptOss
            | Architecture::Glm4Moe
            | Architecture::DeepseekV2 => None,
        }
    }

    /// Whether q, k and v have biases.
    pub fn attention_bias(self) -> bool {
        matches!(
            self,
            Architecture::Qwen2Moe
                | Architecture::Phimoe
                | Architecture::GptOss
                | Architecture::Glm4Moe
        )
    }

    /// Whether the attention output has a bias without the LayerNorms of Phi (gpt-oss).
    pub fn output_proj_bias(self) -> bool {
        matches!(self, Architecture::GptOss)
    }

    /// Whether each attention head has a learned sink logit in its softmax, the router a bias,
    /// and the routed experts biases (gpt-oss).
    pub fn sinks_and_expert_biases(self) -> bool {
        matches!(self, Architecture::GptOss)
    }

    /// Whether the attention output and the output head have biases, and the norms are
    /// LayerNorms with biases (Phi-3.5-MoE) rather than RMSNorms.
    pub fn layer_norm_and_output_biases(self) -> bool {
        matches!(self, Architecture::Phimoe)
    }

    /// Whether each MoE block has a shared expert (its width from the metadata).
    pub fn shared_expert(self) -> bool {
        matches!(
            self,
            Architecture::Qwen2Moe | Architecture::Glm4Moe | Architecture::DeepseekV2
        )
    }

    /// Whether the shared expert's output is scaled by a sigmoid gate (Qwen2-MoE's).
    pub fn shared_expert_gate(self) -> bool {
        matches!(self, Architecture::Qwen2Moe)
    }
}

/// The ranges hob accepts for hyper-parameters (inclusive): wide enough for every released MoE,
/// narrow enough that nothing in them overflows an activation or an allocation size.
pub mod limits {
    pub const VOCAB: (usize, usize) = (1, 1 << 24);
    /// The hidden size and the expert FFN width.
    pub const WIDTH: (usize, usize) = (1, 1 << 18);
    pub const LAYERS: (usize, usize) = (1, 1024);
    pub const HEADS: (usize, usize) = (1, 1024);
    pub const HEAD_DIM: (usize, usize) = (2, 1024);
    pub const EXPERTS: (usize, usize) = (1, 4096);
    pub const CONTEXT: (usize, usize) = (1, 1 << 24);
    pub const RMS_EPS: (f32, f32) = (1e-12, 1e-1);
    /// RoPE's base: below 1 the frequencies grow with the dimension, and a tiny base
    /// overflows them to infinity (a NaN at the first rotation).
    pub const ROPE_FREQ_BASE: (f32, f32) = (1.0, 1e12);
    /// LongRoPE's scale of cos and sin (Phi-3.5-MoE's is 1.24).
    pub const ROPE_MSCALE: (f32, f32) = (0.01, 100.0);
}

/// A float as a person writes it: 1e-5, 1000000, 1e12, 1e-45, NaN.
fn show(v: f32) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e7).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub vocab: usize,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Expert FFN width.
    pub ffn: usize,
    pub n_experts: usize,
    /// Experts used per token.
    pub top_k: usize,
    /// The shared expert's FFN width, where the architecture has one.
    pub shared_ffn: Option<usize>,
    /// Sparsemixer's relative margin (Phi-3.5-MoE's router_jitter_noise; 0 elsewhere).
    pub router_jitter: f32,
    /// LongRoPE's factors, where the architecture has them.
    pub long_rope: Option<LongRope>,
    /// YaRN's parameters, where the architecture has them.
    pub yarn: Option<Yarn>,
    /// The routed experts' activation.
    pub expert_act: ExpertAct,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Training context length (the largest -c allowed).
    pub context_length: usize,
    pub tie_embeddings: bool,
    /// Each query attends only to the last `w` positions (itself included), when set: in every
    /// layer, or in those `sliding_layers` marks.
    pub sliding_window: Option<usize>,
    pub sliding_layers: Option<Vec<bool>>,
    /// The dimensions of each head RoPE rotates (head_dim unless rotary is partial). A .hob
    /// stores q and k with the rotated pairs at (i, i + head_dim / 2), i < rope_dim / 2: the
    /// other dimensions turn by angle 0 (src/import/glm4moe.rs orders them at convert).
    pub rope_dim: usize,
    /// The leading layers whose FFN is a dense MLP (of width `dense_ffn`), not experts.
    pub dense_layers: usize,
    pub dense_ffn: usize,
    /// Group-limited sigmoid routing (GLM-4.5), where the architecture routes so.
    pub grouped: Option<Grouped>,
    /// q's and k's normalization before RoPE, if any.
    pub qk_norm: Option<QkNorm>,
    /// Multi-head latent attention (DeepSeek-V2): `head_dim` and `n_kv_heads` are then the
    /// attention's over the latent (kv_lora + rope, one KV head).
    pub mla: Option<Mla>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
}

impl ModelConfig {
    pub fn from_metadata(md: &Metadata) -> Result<ModelConfig, ModelError> {
        let name = md.get_str(keys::ARCHITECTURE)?;
        let arch = Architecture::SUPPORTED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .ok_or_else(|| ModelError::UnsupportedArchitecture {
                found: name.to_string(),
                supported: Architecture::SUPPORTED
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let a = arch.name();
        let u =
            |k: &str| -> Result<usize, ModelError> { Ok(md.get_u32(&arch_key(a, k))? as usize) };
        let n_heads = u(keys::HEAD_COUNT)?;
        let hidden = u(keys::EMBEDDING_LENGTH)?;
        let head_dim = match md.get(&arch_key(a, keys::KEY_LENGTH)) {
            Some(_) => u(keys::KEY_LENGTH)?,
            None if n_heads > 0 => hidden / n_heads,
            None => 0,
        };
        let optional_u32 = |k: &str| -> Result<Option<u32>, ModelError> {
            match md.get(k) {
                Some(_) => Ok(Some(md.get_u32(k)?)),
                None => Ok(None),
            }
        };
        // GLM-4.5's and DeepSeek-V2's keys: dense layers, grouped routing.
        let glm = matches!(arch, Architecture::Glm4Moe | Architecture::DeepseekV2);
        let (dense_layers, dense_ffn, grouped, glm_qk_norm) = match glm {
            true => glm_parts(md, a)?,
            false => (0, 0, None, false),
        };
        let cfg = ModelConfig {
            arch,
            vocab: u(keys::VOCAB_SIZE)?,
            hidden,
            n_layers: u(keys::BLOCK_COUNT)?,
            n_heads,
            n_kv_heads: u(keys::HEAD_COUNT_KV)?,
            head_dim,
            ffn: u(keys::FEED_FORWARD_LENGTH)?,
            n_experts: u(keys::EXPERT_COUNT)?,
            top_k: u(keys::EXPERT_USED_COUNT)?,
            shared_ffn: match arch.shared_expert() {
                true => Some(u(keys::EXPERT_SHARED_FEED_FORWARD_LENGTH)?),
                false => None,
            },
            router_jitter: match arch {
                Architecture::Phimoe => md.get_f32(&arch_key(a, keys::EXPERT_ROUTER_JITTER))?,
                _ => 0.0,
            },
            long_rope: match arch {
                Architecture::Phimoe => Some(long_rope(md, a, head_dim)?),
                _ => None,
            },
            yarn: match arch {
                Architecture::GptOss => Some(Yarn::from_metadata(md, a)?),
                Architecture::DeepseekV2
                    if md.get(&arch_key(a, keys::ROPE_SCALING_FACTOR)).is_some() =>
                {
                    Some(Yarn::from_metadata(md, a)?)
                }
                _ => None,
            },
            expert_act: match arch {
                Architecture::GptOss => ExpertAct::ClampedSwiglu {
                    alpha: md.get_f32(&arch_key(a, keys::EXPERT_SWIGLU_ALPHA))?,
                    limit: md.get_f32(&arch_key(a, keys::EXPERT_SWIGLU_LIMIT))?,
                },
                _ => ExpertAct::SiluGlu,
            },
            rms_eps: md.get_f32(&arch_key(a, keys::RMS_EPS))?,
            rope_theta: md.get_f32(&arch_key(a, keys::ROPE_FREQ_BASE))?,
            context_length: u(keys::CONTEXT_LENGTH)?,
            tie_embeddings: match md.get(keys::TIE_WORD_EMBEDDINGS) {
                Some(_) => md.get_bool(keys::TIE_WORD_EMBEDDINGS)?,
                None => false,
            },
            sliding_window: optional_u32(&arch_key(a, keys::SLIDING_WINDOW))?.map(|w| w as usize),
            sliding_layers: sliding_layers(md, a)?,
            rope_dim: match md.get(&arch_key(a, keys::ROPE_DIMENSION_COUNT)) {
                Some(_) => u(keys::ROPE_DIMENSION_COUNT)?,
                None => head_dim,
            },
            dense_layers,
            dense_ffn,
            grouped,
            mla: match arch {
                Architecture::DeepseekV2 => Some(mla(md, a, head_dim)?),
                _ => None,
            },
            qk_norm: match glm {
                true => glm_qk_norm.then_some(QkNorm::PerHead),
                false => arch.qk_norm(),
            },
            bos: optional_u32(keys::BOS_TOKEN_ID)?,
            eos: optional_u32(keys::EOS_TOKEN_ID)?,
            add_bos: match md.get(keys::ADD_BOS_TOKEN) {
                Some(_) => md.get_bool(keys::ADD_BOS_TOKEN)?,
                None => true,
            },
        };
        cfg.check()?;
        // Values are as wide as keys in every architecture hob runs (MLA's: its latent).
        if md.get(&arch_key(a, keys::VALUE_LENGTH)).is_some() && cfg.mla.is_none() {
            let v = u(keys::VALUE_LENGTH)?;
            if v != head_dim {
                return Err(ModelError::BadHyperParameter {
                    key: arch_key(a, keys::VALUE_LENGTH),
                    value: v.to_string(),
                    problem: format!("must equal the key length {head_dim}"),
                });
            }
        }
        Ok(cfg)
    }

    /// Every hyper-parameter in the range hob runs (and real models use): a value outside it
    /// is refused here, by key, rather than met as a NaN or an allocation failure later.
    fn check(&self) -> Result<(), ModelError> {
        let bad = |key: &str, value: &dyn std::fmt::Display, problem: String| {
            let key = match key {
                keys::BOS_TOKEN_ID | keys::EOS_TOKEN_ID => key.to_string(),
                k => arch_key(self.arch.name(), k),
            };
            Err(ModelError::BadHyperParameter {
                key,
                value: value.to_string(),
                problem,
            })
        };
        for (key, v, (lo, hi)) in [
            (keys::VOCAB_SIZE, self.vocab, limits::VOCAB),
            (keys::EMBEDDING_LENGTH, self.hidden, limits::WIDTH),
            (keys::BLOCK_COUNT, self.n_layers, limits::LAYERS),
            (keys::HEAD_COUNT, self.n_heads, limits::HEADS),
            (keys::HEAD_COUNT_KV, self.n_kv_heads, (1, self.n_heads)),
            (keys::KEY_LENGTH, self.head_dim, limits::HEAD_DIM),
            (keys::FEED_FORWARD_LENGTH, self.ffn, limits::WIDTH),
            (
                keys::EXPERT_SHARED_FEED_FORWARD_LENGTH,
                self.shared_ffn.unwrap_or(1),
                limits::WIDTH,
            ),
            (keys::EXPERT_COUNT, self.n_experts, limits::EXPERTS),
            (keys::EXPERT_USED_COUNT, self.top_k, (1, self.n_experts)),
            (keys::CONTEXT_LENGTH, self.context_length, limits::CONTEXT),
            (
                keys::SLIDING_WINDOW,
                self.sliding_window.unwrap_or(1),
                (1, usize::MAX),
            ),
        ] {
            if !(lo..=hi).contains(&v) {
                let range = match hi {
                    usize::MAX => format!("at least {lo}"),
                    _ => format!("{lo} to {hi}"),
                };
                return bad(key, &v, format!("out of range (accepted: {range})"));
            }
        }
        if let Some(s) = self
            .sliding_layers
            .as_ref()
            .filter(|s| s.len() != self.n_layers)
        {
            let problem = format!("must list each of the {} layers", self.n_layers);
            let found = format!("{} values", s.len());
            return bad(keys::SLIDING_WINDOW_LAYERS, &found, problem);
        }
        if let ExpertAct::ClampedSwiglu { alpha, limit } = self.expert_act {
            for (key, v) in [
                (keys::EXPERT_SWIGLU_ALPHA, alpha),
                (keys::EXPERT_SWIGLU_LIMIT, limit),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return bad(key, &show(v), "must be a positive number".into());
                }
            }
        }
        if let Some(y) = &self.yarn {
            y.check(self.arch.name())?;
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            let problem = format!("must divide the head count {}", self.n_heads);
            return bad(keys::HEAD_COUNT_KV, &self.n_kv_heads, problem);
        }
        if !self.head_dim.is_multiple_of(2) {
            let problem = "RoPE needs an even head size".to_string();
            return bad(keys::KEY_LENGTH, &self.head_dim, problem);
        }
        self.check_glm()?;
        for (key, v, (lo, hi)) in [
            (keys::RMS_EPS, self.rms_eps, limits::RMS_EPS),
            (
                keys::ROPE_FREQ_BASE,
                self.rope_theta,
                limits::ROPE_FREQ_BASE,
            ),
            (keys::EXPERT_ROUTER_JITTER, self.router_jitter, (0.0, 1.0)),
            (
                keys::ROPE_SHORT_MSCALE,
                self.long_rope.as_ref().map_or(1.0, |r| r.short_mscale),
                limits::ROPE_MSCALE,
            ),
            (
                keys::ROPE_LONG_MSCALE,
                self.long_rope.as_ref().map_or(1.0, |r| r.long_mscale),
                limits::ROPE_MSCALE,
            ),
        ] {
            // (NaN is in no range.)
            if !(lo..=hi).contains(&v) {
                let (v, lo, hi) = (show(v), show(lo), show(hi));
                return bad(key, &v, format!("out of range (accepted: {lo} to {hi})"));
            }
        }
        for (key, id) in [
            (keys::BOS_TOKEN_ID, self.bos),
            (keys::EOS_TOKEN_ID, self.eos),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= self.vocab) {
                let problem = format!("out of range (accepted: 0 to {})", self.vocab - 1);
                return bad(key, &id, problem);
            }
        }
        Ok(())
    }

    /// The dense layers, rotary and grouped routing in range (GLM-4.5's keys).
    fn check_glm(&self) -> Result<(), ModelError> {
        let bad = |key: &str, value: &dyn std::fmt::Display, problem: String| {
            Err(ModelError::BadHyperParameter {
                key: arch_key(self.arch.name(), key),
                value: value.to_string(),
                problem,
            })
        };
        if self.rope_dim == 0 || self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            let problem = format!("must be even, from 2 to the head size {}", self.head_dim);
            return bad(keys::ROPE_DIMENSION_COUNT, &self.rope_dim, problem);
        }
        if self.dense_layers >= self.n_layers {
            let problem = format!("must leave an MoE layer of the {}", self.n_layers);
            return bad(keys::LEADING_DENSE_BLOCK_COUNT, &self.dense_layers, problem);
        }
        if self.dense_layers > 0 && !(limits::WIDTH.0..=limits::WIDTH.1).contains(&self.dense_ffn) {
            let problem = format!("out of range (accepted: 1 to {})", limits::WIDTH.1);
            return bad(keys::DENSE_FEED_FORWARD_LENGTH, &self.dense_ffn, problem);
        }
        let Some(g) = self.grouped else {
            return Ok(());
        };
        if !(1..=MAX_GROUPS).contains(&g.groups) || !self.n_experts.is_multiple_of(g.groups) {
            let problem = format!(
                "must divide the {} experts, at most {MAX_GROUPS}",
                self.n_experts
            );
            return bad(keys::EXPERT_GROUP_COUNT, &g.groups, problem);
        }
        if !(1..=g.groups).contains(&g.topk_groups)
            || g.topk_groups * (self.n_experts / g.groups) < self.top_k
        {
            let problem = format!(
                "must be 1 to {} groups, holding at least the {} experts used",
                g.groups, self.top_k
            );
            return bad(keys::EXPERT_GROUP_USED_COUNT, &g.topk_groups, problem);
        }
        if !(g.scale.is_finite() && g.scale > 0.0) {
            let problem = "must be a positive number".to_string();
            return bad(keys::EXPERT_WEIGHTS_SCALE, &show(g.scale), problem);
        }
        Ok(())
    }

    /// How the router's logits become routes (a layer's selection bias: `Routing::with_bias`).
    pub fn routing(&self) -> Routing<'static> {
        match self.arch {
            Architecture::Mixtral | Architecture::Qwen3Moe => {
                Routing::Softmax { renormalize: true }
            }
            Architecture::Olmoe | Architecture::Qwen2Moe => Routing::Softmax { renormalize: false },
            Architecture::Phimoe => Routing::SparseMixer {
                jitter_eps: self.router_jitter,
            },
            Architecture::GptOss => Routing::TopkSoftmax,
            Architecture::Glm4Moe | Architecture::DeepseekV2 => match self.grouped {
                Some(rule) => Routing::Grouped { rule, bias: None },
                None => Routing::Softmax { renormalize: true },
            },
        }
    }

    /// The layers with routed experts (the expert table's layers): those after the dense ones.
    pub fn moe_layers(&self) -> usize {
        self.n_layers - self.dense_layers
    }

    /// Layer `layer`'s index in the expert table, or None for a dense layer.
    pub fn moe_index(&self, layer: usize) -> Option<usize> {
        layer.checked_sub(self.dense_layers)
    }

    /// Layer `layer`'s attention window, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        match &self.sliding_layers {
            Some(s) if !s.get(layer).copied().unwrap_or(false) => None,
            _ => self.sliding_window,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether attention reads each cached row as key and value: MLA's [latent, RoPE key] rows
    /// (the absorbed form), cached once.
    pub fn values_are_keys(&self) -> bool {
        self.mla.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::MetaValue;

    /// The tiny fixture's hyper-parameters.
    fn tiny() -> Metadata {
        let mut m = Metadata::new();
        m.set(keys::ARCHITECTURE, MetaValue::String("mixtral".into()));
        for (k, v) in [
            (keys::VOCAB_SIZE, 512),
            (keys::CONTEXT_LENGTH, 256),
            (keys::EMBEDDING_LENGTH, 64),
            (keys::FEED_FORWARD_LENGTH, 128),
            (keys::BLOCK_COUNT, 2),
            (keys::HEAD_COUNT, 4),
            (keys::HEAD_COUNT_KV, 2),
            (keys::KEY_LENGTH, 16),
            (keys::VALUE_LENGTH, 16),
            (keys::EXPERT_COUNT, 4),
            (keys::EXPERT_USED_COUNT, 2),
        ] {
            m.set(&arch_key("mixtral", k), MetaValue::U32(v));
        }
        m.set(&arch_key("mixtral", keys::RMS_EPS), MetaValue::F32(1e-5));
        m.set(
            &arch_key("mixtral", keys::ROPE_FREQ_BASE),
            MetaValue::F32(1e6),
        );
        m.set(keys::BOS_TOKEN_ID, MetaValue::U32(1));
        m.set(keys::EOS_TOKEN_ID, MetaValue::U32(2));
        m
    }

    /// The error for the tiny metadata with `key` set to `value`.
    fn refused(key: &str, value: MetaValue) -> String {
        let mut m = tiny();
        m.set(key, value);
        match ModelConfig::from_metadata(&m) {
            Ok(cfg) => panic!("{key} accepted: {cfg:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_tiny_fixture_passes() {
        let cfg = ModelConfig::from_metadata(&tiny()).unwrap();
        assert_eq!((cfg.head_dim, cfg.top_k, cfg.rope_theta), (16, 2, 1e6));
    }

    #[test]
    fn tiny_rope_freq_base_is_refused() {
        // 1.4e-45 passed "finite and positive": RoPE's frequencies overflowed to infinity and
        // the first rotation made the hidden state NaN.
        let key = arch_key("mixtral", keys::ROPE_FREQ_BASE);
        for v in [1.4e-45, 0.0, -1.0, 0.5, f32::NAN, f32::INFINITY, 1e30] {
            let msg = refused(&key, MetaValue::F32(v));
            assert!(
                msg.contains("mixtral.rope.freq_base") && msg.contains("(accepted: 1 to 1e12)"),
                "{v}: {msg}"
            );
        }
        assert!(refused(&key, MetaValue::F32(1.4e-45)).contains("= 1e-45:"));
    }

    #[test]
    fn hyper_parameters_out_of_range_are_refused_by_key() {
        let a = |k: &str| arch_key("mixtral", k);
        let cases = [
            (
                a(keys::RMS_EPS),
                MetaValue::F32(0.0),
                "accepted: 1e-12 to 0.1",
            ),
            (
                a(keys::RMS_EPS),
                MetaValue::F32(f32::NAN),
                "accepted: 1e-12 to 0.1",
            ),
            (
                a(keys::RMS_EPS),
                MetaValue::F32(2.0),
                "accepted: 1e-12 to 0.1",
            ),
            (
                a(keys::VOCAB_SIZE),
                MetaValue::U32(0),
                "accepted: 1 to 16777216",
            ),
            (
                a(keys::BLOCK_COUNT),
                MetaValue::U32(5000),
                "accepted: 1 to 1024",
            ),
            (
                a(keys::HEAD_COUNT),
                MetaValue::U32(0),
                "accepted: 1 to 1024",
            ),
            (
                a(keys::HEAD_COUNT_KV),
                MetaValue::U32(8),
                "accepted: 1 to 4",
            ),
            (
                a(keys::HEAD_COUNT_KV),
                MetaValue::U32(3),
                "must divide the head count 4",
            ),
            (a(keys::KEY_LENGTH), MetaValue::U32(15), "even head size"),
            (
                a(keys::KEY_LENGTH),
                MetaValue::U32(1 << 20),
                "accepted: 2 to 1024",
            ),
            (
                a(keys::VALUE_LENGTH),
                MetaValue::U32(32),
                "must equal the key length 16",
            ),
            (
                a(keys::EXPERT_COUNT),
                MetaValue::U32(0),
                "accepted: 1 to 4096",
            ),
            (
                a(keys::EXPERT_USED_COUNT),
                MetaValue::U32(5),
                "accepted: 1 to 4",
            ),
            (
                a(keys::EXPERT_USED_COUNT),
                MetaValue::U32(0),
                "accepted: 1 to 4",
            ),
            (
                a(keys::CONTEXT_LENGTH),
                MetaValue::U32(0),
                "accepted: 1 to 16777216",
            ),
            (
                a(keys::FEED_FORWARD_LENGTH),
                MetaValue::U32(u32::MAX),
                "accepted: 1 to 262144",
            ),
            (
                a(keys::SLIDING_WINDOW),
                MetaValue::U32(0),
                "accepted: at least 1",
            ),
            (
                keys::BOS_TOKEN_ID.to_string(),
                MetaValue::U32(512),
                "accepted: 0 to 511",
            ),
            (
                keys::EOS_TOKEN_ID.to_string(),
                MetaValue::U32(70000),
                "accepted: 0 to 511",
            ),
        ];
        for (key, value, needle) in cases {
            let msg = refused(&key, value.clone());
            assert!(
                msg.contains(&format!("{key} = ")) && msg.contains(needle),
                "{key} = {value:?}: {msg}"
            );
        }
    }
}
