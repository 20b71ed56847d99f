//! Qwen2MoeForCausalLM's tensors beyond the common ones: q/k/v biases and the gated shared
//! expert.

use super::arch::{DenseTensor, MixtralSpec, TensorRole};
use crate::format::keys;

/// Qwen2-MoE's q/k/v biases and shared expert (of width `shared`), after the common tensors.
pub fn add_tensors(s: &MixtralSpec, shared: usize, out: &mut Vec<DenseTensor>) {
    let (h, q, kv) = (s.hidden, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    for l in 0..s.n_layers {
        let hf = |s: &str| format!("model.layers.{l}.{s}");
        let t = |hob: &str, hf: String, shape: Vec<usize>, role| {
            DenseTensor::new(keys::blk(l, hob), hf, shape, role)
        };
        out.extend([
            t(
                keys::ATTN_Q_BIAS,
                hf("self_attn.q_proj.bias"),
                vec![q],
                TensorRole::Norm,
            ),
            t(
                keys::ATTN_K_BIAS,
                hf("self_attn.k_proj.bias"),
                vec![kv],
                TensorRole::Norm,
            ),
            t(
                keys::ATTN_V_BIAS,
                hf("self_attn.v_proj.bias"),
                vec![kv],
                TensorRole::Norm,
            ),
            t(
                keys::FFN_GATE_SHEXP,
                hf("mlp.shared_expert.gate_proj.weight"),
                vec![shared, h],
                TensorRole::Matrix,
            ),
            t(
                keys::FFN_UP_SHEXP,
                hf("mlp.shared_expert.up_proj.weight"),
                vec![shared, h],
                TensorRole::Matrix,
            ),
            t(
                keys::FFN_DOWN_SHEXP,
                hf("mlp.shared_expert.down_proj.weight"),
                vec![h, shared],
                TensorRole::Matrix,
            ),
            t(
                keys::FFN_GATE_INP_SHEXP,
                hf("mlp.shared_expert_gate.weight"),
                vec![1, h],
                TensorRole::Router,
            ),
        ]);
    }
}
