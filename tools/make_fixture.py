#!/usr/bin/env python3
"""Build tests/fixtures/tiny-<family>: a tiny random MoE checkpoint made with transformers, fixed seed.

Families: mixtral (tests/fixtures/tiny-mixtral), qwen3_moe, qwen2_moe, olmoe, phimoe (issue 50), gpt_oss, glm4_moe, deepseek_v2, glm4_moe_lite (issue 53). Each has its
own special tokens, chat template (ChatML-style for Qwen and OLMoE, Phi's own) and stop tokens; the new families
also perturb every norm weight and bias (transformers initializes them to 1 and 0), so a forward pass that skips
one is caught, and store `chat_ids`: transformers' apply_chat_template ids of a multi-turn conversation.

Needs torch, transformers and tokenizers (the device machine has them; CI does not run this). Writes:
  config.json, model-0000N-of-00002.safetensors + model.safetensors.index.json (f16 weights),
  tokenizer.json (a small byte-level BPE trained here), tokenizer_config.json (Mixtral's [INST] template),
  reference.safetensors: input_ids [T] i64, logits [T, V] f32 (every position of the prompt),
  greedy_ids [32] i64 and greedy_logits [32, V] f32 (full-recompute greedy continuation),
  reference.json: versions, the prompt text, and the sensitivity check below.

Weights are rounded to f16 before the reference runs in float32, so the stored checkpoint is exactly the model
the reference logits come from. initializer_range 0.15 makes every block matter (shared/ASSETS.md): the script
zeroes one layer's attention output and one expert and prints how far the mean log-likelihood moves.

usage: python3 tools/make_fixture.py OUT_DIR [--family mixtral|qwen3_moe|qwen2_moe|olmoe|phimoe|gpt_oss|glm4_moe|deepseek_v2|glm4_moe_lite]
"""
import json
import os
import sys

import torch
import transformers
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from safetensors.torch import save_file

SEED = 1234
VOCAB = 512
PROMPT = (
    "The quick brown fox jumps over the lazy dog. To be, or not to be, that is the question: "
    "whether 'tis nobler in the mind to suffer"
)
N_GREEDY = 32

# Training text for the tokenizer: public-domain English, enough to learn a few hundred merges.
CORPUS = [
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer the slings and arrows "
    "of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.",
    "Now is the winter of our discontent made glorious summer by this sun of York; and all the clouds that "
    "lour'd upon our house in the deep bosom of the ocean buried.",
    "All the world's a stage, and all the men and women merely players; they have their exits and their "
    "entrances, and one man in his time plays many parts.",
    "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital of "
    "France. And of Italy? Rome is the capital of Italy.",
    "Of Man's first disobedience, and the fruit of that forbidden tree whose mortal taste brought death into "
    "the World, and all our woe, with loss of Eden.",
]

MIXTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def build_tokenizer(specials=("<unk>", "<s>", "</s>")):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def main():
    out = sys.argv[1]
    family = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--family" else "mixtral"
    if family != "mixtral":
        import make_family_fixture

        make_family_fixture.make(out, family)
        return
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    assert vocab <= VOCAB, vocab
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
                "chat_template": MIXTRAL_TEMPLATE,
                "model_max_length": 256,
            },
            f,
            indent=2,
        )

    cfg = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        initializer_range=0.15,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        tie_word_embeddings=False,
        router_jitter_noise=0.0,
        sliding_window=None,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg._attn_implementation = "eager"
    model = transformers.MixtralForCausalLM(cfg).eval()
    # Round every weight to f16: the saved checkpoint is then exactly the float32 model below.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())

    ids = [1] + tok.encode(PROMPT).ids
    assert len(ids) >= 16, len(ids)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids).logits[0].float()
        seq = list(ids)
        greedy_logits = []
        for _ in range(N_GREEDY):
            step = model(torch.tensor([seq])).logits[0, -1].float()
            greedy_logits.append(step)
            seq.append(int(step.argmax()))
        greedy = seq[len(ids):]
        top2 = torch.stack(greedy_logits).topk(2, dim=-1).values
        min_margin = float((top2[:, 0] - top2[:, 1]).min())

        def mean_ll(m):
            full = torch.tensor([seq])
            lp = torch.log_softmax(m(full).logits[0, :-1].float(), -1)
            return float(lp.gather(1, full[0, 1:, None]).mean())

        base = mean_ll(model)
        sens = {}
        o = model.model.layers[1].self_attn.o_proj.weight
        saved = o.clone()
        o.zero_()
        sens["zero_layer1_attention"] = base - mean_ll(model)
        o.copy_(saved)
        layer0 = model.model.layers[0]
        moe = getattr(layer0, "block_sparse_moe", None) or layer0.mlp
        experts = moe.experts
        # transformers 4 keeps a ModuleList of w1/w2/w3; transformers 5 fuses them (down_proj [E, hidden, ffn]).
        w2 = experts[0].w2.weight if isinstance(experts, torch.nn.ModuleList) else experts.down_proj[0]
        saved = w2.clone()
        w2.zero_()
        sens["zero_layer0_expert0"] = base - mean_ll(model)
        w2.copy_(saved)

    model.half()
    try:
        model.save_pretrained(out, max_shard_size="400KB", safe_serialization=True)
    except TypeError:
        model.save_pretrained(out, max_shard_size="400KB")

    save_file(
        {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "logits": logits.contiguous(),
            "greedy_ids": torch.tensor(greedy, dtype=torch.int64),
            "greedy_logits": torch.stack(greedy_logits).contiguous(),
        },
        os.path.join(out, "reference.safetensors"),
    )
    info = {
        "seed": SEED,
        "prompt": PROMPT,
        "prompt_tokens": len(ids),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "mean_log_likelihood": base,
        "ll_drop_when_zeroed": sens,
        "greedy_min_top2_margin": min_margin,
        "greedy_ids": greedy,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(json.dumps(info, indent=2))
    print(sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
