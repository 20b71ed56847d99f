//! Metadata keys. Standard keys follow GGUF's names (`{arch}.` prefixed hyper-parameters);
//! hob's own keys live under `hob.`.

pub const ARCHITECTURE: &str = "general.architecture";
pub const NAME: &str = "general.name";

/// `{arch}.` keys: call with the architecture name, e.g. `arch_key("mixtral", BLOCK_COUNT)`.
pub const VOCAB_SIZE: &str = "vocab_size";
pub const CONTEXT_LENGTH: &str = "context_length";
pub const EMBEDDING_LENGTH: &str = "embedding_length";
pub const FEED_FORWARD_LENGTH: &str = "feed_forward_length";
pub const BLOCK_COUNT: &str = "block_count";
pub const HEAD_COUNT: &str = "attention.head_count";
pub const HEAD_COUNT_KV: &str = "attention.head_count_kv";
pub const KEY_LENGTH: &str = "attention.key_length";
pub const VALUE_LENGTH: &str = "attention.value_length";
pub const RMS_EPS: &str = "attention.layer_norm_rms_epsilon";
pub const ROPE_FREQ_BASE: &str = "rope.freq_base";
pub const EXPERT_COUNT: &str = "expert_count";
pub const EXPERT_USED_COUNT: &str = "expert_used_count";
/// Phi-3.5-MoE's sparsemixer margin (transformers' router_jitter_noise).
pub const EXPERT_ROUTER_JITTER: &str = "expert_router_jitter_eps";
/// LongRoPE: the training context below which the short factors apply, the per-dimension
/// factors ([head_dim / 2] f32 arrays) and the cos/sin scales.
pub const ROPE_SCALING_ORIG_CTX: &str = "rope.scaling.original_context_length";
pub const ROPE_SHORT_FACTOR: &str = "rope.scaling.short_factor";
pub const ROPE_LONG_FACTOR: &str = "rope.scaling.long_factor";
pub const ROPE_SHORT_MSCALE: &str = "rope.scaling.short_mscale";
pub const ROPE_LONG_MSCALE: &str = "rope.scaling.long_mscale";
/// The shared expert's FFN width, where the architecture has one.
pub const EXPERT_SHARED_FEED_FORWARD_LENGTH: &str = "expert_shared_feed_forward_length";
/// Sliding attention window in tokens; absent when attention is global.
pub const SLIDING_WINDOW: &str = "attention.sliding_window";
/// Which layers the sliding window applies to (a u32 per layer, 1: sliding), where only some do
/// (gpt-oss: sliding and full layers alternate); absent: every layer, when there is a window.
pub const SLIDING_WINDOW_LAYERS: &str = "attention.sliding_window_layers";
/// YaRN (gpt-oss): the scaling factor, the correction range's rotations (beta fast and slow),
/// whether that range is truncated to whole dimensions, and the cos/sin scale (the attention
/// factor); the original context is `ROPE_SCALING_ORIG_CTX`.
pub const ROPE_SCALING_FACTOR: &str = "rope.scaling.factor";
pub const ROPE_YARN_BETA_FAST: &str = "rope.scaling.yarn_beta_fast";
pub const ROPE_YARN_BETA_SLOW: &str = "rope.scaling.yarn_beta_slow";
pub const ROPE_YARN_TRUNCATE: &str = "rope.scaling.yarn_truncate";
pub const ROPE_ATTN_FACTOR: &str = "rope.scaling.attn_factor";
/// gpt-oss's expert activation: (up + 1) * g * sigmoid(alpha * g) with g clamped above at the
/// limit and up to [-limit, limit].
pub const EXPERT_SWIGLU_ALPHA: &str = "expert_swiglu_alpha";
pub const EXPERT_SWIGLU_LIMIT: &str = "expert_swiglu_limit";

pub fn arch_key(arch: &str, key: &str) -> String {
    format!("{arch}.{key}")
}

pub const TOKENIZER_HF_JSON: &str = "tokenizer.huggingface.json";
pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
pub const BOS_TOKEN_ID: &str = "tokenizer.ggml.bos_token_id";
pub const EOS_TOKEN_ID: &str = "tokenizer.ggml.eos_token_id";
/// Every token that ends an answer (generation_config.json's eos_token_id list), EOS included.
pub const STOP_TOKEN_IDS: &str = "hob.stop_token_ids";
/// Whether the tokenizer_config.json asked for BOS to be prepended (`add_bos_token`).
pub const ADD_BOS_TOKEN: &str = "tokenizer.ggml.add_bos_token";

/// The output projection shares the token embedding (no `output.weight` tensor).
pub const TIE_WORD_EMBEDDINGS: &str = "hob.tie_word_embeddings";
/// Source checkpoint dtype ("f32", "f16", "bf16").
pub const SOURCE_DTYPE: &str = "hob.source_dtype";
/// Where the weights came from, for `hob inspect`: the source's kind and name, and for a GGUF its
/// tensor types (experts and dense apart).
pub const SOURCE: &str = "hob.source";
/// Set by `hob convert --synthetic`: the model whose shapes the random weights take
/// ("mixtral-8x7b", ...), and the seed they came from.
pub const SYNTHETIC_MODEL: &str = "hob.synthetic_model";
pub const SYNTHETIC_SEED: &str = "hob.synthetic_seed";

/// Dense tensor names (GGUF style). Q and K rows stay in Hugging Face order (rotate-half RoPE).
pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";

pub fn blk(layer: usize, name: &str) -> String {
    format!("blk.{layer}.{name}")
}
pub const ATTN_NORM: &str = "attn_norm.weight";
pub const ATTN_Q: &str = "attn_q.weight";
pub const ATTN_K: &str = "attn_k.weight";
pub const ATTN_V: &str = "attn_v.weight";
pub const ATTN_OUTPUT: &str = "attn_output.weight";
pub const FFN_NORM: &str = "ffn_norm.weight";
/// QK-norm (Qwen3-MoE): RMSNorm weights over each head of q and k, [head_dim].
pub const ATTN_Q_NORM: &str = "attn_q_norm.weight";
pub const ATTN_K_NORM: &str = "attn_k_norm.weight";
/// LayerNorm biases and the attention output's and output head's biases (Phi-3.5-MoE).
pub const ATTN_NORM_BIAS: &str = "attn_norm.bias";
pub const FFN_NORM_BIAS: &str = "ffn_norm.bias";
pub const ATTN_OUTPUT_BIAS: &str = "attn_output.bias";
pub const OUTPUT_NORM_BIAS: &str = "output_norm.bias";
pub const OUTPUT_BIAS: &str = "output.bias";
/// Attention biases (Qwen2-MoE): [q_dim], [kv_dim], [kv_dim].
pub const ATTN_Q_BIAS: &str = "attn_q.bias";
pub const ATTN_K_BIAS: &str = "attn_k.bias";
pub const ATTN_V_BIAS: &str = "attn_v.bias";
/// The shared expert (Qwen2-MoE): an FFN every token runs, scaled by a sigmoid gate
/// ([1, hidden]); its width is `{arch}.expert_shared_feed_forward_length`.
pub const FFN_GATE_SHEXP: &str = "ffn_gate_shexp.weight";
pub const FFN_UP_SHEXP: &str = "ffn_up_shexp.weight";
pub const FFN_DOWN_SHEXP: &str = "ffn_down_shexp.weight";
pub const FFN_GATE_INP_SHEXP: &str = "ffn_gate_inp_shexp.weight";
/// The router: [n_experts, hidden].
pub const FFN_GATE_INP: &str = "ffn_gate_inp.weight";
/// gpt-oss: the router's bias [n_experts], each attention head's sink logit [n_heads], and the
/// routed experts' biases, [n_experts, ffn] for gate and up and [n_experts, hidden] for down.
pub const FFN_GATE_INP_BIAS: &str = "ffn_gate_inp.bias";
pub const ATTN_SINKS: &str = "attn_sinks.weight";
pub const FFN_GATE_EXPS_BIAS: &str = "ffn_gate_exps.bias";
pub const FFN_UP_EXPS_BIAS: &str = "ffn_up_exps.bias";
pub const FFN_DOWN_EXPS_BIAS: &str = "ffn_down_exps.bias";

// GLM-4.5 (glm4moe) and DeepSeek-style MoEs, as llama.cpp names them: the leading dense layers
// and their FFN width (the experts' stays `feed_forward_length` in a .hob), sigmoid routing in
// groups with a selection bias, the renormalization and scale of the top-k weights, partial
// rotary. `attention.qk_norm` is hob's: whether q and k have a per-head RMSNorm.
pub const LEADING_DENSE_BLOCK_COUNT: &str = "leading_dense_block_count";
pub const DENSE_FEED_FORWARD_LENGTH: &str = "dense_feed_forward_length";
pub const EXPERT_GROUP_COUNT: &str = "expert_group_count";
pub const EXPERT_GROUP_USED_COUNT: &str = "expert_group_used_count";
pub const EXPERT_WEIGHTS_SCALE: &str = "expert_weights_scale";
pub const EXPERT_WEIGHTS_NORM: &str = "expert_weights_norm";
pub const ROPE_DIMENSION_COUNT: &str = "rope.dimension_count";
pub const ATTENTION_QK_NORM: &str = "attention.qk_norm";
pub const FFN_GATE: &str = "ffn_gate.weight";
pub const FFN_UP: &str = "ffn_up.weight";
pub const FFN_DOWN: &str = "ffn_down.weight";
pub const FFN_EXP_PROBS_B: &str = "exp_probs_b.bias";

// DeepSeek-V2's multi-head latent attention, as llama.cpp's deepseek2 writes it: the attention
// runs over the latent (key_length = kv_lora_rank + the RoPE part, value_length =
// kv_lora_rank, one KV head), the per-head projections in and out of it are *_mla.
pub const KV_LORA_RANK: &str = "attention.kv_lora_rank";
pub const Q_LORA_RANK: &str = "attention.q_lora_rank";
pub const KEY_LENGTH_MLA: &str = "attention.key_length_mla";
pub const VALUE_LENGTH_MLA: &str = "attention.value_length_mla";
pub const EXPERT_GATING_FUNC: &str = "expert_gating_func";
pub const ATTN_Q_A: &str = "attn_q_a.weight";
pub const ATTN_Q_A_NORM: &str = "attn_q_a_norm.weight";
pub const ATTN_Q_B: &str = "attn_q_b.weight";
pub const ATTN_KV_A_MQA: &str = "attn_kv_a_mqa.weight";
pub const ATTN_KV_A_NORM: &str = "attn_kv_a_norm.weight";
pub const ATTN_K_B: &str = "attn_k_b.weight";
pub const ATTN_V_B: &str = "attn_v_b.weight";
/// DeepSeek's YaRN softmax scale as llama.cpp stores it: 0.1 * mscale_all_dim, the scale being
/// (1 + this * ln(factor))^2.
pub const ROPE_YARN_LOG_MUL: &str = "rope.scaling.yarn_log_multiplier";
