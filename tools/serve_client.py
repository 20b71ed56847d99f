#!/usr/bin/env python3
"""Time `hob serve` from the client's side: streamed completions, time to first token and decode
tokens/s as a client sees them, beside the server's own `timings`. Standard library only (the
device machine has no openai package).

    serve_client.py BASE_URL N_TOKENS PROMPT_FILE [REPEATS]

Each repeat sends the prompt with a different first line, so the KV cache cannot reuse it: every
request prefills the whole prompt, as `hob run` does. Prints one markdown row per request.
"""

import http.client
import json
import sys
import time
import urllib.parse


def one(base, prompt, n):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    first = last = None
    usage = timings = None
    chunks = 0
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            usage, timings = j["usage"], j.get("timings")
        for c in j.get("choices", []):
            if c.get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    conn.close()
    ttft = (first - t0) * 1e3
    n_gen = usage["completion_tokens"]
    rate = (n_gen - 1) / (last - first) if last > first else 0.0
    return ttft, rate, usage, timings, chunks


def main():
    base, n, prompt_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    text = open(prompt_file).read()
    print("| request | prompt tokens | client TTFT ms | server prefill ms | client decode t/s | server decode t/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for i in range(repeats):
        ttft, rate, usage, t, _ = one(base, f"Request {i}.\n{text}", n)
        print(f"| {i} | {usage['prompt_tokens']} | {ttft:.1f} | {t['prompt_ms']:.1f} | {rate:.2f} | "
              f"{t['predicted_per_second']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
