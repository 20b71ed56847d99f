#!/usr/bin/env python3
"""A GGUF with random weights in a real MoE's shapes, for llama.cpp speed runs beside `hob convert --synthetic`.

    python3 tools/make_synthetic_gguf.py OUT.gguf [--layers 8] [--model mixtral-8x7b|qwen3-30b-a3b|olmoe-1b-7b|phi-3.5-moe|
                                                                gpt-oss-20b|gpt-oss-120b|glm-4.5-air|deepseek-v2-lite|glm-4.7-flash]
                                                  [--mxfp4-experts | --q4-k-m | --q8-0]

--mxfp4-experts writes the routed experts as MXFP4 blocks (random codes, exponents around 2^-7, as gpt-oss ships
them) instead of f16: `llama-quantize --allow-requantize OUT.gguf Q.gguf MXFP4_MOE` then keeps them and makes the
rest Q8_0.

--q4-k-m writes the file llama-quantize's Q4_K_M would make, without the f16 file and the quantization (a whole
Qwen3-30B-A3B in f16, 61 GB, does not fit the device's disk beside its Q4_K_M): each matrix in the type
llama.cpp's Q4_K_M rule gives it (src/llama-quant.cpp, models of other than 8 experts: Q4_K, ffn_down_exps and
attn_v Q6_K in the layers its use_more_bits picks, the output head Q6_K; routers and norms f32), its blocks random
codes and sub-block scales under fixed f16 super-block scales (dequantized by gguf-py: Q4_K values of sd
~0.04, Q6_K ~0.02).

--q8-0 writes the file llama-quantize's Q8_0 would make, likewise: every 2-D and 3-D matrix in Q8_0 blocks (random
int8 codes under a fixed f16 scale: values of sd ~0.02; rows not a multiple of 32 stay f16).

Each model in llama.cpp's own architecture (llama for Mixtral, qwen3moe and olmoe with their QK-norm tensors, phimoe
with its LayerNorm, attention and output biases; LongRoPE's factor tensors are optional there and left out; gpt-oss
with its attention biases and sinks, router and expert biases, post-attention norm and a 128-token window on every
other layer; glm4moe with q/k/v biases, partial rotary (64 of 128), a dense first layer of width 10944, a shared
expert and sigmoid routing with its selection bias; deepseek2 with MLA as llama.cpp's converter writes it: the
latent and RoPE key (attn_kv_a_mqa), k_b and v_b split per head, YaRN, a dense first layer and two shared experts),
GLM-4.7-Flash as deepseek2 too, with a q bottleneck, sigmoid routing and exp_probs_b), so both programs run the same
shapes and the same attention.

Needs numpy and llama.cpp's gguf-py (PYTHONPATH=<llama.cpp>/gguf-py). Streams tensor by tensor (memory stays
near 1 GB). The weights are noise (speed only): f16 ~ N(0, 0.02) drawn from a 64M-value pool, routers f32 N(0, 1)
so routing varies, a dummy 32000-token SentencePiece-style vocabulary (ids 0-2: <unk> <s> </s>).
"""
import argparse
import sys

import numpy as np
import gguf
from gguf.gguf_writer import WriterState

# name: (gguf architecture, hidden, expert ffn, heads, kv heads, head dim, vocab, experts, top-k, layers,
#        rope base, rms eps, context, QK-norm: None | "head" | "whole")
MODELS = {
    "mixtral-8x7b": ("llama", 4096, 14336, 32, 8, 128, 32000, 8, 2, 32, 1e6, 1e-5, 32768, None),
    "qwen3-30b-a3b": ("qwen3moe", 2048, 768, 32, 4, 128, 151936, 128, 8, 48, 1e6, 1e-6, 40960, "head"),
    "olmoe-1b-7b": ("olmoe", 2048, 1024, 16, 16, 128, 50304, 64, 8, 16, 1e4, 1e-5, 4096, "whole"),
    "phi-3.5-moe": ("phimoe", 4096, 6400, 32, 8, 128, 32064, 16, 2, 32, 1e4, 1e-5, 131072, None),
    "gpt-oss-20b": ("gpt-oss", 2880, 2880, 64, 8, 64, 201088, 32, 4, 24, 150000.0, 1e-5, 131072, None),
    "gpt-oss-120b": ("gpt-oss", 2880, 2880, 64, 8, 64, 201088, 128, 4, 36, 150000.0, 1e-5, 131072, None),
    "glm-4.5-air": ("glm4moe", 4096, 1408, 96, 8, 128, 151552, 128, 8, 46, 1e6, 1e-5, 131072, None),
    "deepseek-v2-lite": ("deepseek2", 2048, 1408, 16, 1, 576, 102400, 64, 6, 27, 1e4, 1e-6, 163840, None),
    "glm-4.7-flash": ("deepseek2", 2048, 1536, 20, 1, 576, 154880, 64, 4, 47, 1e6, 1e-5, 202752, None),
}
# DeepSeek-V2-Lite's MLA: kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; its dense first layer,
# shared experts and YaRN (factor, original context, 0.1 * mscale_all_dim).
# GLM-4.7-Flash differs in (q_lora_rank, qk_nope_head_dim, v_head_dim, dense width, shared experts, weights scale)
# and routes by sigmoid with exp_probs_b, renormalized, without YaRN.
DS_LORA, DS_NOPE, DS_ROPE, DS_V = 512, 128, 64, 128
DS_DENSE_FFN, DS_SHARED, DS_YARN = 10944, 2, (40.0, 4096, 0.0707)
FLASH = dict(q_lora=768, nope=192, v=256, dense_ffn=10240, shared=1, scale=1.8)
# GLM-4.5-Air: the dense first layer's width, leading dense layers, shared experts, rotated dims per head.
GLM_DENSE_FFN, GLM_DENSE_LAYERS, GLM_SHARED, GLM_ROPE_DIM = 10944, 1, 1, 64
# Architectures with LayerNorm biases and attention, output-head biases.
BIASES = {"phimoe"}


# Block types written as random bytes: values per block, bytes per block, ggml type.
BLOCKS = {"mxfp4": (32, 17, gguf.GGMLQuantizationType.MXFP4),
          "q4_k": (256, 144, gguf.GGMLQuantizationType.Q4_K),
          "q6_k": (256, 210, gguf.GGMLQuantizationType.Q6_K),
          "q8_0": (32, 34, gguf.GGMLQuantizationType.Q8_0)}


def use_more_bits(i, n):
    """llama.cpp's choice of the layers whose ffn_down and attn_v get more bits in its _M types."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name, n_layers):
    """The block type llama-quantize's Q4_K_M gives a 2-D or 3-D f16 tensor (models of other than 8 experts)."""
    if name == "output.weight":
        return "q6_k"
    if name.startswith("blk.") and (name.endswith("ffn_down_exps.weight") or name.endswith("attn_v.weight")):
        return "q6_k" if use_more_bits(int(name.split(".")[1]), n_layers) else "q4_k"
    return "q4_k"


def k_pools(rng):
    """Pools of random Q4_K and Q6_K blocks (2^18 each): random codes and sub-block scales under fixed f16
    super-block scales (Q4_K: d * sc * q - dmin * m, sc, m in 0..63, q in 0..15, values of sd ~0.04; Q6_K:
    d * scale * (q - 32), int8 scales, sd ~0.02; both dequantized by gguf-py)."""
    nb = 1 << 18
    q4 = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
    q4[:, 0:4] = np.frombuffer(np.array([1.5e-4, 1.1e-3], dtype=np.float16).tobytes(), dtype=np.uint8)
    q6 = rng.integers(0, 256, size=(nb, 210), dtype=np.uint8)
    q6[:, 208:210] = np.frombuffer(np.array([1.5e-5], dtype=np.float16).tobytes(), dtype=np.uint8)
    q8 = rng.integers(-127, 128, size=(nb, 34), dtype=np.int8).view(np.uint8)
    q8[:, 0:2] = np.frombuffer(np.array([2.7e-4], dtype=np.float16).tobytes(), dtype=np.uint8)
    return {"q4_k": q4.reshape(-1), "q6_k": q6.reshape(-1), "q8_0": q8.reshape(-1)}


def deepseek2_layer(b, l, hidden, heads, ffn, experts, p):
    """One deepseek2 block's tensors, in llama.cpp's MLA layout (numpy shapes: ggml's reversed); p: the model's
    q_lora, nope, v, dense_ffn and shared (DeepSeek-V2-Lite's or GLM-4.7-Flash's)."""
    sh, qw = p["shared"] * ffn, heads * (p["nope"] + DS_ROPE)
    t = [(b + "attn_norm.weight", (hidden,), np.float32)]
    if p["q_lora"]:
        t += [(b + "attn_q_a.weight", (p["q_lora"], hidden), np.float16),
              (b + "attn_q_a_norm.weight", (p["q_lora"],), np.float32),
              (b + "attn_q_b.weight", (qw, p["q_lora"]), np.float16)]
    else:
        t += [(b + "attn_q.weight", (qw, hidden), np.float16)]
    t += [(b + "attn_kv_a_mqa.weight", (DS_LORA + DS_ROPE, hidden), np.float16),
          (b + "attn_kv_a_norm.weight", (DS_LORA,), np.float32),
          (b + "attn_k_b.weight", (heads, DS_LORA, p["nope"]), np.float16),
          (b + "attn_v_b.weight", (heads, p["v"], DS_LORA), np.float16),
          (b + "attn_output.weight", (hidden, heads * p["v"]), np.float16),
          (b + "ffn_norm.weight", (hidden,), np.float32)]
    if l == 0:
        f = p["dense_ffn"]
        return t + [(b + "ffn_gate.weight", (f, hidden), np.float16),
                    (b + "ffn_down.weight", (hidden, f), np.float16),
                    (b + "ffn_up.weight", (f, hidden), np.float16)]
    bias = [(b + "exp_probs_b.bias", (experts,), np.float32)] if p is FLASH else []
    return t + bias + [(b + "ffn_gate_inp.weight", (experts, hidden), np.float32),
                       (b + "ffn_gate_exps.weight", (experts, ffn, hidden), np.float16),
                       (b + "ffn_down_exps.weight", (experts, hidden, ffn), np.float16),
                       (b + "ffn_up_exps.weight", (experts, ffn, hidden), np.float16),
                       (b + "ffn_gate_shexp.weight", (sh, hidden), np.float16),
                       (b + "ffn_down_shexp.weight", (hidden, sh), np.float16),
                       (b + "ffn_up_shexp.weight", (sh, hidden), np.float16)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--model", default="mixtral-8x7b", choices=sorted(MODELS))
    ap.add_argument("--mxfp4-experts", action="store_true")
    ap.add_argument("--q4-k-m", action="store_true")
    ap.add_argument("--q8-0", action="store_true")
    a = ap.parse_args()
    if sum([a.mxfp4_experts, a.q4_k_m, a.q8_0]) > 1:
        sys.exit("--mxfp4-experts, --q4-k-m and --q8-0: one at most")
    arch, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB, EXPERTS, TOP_K, total, base, eps, ctx, qk = MODELS[a.model]
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    rng = np.random.default_rng(1234)
    pool = (rng.standard_normal(64 << 20, dtype=np.float32) * 0.02).astype(np.float16)
    # ggml block_mxfp4: an E8M0 exponent (2^-8 .. 2^-6: e2m1 codes' sd 2.9 times it ~ 0.01-0.02), 16 code bytes.
    mxpool = rng.integers(0, 256, size=(1 << 20, 17), dtype=np.uint8)
    mxpool[:, 0] = rng.integers(119, 122, size=1 << 20, dtype=np.uint8)
    mxpool = mxpool.reshape(-1)
    kpools = k_pools(rng) if a.q4_k_m or a.q8_0 else {}

    w = gguf.GGUFWriter(a.out, arch)
    # Not "phi-3" in the name: llama.cpp then sets attributes on Phi-3's special tokens, which this vocabulary lacks.
    w.add_name(f"synthetic {a.model.replace('-', ' ')} ({a.layers} of {total} layers)")
    w.add_block_count(a.layers)
    w.add_context_length(ctx)
    w.add_embedding_length(HIDDEN)
    oss, glm, ds = arch == "gpt-oss", arch == "glm4moe", arch == "deepseek2"
    w.add_feed_forward_length(GLM_DENSE_FFN if glm else (FLASH["dense_ffn"] if a.model == "glm-4.7-flash" else DS_DENSE_FFN) if ds else FFN)
    flash = a.model == "glm-4.7-flash"
    ds_p = dict(q_lora=0, nope=DS_NOPE, v=DS_V, dense_ffn=DS_DENSE_FFN, shared=DS_SHARED, scale=1.0)
    if flash:
        ds_p = FLASH
    if ds:
        w.add_leading_dense_block_count(1)
        w.add_expert_shared_count(ds_p["shared"])
        w.add_expert_weights_scale(ds_p["scale"])
        w.add_kv_lora_rank(DS_LORA)
        w.add_key_length_mla(ds_p["nope"] + DS_ROPE)
        w.add_value_length_mla(ds_p["v"])
    if ds and ds_p["q_lora"]:
        w.add_q_lora_rank(ds_p["q_lora"])
    if flash:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_norm(True)
    elif ds:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(DS_YARN[0])
        w.add_rope_scaling_orig_ctx_len(DS_YARN[1])
        w.add_rope_scaling_yarn_log_mul(DS_YARN[2])
    if glm:
        w.add_leading_dense_block_count(GLM_DENSE_LAYERS)
        w.add_expert_shared_count(GLM_SHARED)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if oss:
        w.add_sliding_window(128)
    if arch != "llama":
        w.add_expert_feed_forward_length(FFN)
        w.add_key_length(HEAD_DIM)
        w.add_value_length(DS_LORA if ds else HEAD_DIM)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(base)
    w.add_layer_norm_rms_eps(eps)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_rope_dimension_count(GLM_ROPE_DIM if glm else DS_ROPE if ds else HEAD_DIM)
    w.add_vocab_size(VOCAB)
    if a.q4_k_m and (EXPERTS == 8 or arch in ("gpt-oss", "glm4moe", "deepseek2") or a.mxfp4_experts):
        sys.exit("--q4-k-m: written for qwen3moe, olmoe and phimoe shapes (llama.cpp's rule differs for the others)")
    ftype = "MOSTLY_Q4_K_M" if a.q4_k_m else "MOSTLY_Q8_0" if a.q8_0 else "MOSTLY_F16"
    w.add_file_type(getattr(gguf.LlamaFileType, ftype))
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([3, 3, 3] + [1] * (VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    # (name, numpy shape, dtype)
    bias = arch in BIASES
    specs = [("token_embd.weight", (VOCAB, HIDDEN), np.float16)]
    for l in range(a.layers):
        b = f"blk.{l}."
        if ds:
            specs += deepseek2_layer(b, l, HIDDEN, HEADS, FFN, EXPERTS, ds_p)
            continue
        specs += [
            (b + "attn_norm.weight", (HIDDEN,), np.float32),
            (b + "attn_q.weight", (q_dim, HIDDEN), np.float16),
            (b + "attn_k.weight", (kv_dim, HIDDEN), np.float16),
            (b + "attn_v.weight", (kv_dim, HIDDEN), np.float16),
            (b + "attn_output.weight", (HIDDEN, q_dim), np.float16),
        ]
        if bias:
            specs += [(b + n + ".bias", (d,), np.float32) for n, d in
                      [("attn_norm", HIDDEN), ("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim),
                       ("attn_output", HIDDEN), ("ffn_norm", HIDDEN)]]
        if glm:
            specs += [(b + n + ".bias", (d,), np.float32) for n, d in
                      [("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)]]
            specs += [(b + "post_attention_norm.weight", (HIDDEN,), np.float32)]
            if l < GLM_DENSE_LAYERS:
                specs += [(b + "ffn_gate.weight", (GLM_DENSE_FFN, HIDDEN), np.float16),
                          (b + "ffn_down.weight", (HIDDEN, GLM_DENSE_FFN), np.float16),
                          (b + "ffn_up.weight", (GLM_DENSE_FFN, HIDDEN), np.float16)]
                continue
            sh = GLM_SHARED * FFN
            specs += [(b + "exp_probs_b.bias", (EXPERTS,), np.float32),
                      (b + "ffn_gate_shexp.weight", (sh, HIDDEN), np.float16),
                      (b + "ffn_down_shexp.weight", (HIDDEN, sh), np.float16),
                      (b + "ffn_up_shexp.weight", (sh, HIDDEN), np.float16)]
        if oss:
            specs += [(b + n + ".bias", (d,), np.float32) for n, d in
                      [("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim), ("attn_output", HIDDEN),
                       ("ffn_gate_inp", EXPERTS)]]
            specs += [(b + "attn_sinks.weight", (HEADS,), np.float32),
                      (b + "ffn_gate_exps.bias", (EXPERTS, FFN), np.float32),
                      (b + "ffn_up_exps.bias", (EXPERTS, FFN), np.float32),
                      (b + "ffn_down_exps.bias", (EXPERTS, HIDDEN), np.float32)]
        if qk is not None:
            qn, kn = (HEAD_DIM, HEAD_DIM) if qk == "head" else (q_dim, kv_dim)
            specs += [(b + "attn_q_norm.weight", (qn,), np.float32), (b + "attn_k_norm.weight", (kn,), np.float32)]
        specs += [] if glm else [(b + ("post_attention_norm" if oss else "ffn_norm") + ".weight", (HIDDEN,), np.float32)]
        specs += [
            (b + "ffn_gate_inp.weight", (EXPERTS, HIDDEN), np.float32),
            (b + "ffn_gate_exps.weight", (EXPERTS, FFN, HIDDEN), np.float16),
            (b + "ffn_down_exps.weight", (EXPERTS, HIDDEN, FFN), np.float16),
            (b + "ffn_up_exps.weight", (EXPERTS, FFN, HIDDEN), np.float16),
        ]
    specs += [("output_norm.weight", (HIDDEN,), np.float32), ("output.weight", (VOCAB, HIDDEN), np.float16)]
    if bias:
        specs += [("output_norm.bias", (HIDDEN,), np.float32), ("output.bias", (VOCAB,), np.float32)]
    if a.mxfp4_experts:
        specs = [(n, sh, "mxfp4" if n.endswith("_exps.weight") else dt) for n, sh, dt in specs]
    if a.q4_k_m:
        specs = [(n, sh, q4_k_m_type(n, a.layers) if dt == np.float16 else dt) for n, sh, dt in specs]
    if a.q8_0:
        specs = [(n, sh, "q8_0" if dt == np.float16 and sh[-1] % 32 == 0 else dt) for n, sh, dt in specs]
    for name, shape, dt in specs:
        if dt in BLOCKS:
            vals, nbytes, qtype = BLOCKS[dt]
            byte_shape = tuple(shape[:-1]) + (shape[-1] // vals * nbytes,)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                              raw_dtype=qtype)
            continue
        w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    for i, (name, shape, dt) in enumerate(specs):
        n = int(np.prod(shape))
        ti = w.tensors[0].pop(name)
        w.write_padding(fout, fout.tell())
        if name.endswith("norm.weight") or name.endswith("sinks.weight"):
            np.ones(n, dtype=np.float32).tofile(fout)
        elif name.endswith(".bias"):
            np.zeros(n, dtype=np.float32).tofile(fout)
        elif dt in BLOCKS:
            vals, nbytes, _ = BLOCKS[dt]
            bpool = mxpool if dt == "mxfp4" else kpools[dt]
            done, nb = 0, n // vals * nbytes
            while done < nb:
                k = min(nb - done, len(bpool))
                bpool[:k].tofile(fout)
                done += k
        elif dt == np.float32:
            rng.standard_normal(n, dtype=np.float32).tofile(fout)
        else:
            done, off = 0, (i * 7919) % (len(pool) // 2)
            while done < n:
                k = min(n - done, len(pool) - off)
                pool[off : off + k].tofile(fout)
                done += k
                off = 0
        w.write_padding(fout, ti.nbytes)
        w.state = WriterState.WEIGHTS
        if name.endswith("ffn_up_exps.weight"):
            print(f"  {name}", file=sys.stderr, flush=True)
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
