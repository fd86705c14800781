#!/usr/bin/env python3
"""Reads a host profile written by DFLASH_HOSTPROF (mlxc/csrc/hostprof.cpp) and prints, per
label (1: plain decoding, 2: DFlash in `dflash-mlx bench`), where the sampled CPU time went:
by function (self: the interrupted frame; total: anywhere on the stack) and by module.

  python3 scripts/hostprof.py PROFILE[.xz] --exe BIN [--lib DIR] [--top N] [--tid-all]

BIN: the Go binary that ran (C frames in it need an unstripped build; Go frames come named
by the process itself, else through `go tool addr2line`, which misnames a stripped binary's). DIR: where libmlx.so lies (addr2line reads its symbol table). Frames in
other libraries keep the nearest exported name the profiler saw (`~name`). By default only
the thread with the most samples in each label is read (the one encoding MLX graphs).
"""
import argparse
import collections
import lzma
import os
import re
import subprocess
import sys


def parse(path):
    rows = []
    opener = lzma.open if path.endswith(".xz") else open  # the stored profiles are compressed
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                print(line.strip())
                continue
            parts = line.split()
            label, tid, count = int(parts[0]), int(parts[1]), int(parts[2])
            rows.append((label, tid, count, parts[3:]))
    return rows


FRAME = re.compile(r"^(.*?)\+(0x[0-9a-f]+|0)(?::(.*))?$")


def split(frame):
    m = FRAME.match(frame)
    if not m:
        return frame, 0, ""
    return m.group(1), int(m.group(2), 16), m.group(3) or ""


def symbolize(frames, exe, libdir):
    """Maps each (module, address) to a function name."""
    by_mod = collections.defaultdict(set)
    for mod, addr in frames:
        by_mod[mod].add(addr)
    names = {}
    for mod, addrs in by_mod.items():
        addrs = sorted(addrs)
        path = None
        if exe and (mod == os.path.basename(exe) or mod == "exe"):
            out = subprocess.run(["go", "tool", "addr2line", exe], input="".join(f"{a:#x}\n" for a in addrs),
                                 capture_output=True, text=True).stdout.splitlines()
            for i, a in enumerate(addrs):
                fn = out[2 * i] if 2 * i < len(out) else "?"
                names[(mod, a)] = fn if fn != "?" else f"{mod}:{a:#x}"
            continue
        if libdir and os.path.exists(os.path.join(libdir, mod)):
            path = os.path.join(libdir, mod)
        if path:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", path] + [f"{a:#x}" for a in addrs],
                                 capture_output=True, text=True).stdout.splitlines()
            for i, a in enumerate(addrs):
                fn = out[2 * i] if 2 * i < len(out) else "??"
                names[(mod, a)] = short(fn) if fn != "??" else f"{mod}:{a:#x}"
    return names


def short(fn):
    # Drop argument lists and template arguments beyond a readable length.
    depth, out = 0, []
    for ch in fn:
        if ch in "(<":
            depth += 1
            if depth == 1:
                out.append("(…)" if ch == "(" else "<…>")
            continue
        if ch in ")>":
            depth = max(0, depth - 1)
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)[:140]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--exe")
    ap.add_argument("--lib")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--tid-all", action="store_true")
    a = ap.parse_args()
    rows = parse(a.profile)
    # Frames 0 and 1 are the signal handler and the kernel's return trampoline; frame 2 is
    # the interrupted instruction, the rest return addresses (one byte back names the call).
    keyed = []
    wanted = set()
    for label, tid, count, frames in rows:
        stack = []
        for i, fr in enumerate(frames[2:]):
            mod, off, sname = split(fr)
            addr = off if i == 0 else off - 1
            stack.append((mod, addr, sname))
            wanted.add((mod, addr))
        keyed.append((label, tid, count, stack))
    names = symbolize(wanted, a.exe, a.lib)

    def name(mod, addr, sname):
        if sname.startswith("go:"):  # named by the Go runtime that ran (mlxc.StopHostProfile)
            return sname[3:]
        n = names.get((mod, addr))
        if n:
            return n
        return f"{mod}:~{sname}" if sname else mod

    for label in sorted({k[0] for k in keyed}):
        per_tid = collections.Counter()
        for l, tid, count, _ in keyed:
            if l == label:
                per_tid[tid] += count
        tids = set(per_tid) if a.tid_all else {per_tid.most_common(1)[0][0]}
        total = sum(per_tid[t] for t in tids)
        print(f"\n== label {label}: {total} samples (threads {dict(per_tid.most_common(6))})")
        self_c, incl_c, mod_c = collections.Counter(), collections.Counter(), collections.Counter()
        for l, tid, count, stack in keyed:
            if l != label or tid not in tids or not stack:
                continue
            leaf = stack[0]
            self_c[name(*leaf)] += count
            mod_c[leaf[0]] += count
            seen = set()
            for fr in stack:
                n = name(*fr)
                if n not in seen:
                    seen.add(n)
                    incl_c[n] += count
        print("-- modules (self)")
        for m, c in mod_c.most_common(12):
            print(f"{100 * c / total:6.1f}%  {m}")
        print("-- self")
        for n, c in self_c.most_common(a.top):
            print(f"{100 * c / total:6.1f}%  {n}")
        print("-- total (on the stack)")
        for n, c in incl_c.most_common(a.top):
            print(f"{100 * c / total:6.1f}%  {n}")


if __name__ == "__main__":
    sys.exit(main())
