//! The hyper-parameters read from lists and groups of keys: MLA's shapes, the sliding layers,
//! LongRoPE's factors (`ModelConfig::from_metadata` reads the rest).

use super::config::{limits, LongRope, Mla};
use super::routing::Grouped;
use super::ModelError;
use crate::format::keys::{self, arch_key};
use crate::format::Metadata;

/// MLA's shapes from `a`'s keys: the attention's key length (`head_dim`) is the latent plus the
/// RoPE part; key_length_mla is a head's q (nope + rope), value_length_mla its value.
pub(super) fn mla(md: &Metadata, a: &str, head_dim: usize) -> Result<Mla, ModelError> {
    let u = |k: &str| -> Result<usize, ModelError> { Ok(md.get_u32(&arch_key(a, k))? as usize) };
    let kv_lora = u(keys::KV_LORA_RANK)?;
    let rope = u(keys::ROPE_DIMENSION_COUNT)?;
    let qk = u(keys::KEY_LENGTH_MLA)?;
    let bad = |key: &str, value: usize, problem: String| ModelError::BadHyperParameter {
        key: arch_key(a, key),
        value: value.to_string(),
        problem,
    };
    if kv_lora + rope != head_dim || kv_lora == 0 {
        let problem = format!("must be the key length {head_dim} less the RoPE part {rope}");
        return Err(bad(keys::KV_LORA_RANK, kv_lora, problem));
    }
    if qk <= rope || qk > limits::HEAD_DIM.1 {
        let problem = format!(
            "must exceed the RoPE part {rope}, at most {}",
            limits::HEAD_DIM.1
        );
        return Err(bad(keys::KEY_LENGTH_MLA, qk, problem));
    }
    let v = u(keys::VALUE_LENGTH_MLA)?;
    if v == 0 || v > limits::HEAD_DIM.1 {
        let problem = format!("out of range (accepted: 1 to {})", limits::HEAD_DIM.1);
        return Err(bad(keys::VALUE_LENGTH_MLA, v, problem));
    }
    Ok(Mla {
        q_lora: match md.get(&arch_key(a, keys::Q_LORA_RANK)) {
            Some(_) => u(keys::Q_LORA_RANK)?,
            None => 0,
        },
        kv_lora,
        nope: qk - rope,
        rope,
        v,
        softmax_scale: match md.get(&arch_key(a, keys::ROPE_YARN_LOG_MUL)) {
            Some(_) => {
                let mul = md.get_f32(&arch_key(a, keys::ROPE_YARN_LOG_MUL))?;
                let factor = md.get_f32(&arch_key(a, keys::ROPE_SCALING_FACTOR))?;
                let m = if factor > 1.0 {
                    1.0 + mul * factor.ln()
                } else {
                    1.0
                };
                m * m
            }
            None => 1.0,
        },
    })
}

/// The layers the sliding window applies to (`SLIDING_WINDOW_LAYERS`), where the file lists them.
pub(super) fn sliding_layers(md: &Metadata, a: &str) -> Result<Option<Vec<bool>>, ModelError> {
    let key = arch_key(a, keys::SLIDING_WINDOW_LAYERS);
    let Some(v) = md.get(&key) else {
        return Ok(None);
    };
    let crate::format::MetaValue::Array { items, .. } = v else {
        return Err(ModelError::BadHyperParameter {
            key,
            value: "not a list".into(),
            problem: "must be a list of 0 or 1 per layer".into(),
        });
    };
    items
        .iter()
        .map(|v| match v {
            crate::format::MetaValue::U32(x @ (0 | 1)) => Ok(*x == 1),
            other => Err(ModelError::BadHyperParameter {
                key: key.clone(),
                value: format!("{other:?}"),
                problem: "must be a list of 0 or 1 per layer".into(),
            }),
        })
        .collect::<Result<Vec<bool>, _>>()
        .map(Some)
}

/// LongRoPE's keys of architecture `a`: both factor lists hold head_dim / 2 positive values.
pub(super) fn long_rope(md: &Metadata, a: &str, head_dim: usize) -> Result<LongRope, ModelError> {
    let factors = |k: &str| -> Result<Vec<f32>, ModelError> {
        let key = arch_key(a, k);
        let bad = |value: String| ModelError::BadHyperParameter {
            key: key.clone(),
            value,
            problem: format!("must be a list of {} positive numbers", head_dim / 2),
        };
        let Some(crate::format::MetaValue::Array { items, .. }) = md.get(&key) else {
            return Err(bad("not a list".into()));
        };
        let values: Vec<f32> = items
            .iter()
            .filter_map(|v| match v {
                crate::format::MetaValue::F32(x) if x.is_finite() && *x > 0.0 => Some(*x),
                _ => None,
            })
            .collect();
        if values.len() != items.len() || values.len() != head_dim / 2 {
            return Err(bad(format!("{} items", items.len())));
        }
        Ok(values)
    };
    Ok(LongRope {
        original_context: md.get_u32(&arch_key(a, keys::ROPE_SCALING_ORIG_CTX))? as usize,
        short_factor: factors(keys::ROPE_SHORT_FACTOR)?,
        long_factor: factors(keys::ROPE_LONG_FACTOR)?,
        short_mscale: md.get_f32(&arch_key(a, keys::ROPE_SHORT_MSCALE))?,
        long_mscale: md.get_f32(&arch_key(a, keys::ROPE_LONG_MSCALE))?,
    })
}

/// GLM-4.5's and DeepSeek-V2's keys: the leading dense layers and their width, the grouped
/// routing, and whether q and k have a per-head RMSNorm.
pub(super) fn glm_parts(
    md: &Metadata,
    a: &str,
) -> Result<(usize, usize, Option<Grouped>, bool), ModelError> {
    let u = |k: &str| -> Result<usize, ModelError> { Ok(md.get_u32(&arch_key(a, k))? as usize) };
    let flag = |k: &str| -> Result<bool, ModelError> {
        match md.get(&arch_key(a, k)) {
            Some(_) => Ok(md.get_bool(&arch_key(a, k))?),
            None => Ok(false),
        }
    };
    let gating = match md.get(&arch_key(a, keys::EXPERT_GATING_FUNC)) {
        Some(_) => Some(u(keys::EXPERT_GATING_FUNC)?),
        None => None,
    };
    let grouped = Grouped {
        // llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid (GLM's default).
        softmax: gating == Some(1),
        groups: u(keys::EXPERT_GROUP_COUNT)?,
        topk_groups: u(keys::EXPERT_GROUP_USED_COUNT)?,
        renormalize: flag(keys::EXPERT_WEIGHTS_NORM)?,
        scale: md.get_f32(&arch_key(a, keys::EXPERT_WEIGHTS_SCALE))?,
    };
    Ok((
        u(keys::LEADING_DENSE_BLOCK_COUNT)?,
        u(keys::DENSE_FEED_FORWARD_LENGTH)?,
        Some(grouped),
        flag(keys::ATTENTION_QK_NORM)?,
    ))
}
