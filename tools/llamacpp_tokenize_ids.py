#!/usr/bin/env python3
"""llama.cpp's token ids for the tokenizer corpus of tests/gguf_tokenizer.rs (issue 51's golden ids).

    python3 tools/llamacpp_tokenize_ids.py LLAMA_TOKENIZE CORPUS.json OUT.json GGUF_DIR

CORPUS.json: {"GGUF file name": [texts], ...}, as `cargo test --test gguf_tokenizer` writes it on every run
(target/tokenizer-corpus.json). Each text goes through
`llama-tokenize -m GGUF_DIR/NAME --stdin --ids --no-bos --no-escape` (special tokens parsed, as Hugging Face's encode
does); OUT.json holds {"NAME": [{"text": ..., "ids": [...]}, ...], ...}.
"""
import json
import os
import subprocess
import sys


def main() -> None:
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    exe, corpus, out, gguf_dir = sys.argv[1:5]
    result = {}
    for name, texts in json.load(open(corpus)).items():
        rows = []
        for t in texts:
            r = subprocess.run(
                [exe, "-m", os.path.join(gguf_dir, name), "--stdin", "--ids", "--no-bos", "--no-escape", "--log-disable"],
                input=t.encode(), capture_output=True, check=True)
            line = r.stdout.decode().strip().splitlines()[-1] if r.stdout.strip() else "[]"
            rows.append({"text": t, "ids": json.loads(line)})
        result[name] = rows
    with open(out, "w") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
    print(f"wrote {out}: {', '.join(f'{k} ({len(v)} texts)' for k, v in result.items())}")


if __name__ == "__main__":
    main()
