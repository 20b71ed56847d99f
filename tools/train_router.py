#!/usr/bin/env python3
"""Train a small MoE in a real model's routing layout so routing is learned, not random (issue 50).

The sibling of shared/models/shakespeare-moe/train.py (a Mixtral with 8 experts, top-2) in the layouts whose traces
replay onto the synthetic shapes of tools/families_gpu.sh:
- `--layout qwen3` (default): Qwen3MoeForCausalLM with 128 experts of FFN 128 (Qwen3-30B-A3B's count), 8 routed per
  token, per-head QK-norm, top-k renormalized;
- `--layout phimoe`: PhimoeForCausalLM with 16 experts of FFN 512 (Phi-3.5-MoE's count), top-2 by its sparsemixer,
  LayerNorm and biases, LongRoPE with unit factors (training windows stay inside the original context).
Cache, prefetch and precision policies are judged on its routing (hob sim, the replay modes), as they are on
shakespeare-moe's for Mixtral. Runs on the device machine (PyTorch and transformers there):

    python3 tools/train_router.py OUT_DIR --data .gpu/shakes [--layout qwen3|phimoe] [--budget 300] [--steps 1500]

Data: shakespeare-moe's train.bin / val.bin (uint16 Mistral-tokenizer ids; tools/stage_gpu.sh copies them to
.gpu/shakes). Writes the best-validation checkpoint in f16 (config.json, safetensors shards under 15 MB, the index)
and train_log.json (validation perplexity by step; per layer: consecutive-token reuse of the top-1 expert, overlap of
the top-k sets, and expert load) to OUT_DIR. Copy the Mistral tokenizer files next to them and `hob convert` reads the
folder like any Hugging Face checkpoint.
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
from transformers import PhimoeConfig, PhimoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

SEQ = 256
COMMON = dict(vocab_size=32000, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=1024, rope_theta=1e6, tie_word_embeddings=True, output_router_logits=True,
              bos_token_id=1, eos_token_id=2)


def layout(name):
    """(model class, config, experts, top-k) of a layout."""
    if name == "qwen3":
        cfg = Qwen3MoeConfig(intermediate_size=512, moe_intermediate_size=128, head_dim=64, num_experts=128,
                             num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                             router_aux_loss_coef=0.01, **COMMON)
        return Qwen3MoeForCausalLM, cfg, 128, 8
    half = 256 // 4 // 2  # LongRoPE's factor lists: one per rotary frequency
    rope = {"rope_type": "longrope", "type": "longrope", "short_factor": [1.0] * half, "long_factor": [1.0] * half,
            "short_mscale": 1.0, "long_mscale": 1.0, "original_max_position_embeddings": 1024}
    kw = dict(intermediate_size=512, num_local_experts=16, num_experts_per_tok=2, router_aux_loss_coef=0.01,
              router_jitter_noise=0.01, input_jitter_noise=0.0, attention_bias=True, lm_head_bias=True,
              original_max_position_embeddings=1024, **COMMON)
    try:  # transformers 4 names them rope_scaling; 5 folds the base into rope_parameters
        cfg = PhimoeConfig(**kw, rope_scaling=rope)
    except TypeError:
        cfg = PhimoeConfig(**{k: v for k, v in kw.items() if k != "rope_theta"},
                           rope_parameters=dict(rope, rope_theta=1e6))
    return PhimoeForCausalLM, cfg, 16, 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--data", required=True, help="folder with train.bin and val.bin")
    ap.add_argument("--budget", type=float, default=300, help="training seconds at most")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--layout", default="qwen3", choices=["qwen3", "phimoe"])
    a = ap.parse_args()
    model_class, cfg, EXPERTS, TOP_K = layout(a.layout)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    load = lambda name: torch.from_numpy(np.fromfile(os.path.join(a.data, name), dtype=np.uint16).astype(np.int64))
    train, val = load("train.bin"), load("val.bin")
    model = model_class(cfg).to(dev)
    print("params", sum(p.numel() for p in model.parameters()), flush=True)
    batch = 64 if dev == "cuda" else 2
    opt = torch.optim.AdamW(model.parameters(), lr=1.5e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm = lambda s: min(1.0, (s + 1) / 200)
    cosine = lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warm(s) * cosine(s))

    def windows(src, n, gen=None):
        ix = torch.randint(0, len(src) - SEQ - 1, (n,), generator=gen)
        return torch.stack([src[i : i + SEQ] for i in ix]).to(dev)

    @torch.no_grad()
    def val_ppl(n=40):
        model.eval()
        g, total = torch.Generator().manual_seed(1), 0.0
        for _ in range(n):
            x = windows(val, 16, g)
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                total += model(x, labels=x, output_router_logits=False).loss.item()
        model.train()
        return math.exp(total / n)

    t0, step, log, best = time.time(), 0, [], (float("inf"), None)
    model.train()
    while step < a.steps and time.time() - t0 < a.budget:
        x = windows(train, batch)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = model(x, labels=x)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 100 == 0 or step == 5:
            ppl, el = val_ppl(), time.time() - t0
            log.append({"step": step, "train_loss": out.loss.item(), "val_ppl": ppl, "s": el})
            print(f"step {step} loss {out.loss.item():.3f} val_ppl {ppl:.2f} {el:.0f}s", flush=True)
            if ppl < best[0]:
                best = (ppl, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
    model.load_state_dict(best[1])
    model = model.to("cpu").half()
    model.config.output_router_logits = False
    model.save_pretrained(a.out, max_shard_size="15MB")

    # Routing on held-out text: what cache and prefetch policies live on (the checkpoint is
    # written above whatever happens here).
    stats = []
    try:
        with torch.no_grad():
            logits = model.float()(val[:2048].unsqueeze(0), output_router_logits=True).router_logits
    except Exception as e:  # a transformers version without router logits in the output
        print("no routing statistics:", e, flush=True)
        logits = []
    for layer, r in enumerate(logits):
        top = r.float().topk(TOP_K, -1).indices.view(-1, TOP_K)
        reuse = (top[1:, 0] == top[:-1, 0]).float().mean().item()
        overlap = np.mean([len(set(p.tolist()) & set(q.tolist())) / TOP_K for p, q in zip(top[1:], top[:-1])])
        share = torch.bincount(top.view(-1), minlength=EXPERTS).float()
        share = (share / share.sum()).tolist()
        stats.append({"layer": layer, "top1_reuse": round(reuse, 3), "topk_overlap": round(float(overlap), 3),
                      "load_min": round(min(share), 4), "load_max": round(max(share), 4)})
    summary = {"best_val_ppl": best[0], "steps": step, "log": log, "routing": stats}
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("best val ppl", best[0], "steps", step)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
