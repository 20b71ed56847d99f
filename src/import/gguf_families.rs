//! The GGUF families whose keys go beyond the common ones (see [`super::gguf_checkpoint`]):
//! Phi-3.5-MoE's LongRoPE, gpt-oss's YaRN and sliding layers, GLM-4.5's dense layers, shared
//! experts, grouped routing and partial rotary, DeepSeek-V2's latent attention; and the tensor
//! names and shapes they spell their own way.

use super::arch::{Architecture, Lanes};
use super::deepseek::DeepseekExtras;
use super::gguf::GgufFile;
use super::gguf_checkpoint::{check_finite, check_tensor};
use super::gguf_spec::{missing, parse_spec, unsupported, Keys};
use super::glm4moe::GlmExtras;
use super::gptoss::GptOssExtras;
use super::{DenseTensor, ImportError, MixtralSpec};
use crate::format::{keys, MetaValue};
use crate::model::yarn::Yarn;

/// llama.cpp's LongRoPE factors (Phi-3 and Phi-3.5-MoE), [head_dim / 2] F32 tensors.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// gpt-oss's SwiGLU constants, which llama.cpp hard-codes (LLM_FFN_SWIGLU_OAI_MOE) and GGUF
/// files do not carry.
const GPT_OSS_SWIGLU: (f32, f32) = (1.702, 7.0);

/// The GGUF name of the dense tensor hob calls `hob`: gpt-oss's and GLM-4.5's FFN norm is
/// `post_attention_norm` there.
pub fn gguf_name(arch: &Architecture, hob: &str) -> String {
    match arch {
        Architecture::GptOss(..) | Architecture::Glm4Moe(..) if hob.ends_with(keys::FFN_NORM) => {
            hob.replace(keys::FFN_NORM, "post_attention_norm.weight")
        }
        _ => hob.to_string(),
    }
}

/// The GGUF dims (numpy order) of the dense tensor `t`: DeepSeek's k_b and v_b are per-head 3-D
/// tensors there ([heads, rank, nope], [heads, v, rank]), the same values as hob's 2-D ones.
pub fn gguf_shape(t: &DenseTensor) -> Vec<usize> {
    match t.lanes {
        Lanes::KvB {
            heads,
            nope,
            v,
            rank,
            values,
        } => match values {
            true => vec![heads, v, rank],
            false => vec![heads, rank, nope],
        },
        _ => t.shape.clone(),
    }
}

/// DeepSeek-V2 (`deepseek2`) as llama.cpp's converter writes it: MLA as one KV head of
/// `key_length` (kv_lora_rank + the RoPE part) with `key_length_mla` / `value_length_mla` the
/// per-head sizes, kv_b_proj already split into `attn_k_b` / `attn_v_b`, RoPE in the
/// checkpoint's interleaved order (de-interleaved here as from Hugging Face), softmax routing
/// (`expert_gating_func` 1) or GLM-4.7-Flash's sigmoid one (2, with `exp_probs_b`), YaRN with `yarn_log_multiplier` = 0.1 * mscale_all_dim
/// (the cos/sin scale taken as 1: mscale = mscale_all_dim, as DeepSeek's configs have it).
pub fn deepseek2(k: &Keys, file: &GgufFile) -> Result<(MixtralSpec, DeepseekExtras), ImportError> {
    let mut glm = glm4moe_parts(k, file)?;
    // llama.cpp's default where the key is absent: sigmoid for GLM-4.7-Flash's shape, else softmax.
    let flash = matches!(glm.0.n_layers, 47 | 48) && glm.0.vocab == 154880;
    let sigmoid = match k.opt_usize(keys::EXPERT_GATING_FUNC)? {
        None => flash,
        Some(1) => false,
        Some(2) => true,
        Some(g) => {
            let detail = format!("found {g}; hob runs softmax (1) and sigmoid (2) routing");
            return Err(unsupported(
                k.path,
                &k.full(keys::EXPERT_GATING_FUNC),
                &detail,
            ));
        }
    };
    let (spec, moe) = (&mut glm.0, &mut glm.1);
    let rope = moe.rope_dim;
    let key_mla = k.usize(keys::KEY_LENGTH_MLA)?;
    let mla = crate::model::Mla {
        q_lora: k.opt_usize(keys::Q_LORA_RANK)?.unwrap_or(0),
        kv_lora: k.usize(keys::KV_LORA_RANK)?,
        nope: key_mla
            .checked_sub(rope)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                k.err(
                    &k.full(keys::KEY_LENGTH_MLA),
                    "more than the RoPE dimension count",
                )
            })?,
        rope,
        v: k.usize(keys::VALUE_LENGTH_MLA)?,
        softmax_scale: 1.0,
    };
    if spec.n_kv_heads != 1 || spec.head_dim != mla.kv_lora + rope {
        let expected = format!(
            "one KV head of kv_lora_rank + RoPE ({})",
            mla.kv_lora + rope
        );
        return Err(k.err(&k.full(keys::KEY_LENGTH), &expected));
    }
    let yarn = match k.meta.get(&k.full("rope.scaling.type")) {
        None => None,
        Some(MetaValue::String(s)) if s == "none" => None,
        Some(MetaValue::String(s)) if s == "yarn" => Some((
            Yarn {
                factor: k.f32(keys::ROPE_SCALING_FACTOR)?,
                original_context: k.usize(keys::ROPE_SCALING_ORIG_CTX)?,
                beta_fast: k.opt_f32(keys::ROPE_YARN_BETA_FAST)?.unwrap_or(32.0),
                beta_slow: k.opt_f32(keys::ROPE_YARN_BETA_SLOW)?.unwrap_or(1.0),
                // ggml's correction range is floored and ceiled (ggml_rope_yarn_corr_dims).
                truncate: true,
                attention_factor: 1.0,
            },
            k.opt_f32(keys::ROPE_YARN_LOG_MUL)?.unwrap_or(0.0),
        )),
        Some(v) => {
            let detail = format!("found {v:?}; hob runs DeepSeek-V2 with YaRN or plain RoPE");
            return Err(unsupported(k.path, &k.full("rope.scaling.type"), &detail));
        }
    };
    // transformers' DeepSeek-V2 router never renormalizes; GLM-4.7-Flash's follows the key.
    moe.renormalize &= sigmoid;
    let (spec, moe) = glm;
    let extras = DeepseekExtras {
        moe,
        mla,
        yarn,
        sigmoid,
        interleaved: true,
    };
    Ok((spec, extras))
}

/// Tensors of the layers after the model's (GLM-4.5's next-token-prediction layer, which hob
/// does not run), left out of the conversion with a note.
pub fn skipped_layers(arch: &Architecture, file: &GgufFile) -> Vec<String> {
    let Architecture::Glm4Moe(s, _) = arch else {
        return Vec::new();
    };
    let beyond = |name: &str| {
        let layer = name.strip_prefix("blk.").and_then(|r| r.split('.').next());
        layer
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| l >= s.n_layers)
    };
    let names: Vec<String> = file
        .tensors()
        .iter()
        .filter(|t| beyond(&t.name))
        .map(|t| t.name.clone())
        .collect();
    if !names.is_empty() {
        eprintln!(
            "note: {} tensors of the next-token-prediction layer are left out (hob does not run it)",
            names.len()
        );
    }
    names
}

/// gpt-oss (`gpt-oss`) as llama.cpp's converter writes it: YaRN as `rope.scaling.*` (no
/// truncation, as llama.cpp computes it), a window on every other layer from layer 0 (its
/// `set_swa_pattern(2)`), the experts' gate and up de-interleaved (MXFP4 or float) with their
/// biases, and llama.cpp's SwiGLU constants.
pub fn gptoss(k: &Keys, file: &GgufFile) -> Result<(MixtralSpec, GptOssExtras), ImportError> {
    let kind = k.meta.get(&k.full("rope.scaling.type"));
    if !matches!(kind, Some(MetaValue::String(s)) if s == "yarn") {
        let detail = format!("found {kind:?}; gpt-oss uses YaRN");
        return Err(unsupported(k.path, &k.full("rope.scaling.type"), &detail));
    }
    let mut spec = parse_spec(k, file, true)?;
    spec.sliding_window = Some(k.usize(keys::SLIDING_WINDOW)?);
    let factor = k.f32(keys::ROPE_SCALING_FACTOR)?;
    let yarn = Yarn {
        factor,
        original_context: k.usize(keys::ROPE_SCALING_ORIG_CTX)?,
        beta_fast: k.opt_f32(keys::ROPE_YARN_BETA_FAST)?.unwrap_or(32.0),
        beta_slow: k.opt_f32(keys::ROPE_YARN_BETA_SLOW)?.unwrap_or(1.0),
        truncate: false,
        attention_factor: match k.opt_f32(keys::ROPE_ATTN_FACTOR)? {
            Some(a) => a,
            None => Yarn::default_attention_factor(factor),
        },
    };
    let extras = GptOssExtras {
        yarn,
        sliding_layers: (0..spec.n_layers).map(|l| l % 2 == 0).collect(),
        swiglu_alpha: GPT_OSS_SWIGLU.0,
        swiglu_limit: GPT_OSS_SWIGLU.1,
    };
    Ok((spec, extras))
}

/// GLM-4.5 (`glm4moe`) as llama.cpp's converter writes it: `block_count` counts the
/// next-token-prediction layers (`nextn_predict_layers`), `feed_forward_length` is the dense
/// layers' width and `expert_feed_forward_length` the experts'; sigmoid routing
/// (`expert_gating_func` 2) with `exp_probs_b`, in `expert_group_count` groups; partial rotary
/// as `rope.dimension_count` (NEOX order, as Hugging Face's); QK-norm where the tensors are.
pub fn glm4moe(k: &Keys, file: &GgufFile) -> Result<(MixtralSpec, GlmExtras), ImportError> {
    if let Some(g) = k.opt_usize(keys::EXPERT_GATING_FUNC)?.filter(|&g| g != 2) {
        let detail = format!("found {g}; hob runs GLM-4.5's sigmoid routing (2)");
        return Err(unsupported(
            k.path,
            &k.full(keys::EXPERT_GATING_FUNC),
            &detail,
        ));
    }
    glm4moe_parts(k, file)
}

/// What `glm4moe` and `deepseek2` share: the next-token-prediction layers counted out, the
/// leading dense layers, shared experts, groups, the weights' scale and norm, partial rotary.
fn glm4moe_parts(k: &Keys, file: &GgufFile) -> Result<(MixtralSpec, GlmExtras), ImportError> {
    let mut spec = parse_spec(k, file, true)?;
    let nextn = k.opt_usize("nextn_predict_layers")?.unwrap_or(0);
    spec.n_layers = spec
        .n_layers
        .checked_sub(nextn)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            let expected = format!(
                "fewer next-token-prediction layers than block_count ({})",
                spec.n_layers
            );
            k.err(&k.full("nextn_predict_layers"), &expected)
        })?;
    let dense_layers = k.opt_usize(keys::LEADING_DENSE_BLOCK_COUNT)?.unwrap_or(0);
    if dense_layers >= spec.n_layers {
        let expected = format!("fewer than the {} layers", spec.n_layers);
        return Err(k.err(&k.full(keys::LEADING_DENSE_BLOCK_COUNT), &expected));
    }
    let rope_dim = k
        .opt_usize(keys::ROPE_DIMENSION_COUNT)?
        .unwrap_or(spec.head_dim);
    if rope_dim == 0 || rope_dim > spec.head_dim || !rope_dim.is_multiple_of(2) {
        let expected = format!("an even count up to the head size {}", spec.head_dim);
        return Err(k.err(&k.full(keys::ROPE_DIMENSION_COUNT), &expected));
    }
    let norm = match k.meta.get(&k.full(keys::EXPERT_WEIGHTS_NORM)) {
        None => false,
        Some(MetaValue::Bool(b)) => *b,
        Some(_) => return Err(k.err(&k.full(keys::EXPERT_WEIGHTS_NORM), "a bool")),
    };
    let extras = GlmExtras {
        dense_layers,
        dense_ffn: match dense_layers {
            0 => 0,
            _ => k.usize(keys::FEED_FORWARD_LENGTH)?,
        },
        shared_ffn: k.opt_usize("expert_shared_count")?.unwrap_or(1) * spec.ffn,
        rope_dim,
        groups: k.opt_usize(keys::EXPERT_GROUP_COUNT)?.unwrap_or(1),
        topk_groups: k.opt_usize(keys::EXPERT_GROUP_USED_COUNT)?.unwrap_or(1),
        renormalize: norm,
        scale: k.opt_f32(keys::EXPERT_WEIGHTS_SCALE)?.unwrap_or(1.0),
        qk_norm: file.tensor(&keys::blk(0, keys::ATTN_Q_NORM)).is_some(),
    };
    if !spec.n_experts.is_multiple_of(extras.groups) || extras.topk_groups > extras.groups {
        let expected = format!("a divisor of the {} experts", spec.n_experts);
        return Err(k.err(&k.full(keys::EXPERT_GROUP_COUNT), &expected));
    }
    Ok((spec, extras))
}

/// Phi-3.5-MoE (`phimoe`) as llama.cpp's converter (Phi3MiniModel / PhiMoeModel) writes it:
/// LayerNorm with biases (`blk.N.attn_norm.bias`, ...; the dense tensors'
/// names are hob's), q/k/v/o and output biases, NEOX RoPE (no Q/K permutation), and LongRoPE as
/// `{arch}.rope.scaling.original_context_length`, `{arch}.rope.scaling.attn_factor` and the
/// tensors `rope_factors_long.weight` / `rope_factors_short.weight`.
///
/// What maps to [`PhiExtras`]:
/// - The factors and the original context: as they are.
/// - short and long mscale: llama.cpp has one `attn_factor`, which its converter computes as
///   `sqrt(1 + ln(max_pos / original) / ln(original))` (1 when the ratio is <= 1; llama.cpp's
///   default 1 when the key is absent) and applies at every context, ignoring the config's
///   `short_mscale` / `long_mscale`. Both are set to it, so the .hob runs as llama.cpp runs the
///   file; it differs from the Hugging Face conversion where the config's values differ.
/// - The jitter eps: not in the file. llama.cpp routes `phimoe` by plain softmax top-2 with
///   the two weights renormalized (build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX),
///   not by sparsemixer; hob keeps sparsemixer with Phi-3.5-MoE's `router_jitter_noise` 0.01
///   (the value transformers uses at inference), and `open` says so on stderr.
pub fn phimoe(
    k: &Keys,
    file: &GgufFile,
) -> Result<(MixtralSpec, super::phimoe::PhiExtras), ImportError> {
    let mut spec = parse_spec(k, file, false)?;
    if spec.n_experts_used != 2 {
        let detail = format!("found {}; sparsemixer picks 2", spec.n_experts_used);
        return Err(unsupported(
            k.path,
            &k.full(keys::EXPERT_USED_COUNT),
            &detail,
        ));
    }
    if spec.head_dim % 2 != 0 {
        return Err(k.err(&k.full(keys::KEY_LENGTH), "an even head size"));
    }
    // The converter writes 0 for the config's `sliding_window: null`.
    spec.sliding_window = k.opt_usize(keys::SLIDING_WINDOW)?.filter(|&w| w > 0);
    let factors = |name: &str| -> Result<Vec<f32>, ImportError> {
        let t = file.tensor(name).ok_or_else(|| missing(k.path, name))?;
        check_tensor(&t, &[spec.head_dim / 2])?;
        let values = t.dequantize_f32()?;
        check_finite(&t, &values)?;
        if let Some(bad) = values.iter().find(|&&x| x <= 0.0) {
            return Err(ImportError::Unsupported {
                path: k.path.to_path_buf(),
                what: format!("tensor {name}"),
                detail: format!("a LongRoPE factor of {bad}; they are positive"),
            });
        }
        Ok(values)
    };
    let mscale = k.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let extras = super::phimoe::PhiExtras {
        jitter_eps: PHI_JITTER_EPS,
        original_context: k.usize(keys::ROPE_SCALING_ORIG_CTX)?,
        short_factor: factors(ROPE_FACTORS_SHORT)?,
        long_factor: factors(ROPE_FACTORS_LONG)?,
        short_mscale: mscale,
        long_mscale: mscale,
    };
    Ok((spec, extras))
}

/// Phi-3.5-MoE's `router_jitter_noise` (its config.json's), which GGUF files do not carry.
const PHI_JITTER_EPS: f32 = 0.01;
