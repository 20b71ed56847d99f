//! Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6): what its config adds to the common fields
//! (leading dense layers, a shared expert, grouped sigmoid routing, partial rotary, optional
//! QK-norm) and its tensors beyond the common ones.
//!
//! Partial rotary: transformers rotates the first rope_dim values of each q and k head as two
//! halves (i, i + rope_dim / 2) and passes the rest. hob's RoPE rotates (i, i + head_dim / 2)
//! over the whole head, so convert orders each head's values (rows of q_proj and k_proj, their
//! biases and QK-norm weights) so that the rotated pairs sit there and the passed values pair
//! up with each other, turned by angle 0 (`Lanes::RopeOrder`): q · k is unchanged, exactly.

use super::arch::{DenseTensor, Lanes, MixtralSpec, TensorRole};
use super::fields::Fields;
use super::ImportError;
use crate::format::{keys, MetaValue, Metadata};

/// GLM-4.5's additions to the common hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct GlmExtras {
    /// `first_k_dense_replace`: the leading layers with a dense MLP of width `dense_ffn`.
    pub dense_layers: usize,
    pub dense_ffn: usize,
    /// The shared experts' width (`n_shared_experts` x `moe_intermediate_size`).
    pub shared_ffn: usize,
    pub rope_dim: usize,
    pub groups: usize,
    pub topk_groups: usize,
    pub renormalize: bool,
    pub scale: f32,
    pub qk_norm: bool,
}

/// The spec and the extras from a Glm4MoeForCausalLM config.json.
pub fn parse(f: &Fields) -> Result<(MixtralSpec, GlmExtras), ImportError> {
    let spec = MixtralSpec::parse(f, "n_routed_experts", "moe_intermediate_size")?;
    if !f.bool_or("attention_bias", false)? {
        let detail = "hob runs GLM-4.5 with q/k/v biases (attention_bias true)";
        return Err(f.unsupported("attention_bias", detail));
    }
    if let Some(act) = f.get("hidden_act").filter(|v| v.as_str() != Some("silu")) {
        return Err(f.err("hidden_act", "\"silu\"", Some(act)));
    }
    let factor = match f
        .get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"))
    {
        Some(v) => v.as_f64(),
        None => f.opt_f64("partial_rotary_factor")?.or(Some(0.5)),
    };
    let rope_dim = factor
        .filter(|x| *x > 0.0 && *x <= 1.0)
        .map(|x| (spec.head_dim as f64 * x) as usize)
        .filter(|d| *d >= 2 && d.is_multiple_of(2))
        .ok_or_else(|| {
            let expected = format!(
                "a factor in (0, 1] giving an even part of head_dim {}",
                spec.head_dim
            );
            f.err(
                "partial_rotary_factor",
                &expected,
                f.get("partial_rotary_factor"),
            )
        })?;
    let dense_layers = f
        .obj
        .get("first_k_dense_replace")
        .and_then(|v| v.as_u64())
        .unwrap_or(0) as usize;
    if dense_layers >= spec.n_layers {
        let expected = format!("fewer than num_hidden_layers ({})", spec.n_layers);
        return Err(f.err(
            "first_k_dense_replace",
            &expected,
            f.get("first_k_dense_replace"),
        ));
    }
    let groups = f.opt_usize("n_group")?.unwrap_or(1);
    let topk_groups = f.opt_usize("topk_group")?.unwrap_or(1);
    if !spec.n_experts.is_multiple_of(groups) || topk_groups > groups {
        let expected = format!(
            "a divisor of the {} experts, at least topk_group",
            spec.n_experts
        );
        return Err(f.err("n_group", &expected, f.get("n_group")));
    }
    let extras = GlmExtras {
        dense_layers,
        dense_ffn: match dense_layers {
            0 => 0,
            _ => f.usize("intermediate_size")?,
        },
        shared_ffn: f.opt_usize("n_shared_experts")?.unwrap_or(1) * spec.ffn,
        rope_dim,
        groups,
        topk_groups,
        renormalize: f.bool_or("norm_topk_prob", true)?,
        scale: f.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        qk_norm: f.bool_or("use_qk_norm", false)?,
    };
    Ok((spec, extras))
}

/// GLM-4.5's dense tensors from the common list (`out`, with a router in every layer): no router
/// in the dense layers, q and k in RoPE order, then biases, MLPs, shared experts and selection
/// biases.
pub fn adjust_tensors(s: &MixtralSpec, e: &GlmExtras, out: &mut Vec<DenseTensor>) {
    let dense_router = |t: &DenseTensor| {
        (0..e.dense_layers).any(|l| t.hob_name == keys::blk(l, keys::FFN_GATE_INP))
    };
    out.retain(|t| !dense_router(t));
    let (h, q, kv) = (s.hidden, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let t = |l: usize, hob: &str, hf: &str, shape: Vec<usize>, role| {
        DenseTensor::new(
            keys::blk(l, hob),
            format!("model.layers.{l}.{hf}"),
            shape,
            role,
        )
    };
    let (mat, vec) = (TensorRole::Matrix, TensorRole::Norm);
    let mut extra = Vec::new();
    for l in 0..s.n_layers {
        extra.extend([
            t(l, keys::ATTN_Q_BIAS, "self_attn.q_proj.bias", vec![q], vec),
            t(l, keys::ATTN_K_BIAS, "self_attn.k_proj.bias", vec![kv], vec),
            t(l, keys::ATTN_V_BIAS, "self_attn.v_proj.bias", vec![kv], vec),
        ]);
        if l < e.dense_layers {
            let f = e.dense_ffn;
            extra.extend([
                t(l, keys::FFN_GATE, "mlp.gate_proj.weight", vec![f, h], mat),
                t(l, keys::FFN_UP, "mlp.up_proj.weight", vec![f, h], mat),
                t(l, keys::FFN_DOWN, "mlp.down_proj.weight", vec![h, f], mat),
            ]);
            continue;
        }
        let f = e.shared_ffn;
        extra.extend([
            t(
                l,
                keys::FFN_GATE_SHEXP,
                "mlp.shared_experts.gate_proj.weight",
                vec![f, h],
                mat,
            ),
            t(
                l,
                keys::FFN_UP_SHEXP,
                "mlp.shared_experts.up_proj.weight",
                vec![f, h],
                mat,
            ),
            t(
                l,
                keys::FFN_DOWN_SHEXP,
                "mlp.shared_experts.down_proj.weight",
                vec![h, f],
                mat,
            ),
            t(
                l,
                keys::FFN_EXP_PROBS_B,
                "mlp.gate.e_score_correction_bias",
                vec![s.n_experts],
                vec,
            ),
        ]);
    }
    out.extend(extra);
    if e.rope_dim < s.head_dim {
        let rotated = [
            keys::ATTN_Q,
            keys::ATTN_K,
            keys::ATTN_Q_BIAS,
            keys::ATTN_K_BIAS,
            keys::ATTN_Q_NORM,
            keys::ATTN_K_NORM,
        ];
        for t in out.iter_mut() {
            if rotated
                .iter()
                .any(|r| t.hob_name.ends_with(&format!(".{r}")))
            {
                t.lanes = Lanes::RopeOrder {
                    head_dim: s.head_dim,
                    rope_dim: e.rope_dim,
                };
            }
        }
    }
}

/// The `{arch}.*` keys GLM-4.5 adds.
pub fn write_metadata(e: &GlmExtras, arch: &str, m: &mut Metadata) {
    let k = |key: &str| keys::arch_key(arch, key);
    let u = |n: usize| MetaValue::U32(u32::try_from(n).unwrap_or(u32::MAX));
    m.set(&k(keys::LEADING_DENSE_BLOCK_COUNT), u(e.dense_layers));
    m.set(&k(keys::DENSE_FEED_FORWARD_LENGTH), u(e.dense_ffn));
    m.set(&k(keys::EXPERT_SHARED_FEED_FORWARD_LENGTH), u(e.shared_ffn));
    m.set(&k(keys::ROPE_DIMENSION_COUNT), u(e.rope_dim));
    m.set(&k(keys::EXPERT_GROUP_COUNT), u(e.groups));
    m.set(&k(keys::EXPERT_GROUP_USED_COUNT), u(e.topk_groups));
    m.set(
        &k(keys::EXPERT_WEIGHTS_NORM),
        MetaValue::Bool(e.renormalize),
    );
    m.set(&k(keys::EXPERT_WEIGHTS_SCALE), MetaValue::F32(e.scale));
    m.set(&k(keys::ATTENTION_QK_NORM), MetaValue::Bool(e.qk_norm));
}

/// Where value j of a head in hob's RoPE order comes from in the checkpoint's head: the rotated
/// halves at 0.. and head_dim / 2.., the passed values after each half.
pub fn rope_order_source(j: usize, head_dim: usize, rope_dim: usize) -> usize {
    let (half, r) = (head_dim / 2, rope_dim / 2);
    let pass = half - r;
    match j {
        j if j < r => j,
        j if j < half => rope_dim + (j - r),
        j if j < half + r => r + (j - half),
        j => rope_dim + pass + (j - half - r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_order_is_a_permutation_that_pairs_the_rotated_halves() {
        let (hd, rd) = (32, 16);
        let src: Vec<usize> = (0..hd).map(|j| rope_order_source(j, hd, rd)).collect();
        let mut sorted = src.clone();
        sorted.sort();
        assert_eq!(sorted, (0..hd).collect::<Vec<_>>());
        // hob's pair (j, j + 16) is transformers' rotated pair (i, i + 8) for j < 8.
        for i in 0..rd / 2 {
            assert_eq!((src[i], src[i + hd / 2]), (i, i + rd / 2));
        }
        // Whole rotary: the identity.
        assert!((0..hd).all(|j| rope_order_source(j, hd, hd) == j));
    }
}
