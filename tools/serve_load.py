#!/usr/bin/env python3
"""Load and faults on loopback against `hob serve`: CLIENTS concurrent clients for SECONDS, each looping
over a mix of streamed and whole chats, text completions, streams dropped midway, malformed bodies
and prompts longer than the context. Standard library only.

    serve_load.py HOB_BINARY MODEL.hob [CLIENTS] [SECONDS] [OUT.md] [QUEUE]

Starts the server itself (--queue QUEUE, default 64; -c 256), samples its RSS and open files every 5 s, and
reports: requests by kind and status, any answer that was not a status (a stuck or dropped request),
client-side latency percentiles, the server's queue-wait percentiles (/metrics), and RSS and open files over
the run (each minute for runs up to 10 minutes, else every tenth of the run). Exit status 1 when a
well-formed request got no status, the server died, or an unexpected status came back.
"""

import collections
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

HOB, MODEL = sys.argv[1], sys.argv[2]
CLIENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 32
SECONDS = float(sys.argv[4]) if len(sys.argv) > 4 else 300
OUT = sys.argv[5] if len(sys.argv) > 5 else None
QUEUE = sys.argv[6] if len(sys.argv) > 6 else "64"

WORDS = "the cat sat on a mat while rain fell over quiet hills and rivers".split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def request(port, body, raw=None, stream=False, drop_after=None, timeout=120):
    """(status, seconds, detail); status None when no answer came."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    path = "/v1/completions" if "prompt" in (body or {}) else "/v1/chat/completions"
    try:
        data = raw if raw is not None else json.dumps(body)
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if stream and r.status == 200:
            events = 0
            while True:
                line = r.readline()
                if not line:
                    return None, time.perf_counter() - t0, "stream ended without [DONE]"
                if line.startswith(b"data: "):
                    events += 1
                    if line.strip() == b"data: [DONE]":
                        break
                    if drop_after is not None and events >= drop_after:
                        conn.close()  # the client goes away mid-answer
                        return "dropped", time.perf_counter() - t0, ""
        else:
            r.read()
        return r.status, time.perf_counter() - t0, ""
    except Exception as e:  # noqa: BLE001 - any failure is a finding
        return None, time.perf_counter() - t0, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


EXPECTED = {
    "chat_stream": {200, 429}, "chat": {200, 429}, "completion": {200, 429}, "drop": {"dropped", 200, 429},
    "malformed": {400}, "wrong_type": {400}, "too_long": {400, 429},
}


def client(port, seed, deadline, results, lock):
    rng = random.Random(seed)
    while time.time() < deadline:
        kind = rng.choices(list(EXPECTED), weights=[35, 20, 10, 15, 7, 5, 8])[0]
        n = rng.randint(1, 48)
        msgs = [{"role": "user", "content": text(rng, rng.randint(3, 30))}]
        if kind == "chat_stream":
            out = request(port, {"messages": msgs, "max_tokens": n, "stream": True}, stream=True)
        elif kind == "chat":
            out = request(port, {"messages": msgs, "max_tokens": n, "temperature": 0.7, "seed": seed})
        elif kind == "completion":
            out = request(port, {"prompt": text(rng, 10), "max_tokens": n})
        elif kind == "drop":
            out = request(port, {"messages": msgs, "max_tokens": 64, "stream": True, "ignore_eos": True},
                          stream=True, drop_after=rng.randint(1, 4))
        elif kind == "malformed":
            out = request(port, None, raw=rng.choice(['{"messages": [', "not json", "[1,2]", "{}"]))
        elif kind == "wrong_type":
            out = request(port, {"messages": msgs, "temperature": "hot"})
        else:
            out = request(port, {"messages": [{"role": "user", "content": text(rng, 400)}]})
        with lock:
            results.append((kind,) + out)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def open_files(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


def samples(rss):
    """RSS and open files at about 11 points of the run, and their extremes."""
    step = 60 if SECONDS <= 600 else SECONDS / 10
    marks, next_t = [], 0.0
    for t, r, f in rss:
        if t >= next_t:
            marks.append((t, r, f))
            next_t += step
    if rss and marks[-1] != rss[-1]:
        marks.append(rss[-1])
    out = ["| at s | RSS MiB | open files |", "|---:|---:|---:|"]
    out += [f"| {t:.0f} | {r / 1024:.1f} | {f} |" for t, r, f in marks]
    if rss:
        out += ["", f"RSS min {min(r for _, r, _ in rss) / 1024:.1f} MiB, max {max(r for _, r, _ in rss) / 1024:.1f} MiB; "
                    f"open files min {min(f for _, _, f in rss)}, max {max(f for _, _, f in rss)} ({len(rss)} samples)."]
    return out


def main():
    proc = subprocess.Popen([HOB, "serve", "-m", MODEL, "--port", "0", "-t", "1", "--queue", QUEUE, "-c", "256"],
                            stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"ready on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    results, lock = [], threading.Lock()
    t0 = time.time()
    deadline = t0 + SECONDS
    threads = [threading.Thread(target=client, args=(port, i, deadline, results, lock)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    rss = []
    while any(t.is_alive() for t in threads):
        rss.append((time.time() - t0, rss_kib(proc.pid), open_files(proc.pid)))
        time.sleep(5)
    alive = proc.poll() is None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    proc.terminate()
    code = proc.wait(30)

    by = collections.Counter((k, s) for k, s, _, _ in results)
    bad = [(k, s, d) for k, s, _, d in results if s not in EXPECTED[k]]
    lines = [f"# hob serve under load: {CLIENTS} clients, {SECONDS:.0f} s, queue {QUEUE}, {len(results)} requests", "",
             "| kind | status | count | p50 s | p99 s |", "|---|---|---:|---:|---:|"]
    for (k, s), c in sorted(by.items(), key=lambda x: (x[0][0], str(x[0][1]))):
        lat = [t for kk, ss, t, _ in results if kk == k and ss == s]
        lines.append(f"| {k} | {s} | {c} | {pct(lat, 0.5):.3f} | {pct(lat, 0.99):.3f} |")
    q = {m.group(1): float(m.group(2)) for m in re.finditer(r'hob_queue_wait_seconds\{quantile="([\d.]+)"\} (\S+)', metrics)}
    lines += ["", f"Server queue wait (last 1024 requests): p50 {q.get('0.5', 0):.3f} s, p99 {q.get('0.99', 0):.3f} s.",
              f"Server alive at the end: {alive}; exit status after SIGTERM: {code}.",
              f"Unexpected outcomes: {len(bad)}" + (f" (first: {bad[:5]})" if bad else "."), "",
              ""] + samples(rss)
    report = "\n".join(lines) + "\n"
    print(report)
    if OUT:
        open(OUT, "w").write(report)
    sys.exit(0 if alive and not bad and code == 0 else 1)


if __name__ == "__main__":
    main()
