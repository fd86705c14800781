#!/usr/bin/env python3
"""Per-cycle device time of each kernel launch shape, from the CSVs of `gpu_run.sh prof`.

Usage: python3 scripts/prof_cycle.py prof_1.csv [prof_2.csv ...]

A DFlash cycle ends with its verify argmax (MLX's arg_reduce over 16 rows). Only the
launches of whole cycles — from after one verify argmax to the next — are counted; each
(kernel, grid, block) line gives microseconds per cycle, launches per cycle and
microseconds per launch. (Counting the window's partial cycles as whole ones made
per-cycle sums about 10% low: docs/perf/profiling.md.)
"""
import collections
import csv
import sys

UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}


def load(path):
    rows = list(csv.reader(open(path)))
    ix = {k: i for i, k in enumerate(rows[0])}
    dur, name = ix["gpu__time_duration.sum"], ix["Kernel Name"]
    grid, block = ix["launch__grid_size"], ix["launch__block_size"]
    scale = UNITS[rows[1][dur]]
    out = []
    for r in rows[2:]:
        try:
            d = float(r[dur].replace(",", "")) * scale
        except (ValueError, IndexError):
            continue
        n = r[name].split("(")[0].replace("custom_kernel_dflash_", "").replace("void ", "")
        out.append((n, r[grid].replace(",", ""), r[block].replace(",", ""), d))
    return out


def main(paths, top=18):
    for p in paths:
        launches = load(p)
        ends = [i for i, (n, g, _, _) in enumerate(launches) if n.startswith("arg_reduce_general<__nv_bfloat16") and g == "16"]
        if len(ends) < 2:
            print(p, "fewer than two verify argmaxes in the window: no whole DFlash cycle")
            continue
        whole = launches[ends[0] + 1 : ends[-1] + 1]
        cycles = len(ends) - 1
        agg = collections.defaultdict(lambda: [0, 0.0])
        total = 0.0
        for n, g, b, d in whole:
            agg[(n[:56], g, b)][0] += 1
            agg[(n[:56], g, b)][1] += d
            total += d
        print(f"{p}: {cycles} whole cycles, {len(whole) / cycles:.0f} launches and {total / cycles:.0f} us of kernels per cycle")
        for (n, g, b), (c, d) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {d / cycles:8.1f} us/cycle {c / cycles:5.1f}x {d / c:7.2f} us  grid {g:>6} block {b:>4}  {n}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
