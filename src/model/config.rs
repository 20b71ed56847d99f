//! Hyper-parameters from the .hob metadata, for each supported architecture.

use super::ModelError;
use crate::format::keys::{self, arch_key};
use crate::format::Metadata;

/// The architectures hob runs. Qwen-MoE, Phi-MoE, OLMoE and dense Llama add as variants here
/// (with their routing rule and extra tensors), not as flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Mixtral: softmax over all router logits, top-k, renormalized over the top-k.
    Mixtral,
}

impl Architecture {
    pub const SUPPORTED: [(&'static str, Architecture); 1] = [("mixtral", Architecture::Mixtral)];

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Mixtral => "mixtral",
        }
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
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Training context length (the largest -c allowed).
    pub context_length: usize,
    pub tie_embeddings: bool,
    /// Each query attends only to the last `w` positions (itself included), when set.
    pub sliding_window: Option<usize>,
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
            rms_eps: md.get_f32(&arch_key(a, keys::RMS_EPS))?,
            rope_theta: md.get_f32(&arch_key(a, keys::ROPE_FREQ_BASE))?,
            context_length: u(keys::CONTEXT_LENGTH)?,
            tie_embeddings: match md.get(keys::TIE_WORD_EMBEDDINGS) {
                Some(_) => md.get_bool(keys::TIE_WORD_EMBEDDINGS)?,
                None => false,
            },
            sliding_window: optional_u32(&arch_key(a, keys::SLIDING_WINDOW))?.map(|w| w as usize),
            bos: optional_u32(keys::BOS_TOKEN_ID)?,
            eos: optional_u32(keys::EOS_TOKEN_ID)?,
            add_bos: match md.get(keys::ADD_BOS_TOKEN) {
                Some(_) => md.get_bool(keys::ADD_BOS_TOKEN)?,
                None => true,
            },
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ModelError> {
        let bad = |key: &str, value: usize, problem: &str| {
            Err(ModelError::BadHyperParameter {
                key: arch_key(self.arch.name(), key),
                value: value.to_string(),
                problem: problem.to_string(),
            })
        };
        for (key, v) in [
            (keys::VOCAB_SIZE, self.vocab),
            (keys::EMBEDDING_LENGTH, self.hidden),
            (keys::BLOCK_COUNT, self.n_layers),
            (keys::HEAD_COUNT, self.n_heads),
            (keys::HEAD_COUNT_KV, self.n_kv_heads),
            (keys::KEY_LENGTH, self.head_dim),
            (keys::FEED_FORWARD_LENGTH, self.ffn),
            (keys::EXPERT_COUNT, self.n_experts),
            (keys::EXPERT_USED_COUNT, self.top_k),
            (keys::CONTEXT_LENGTH, self.context_length),
        ] {
            if v == 0 {
                return bad(key, v, "must be positive");
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(
                keys::HEAD_COUNT_KV,
                self.n_kv_heads,
                "must divide the head count",
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(
                keys::KEY_LENGTH,
                self.head_dim,
                "RoPE needs an even head size",
            );
        }
        if self.sliding_window == Some(0) {
            return bad(keys::SLIDING_WINDOW, 0, "must be positive");
        }
        if self.top_k > self.n_experts {
            return bad(
                keys::EXPERT_USED_COUNT,
                self.top_k,
                "exceeds the expert count",
            );
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return Err(ModelError::BadHyperParameter {
                key: arch_key(self.arch.name(), keys::RMS_EPS),
                value: self.rms_eps.to_string(),
                problem: "must be a finite non-negative number".into(),
            });
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ModelError::BadHyperParameter {
                key: arch_key(self.arch.name(), keys::ROPE_FREQ_BASE),
                value: self.rope_theta.to_string(),
                problem: "must be a finite positive number".into(),
            });
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
