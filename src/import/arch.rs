//! config.json -> the architecture: hyper-parameters, the Hugging Face -> .hob tensor names and
//! the .hob metadata. One enum variant per architecture family.

use std::path::Path;

use serde_json::Value;

use super::deepseek::DeepseekExtras;
use super::fields::Fields;
use super::glm4moe::GlmExtras;
use super::gptoss::GptOssExtras;
use super::phimoe::PhiExtras;
use super::{ExpertWeights, ImportError, TensorIndex};
use crate::format::{keys, ExpertShape, MetaValue, Metadata};

/// Architectures hob converts, by their config.json `architectures` name.
#[derive(Clone, Debug, PartialEq)]
pub enum Architecture {
    Mixtral(MixtralSpec),
    /// Qwen3MoeForCausalLM: Mixtral's hyper-parameters; QK-norm tensors and Qwen's names.
    Qwen3Moe(MixtralSpec),
    /// OlmoeForCausalLM: QK-norm over the whole projections, Qwen's names.
    Olmoe(MixtralSpec),
    /// Qwen2MoeForCausalLM: q/k/v biases and a shared expert of this FFN width.
    Qwen2Moe(MixtralSpec, usize),
    /// PhimoeForCausalLM: Mixtral's names, LayerNorm and biases, sparsemixer, LongRoPE.
    Phimoe(MixtralSpec, PhiExtras),
    /// GptOssForCausalLM: biases, sinks, sliding layers, YaRN, its own experts' layout.
    GptOss(MixtralSpec, GptOssExtras),
    /// Glm4MoeForCausalLM: dense leading layers, shared experts, grouped sigmoid routing,
    /// partial rotary.
    Glm4Moe(MixtralSpec, GlmExtras),
    /// DeepseekV2ForCausalLM: multi-head latent attention, GLM's dense layers and shared
    /// experts, softmax routing; Glm4MoeLiteForCausalLM (GLM-4.7-Flash) with sigmoid routing.
    DeepseekV2(MixtralSpec, DeepseekExtras),
}

const SUPPORTED: &[&str] = &[
    "MixtralForCausalLM",
    "Qwen3MoeForCausalLM",
    "OlmoeForCausalLM",
    "Qwen2MoeForCausalLM",
    "PhimoeForCausalLM",
    "GptOssForCausalLM",
    "Glm4MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "Glm4MoeLiteForCausalLM",
];

/// The hyper-parameters of a Mixtral-style MoE (MixtralForCausalLM, Qwen3MoeForCausalLM).
#[derive(Clone, Debug, PartialEq)]
pub struct MixtralSpec {
    pub hidden: usize,
    /// Expert FFN width.
    pub ffn: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub vocab: usize,
    pub context_length: usize,
    pub n_experts: usize,
    pub n_experts_used: usize,
    pub tie_word_embeddings: bool,
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

pub use super::dense_tensor::{DenseTensor, Lanes, TensorRole};

/// Where the experts' matrices are in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpertSource {
    /// One tensor per matrix (the hub layout): Mixtral's `block_sparse_moe.experts.E.w1/w3/w2`
    /// or Qwen's `mlp.experts.E.gate_proj/up_proj/down_proj`.
    PerExpert {
        hidden: usize,
        ffn: usize,
        names: ExpertNames,
    },
    /// transformers 5's fused layout (`save_original_format=False`): `mlp.experts.gate_up_proj`
    /// [E, 2 * ffn, hidden] (gate rows first) and `mlp.experts.down_proj` [E, hidden, ffn].
    Fused { hidden: usize, ffn: usize },
    /// gpt-oss's: `gate_up_proj` [E, hidden, 2 * ffn] (gate and up columns interleaved) and
    /// `down_proj` [E, ffn, hidden]; or their MXFP4 blocks and scales (`mxfp4`).
    GptOss {
        hidden: usize,
        ffn: usize,
        mxfp4: bool,
    },
}

/// How a checkpoint names one expert's matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertNames {
    /// `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight`
    Mixtral,
    /// `model.layers.L.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight`
    Qwen,
}

impl ExpertNames {
    fn name(self, layer: usize, expert: usize, which: Which) -> String {
        let (block, w) = match (self, which) {
            (ExpertNames::Mixtral, Which::Gate) => ("block_sparse_moe", "w1"),
            (ExpertNames::Mixtral, Which::Up) => ("block_sparse_moe", "w3"),
            (ExpertNames::Mixtral, Which::Down) => ("block_sparse_moe", "w2"),
            (ExpertNames::Qwen, Which::Gate) => ("mlp", "gate_proj"),
            (ExpertNames::Qwen, Which::Up) => ("mlp", "up_proj"),
            (ExpertNames::Qwen, Which::Down) => ("mlp", "down_proj"),
        };
        format!("model.layers.{layer}.{block}.experts.{expert}.{w}.weight")
    }
}

#[derive(Clone, Copy)]
enum Which {
    Gate,
    Up,
    Down,
}

impl Architecture {
    /// Parse config.json (already read from `path`, which errors name).
    pub fn from_config(path: &Path, config: &Value) -> Result<Architecture, ImportError> {
        let obj = config.as_object().ok_or_else(|| ImportError::Field {
            path: path.to_path_buf(),
            field: "(top level)".into(),
            expected: "a JSON object".into(),
            found: config.to_string(),
        })?;
        let f = Fields { path, obj };
        let archs = f
            .get("architectures")
            .and_then(|v| v.as_array())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                f.err(
                    "architectures",
                    "a non-empty list of names",
                    f.get("architectures"),
                )
            })?;
        let name = archs[0]
            .as_str()
            .ok_or_else(|| f.err("architectures", "a list of names", Some(&archs[0])))?;
        match name {
            "MixtralForCausalLM" => Ok(Architecture::Mixtral(MixtralSpec::from_fields(&f)?)),
            "Qwen3MoeForCausalLM" => Ok(Architecture::Qwen3Moe(MixtralSpec::from_qwen3(&f)?)),
            "OlmoeForCausalLM" => Ok(Architecture::Olmoe(MixtralSpec::from_olmoe(&f)?)),
            "PhimoeForCausalLM" => {
                let (spec, extras) = super::phimoe::parse(&f)?;
                Ok(Architecture::Phimoe(spec, extras))
            }
            "GptOssForCausalLM" => {
                let (spec, extras) = super::gptoss::parse(&f)?;
                Ok(Architecture::GptOss(spec, extras))
            }
            "DeepseekV2ForCausalLM" => {
                let (spec, extras) = super::deepseek::parse(&f, false)?;
                Ok(Architecture::DeepseekV2(spec, extras))
            }
            "Glm4MoeLiteForCausalLM" => {
                let (spec, extras) = super::deepseek::parse(&f, true)?;
                Ok(Architecture::DeepseekV2(spec, extras))
            }
            "Glm4MoeForCausalLM" => {
                let (spec, extras) = super::glm4moe::parse(&f)?;
                Ok(Architecture::Glm4Moe(spec, extras))
            }
            "Qwen2MoeForCausalLM" => {
                let spec = MixtralSpec::from_qwen2(&f)?;
                Ok(Architecture::Qwen2Moe(
                    spec,
                    f.usize("shared_expert_intermediate_size")?,
                ))
            }
            other => Err(ImportError::UnsupportedArchitecture {
                path: path.to_path_buf(),
                found: other.to_string(),
                supported: SUPPORTED.join(", "),
            }),
        }
    }

    /// general.architecture in the .hob file (llama.cpp's name for it).
    pub fn hob_name(&self) -> &'static str {
        match self {
            Architecture::Mixtral(_) => "mixtral",
            Architecture::Qwen3Moe(_) => "qwen3moe",
            Architecture::Olmoe(_) => "olmoe",
            Architecture::Qwen2Moe(..) => "qwen2moe",
            Architecture::Phimoe(..) => "phimoe",
            Architecture::GptOss(..) => "gpt-oss",
            Architecture::Glm4Moe(..) => "glm4moe",
            Architecture::DeepseekV2(..) => "deepseek2",
        }
    }

    pub(crate) fn spec(&self) -> &MixtralSpec {
        match self {
            Architecture::Mixtral(s)
            | Architecture::Qwen3Moe(s)
            | Architecture::Olmoe(s)
            | Architecture::Qwen2Moe(s, _)
            | Architecture::Phimoe(s, _)
            | Architecture::GptOss(s, _)
            | Architecture::Glm4Moe(s, _)
            | Architecture::DeepseekV2(s, _) => s,
        }
    }

    /// How the checkpoint names one expert's matrices.
    fn expert_names(&self) -> ExpertNames {
        match self {
            Architecture::Mixtral(_) | Architecture::Phimoe(..) => ExpertNames::Mixtral,
            Architecture::Qwen3Moe(_)
            | Architecture::Olmoe(_)
            | Architecture::Qwen2Moe(..)
            | Architecture::GptOss(..)
            | Architecture::Glm4Moe(..)
            | Architecture::DeepseekV2(..) => ExpertNames::Qwen,
        }
    }

    /// (bos, eos) ids from config.json, used when tokenizer_config.json names none.
    pub fn special_token_ids(&self) -> (Option<u32>, Option<u32>) {
        let s = self.spec();
        (s.bos_token_id, s.eos_token_id)
    }

    pub fn tie_word_embeddings(&self) -> bool {
        self.spec().tie_word_embeddings
    }

    /// The first layer with routed experts (the expert table's layer 0).
    pub fn first_moe_layer(&self) -> usize {
        match self {
            Architecture::Glm4Moe(_, e) => e.dense_layers,
            Architecture::DeepseekV2(_, e) => e.moe.dense_layers,
            _ => 0,
        }
    }

    pub fn expert_shape(&self) -> ExpertShape {
        let s = self.spec();
        ExpertShape {
            n_layers: s.n_layers - self.first_moe_layer(),
            n_experts: s.n_experts,
            hidden: s.hidden,
            ffn: s.ffn,
        }
    }

    /// Dense tensors in the order convert writes them; router names follow the expert layout.
    pub fn dense_tensors(&self, experts: &ExpertSource) -> Vec<DenseTensor> {
        if let Architecture::DeepseekV2(s, e) = self {
            return super::deepseek::dense_tensors(s, e);
        }
        let router = match (self, experts) {
            (
                Architecture::Mixtral(_) | Architecture::Phimoe(..),
                ExpertSource::PerExpert { .. },
            ) => "block_sparse_moe.gate.weight",
            (Architecture::GptOss(..), _) => "mlp.router.weight",
            _ => "mlp.gate.weight",
        };
        let s = self.spec();
        let (q, kv) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let qk_norm = match self {
            Architecture::Mixtral(_)
            | Architecture::Qwen2Moe(..)
            | Architecture::Phimoe(..)
            | Architecture::GptOss(..) => None,
            Architecture::Qwen3Moe(_) => Some([s.head_dim; 2]),
            Architecture::Glm4Moe(_, e) => e.qk_norm.then_some([s.head_dim; 2]),
            Architecture::DeepseekV2(..) => None,
            Architecture::Olmoe(_) => Some([q, kv]),
        };
        let mut out = s.dense_tensors(router, qk_norm);
        match self {
            Architecture::Qwen2Moe(_, shared) => super::qwen2moe::add_tensors(s, *shared, &mut out),
            Architecture::Phimoe(..) => super::phimoe::add_tensors(s, &mut out),
            Architecture::GptOss(..) => super::gptoss::add_tensors(s, &mut out),
            Architecture::Glm4Moe(_, e) => super::glm4moe::adjust_tensors(s, e, &mut out),
            _ => {}
        }
        out
    }

    /// Find the experts in the checkpoint (either layout) and check every tensor's shape.
    pub fn expert_source(&self, index: &TensorIndex) -> Result<ExpertSource, ImportError> {
        if let Architecture::GptOss(s, _) = self {
            let mxfp4 = super::gptoss::check_experts(s, index)?;
            return Ok(ExpertSource::GptOss {
                hidden: s.hidden,
                ffn: s.ffn,
                mxfp4,
            });
        }
        let layers = self.first_moe_layer()..self.spec().n_layers;
        self.spec()
            .expert_source(index, self.expert_names(), layers)
    }

    /// The `{arch}.*` hyper-parameter keys.
    pub fn write_metadata(&self, m: &mut Metadata) {
        self.spec().write_metadata(self.hob_name(), m);
        match self {
            Architecture::Qwen2Moe(_, shared) => {
                let key = keys::arch_key(self.hob_name(), keys::EXPERT_SHARED_FEED_FORWARD_LENGTH);
                m.set(&key, u32_value(*shared));
            }
            Architecture::Phimoe(_, extras) => {
                super::phimoe::write_metadata(extras, self.hob_name(), m)
            }
            Architecture::GptOss(_, extras) => {
                super::gptoss::write_metadata(extras, self.hob_name(), m)
            }
            Architecture::Glm4Moe(_, extras) => {
                super::glm4moe::write_metadata(extras, self.hob_name(), m)
            }
            Architecture::DeepseekV2(_, extras) => {
                super::deepseek::write_metadata(extras, self.hob_name(), m)
            }
            _ => {}
        }
    }
}

fn u32_value(n: usize) -> MetaValue {
    // Hyper-parameters were checked to fit in u32 when parsed.
    MetaValue::U32(u32::try_from(n).unwrap_or(u32::MAX))
}

impl MixtralSpec {
    fn from_fields(f: &Fields) -> Result<MixtralSpec, ImportError> {
        Self::parse(f, "num_local_experts", "intermediate_size")
    }

    /// Qwen3MoeForCausalLM's config: `num_experts` (hub) or `num_local_experts` (saved by
    /// transformers 5), `moe_intermediate_size`; what hob does not run yet is refused by field.
    fn from_qwen3(f: &Fields) -> Result<MixtralSpec, ImportError> {
        require_all_sparse(f)?;
        let renorm = "hob renormalizes the top-k weights (norm_topk_prob true)";
        require_bool(f, ("norm_topk_prob", false), true, renorm)?;
        let bias = "hob runs attention without biases";
        require_bool(f, ("attention_bias", false), false, bias)?;
        Self::parse(f, experts_field(f), "moe_intermediate_size")
    }

    /// Qwen2MoeForCausalLM's config: Qwen3's fields without QK-norm; q/k/v biases (`qkv_bias`,
    /// true where absent as in Qwen1.5-MoE's config), top-k weights as they are.
    fn from_qwen2(f: &Fields) -> Result<MixtralSpec, ImportError> {
        require_all_sparse(f)?;
        let kept = "hob runs Qwen2-MoE's top-k weights as they are (norm_topk_prob false)";
        require_bool(f, ("norm_topk_prob", false), false, kept)?;
        let bias = "hob runs Qwen2-MoE with q/k/v biases";
        require_bool(f, ("qkv_bias", true), true, bias)?;
        Self::parse(f, experts_field(f), "moe_intermediate_size")
    }

    /// OlmoeForCausalLM's config: `num_experts`, `intermediate_size` (the experts' width); the
    /// top-k weights as they are (`norm_topk_prob` false), no q/k/v clipping.
    fn from_olmoe(f: &Fields) -> Result<MixtralSpec, ImportError> {
        let kept = "hob runs OLMoE's top-k weights as they are (norm_topk_prob false)";
        require_bool(f, ("norm_topk_prob", false), false, kept)?;
        if f.get("clip_qkv").is_some() {
            return Err(f.unsupported("clip_qkv", "hob does not clip q, k and v"));
        }
        let bias = "hob runs attention without biases";
        require_bool(f, ("attention_bias", false), false, bias)?;
        Self::parse(f, experts_field(f), "intermediate_size")
    }

    /// The common fields; the experts' count and width are read from `experts` and `ffn`.
    pub(super) fn parse(f: &Fields, experts: &str, ffn: &str) -> Result<MixtralSpec, ImportError> {
        if f.get("rope_scaling").is_some() {
            return Err(ImportError::Unsupported {
                path: f.path.to_path_buf(),
                what: "'rope_scaling'".into(),
                detail: format!(
                    "found {}; hob implements plain RoPE only",
                    f.obj["rope_scaling"]
                ),
            });
        }
        let hidden = f.usize("hidden_size")?;
        let n_heads = f.usize("num_attention_heads")?;
        let n_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(n_heads);
        if n_heads % n_kv_heads != 0 {
            return Err(f.err(
                "num_key_value_heads",
                &format!("a divisor of num_attention_heads ({n_heads})"),
                f.get("num_key_value_heads"),
            ));
        }
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden % n_heads == 0 => hidden / n_heads,
            None => {
                return Err(f.err(
                    "head_dim",
                    &format!(
                        "a head size (hidden_size {hidden} is not divisible by {n_heads} heads)"
                    ),
                    None,
                ))
            }
        };
        let n_experts = f.usize(experts)?;
        let n_experts_used = f.usize("num_experts_per_tok")?;
        if n_experts_used > n_experts {
            return Err(f.err(
                "num_experts_per_tok",
                &format!("at most {experts} ({n_experts})"),
                f.get("num_experts_per_tok"),
            ));
        }
        let spec = MixtralSpec {
            hidden,
            ffn: f.usize(ffn)?,
            n_layers: f.usize("num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            rope_theta: rope_theta(f)?,
            rms_eps: f.f32("rms_norm_eps")?,
            vocab: f.usize("vocab_size")?,
            context_length: f.usize("max_position_embeddings")?,
            n_experts,
            n_experts_used,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            // Qwen's configs carry a window they do not use (use_sliding_window false).
            sliding_window: match f.get("use_sliding_window") {
                Some(Value::Bool(false)) => None,
                _ => f.opt_usize("sliding_window")?,
            },
            bos_token_id: f.opt_token_id("bos_token_id")?,
            eos_token_id: f.opt_token_id("eos_token_id")?,
        };
        for (field, v) in [
            ("hidden_size", spec.hidden),
            (ffn, spec.ffn),
            ("vocab_size", spec.vocab),
            ("max_position_embeddings", spec.context_length),
            ("head_dim", spec.head_dim),
            ("sliding_window", spec.sliding_window.unwrap_or(0)),
            (experts, spec.n_experts),
        ] {
            if u32::try_from(v).is_err() {
                return Err(f.err(field, "a value below 2^32", f.get(field)));
            }
        }
        Ok(spec)
    }

    /// `router`: the router's name in a layer; `qk_norm`: the widths of q's and k's RMSNorm
    /// weights, where they have them.
    fn dense_tensors(&self, router: &str, qk_norm: Option<[usize; 2]>) -> Vec<DenseTensor> {
        let (h, q, kv) = (
            self.hidden,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        let t = DenseTensor::new;
        let mut out = vec![t(
            keys::TOKEN_EMBD.into(),
            "model.embed_tokens.weight".into(),
            vec![self.vocab, h],
            TensorRole::Matrix,
        )];
        for l in 0..self.n_layers {
            let hf = |s: &str| format!("model.layers.{l}.{s}");
            out.extend([
                t(
                    keys::blk(l, keys::ATTN_NORM),
                    hf("input_layernorm.weight"),
                    vec![h],
                    TensorRole::Norm,
                ),
                t(
                    keys::blk(l, keys::ATTN_Q),
                    hf("self_attn.q_proj.weight"),
                    vec![q, h],
                    TensorRole::Matrix,
                ),
                t(
                    keys::blk(l, keys::ATTN_K),
                    hf("self_attn.k_proj.weight"),
                    vec![kv, h],
                    TensorRole::Matrix,
                ),
                t(
                    keys::blk(l, keys::ATTN_V),
                    hf("self_attn.v_proj.weight"),
                    vec![kv, h],
                    TensorRole::Matrix,
                ),
                t(
                    keys::blk(l, keys::ATTN_OUTPUT),
                    hf("self_attn.o_proj.weight"),
                    vec![h, q],
                    TensorRole::Matrix,
                ),
            ]);
            if let Some([qn, kn]) = qk_norm {
                out.extend([
                    t(
                        keys::blk(l, keys::ATTN_Q_NORM),
                        hf("self_attn.q_norm.weight"),
                        vec![qn],
                        TensorRole::Norm,
                    ),
                    t(
                        keys::blk(l, keys::ATTN_K_NORM),
                        hf("self_attn.k_norm.weight"),
                        vec![kn],
                        TensorRole::Norm,
                    ),
                ]);
            }
            out.extend([
                t(
                    keys::blk(l, keys::FFN_NORM),
                    hf("post_attention_layernorm.weight"),
                    vec![h],
                    TensorRole::Norm,
                ),
                t(
                    keys::blk(l, keys::FFN_GATE_INP),
                    hf(router),
                    vec![self.n_experts, h],
                    TensorRole::Router,
                ),
            ]);
        }
        out.push(t(
            keys::OUTPUT_NORM.into(),
            "model.norm.weight".into(),
            vec![h],
            TensorRole::Norm,
        ));
        if !self.tie_word_embeddings {
            out.push(t(
                keys::OUTPUT.into(),
                "lm_head.weight".into(),
                vec![self.vocab, h],
                TensorRole::Matrix,
            ));
        }
        out
    }

    /// The experts of `layers` (the checkpoint's layer numbers) in either layout.
    fn expert_source(
        &self,
        index: &TensorIndex,
        names: ExpertNames,
        layers: std::ops::Range<usize>,
    ) -> Result<ExpertSource, ImportError> {
        let (hidden, ffn, n) = (self.hidden, self.ffn, self.n_experts);
        let first = layers.start;
        if !index.contains(&names.name(first, 0, Which::Gate))
            && index.contains(&fused_name(first, "gate_up_proj"))
        {
            for l in layers {
                index.check(&fused_name(l, "gate_up_proj"), &[n, 2 * ffn, hidden])?;
                index.check(&fused_name(l, "down_proj"), &[n, hidden, ffn])?;
            }
            return Ok(ExpertSource::Fused { hidden, ffn });
        }
        for l in layers {
            for e in 0..n {
                index.check(&names.name(l, e, Which::Gate), &[ffn, hidden])?;
                index.check(&names.name(l, e, Which::Up), &[ffn, hidden])?;
                index.check(&names.name(l, e, Which::Down), &[hidden, ffn])?;
            }
        }
        Ok(ExpertSource::PerExpert { hidden, ffn, names })
    }

    fn write_metadata(&self, arch: &str, m: &mut Metadata) {
        let k = |key: &str| keys::arch_key(arch, key);
        for (key, v) in [
            (keys::VOCAB_SIZE, self.vocab),
            (keys::CONTEXT_LENGTH, self.context_length),
            (keys::EMBEDDING_LENGTH, self.hidden),
            (keys::FEED_FORWARD_LENGTH, self.ffn),
            (keys::BLOCK_COUNT, self.n_layers),
            (keys::HEAD_COUNT, self.n_heads),
            (keys::HEAD_COUNT_KV, self.n_kv_heads),
            (keys::KEY_LENGTH, self.head_dim),
            (keys::VALUE_LENGTH, self.head_dim),
            (keys::EXPERT_COUNT, self.n_experts),
            (keys::EXPERT_USED_COUNT, self.n_experts_used),
        ] {
            m.set(&k(key), u32_value(v));
        }
        m.set(&k(keys::RMS_EPS), MetaValue::F32(self.rms_eps));
        m.set(&k(keys::ROPE_FREQ_BASE), MetaValue::F32(self.rope_theta));
        if let Some(w) = self.sliding_window {
            m.set(&k(keys::SLIDING_WINDOW), u32_value(w));
        }
    }
}

/// `rope_theta` at the top level (hub configs) or inside transformers 5's `rope_parameters`.
fn rope_theta(f: &Fields) -> Result<f32, ImportError> {
    if let Some(params) = f.get("rope_parameters") {
        let obj = params
            .as_object()
            .ok_or_else(|| f.err("rope_parameters", "an object", Some(params)))?;
        let inner = Fields { path: f.path, obj };
        if let Some(t) = inner.get("rope_type") {
            if t.as_str() != Some("default") {
                return Err(ImportError::Unsupported {
                    path: f.path.to_path_buf(),
                    what: "rope_parameters.rope_type".into(),
                    detail: format!("found {t}; hob implements rope_type \"default\" only"),
                });
            }
        }
        if inner.get("rope_theta").is_some() {
            return inner.f32("rope_theta").map_err(|_| {
                f.err(
                    "rope_parameters.rope_theta",
                    "a positive number",
                    inner.get("rope_theta"),
                )
            });
        }
    }
    f.f32("rope_theta")
}

/// Refuse a model unless boolean `field` (`default` where absent) is `want`.
fn require_bool(
    f: &Fields,
    (field, default): (&str, bool),
    want: bool,
    detail: &str,
) -> Result<(), ImportError> {
    match f.bool_or(field, default)? == want {
        true => Ok(()),
        false => Err(f.unsupported(field, detail)),
    }
}

/// Refuse dense-MLP layers: hob runs every layer sparse.
fn require_all_sparse(f: &Fields) -> Result<(), ImportError> {
    if f.opt_usize("decoder_sparse_step")?.is_some_and(|s| s != 1) {
        let detail = "hob runs every layer sparse (decoder_sparse_step 1)";
        return Err(f.unsupported("decoder_sparse_step", detail));
    }
    let dense = f.get("mlp_only_layers").and_then(|v| v.as_array());
    if dense.is_some_and(|a| !a.is_empty()) {
        let detail = "hob runs every layer sparse (no dense-MLP layers)";
        return Err(f.unsupported("mlp_only_layers", detail));
    }
    Ok(())
}

/// The experts' count: `num_experts` on the hub, `num_local_experts` as transformers 5 saves it.
fn experts_field(f: &Fields) -> &'static str {
    match f.get("num_experts") {
        Some(_) => "num_experts",
        None => "num_local_experts",
    }
}

fn fused_name(layer: usize, w: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{w}")
}

impl ExpertSource {
    pub fn load(
        &self,
        index: &TensorIndex,
        layer: usize,
        expert: usize,
    ) -> Result<ExpertWeights, ImportError> {
        match *self {
            ExpertSource::PerExpert { names, .. } => Ok(ExpertWeights {
                gate: index.load_f32(&names.name(layer, expert, Which::Gate))?,
                up: index.load_f32(&names.name(layer, expert, Which::Up))?,
                down: index.load_f32(&names.name(layer, expert, Which::Down))?,
                mxfp4: None,
            }),
            ExpertSource::GptOss {
                hidden,
                ffn,
                mxfp4: false,
            } => super::gptoss::load_expert(index, (hidden, ffn), layer, expert),
            ExpertSource::GptOss {
                hidden,
                ffn,
                mxfp4: true,
            } => super::gptoss::load_mxfp4_expert(index, (hidden, ffn), layer, expert),
            ExpertSource::Fused { hidden, ffn } => {
                let m = hidden * ffn;
                let gate_up = fused_name(layer, "gate_up_proj");
                let down = fused_name(layer, "down_proj");
                let (mut w, base) = (
                    ExpertWeights {
                        gate: Vec::new(),
                        up: Vec::new(),
                        down: Vec::new(),
                        mxfp4: None,
                    },
                    expert * 2 * m,
                );
                index.load_range_into(&gate_up, base..base + m, &mut w.gate)?;
                index.load_range_into(&gate_up, base + m..base + 2 * m, &mut w.up)?;
                index.load_range_into(&down, expert * m..(expert + 1) * m, &mut w.down)?;
                Ok(w)
            }
        }
    }
}
