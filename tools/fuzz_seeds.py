#!/usr/bin/env python3
"""The seed corpus of the fuzz targets (tests/fuzz/seeds/TARGET/), made small from the repository's fixtures.

    python3 tools/fuzz_seeds.py [--hob target/debug/hob]

- gguf_reader: a micro Mixtral (llama architecture: 1 layer, 2 experts, width 32, a 16-token GPT-2 vocabulary cut
  from tests/fixtures/gguf-convert/tiny-mixtral.gguf's), once with merged Q8_0 experts and once per expert in F32,
  both complete enough to pass `GgufCheckpoint::open`; tests/fixtures/gguf-small's files; and each family fixture
  of tests/fixtures/gguf-convert with its metadata only (no tensors, no vocabulary arrays), which reaches the
  family's key parsing.
- hob_reader: the micro Mixtral converted by `hob convert` (int2/g32 experts, and f16 + int4/g32).
- safetensors_header: a micro model.safetensors of every dtype hob reads and a U8 tensor; a sharded checkpoint
  (index JSON and two shards, joined by the target's separator).
- tokenizer_template: the tiny-mixtral and tiny-qwen3-moe tokenizer files with the Mistral and Qwen3 tool chat
  templates and a few messages (the target's parts, joined by NUL bytes); a hand-written WordLevel tokenizer.
- serve_request: chat and completion request bodies (tools, tool_choice, response_format, stop, ids) with model
  answers holding tool calls.
- trace_reader: routing traces in tests/cli_sim.rs's shape, with predictions and without a low variant.

Deterministic: the same fixtures and hob give the same files. Python standard library only.
"""

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
SEEDS = ROOT / "tests" / "fuzz" / "seeds"

# GGUF value types and GGML tensor types.
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q8_0 = 0, 1, 8
FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32V: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}


def read_gguf(path):
    """(metadata as [(key, type, value)], raw bytes) of a GGUF file; array values are (elem_type, [items])."""
    b = path.read_bytes()
    pos = 24
    n_kv = struct.unpack_from("<Q", b, 16)[0]

    def string():
        nonlocal pos
        n = struct.unpack_from("<Q", b, pos)[0]
        s = b[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        return s

    def value(t):
        nonlocal pos
        if t == STR:
            return string()
        if t == ARR:
            et, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            return (et, [value(et) for _ in range(n)])
        v = struct.unpack_from("<" + FMT[t], b, pos)[0]
        pos += struct.calcsize(FMT[t])
        return v

    kvs = []
    for _ in range(n_kv):
        k = string()
        t = struct.unpack_from("<I", b, pos)[0]
        pos += 4
        kvs.append((k, t, value(t)))
    return kvs


def put_str(out, s):
    e = s.encode()
    out += struct.pack("<Q", len(e)) + e


def put_value(out, t, v):
    if t == STR:
        put_str(out, v)
    elif t == ARR:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for item in items:
            put_value(out, et, item)
    else:
        out += struct.pack("<" + FMT[t], v)


def write_gguf(kvs, tensors, align=32):
    """GGUF v3 bytes: `tensors` is [(name, dims (ne[0] first), ggml type, data bytes)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, t, v in kvs:
        put_str(out, k)
        out += struct.pack("<I", t)
        put_value(out, t, v)
    offset = 0
    for name, dims, ty, data in tensors:
        put_str(out, name)
        out += struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ty, offset)
        offset += -(-len(data) // align) * align
    out += bytes(-len(out) % align)
    for _, _, _, data in tensors:
        out += data + bytes(-len(data) % align)
    return bytes(out)


def noise(n, seed):
    """n deterministic values in [-0.5, 0.5)."""
    x = seed * 2654435761 % 2**32 or 1
    vals = []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        vals.append((x % 1000) / 1000 - 0.5)
    return vals


def f32s(n, seed):
    return struct.pack(f"<{n}f", *noise(n, seed))


def f16s(n, seed):
    return struct.pack(f"<{n}e", *noise(n, seed))


def q8_0(n, seed):
    """Q8_0 blocks: an f16 scale, then 32 int8 codes."""
    out = bytearray()
    for i in range(n // 32):
        out += struct.pack("<e", 0.01) + bytes((c * 37 + i) % 256 for c in range(32))
    return bytes(out)


def micro_mixtral(per_expert):
    """A 1-layer, 2-expert Mixtral at width 32 that `hob convert` accepts."""
    src = dict((k, (t, v)) for k, t, v in read_gguf(FIX / "gguf-convert" / "tiny-mixtral.gguf"))
    vocab, hidden, ffn, heads, kv_heads, experts = 16, 32, 32, 2, 1, 2
    head_dim = hidden // heads
    tokens = src["tokenizer.ggml.tokens"][1][1][:vocab]
    types = src["tokenizer.ggml.token_type"][1][1][:vocab]
    kvs = [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "Micro Mixtral"),
        ("llama.block_count", U32, 1),
        ("llama.context_length", U32, 64),
        ("llama.embedding_length", U32, hidden),
        ("llama.feed_forward_length", U32, ffn),
        ("llama.attention.head_count", U32, heads),
        ("llama.attention.head_count_kv", U32, kv_heads),
        ("llama.rope.freq_base", F32V, 1e6),
        ("llama.attention.layer_norm_rms_epsilon", F32V, 1e-5),
        ("llama.expert_count", U32, experts),
        ("llama.expert_used_count", U32, 1),
        ("llama.vocab_size", U32, vocab),
        ("llama.rope.dimension_count", U32, head_dim),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "gpt-2"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, [])),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
        ("tokenizer.chat_template", STR, src["tokenizer.chat_template"][1]),
    ]
    seed = iter(range(1, 1000))
    tensors = [
        ("token_embd.weight", (hidden, vocab), T_F16, f16s(hidden * vocab, next(seed))),
        ("output.weight", (hidden, vocab), T_F16, f16s(hidden * vocab, next(seed))),
        ("output_norm.weight", (hidden,), T_F32, f32s(hidden, next(seed))),
        ("blk.0.attn_norm.weight", (hidden,), T_F32, f32s(hidden, next(seed))),
        ("blk.0.ffn_norm.weight", (hidden,), T_F32, f32s(hidden, next(seed))),
        ("blk.0.attn_q.weight", (hidden, heads * head_dim), T_F16, f16s(hidden * hidden, next(seed))),
        ("blk.0.attn_k.weight", (hidden, kv_heads * head_dim), T_F16, f16s(hidden * head_dim, next(seed))),
        ("blk.0.attn_v.weight", (hidden, kv_heads * head_dim), T_F16, f16s(hidden * head_dim, next(seed))),
        ("blk.0.attn_output.weight", (hidden, hidden), T_F16, f16s(hidden * hidden, next(seed))),
        ("blk.0.ffn_gate_inp.weight", (hidden, experts), T_F32, f32s(hidden * experts, next(seed))),
    ]
    for which, (cols, rows) in [("gate", (hidden, ffn)), ("up", (hidden, ffn)), ("down", (ffn, hidden))]:
        if per_expert:
            for e in range(experts):
                name = f"blk.0.ffn_{which}.{e}.weight"
                tensors.append((name, (cols, rows), T_F32, f32s(cols * rows, next(seed))))
        else:
            name = f"blk.0.ffn_{which}_exps.weight"
            tensors.append((name, (cols, rows, experts), T_Q8_0, q8_0(cols * rows * experts, next(seed))))
    return write_gguf(kvs, tensors)


def metadata_only(path):
    """A family fixture without tensors and without its vocabulary arrays."""
    kvs = [(k, t, v) for k, t, v in read_gguf(path) if t != ARR]
    return write_gguf(kvs, [])


def safetensors(tensors, meta=None):
    """safetensors bytes of [(name, dtype, shape, data)]."""
    header, offset = {}, 0
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def gguf_seeds(out):
    (out / "micro-mixtral-q8_0.gguf").write_bytes(micro_mixtral(per_expert=False))
    (out / "micro-mixtral-per-expert.gguf").write_bytes(micro_mixtral(per_expert=True))
    for name in ["small.gguf", "tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"]:
        shutil.copy(FIX / "gguf-small" / name, out / name)
    for family in ["deepseek-v2", "glm4-moe", "gpt-oss-mxfp4", "olmoe", "phimoe", "qwen2-moe", "qwen3-moe"]:
        src = FIX / "gguf-convert" / f"tiny-{family}.gguf"
        (out / f"{family}-metadata.gguf").write_bytes(metadata_only(src))


def hob_seeds(out, hob, gguf_dir):
    with tempfile.TemporaryDirectory() as tmp:
        for name, experts in [("micro-int2.hob", "int2/g32"), ("micro-f16-int4.hob", "f16,int4/g32")]:
            path = Path(tmp) / name
            cmd = [hob, "convert", "--from", str(gguf_dir / "micro-mixtral-q8_0.gguf"), "-o", str(path),
                   "--experts", experts, "--no-progress"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            shutil.copy(path, out / name)


def safetensors_seeds(out):
    sep = b"\xff\xfeSHARD\xfe\xff"
    single = safetensors([
        ("model.embed_tokens.weight", "F32", (4, 2), f32s(8, 1)),
        ("model.norm.weight", "F16", (2,), f16s(2, 2)),
        ("lm_head.weight", "BF16", (2, 2), bytes([0, 63, 128, 191, 0, 64, 0, 0])),
        ("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", (2, 3), bytes(range(6))),
        ("model.layers.0.ids", "I64", (1,), struct.pack("<q", 7)),
    ], meta={"format": "pt"})
    (out / "single.safetensors").write_bytes(single)
    a = safetensors([("model.embed_tokens.weight", "F32", (2, 2), f32s(4, 3))])
    b = safetensors([("model.norm.weight", "BF16", (2,), bytes([0, 63, 0, 64])),
                     ("model.layers.0.mlp.gate.weight", "F16", (1, 2), f16s(2, 4))])
    index = {"metadata": {"total_size": 20}, "weight_map": {
        "model.embed_tokens.weight": "a.safetensors",
        "model.norm.weight": "b.safetensors",
        "model.layers.0.mlp.gate.weight": "b.safetensors"}}
    (out / "sharded").write_bytes(json.dumps(index, indent=2).encode() + sep + a + sep + b)
    # The tiny Mixtral's real index (its shards are the micro ones: most names are then missing).
    real = (FIX / "tiny-mixtral" / "model.safetensors.index.json").read_bytes()
    real = real.replace(b"model-00001-of-00002", b"a").replace(b"model-00002-of-00002", b"b")
    (out / "sharded-real-index").write_bytes(real + sep + a + sep + b)


WORD_LEVEL = {
    "version": "1.0",
    "added_tokens": [{"id": 0, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True},
                     {"id": 1, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4},
              "unk_token": "<unk>"},
}


def tokenizer_seeds(out):
    def seed(name, parts):
        (out / name).write_bytes(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))

    msgs = ["user\x01Hello [INST] {{ 7*7 }} </s>", "assistant\x01Hi!", "user\x01\u00e9\u2581 <s>\U0001F600"]
    mixtral = FIX / "tiny-mixtral"
    seed("mixtral", [(mixtral / "tokenizer.json").read_bytes(), (mixtral / "tokenizer_config.json").read_bytes(),
                     "", (mixtral / "generation_config.json").read_bytes(), "{}"] + msgs)
    seed("mixtral-jinja", [(mixtral / "tokenizer.json").read_bytes(), "", (FIX / "mistral" / "chat_template.jinja")
                           .read_bytes(), "", '{"x": 1}'] + msgs)
    qwen = FIX / "tiny-qwen3-moe"
    tools_template = json.loads((FIX / "serve" / "qwen3-tools.json").read_text())["template"]
    call = json.dumps([{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}])
    seed("qwen3-tools", [(qwen / "tokenizer.json").read_bytes(), (qwen / "tokenizer_config.json").read_bytes(),
                         tools_template, "", '{"enable_thinking": false}', "system\x01Be brief.",
                         "user\x01What is 2+2?", "assistant\x01\x01" + call, "tool\x014"])
    seed("word-level", [json.dumps(WORD_LEVEL), '{"bos_token": "<s>", "eos_token": "</s>"}',
                        "{% for m in messages %}{{ m.role }}: {{ m.content | trim }}{% endfor %}", "", "",
                        "user\x01hello world", "assistant\x01world"])


def serve_seeds(out):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    bodies = {
        "chat-tools-named": ({"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "tools": tools,
                              "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                              "stream": True, "stream_options": {"include_usage": True}},
                             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        "chat-tools-required": ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
                                     {"type": "text", "text": "hi"}]}], "tools": tools, "tool_choice": "required",
                                 "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop": ["\n\n", "</s>"]},
                                '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
        "chat-schema": ({"messages": [{"role": "user", "content": "json"}], "response_format": {
                            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                                "type": "object", "properties": {"n": {"type": "integer"}}}}},
                         "chat_template_kwargs": {"enable_thinking": False}, "seed": 3, "top_k": 40},
                        'Sure. <tool_call>{"name": "f"}'),
        "chat-assistant-call": ({"messages": [{"role": "user", "content": "q"}, {
                                    "role": "assistant", "content": None, "tool_calls": [{
                                        "id": "c1", "type": "function",
                                        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                                    {"role": "tool", "tool_call_id": "c1", "content": "1"}]},
                                "plain answer <to"),
        "completion-text": ({"prompt": "Once upon", "max_tokens": 8, "min_p": 0.05, "repeat_penalty": 1.1,
                             "ignore_eos": True, "n": 1, "echo": False}, "a time"),
        "completion-ids": ({"prompt": [1, 2, 3], "stream": False, "presence_penalty": 0.5,
                            "frequency_penalty": 0.5, "response_format": {"type": "json_object"}}, "{}"),
    }
    for name, (body, answer) in bodies.items():
        (out / name).write_bytes(json.dumps(body).encode() + b"\0" + answer.encode() + b"\0" + bytes([2, 5, 1, 9]))


def trace_seeds(out):
    header = {"hob_trace": 1, "model": "tiny", "layers": 2, "experts": 4, "top_k": 2, "high": "f16",
              "low": "int4", "high_bytes": 4, "low_bytes": 1, "t1": 0.6, "t2": 0.9}
    records = [(0, 0, 0, [[0, 0.7, "high"], [1, 0.3, "low"]]), (0, 0, 1, [[2, 0.8, "high"], [3, 0.2, "skip"]]),
               (0, 1, 0, [[0, 0.6, "high"], [1, 0.4, "high"]]), (0, 1, 1, [[2, 0.5, "high"], [0, 0.5, "low"]]),
               (1, 0, 0, [[1, 0.9, "high"], [0, 0.1, "low"]])]

    def write(name, h, recs, pred=None):
        lines = [json.dumps(h)]
        for seq, tok, layer, routes in recs:
            r = {"seq": seq, "tok": tok, "layer": layer, "routes": routes}
            if pred and layer + 1 < h["layers"]:
                r["pred"] = pred
            lines.append(json.dumps(r))
        (out / name).write_text("\n".join(lines) + "\n\n")

    write("two-sequences.jsonl", header, records)
    write("predictions.jsonl", dict(header, pred_depth=3), records, pred=[[[3, 0.8], [1, 0.2]]])
    no_low = dict(header, low=None, low_bytes=0, experts=8, layers=1)
    write("no-low.jsonl", no_low, [(s, t, 0, [[t % 8, 0.6, "high"], [(t + 3) % 8, 0.4, "skip"]])
                                   for s in range(2) for t in range(6)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hob", help="the hob binary for the .hob seeds (default: cargo build, target/debug/hob)")
    args = ap.parse_args()
    hob = args.hob
    if hob is None:
        subprocess.run(["cargo", "build", "--quiet", "--bin", "hob"], cwd=ROOT, check=True)
        hob = str(ROOT / "target" / "debug" / "hob")
    makers = {"gguf_reader": gguf_seeds, "safetensors_header": safetensors_seeds,
              "tokenizer_template": tokenizer_seeds, "serve_request": serve_seeds, "trace_reader": trace_seeds}
    for target, make in makers.items():
        d = SEEDS / target
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        make(d)
    d = SEEDS / "hob_reader"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    hob_seeds(d, hob, SEEDS / "gguf_reader")
    total = 0
    for d in sorted(SEEDS.iterdir()):
        sizes = [f.stat().st_size for f in d.iterdir()]
        total += sum(sizes)
        print(f"{d.name}: {len(sizes)} files, {sum(sizes)} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    sys.exit(main())
