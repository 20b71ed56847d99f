#!/usr/bin/env bash
# Issue 52 on the device: `hob serve` beside `hob run` on one model and prompt, alternated: time to
# first token and decode tokens/s as a client sees them (tools/serve_client.py, streamed
# /v1/completions with ignore_eos) against `hob run`'s own prompt and generation timings.
# After tools/stage_gpu.sh, on the device machine:
#   bash tools/serve_gpu.sh MODEL PROMPT_FILE N ROUNDS [ENGINE FLAGS...]  -> $OUT/serve.md
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
model=${1:?usage: serve_gpu.sh MODEL PROMPT_FILE N ROUNDS [FLAGS...]}
prompt=${2:?}; n=${3:-128}; rounds=${4:-2}
shift 4
table="$out/serve.md"
echo "## hob serve vs hob run: $(basename "$model"), $n tokens, flags: $*" >> "$table"
for round in $(seq 1 "$rounds"); do
  # hob run: the same prompt with a first line of the same shape as the client's.
  { printf 'Request run.\n'; cat "$prompt"; } > /tmp/serve-run-prompt.txt
  err=$("$hob" run -m "$model" --no-chat --ignore-eos --temp 0 -n "$n" -f /tmp/serve-run-prompt.txt "$@" 2>&1 >/dev/null)
  echo "round $round, hob run: $(echo "$err" | grep -E '^(tokenize|prompt|generation):' | tr '\n' ' ')" >> "$table"
  "$hob" serve -m "$model" --port 0 "$@" 2> /tmp/serve.log &
  pid=$!
  base=""
  for _ in $(seq 1 600); do
    base=$(grep -o 'ready on http://[^ ]*' /tmp/serve.log | cut -d' ' -f3)
    [ -n "$base" ] && break
    sleep 0.2
  done
  if [ -z "$base" ]; then echo "round $round: hob serve did not start: $(tail -3 /tmp/serve.log)" >> "$table"; kill $pid; continue; fi
  echo "round $round, hob serve:" >> "$table"
  python3 "$(dirname "${BASH_SOURCE[0]}")/serve_client.py" "$base" "$n" "$prompt" 3 >> "$table" 2>&1
  kill -TERM $pid; wait $pid
done
cat "$table"
