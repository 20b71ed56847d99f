#!/usr/bin/env python3
"""Summarize a kernel timeline written by tools/kernel_trace.c (start_ns,end_ns,stream,graph_node,name).

    python3 tools/kernel_trace.py TRACE.csv [--skip 0.2] [--marker NAME] [--gap-us 20]

Takes the records after the first --skip share (warm-up, capture), splits the GPU's time into segments by
which kernels run, and prints per kernel name: launches per token, time per token with the GPU busy on it
(overlapping kernels share a segment equally), its mean duration, and the idle time between kernels. A token is
one launch of --marker (default: the least frequent kernel name, e.g. the output head). Then each kernel's
increment (how much later it ends than every kernel before it: with dependent launches a kernel starts early and
waits, so its duration overstates it) and head start (how long before the kernel before it ended it started), and
what the host's copies and driver calls (HOB_KTRACE_API) do in the idle gaps longer than --gap-us.
--timeline N prints the kernels of the N-th token after the skip in order: start and end from the token's first
start, and the gap each leaves after the latest end before it.
"""
import argparse, collections, sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--skip", type=float, default=0.2)
    ap.add_argument("--marker")
    ap.add_argument("--gap-us", type=float, default=20.0)
    ap.add_argument("--timeline", type=int, metavar="N")
    a = ap.parse_args()
    recs, other = [], []
    for line in open(a.trace):
        p = line.rstrip("\n").split(",", 4)
        if len(p) == 5:
            r = (int(p[0]), int(p[1]), p[4])
            (other if p[4].startswith(("copy:", "api:")) else recs).append(r)
    recs.sort()
    other.sort()
    if not recs:
        sys.exit("no kernel records")
    recs = recs[int(len(recs) * a.skip):]
    other = [r for r in other if r[0] >= recs[0][0]]
    counts = collections.Counter(n for _, _, n in recs)
    marker = a.marker or min(counts, key=lambda n: (counts[n], n))
    tokens = sum(1 for _, _, n in recs if n == marker)
    t0, t1 = recs[0][0], max(e for _, e, _ in recs)
    # Sweep: segments between consecutive start/end points, shared among the kernels running.
    ev = sorted([(s, 1, i) for i, (s, _, _) in enumerate(recs)] + [(e, -1, i) for i, (_, e, _) in enumerate(recs)])
    running, last, idle = set(), t0, 0
    busy = collections.defaultdict(float)
    for t, kind, i in ev:
        if t > last:
            if running:
                for j in running:
                    busy[recs[j][2]] += (t - last) / len(running)
            else:
                idle += t - last
        last = t
        if kind == 1:
            running.add(i)
        else:
            running.discard(i)
    dur = collections.defaultdict(int)
    for s, e, n in recs:
        dur[n] += e - s
    per = max(tokens, 1)
    span = (t1 - t0) / per / 1e3
    print(f"{len(recs)} kernels, {tokens} tokens (marker {marker}): {span:.1f} us per token, "
          f"GPU idle {idle / per / 1e3:.1f} us per token ({100 * idle / (t1 - t0):.1f}%)")
    print()
    print("| kernel | per token | busy us/token | share | mean us | sum of durations us/token |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in sorted(busy, key=lambda n: -busy[n]):
        print(f"| {n[:60]} | {counts[n] / per:.1f} | {busy[n] / per / 1e3:.1f} | "
              f"{100 * busy[n] / (t1 - t0):.1f}% | {dur[n] / counts[n] / 1e3:.2f} | {dur[n] / per / 1e3:.1f} |")
    print(f"| (idle) | | {idle / per / 1e3:.1f} | {100 * idle / (t1 - t0):.1f}% | | |")
    # Increments: end minus the latest end before (in start order).
    inc = collections.defaultdict(float)
    last = recs[0][1]
    for s, e, n in recs[1:]:
        inc[n] += max(e - last, 0)
        last = max(last, e)
    # Head start: how long before the kernel before it (in start order) ended each launch started
    # (dependent launches start early and wait; a kernel whose blocks find no SM free starts late).
    head = collections.defaultdict(float)
    for (_, pe, _), (s, _, n) in zip(recs, recs[1:]):
        head[n] += pe - s
    print()
    print("| kernel | increment us/token | share | head start us (mean) |")
    print("|---|---:|---:|---:|")
    for n in sorted(inc, key=lambda n: -inc[n]):
        print(f"| {n[:60]} | {inc[n] / per / 1e3:.1f} | {100 * inc[n] / (t1 - t0):.1f}% | "
              f"{head[n] / counts[n] / 1e3:.2f} |")
    if a.timeline is not None:
        timeline(recs, marker, a.timeline)
    # Idle gaps between kernels and what the host did in them.
    gaps, last = [], recs[0][1]
    for s, e, n in recs[1:]:
        if s - last > a.gap_us * 1e3:
            gaps.append((last, s))
        last = max(last, e)
    if not gaps:
        return
    print()
    mean = sum(g1 - g0 for g0, g1 in gaps) / len(gaps)
    print(f"{len(gaps)} idle gaps over {a.gap_us:g} us ({len(gaps) / per:.2f} per token), mean {mean / 1e3:.1f} us; "
          "in them, per gap (offsets from the gap's start):")
    print()
    print("| copy or driver call | per gap | us per gap | first start us | last end us |")
    print("|---|---:|---:|---:|---:|")
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    gi = 0
    for s, e, n in other:
        while gi < len(gaps) and gaps[gi][1] < s:
            gi += 1
        if gi == len(gaps):
            break
        g0, g1 = gaps[gi]
        if e < g0 or s > g1:
            continue
        v = agg[n]
        v[0] += 1
        v[1] += e - s
        v[2] += s - g0
        v[3] += e - g0
    for n in sorted(agg, key=lambda n: agg[n][2] / agg[n][0]):
        c, d, f, l = agg[n]
        print(f"| {n[:60]} | {c / len(gaps):.2f} | {d / len(gaps) / 1e3:.1f} | {f / c / 1e3:.1f} | {l / c / 1e3:.1f} |")


def timeline(recs, marker, n):
    """The kernels from the n-th marker's end to the next one's, in start order."""
    ends = [e for _, e, k in recs if k == marker]
    if n + 1 >= len(ends):
        return
    lo, hi = ends[n], ends[n + 1]
    tok = [r for r in recs if lo <= r[0] and r[1] <= hi]
    if not tok:
        return
    t0, last = tok[0][0], lo
    print()
    print(f"Token {n}: {len(tok)} kernels, {(hi - lo) / 1e3:.1f} us from the head's end to the next one's")
    print()
    print("| # | kernel | start us | end us | duration us | gap before us |")
    print("|---:|---|---:|---:|---:|---:|")
    for i, (s, e, k) in enumerate(tok):
        print(f"| {i} | {k[:60]} | {(s - t0) / 1e3:.1f} | {(e - t0) / 1e3:.1f} | {(e - s) / 1e3:.2f} | "
              f"{(s - last) / 1e3:.2f} |")
        last = max(last, e)


if __name__ == "__main__":
    main()
