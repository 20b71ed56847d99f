#!/usr/bin/env python3
"""Independent float32 numpy reference for the upcycled SmolLM2 Mixtral checkpoint (tools/upcycle_smollm2.py).

Three checks, each optional:
  --tokenizer TEXT_FILE  tokenizer.json (through the `tokenizers` package) against a small re-implementation of
                         llama.cpp's "smollm" byte-level BPE driven by the GGUF's own vocab and merges, plus
                         decode(encode(x)) == x;
  --prompt TEXT          greedy chat answer (ChatML via the checkpoint's chat_template); shared/ASSETS.md expects
                         "The capital of France is Paris." for "What is the capital of France?";
  --ppl TEXT_FILE        llama.cpp-method perplexity (context --ctx, each chunk scores its second half; no BOS, as
                         SmolLM2's add_bos_token is false); --chunks limits the number of chunks. On
                         models/hamlet-60k.txt (19,433 tokens) the s = 0 checkpoint gives 21.0585 after the first 4
                         chunks, the figure shared/ASSETS.md quotes for transformers, and 22.4134 over all 37.

Needs numpy, safetensors, tokenizers, jinja2 (and regex, gguf for --tokenizer).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

try:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
except ImportError as exc:
    sys.exit(f"check_upcycle: missing Python package ({exc}); pip install -r tools/requirements-demo.txt")


class Model:
    """MixtralForCausalLM forward pass, line for line against transformers' modeling_mixtral, in float32."""

    def __init__(self, path):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            c = json.load(f)
        self.c = c
        w = {k: v.astype(np.float32) for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
        self.w = w
        self.n_layers = c["num_hidden_layers"]
        self.n_head, self.n_kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or c["hidden_size"] // self.n_head
        self.n_exp, self.top_k = c["num_local_experts"], c["num_experts_per_tok"]
        self.eps = c["rms_norm_eps"]
        theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        self.embed = w["model.embed_tokens.weight"]  # [vocab, hidden]
        self.lm_head = w.get("lm_head.weight", self.embed) if c.get("tie_word_embeddings") else w["lm_head.weight"]

    def rms(self, x, g):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)) * g

    def rope(self, x, pos):
        # x [heads, T, hd]; rotate-half layout (the Hugging Face one, after undoing llama.cpp's permutation).
        ang = np.outer(pos, self.inv_freq)  # [T, hd/2]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1).astype(np.float32)
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1).astype(np.float32)
        h = self.hd // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return x * cos + rot * sin

    def moe(self, x, p):
        # x [T, hidden]: router softmax -> top-k -> renormalize, each expert w2(silu(w1 x) * w3 x).
        logits = x @ self.w[p + "block_sparse_moe.gate.weight"].T  # [T, E]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : self.top_k]  # [T, k]
        weights = np.take_along_axis(probs, top, -1)
        weights /= weights.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for e in range(self.n_exp):
            rows, slot = np.nonzero(top == e)
            if rows.size == 0:
                continue
            xe = x[rows]
            q = f"{p}block_sparse_moe.experts.{e}."
            a = xe @ self.w[q + "w1.weight"].T
            h = (a / (1.0 + np.exp(-a))) * (xe @ self.w[q + "w3.weight"].T)
            out[rows] += (h @ self.w[q + "w2.weight"].T) * weights[rows, slot][:, None]
        return out

    def forward(self, ids, cache, start):
        """Logits [T, vocab] for tokens ids at positions start..; cache: per layer (k, v) lists, extended."""
        x = self.embed[np.asarray(ids)]
        T = len(ids)
        pos = np.arange(start, start + T)
        rep = self.n_head // self.n_kv
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = self.rms(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).reshape(T, self.n_head, self.hd).transpose(1, 0, 2)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).reshape(T, self.n_kv, self.hd).transpose(1, 0, 2)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).reshape(T, self.n_kv, self.hd).transpose(1, 0, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if cache[i] is not None:
                k = np.concatenate([cache[i][0], k], axis=1)
                v = np.concatenate([cache[i][1], v], axis=1)
            cache[i] = (k, v)
            S = k.shape[1]
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)  # GQA: kv head j serves q heads j*rep..
            s = (q @ k.transpose(0, 2, 1)) / math.sqrt(self.hd)  # [heads, T, S]
            mask = np.arange(S)[None, :] > (pos[:, None])  # causal: key position > query position
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(T, self.n_head * self.hd)
            x = x + a @ self.w[p + "self_attn.o_proj.weight"].T
            x = x + self.moe(self.rms(x, self.w[p + "post_attention_layernorm.weight"]), p)
        return self.rms(x, self.w["model.norm.weight"]) @ self.lm_head.T


def chat(model, tok, path, prompt, n_predict):
    import jinja2

    with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    text = jinja2.Environment().from_string(tc["chat_template"]).render(
        messages=[{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False).ids
    eos = tok.token_to_id(tc["eos_token"])
    print(f"prompt: {len(ids)} tokens: {ids}")
    cache = [None] * model.n_layers
    logits = model.forward(ids, cache, 0)
    out = []
    t0 = time.time()
    while len(out) < n_predict:
        nxt = int(np.argmax(logits[-1]))
        if nxt == eos:
            break
        out.append(nxt)
        logits = model.forward([nxt], cache, len(ids) + len(out) - 1)
    answer = tok.decode(out, skip_special_tokens=False)
    print(f"answer ({len(out)} tokens, {time.time() - t0:.1f} s): {answer!r}")
    print(f"answer ids: {out}")
    return answer


def perplexity(model, tok, text, ctx, max_chunks):
    ids = tok.encode(text, add_special_tokens=False).ids
    n_chunks = len(ids) // ctx
    if max_chunks:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks == 0:
        sys.exit(f"check_upcycle: text has {len(ids)} tokens, fewer than one context of {ctx}")
    nll, count = 0.0, 0
    first = ctx // 2
    for c in range(n_chunks):
        chunk = ids[c * ctx:(c + 1) * ctx]
        logits = model.forward(chunk, [None] * model.n_layers, 0).astype(np.float64)
        for j in range(first, ctx - 1):
            row = logits[j]
            m = row.max()
            nll += m + math.log(np.exp(row - m).sum()) - row[chunk[j + 1]]
            count += 1
        print(f"[{c + 1}/{n_chunks}] ppl {math.exp(nll / count):.4f}", flush=True)
    print(f"perplexity: {math.exp(nll / count):.4f} over {count} tokens ({n_chunks} chunks of {ctx}, "
          f"{len(ids)} tokens in the text)")


def bytes_to_unicode():
    # GPT-2's reversible byte -> printable character table.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def split_keep(pattern, pieces):
    """llama.cpp's unicode_regex_split step: matches and the text between them both become pieces."""
    out = []
    for piece in pieces:
        last = 0
        for m in pattern.finditer(piece):
            out += [piece[last:m.start()], m.group()]
            last = m.end()
        out.append(piece[last:])
    return [p for p in out if p]


def llama_cpp_encode(text, vocab, ranks, specials):
    """llama.cpp's BPE for pre-tokenizer "smollm": special tokens first, then the regexes applied one after the
    other (\\p{N} isolates every digit, then the GPT-2 regex), then merges by lowest rank within each word."""
    import regex

    b2u = bytes_to_unicode()
    gpt2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")
    digit = regex.compile(r"\p{N}")
    split_special = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
    out = []
    for part in split_special.split(text):
        if not part:
            continue
        if part in specials:
            out.append(vocab[part])
            continue
        for word in split_keep(gpt2, split_keep(digit, [part])):
            syms = [b2u[b] for b in word.encode("utf-8")]
            while len(syms) > 1:
                best = min(range(len(syms) - 1), key=lambda i: ranks.get((syms[i], syms[i + 1]), math.inf))
                if (syms[best], syms[best + 1]) not in ranks:
                    break
                syms[best:best + 2] = [syms[best] + syms[best + 1]]
            out += [vocab[s] for s in syms]
    return out


def check_tokenizer(tok, gguf_path, text):
    import gguf

    r = gguf.GGUFReader(gguf_path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
    specials = [t for t, ty in zip(tokens, types) if ty == 3]
    samples = [
        "What is the capital of France?",
        "<|im_start|>user\nIn 1603, 42 players paid $3.50 each.<|im_end|>\n",
        "  Tabs\tand\n\nnewlines,   spaces  ",
        "Café naïve — “quotes” 😀",
        text,
    ]
    ok = True
    for s in samples:
        hf = tok.encode(s, add_special_tokens=False).ids
        ref = llama_cpp_encode(s, vocab, ranks, specials)
        same = hf == ref
        back = tok.decode(hf, skip_special_tokens=False) == s
        ok &= same and back
        label = repr(s) if len(s) < 80 else f"{s[:40]!r}... ({len(s)} chars)"
        print(f"tokenizer: {len(hf)} ids, llama.cpp-style reference {'equal' if same else 'DIFFERENT'}, "
              f"round trip {'ok' if back else 'FAILED'}: {label}")
        if len(s) < 80:
            print(f"  ids: {hf}")
        if not same:
            i = next((i for i, (a, b) in enumerate(zip(hf, ref)) if a != b), min(len(hf), len(ref)))
            print(f"  first difference at {i}: tokenizer.json {hf[i:i + 8]} vs reference {ref[i:i + 8]}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="upcycled checkpoint directory")
    ap.add_argument("--prompt", help="chat prompt to answer greedily")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--ppl", metavar="TEXT_FILE", help="perplexity text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=0, help="at most this many chunks (0: all)")
    ap.add_argument("--tokenizer", metavar="TEXT_FILE", help="check tokenizer.json on this text")
    ap.add_argument("--gguf", help="the source GGUF (its vocab and merges drive the --tokenizer reference)")
    args = ap.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    failed = False
    if args.tokenizer:
        if not args.gguf:
            sys.exit("check_upcycle: --tokenizer needs --gguf")
        with open(args.tokenizer, encoding="utf-8") as f:
            failed |= not check_tokenizer(tok, args.gguf, f.read())
    if args.prompt or args.ppl:
        t0 = time.time()
        model = Model(args.model)
        print(f"loaded {args.model} in {time.time() - t0:.1f} s")
        if args.prompt:
            chat(model, tok, args.model, args.prompt, args.n_predict)
        if args.ppl:
            t0 = time.time()
            with open(args.ppl, encoding="utf-8") as f:
                perplexity(model, tok, f.read(), args.ctx, args.chunks)
            print(f"perplexity took {time.time() - t0:.1f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
