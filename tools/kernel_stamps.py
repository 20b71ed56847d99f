#!/usr/bin/env python3
"""Summarize the stage timings that a STAMPS build of cuda/kernels.cu prints (a measurement switch).

    HOB_NVRTC_DEFINES=STAMPS=1 hob bench -m FILE -p 0 -n 32 -r 1 > stamps.txt
    python3 tools/kernel_stamps.py stamps.txt

With STAMPS=1, thread 0 of the one-block routing launch (moe_route_norm; "route" or "route_regs") and of the
combine launch (moe_combine_norm) prints its clock64() at each stage (d2: past the wait for the kernel before it;
then the norm and products, the router's sums, the top-k / the sums of squares, rms_inv, the stores), and the
first block of every integer matvec prints the global time it passed its wait and how long staging x took.
Prints each stage's median time from the kernel's start, and the routed launches' staging times.
"""
import statistics as st
import sys


def fields(p):
    return {p[i]: int(p[i + 1]) for i in range(2, len(p) - 1, 2)}


def main():
    lines = [l.split() for l in open(sys.argv[1]) if l.startswith("stamps")]
    route, comb, stg_gu, stg_dn = [], [], [], []
    for p in lines:
        if p[1] in ("route", "route_regs", "combine"):
            d = fields(p)
            if p[1] == "combine":
                comb.append(d)
            else:
                route.append(d)
        elif p[1] == "qwait":
            rows, staged = int(p[3]), int(p[7])
            if rows > 4096:
                stg_gu.append(staged)
            else:
                stg_dn.append(staged)
    med = lambda v: st.median(v) if v else float("nan")
    for name, recs in (("routing", route), ("combine", comb)):
        if not recs:
            continue
        ghz = med([d["d5"] / d["ns"] for d in recs if d["ns"] > 0])
        print(f"{name}: {len(recs)} launches, median {med([d['ns'] for d in recs]):.0f} ns start to end, "
              f"clock {ghz:.2f} GHz")
        for k in ("d1", "d2", "d3", "d4", "d5", "d6", "d7"):
            v = [d.get(k, 0) for d in recs]
            if any(v):
                print(f"  start -> {k}: median {med(v) / ghz:.0f} ns ({med(v):.0f} cycles)")
    if stg_gu:
        print(f"gate + up, first block: x staged in {med(stg_gu):.0f} ns (n = {len(stg_gu)})")
    if stg_dn:
        print(f"down, first block: x staged in {med(stg_dn):.0f} ns (n = {len(stg_dn)})")


if __name__ == "__main__":
    main()
