#!/usr/bin/env bash
# Stage what the device machine (GPU, no Rust) needs into .gpu/ (git-ignored via .git/info/exclude):
# the release `hob` binary, every release test executable, and the tokenizer/fixtures they read.
#
#   bash tools/stage_gpu.sh          then, with the device tool: carry [".gpu"], command "bash .gpu/run.sh"
#
# .gpu/run.sh runs every staged test executable and writes one log, $OUT/tests.log (the device returns at most
# 8 files).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
grep -qx '.gpu/' .git/info/exclude 2>/dev/null || echo '.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/tests
cargo build --release
cp target/release/hob .gpu/hob
cargo test --release --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
  | while read -r exe; do cp "$exe" ".gpu/tests/$(basename "$exe")"; done
# Debug info would put the folder far over the device tool's 64 MiB carry limit.
strip .gpu/hob .gpu/tests/*
# Integration tests find the binary at the path baked in at build time (env!("CARGO_BIN_EXE_hob")).
echo "$root/target/release/hob" > .gpu/hob-path
cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the device machine from the repository root (tests read tests/fixtures/ from the tree).
set -u
baked=$(cat .gpu/hob-path); mkdir -p "$(dirname "$baked")"; cp .gpu/hob "$baked"
out="${OUT:-/tmp/hob-out}"; mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
status=0
for t in .gpu/tests/*; do
  name=$(basename "$t")
  { echo "=== $name"; "$t" 2>&1; } >> "$out/tests.log" || { status=1; echo "FAILED: $name"; }
done
grep -h "test result" "$out/tests.log"
exit $status
RUN
chmod +x .gpu/run.sh
du -sh .gpu
