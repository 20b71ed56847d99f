#!/usr/bin/env python3
"""The GGUF fixtures llama.cpp's own converter cannot write, for tests/cli_convert_gguf.rs and gguf_tokenizer.rs.

    PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_gguf_from_fixture.py tests/fixtures/gguf-convert

tiny-qwen3-moe, tiny-qwen2-moe, tiny-olmoe and tiny-mixtral.gguf come from convert_hf_to_gguf.py itself
(tools/llamacpp_convert_fixture.py; tiny-mixtral-q8_0.gguf from llama-quantize). Its converter writes merged
experts only and has no PhimoeForCausalLM, so these three are written by gguf-py's GGUFWriter from this script, in
the layout llama.cpp gives these families (tensor names, norms and routers in F32, the `{arch}.*` keys, and, for
Mixtral, which llama.cpp writes as architecture `llama`, the rows of Q and K permuted as its LlamaModel.permute
does). Reads the fixtures' safetensors by hand (no torch, no safetensors package); needs numpy.

Writes:
- tiny-mixtral-per-expert.gguf: tests/fixtures/tiny-mixtral as `llama` in older Mixtral GGUFs' layout,
  `blk.N.ffn_gate.E.weight` per expert, F16, Q/K permuted.
- tiny-phimoe.gguf: tests/fixtures/tiny-phimoe as `phimoe`, F16, merged experts, as PhiMoeModel / Phi3MiniModel
  write it: LayerNorm, q/k/v/o and output biases (F32), no Q/K permutation (NEOX RoPE), `phimoe.attention.sliding_window`
  0 for the config's null, LongRoPE as `phimoe.rope.scaling.original_context_length`, `phimoe.rope.scaling.attn_factor`
  (sqrt(1 + ln(max_pos / original) / ln(original)), not the config's short/long_mscale) and the F32 tensors
  `rope_factors_long.weight` / `rope_factors_short.weight`. Written after the others, which stay byte-identical.
- mistral-tokenizer.gguf: no tensors, only the `tokenizer.ggml.*` keys of tests/fixtures/mistral (SentencePiece).
Deterministic: the same gguf-py gives the same files.

Tokenizers (`tokenizer.ggml.*`, `tokenizer.chat_template`), as convert_hf_to_gguf.py writes them:
- The tiny fixtures' byte-level BPE tokenizer.json, as its _set_vocab_gpt2 / get_vocab_base do: model `gpt2`,
  tokens in id order ([PADn] unused up to config.json's vocab_size), added tokens CONTROL where special or looking
  special (<|...|>) else USER_DEFINED, merges and BOS/EOS/add_bos/chat template by gguf-py's SpecialVocab.
  `tokenizer.ggml.pre`: get_vocab_base_pre names a pre-tokenizer by hashing a real tokenizer's output, which these
  tiny vocabularies have no entry for; their pre-tokenizer is ByteLevel with GPT-2's regex, which llama.cpp calls
  `gpt-2` (and `olmo`, used for the OLMoE fixture).
- tests/fixtures/mistral, as _set_vocab_sentencepiece does from tokenizer.model (model `llama`, pre `default`,
  pieces, scores, types NORMAL/UNKNOWN/CONTROL/BYTE, then tokenizer_config's special tokens CONTROL with score
  -1000). The fixture has no tokenizer.model, so the pieces' scores are reconstructed: 0 for <unk>/<s>/</s> and byte
  pieces, -1e9 for the whitespace-run pieces (▁▁, ▁▁▁▁, ...), -id for the others. With those scores transformers'
  SentencePieceExtractor yields exactly the fixture's 58,980 merges in order. BOS/EOS/UNK ids, add_bos and the chat
  template are Mistral's tokenizer_config.json values (<s> 1, </s> 2, <unk> 0, add_bos true) and chat_template.jinja.
"""
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter, SpecialVocab, TokenType, quants

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def read_safetensors(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in `directory` (one file or an index of shards)."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
        "model.safetensors"]
    dtypes = {"F16": np.float16, "F32": np.float32}
    out = {}
    for name in files:
        data = (directory / name).read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        body = data[8 + n:]
        for key, info in header.items():
            if key == "__metadata__":
                continue
            start, end = info["data_offsets"]
            out[key] = np.frombuffer(body[start:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half rows -> llama.cpp's adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Out:
    """A GGUFWriter with llama.cpp's type rules: 1-D tensors and routers F32, matrices F16 or Q8_0."""

    def __init__(self, path: Path, arch: str, quant: T):
        self.w = GGUFWriter(path, arch)
        self.quant = quant

    def tensor(self, name: str, value: np.ndarray, force_f32: bool = False) -> None:
        v = value.astype(np.float32)
        if v.ndim == 1 or force_f32:
            self.w.add_tensor(name, v)
        elif self.quant == T.Q8_0:
            self.w.add_tensor(name, quants.quantize(v, T.Q8_0), raw_dtype=T.Q8_0)
        else:
            self.w.add_tensor(name, v.astype(np.float16))

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def common_keys(w: GGUFWriter, cfg: dict, name: str, ffn_key: int) -> None:
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(ffn_key)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_vocab_size(cfg["vocab_size"])


def looks_special(token: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special, the forms these vocabularies could have."""
    return token in ("<pad>", "<mask>") or (token.startswith("<|") and token.endswith("|>"))


def vocab_gpt2(w: GGUFWriter, src: Path, cfg: dict, pre: str) -> None:
    """A byte-level BPE tokenizer.json as _set_vocab_gpt2 writes it."""
    tj = json.loads((src / "tokenizer.json").read_text())
    added = {t["id"]: t for t in tj["added_tokens"]}
    reverse = {i: t for t, i in tj["model"]["vocab"].items()}
    reverse.update({i: t["content"] for i, t in added.items()})
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            special = added[i]["special"] or looks_special(reverse[i])
            types.append(TokenType.CONTROL if special else TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    SpecialVocab(src, load_merges=True).add_to_gguf(w)


def mistral_tokenizer(out: Path) -> None:
    """tests/fixtures/mistral as _set_vocab_sentencepiece would write it (scores reconstructed: see the header)."""
    src = FIXTURES / "mistral"
    tj = json.loads((src / "tokenizer.json").read_text())
    reverse = {i: t for t, i in tj["model"]["vocab"].items()}
    tokens, scores, types = [], [], []
    for i in range(len(reverse)):
        t = reverse[i]
        tokens.append(t)
        if t == tj["model"]["unk_token"]:
            scores.append(0.0), types.append(TokenType.UNKNOWN)
        elif t in ("<s>", "</s>"):
            scores.append(0.0), types.append(TokenType.CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            scores.append(0.0), types.append(TokenType.BYTE)
        elif len(t) >= 2 and set(t) == {"\u2581"}:
            scores.append(-1e9), types.append(TokenType.NORMAL)
        else:
            scores.append(-float(i)), types.append(TokenType.NORMAL)
    for t in tj["added_tokens"]:  # tokenizer_config.json's added_tokens_decoder: all special
        scores[t["id"]] = -1000.0
        types[t["id"]] = TokenType.CONTROL
    w = GGUFWriter(out, "llama")
    w.add_name("mistral-tokenizer")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template((src / "chat_template.jinja").read_text())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def layer_dense(o: Out, t: dict, l: int, q: np.ndarray, k: np.ndarray) -> None:
    p = f"model.layers.{l}."
    o.tensor(f"blk.{l}.attn_norm.weight", t[p + "input_layernorm.weight"])
    o.tensor(f"blk.{l}.attn_q.weight", q)
    o.tensor(f"blk.{l}.attn_k.weight", k)
    o.tensor(f"blk.{l}.attn_v.weight", t[p + "self_attn.v_proj.weight"])
    o.tensor(f"blk.{l}.attn_output.weight", t[p + "self_attn.o_proj.weight"])
    o.tensor(f"blk.{l}.ffn_norm.weight", t[p + "post_attention_layernorm.weight"])


def experts(o: Out, l: int, n: int, names, merged: bool) -> None:
    """names(e) -> (gate, up, down) arrays of expert e."""
    ws = [names(e) for e in range(n)]
    for i, which in enumerate(("gate", "up", "down")):
        if merged:
            o.tensor(f"blk.{l}.ffn_{which}_exps.weight", np.stack([w[i] for w in ws]))
        else:
            for e, w in enumerate(ws):
                o.tensor(f"blk.{l}.ffn_{which}.{e}.weight", w[i])


def mixtral(out: Path, quant: T, merged: bool) -> None:
    src = FIXTURES / "tiny-mixtral"
    cfg = json.loads((src / "config.json").read_text())
    t = read_safetensors(src)
    o = Out(out, "llama", quant)
    common_keys(o.w, cfg, "tiny-mixtral", cfg["intermediate_size"])
    vocab_gpt2(o.w, src, cfg, "gpt-2")
    o.w.add_expert_count(cfg["num_local_experts"])
    o.w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    o.w.add_file_type(1 if quant == T.F16 else 7)
    o.tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        q = permute(t[p + "self_attn.q_proj.weight"], cfg["num_attention_heads"])
        k = permute(t[p + "self_attn.k_proj.weight"], cfg["num_key_value_heads"])
        layer_dense(o, t, l, q, k)
        o.tensor(f"blk.{l}.ffn_gate_inp.weight", t[p + "block_sparse_moe.gate.weight"], force_f32=True)
        e = p + "block_sparse_moe.experts.{}.{}.weight"
        experts(o, l, cfg["num_local_experts"],
                lambda x: tuple(t[e.format(x, w)] for w in ("w1", "w3", "w2")), merged)
    o.tensor("output_norm.weight", t["model.norm.weight"])
    o.tensor("output.weight", t["lm_head.weight"])
    o.close()


def phimoe(out: Path) -> None:
    src = FIXTURES / "tiny-phimoe"
    cfg = json.loads((src / "config.json").read_text())
    rope = cfg["rope_parameters"]
    t = read_safetensors(src)
    o = Out(out, "phimoe", T.F16)
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    max_pos, orig = cfg["max_position_embeddings"], rope["original_max_position_embeddings"]
    # Phi3MiniModel.set_gguf_parameters, then PhiMoeModel's expert counts.
    o.w.add_name("tiny-phimoe")
    o.w.add_context_length(max_pos)
    o.w.add_rope_scaling_orig_ctx_len(orig)
    o.w.add_embedding_length(n_embd)
    o.w.add_feed_forward_length(cfg["intermediate_size"])
    o.w.add_block_count(cfg["num_hidden_layers"])
    o.w.add_head_count(n_head)
    o.w.add_head_count_kv(cfg["num_key_value_heads"])
    o.w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    o.w.add_rope_dimension_count(n_embd // n_head)
    o.w.add_rope_freq_base(rope["rope_theta"])
    o.w.add_file_type(1)
    o.w.add_sliding_window(cfg.get("sliding_window") or 0)
    o.w.add_expert_used_count(cfg["num_experts_per_tok"])
    o.w.add_expert_count(cfg["num_local_experts"])
    vocab_gpt2(o.w, src, cfg, "gpt-2")
    # generate_extra_tensors: the attention factor as a key, the factors as tensors.
    scale = max_pos / orig
    o.w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
    o.tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    o.tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    o.tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        layer_dense(o, t, l, t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"])
        o.tensor(f"blk.{l}.attn_norm.bias", t[p + "input_layernorm.bias"])
        for x in "qkv":
            o.tensor(f"blk.{l}.attn_{x}.bias", t[p + f"self_attn.{x}_proj.bias"])
        o.tensor(f"blk.{l}.attn_output.bias", t[p + "self_attn.o_proj.bias"])
        o.tensor(f"blk.{l}.ffn_norm.bias", t[p + "post_attention_layernorm.bias"])
        o.tensor(f"blk.{l}.ffn_gate_inp.weight", t[p + "block_sparse_moe.gate.weight"], force_f32=True)
        e = p + "block_sparse_moe.experts.{}.{}.weight"
        experts(o, l, cfg["num_local_experts"],
                lambda x: tuple(t[e.format(x, w)] for w in ("w1", "w3", "w2")), True)
    o.tensor("output_norm.weight", t["model.norm.weight"])
    o.tensor("output_norm.bias", t["model.norm.bias"])
    o.tensor("output.weight", t["lm_head.weight"])
    o.tensor("output.bias", t["lm_head.bias"])
    o.close()


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES / "gguf-convert"
    out.mkdir(parents=True, exist_ok=True)
    mixtral(out / "tiny-mixtral-per-expert.gguf", T.F16, merged=False)
    mistral_tokenizer(out / "mistral-tokenizer.gguf")
    phimoe(out / "tiny-phimoe.gguf")


if __name__ == "__main__":
    main()
