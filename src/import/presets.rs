//! The shapes `hob convert --synthetic` knows: each preset's hyper-parameters from its public
//! config.json, and the architecture (routing, norms, extras) it is written as.

use super::arch::{Architecture, MixtralSpec};
use super::deepseek::DeepseekExtras;
use super::glm4moe::GlmExtras;
use super::gptoss::GptOssExtras;
use super::phimoe::PhiExtras;
use crate::model::yarn::Yarn;

/// The models `--synthetic` knows, by the name it takes.
pub const PRESETS: [&str; 10] = [
    "mixtral-8x7b",
    "phi-3.5-moe",
    "qwen3-30b-a3b",
    "qwen1.5-moe-a2.7b",
    "olmoe-1b-7b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "glm-4.5-air",
    "deepseek-v2-lite",
    "glm-4.7-flash",
];

/// Qwen1.5-MoE-A2.7B's shared expert width (shared_expert_intermediate_size).
const QWEN15_SHARED_FFN: usize = 5632;

fn spec(
    (hidden, ffn, n_layers): (usize, usize, usize),
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    vocab: usize,
    (n_experts, n_experts_used): (usize, usize),
    (rope_theta, rms_eps, context_length): (f32, f32, usize),
) -> MixtralSpec {
    MixtralSpec {
        hidden,
        ffn,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        rope_theta,
        rms_eps,
        vocab,
        context_length,
        n_experts,
        n_experts_used,
        tie_word_embeddings: false,
        sliding_window: None,
        bos_token_id: None,
        eos_token_id: None,
    }
}

/// A preset's shapes, all layers.
pub fn spec_of(name: &str) -> Result<MixtralSpec, String> {
    let spec = match name {
        // mistralai/Mixtral-8x7B-v0.1
        "mixtral-8x7b" => spec(
            (4096, 14336, 32),
            (32, 8, 128),
            32000,
            (8, 2),
            (1e6, 1e-5, 32768),
        ),
        // microsoft/Phi-3.5-MoE-instruct
        "phi-3.5-moe" => spec(
            (4096, 6400, 32),
            (32, 8, 128),
            32064,
            (16, 2),
            (1e4, 1e-5, 131072),
        ),
        // Qwen/Qwen3-30B-A3B: head_dim 128 with 32 heads, so q_dim 4096 != hidden 2048.
        "qwen3-30b-a3b" => spec(
            (2048, 768, 48),
            (32, 4, 128),
            151936,
            (128, 8),
            (1e6, 1e-6, 40960),
        ),
        // Qwen/Qwen1.5-MoE-A2.7B (and a shared expert of QWEN15_SHARED_FFN)
        "qwen1.5-moe-a2.7b" => spec(
            (2048, 1408, 24),
            (16, 16, 128),
            151936,
            (60, 4),
            (1e6, 1e-6, 8192),
        ),
        // allenai/OLMoE-1B-7B-0924
        "olmoe-1b-7b" => spec(
            (2048, 1024, 16),
            (16, 16, 128),
            50304,
            (64, 8),
            (1e4, 1e-5, 4096),
        ),
        // openai/gpt-oss-20b and gpt-oss-120b: 64 heads of 64 (q_dim 4096 != hidden 2880).
        "gpt-oss-20b" | "gpt-oss-120b" => {
            let (layers, experts) = match name {
                "gpt-oss-20b" => (24, 32),
                _ => (36, 128),
            };
            let mut s = spec(
                (2880, 2880, layers),
                (64, 8, 64),
                201088,
                (experts, 4),
                (150000.0, 1e-5, 131072),
            );
            s.sliding_window = Some(128);
            s
        }
        // zai-org/GLM-4.5-Air: 96 heads of 128 (q_dim 12288 != hidden 4096).
        "glm-4.5-air" => spec(
            (4096, 1408, 46),
            (96, 8, 128),
            151552,
            (128, 8),
            (1e6, 1e-5, 131072),
        ),
        // deepseek-ai/DeepSeek-V2-Lite as hob runs MLA: 16 heads over one latent "KV head" of
        // 512 + 64 (kv_lora_rank + qk_rope_head_dim).
        "deepseek-v2-lite" => spec(
            (2048, 1408, 27),
            (16, 1, 576),
            102400,
            (64, 6),
            (10000.0, 1e-6, 163840),
        ),
        // zai-org/GLM-4.7-Flash (Glm4MoeLiteForCausalLM): 20 heads over one latent of 512 + 64.
        "glm-4.7-flash" => spec(
            (2048, 1536, 47),
            (20, 1, 576),
            154880,
            (64, 4),
            (1e6, 1e-5, 202752),
        ),
        _ => {
            return Err(format!(
                "unknown synthetic model '{name}' (known: {})",
                PRESETS.join(", ")
            ))
        }
    };
    Ok(spec)
}

/// The architecture preset `name` is written as, with `spec` (maybe cut to fewer layers).
pub fn arch_of(name: &str, spec: MixtralSpec) -> Architecture {
    match name {
        "qwen3-30b-a3b" => Architecture::Qwen3Moe(spec),
        "qwen1.5-moe-a2.7b" => Architecture::Qwen2Moe(spec, QWEN15_SHARED_FFN),
        "olmoe-1b-7b" => Architecture::Olmoe(spec),
        "phi-3.5-moe" => {
            // Phi-3.5-MoE's sparsemixer margin and LongRoPE context; factors of 1.
            let half = spec.head_dim / 2;
            Architecture::Phimoe(
                spec,
                PhiExtras {
                    jitter_eps: 0.01,
                    original_context: 4096,
                    short_factor: vec![1.0; half],
                    long_factor: vec![1.0; half],
                    short_mscale: 1.0,
                    long_mscale: 1.0,
                },
            )
        }
        "gpt-oss-20b" | "gpt-oss-120b" => {
            // Its YaRN, sliding and full layers alternating, its SwiGLU clamp.
            let n = spec.n_layers;
            Architecture::GptOss(
                spec,
                GptOssExtras {
                    yarn: Yarn::gpt_oss(),
                    sliding_layers: (0..n).map(|l| l % 2 == 0).collect(),
                    swiglu_alpha: 1.702,
                    swiglu_limit: 7.0,
                },
            )
        }
        "glm-4.5-air" => {
            // One dense layer of 10944, one shared expert as wide as the routed ones, half of
            // each head rotated, one group.
            let extras = GlmExtras {
                dense_layers: 1,
                dense_ffn: 10944,
                shared_ffn: spec.ffn,
                rope_dim: spec.head_dim / 2,
                groups: 1,
                topk_groups: 1,
                renormalize: true,
                scale: 1.0,
                qk_norm: false,
            };
            Architecture::Glm4Moe(spec, extras)
        }
        "deepseek-v2-lite" => Architecture::DeepseekV2(spec, deepseek_v2_lite()),
        "glm-4.7-flash" => Architecture::DeepseekV2(spec, glm_4_7_flash()),
        _ => Architecture::Mixtral(spec),
    }
}

/// DeepSeek-V2-Lite's extras: one dense layer of 10944, two shared experts, softmax routing
/// unnormalized, MLA without a q bottleneck, YaRN (factor 40 over 4096, mscale 0.707).
fn deepseek_v2_lite() -> DeepseekExtras {
    let yarn = Yarn {
        factor: 40.0,
        original_context: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        truncate: true,
        attention_factor: 1.0,
    };
    DeepseekExtras {
        moe: GlmExtras {
            dense_layers: 1,
            dense_ffn: 10944,
            shared_ffn: 2 * 1408,
            rope_dim: 64,
            groups: 1,
            topk_groups: 1,
            renormalize: false,
            scale: 1.0,
            qk_norm: false,
        },
        mla: crate::model::Mla {
            q_lora: 0,
            kv_lora: 512,
            nope: 128,
            rope: 64,
            v: 128,
            softmax_scale: 1.0,
        },
        yarn: Some((yarn, 0.1 * 0.707)),
        sigmoid: false,
        interleaved: true,
    }
}

/// GLM-4.7-Flash's extras: one dense layer of 10240, one shared expert, sigmoid routing with the
/// score-correction bias (zeros here) renormalized and scaled by 1.8, MLA with a q bottleneck of
/// 768 and heads of 192 + 64 (values 256), no YaRN.
fn glm_4_7_flash() -> DeepseekExtras {
    DeepseekExtras {
        moe: GlmExtras {
            dense_layers: 1,
            dense_ffn: 10240,
            shared_ffn: 1536,
            rope_dim: 64,
            groups: 1,
            topk_groups: 1,
            renormalize: true,
            scale: 1.8,
            qk_norm: false,
        },
        mla: crate::model::Mla {
            q_lora: 768,
            kv_lora: 512,
            nope: 192,
            rope: 64,
            v: 256,
            softmax_scale: 1.0,
        },
        yarn: None,
        sigmoid: true,
        interleaved: true,
    }
}
