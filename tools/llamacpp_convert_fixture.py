#!/usr/bin/env python3
"""llama.cpp's own convert_hf_to_gguf.py on one of hob's tiny fixtures (issue 51's golden GGUFs).

    python3 tools/llamacpp_convert_fixture.py LLAMA_CPP_DIR FIXTURE_DIR OUT.gguf [--pre NAME] [convert_hf_to_gguf args...]

The fixtures' tokenizers are small byte-level BPEs trained here, whose hash llama.cpp's converter cannot know, so
its vocabulary step stops ("BPE pre-tokenizer was not recognized"). Their pre-tokenizer is GPT-2's (ByteLevel with
the GPT-2 regex), so this names it `gpt-2` (or NAME: `olmo`, what the real OLMoE tokenizer is named, splits text
the same way) and otherwise runs the converter unchanged: tensor names, layouts, the Q/K permutation and every
hyper-parameter key are llama.cpp's. Needs torch (llama.cpp's requirements).
"""
import json
import os
import sys


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama, fixture, out = sys.argv[1:4]
    rest = sys.argv[4:]
    name = "gpt-2"
    if rest[:1] == ["--pre"] and len(rest) > 1:
        name, rest = rest[1], rest[2:]
    tok = json.load(open(os.path.join(fixture, "tokenizer.json")))
    pre = tok.get("pre_tokenizer") or {}
    if tok["model"]["type"] != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        sys.exit(f"{fixture}: not a GPT-2-style byte-level BPE tokenizer: {tok['model']['type']}, {pre}")
    sys.path[:0] = [llama, os.path.join(llama, "gguf-py")]
    import convert_hf_to_gguf as conv
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: name
    sys.argv = ["convert_hf_to_gguf.py", fixture, "--outfile", out, *rest]
    conv.main()


if __name__ == "__main__":
    main()
