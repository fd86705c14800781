"""Builds the training corpus of the Go-code pair from the Go standard library's sources.

Every non-generated .go file under GOROOT/src (testdata and vendor folders left out) is one
document; a file goes to the held-out split when the first byte of the SHA-256 of its path
relative to src is below 13 (about 5% of files), so the split depends on the path alone and
is the same on every machine and Go version. Writes train.jsonl and heldout.jsonl
({"path", "text"} per line) and corpus.json (the Go version, file and byte counts).

    python3 train/corpus.py --goroot "$(go env GOROOT)" --out /tmp/pair/corpus
"""

import argparse
import hashlib
import json
import os
import sys

MAX_BYTES = 64 * 1024  # longer files are mostly tables
HELDOUT_BELOW = 13      # of 256: the held-out share of paths


def is_generated(text):
    # The Go convention (go help generate): a line "// Code generated ... DO NOT EDIT."
    # before the package clause.
    head = text.split("\npackage ", 1)[0]
    return any(l.startswith("// Code generated") and l.rstrip().endswith("DO NOT EDIT.") for l in head.splitlines())


def split_of(rel):
    return "heldout" if hashlib.sha256(rel.encode()).digest()[0] < HELDOUT_BELOW else "train"


def walk(src):
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in ("testdata", "vendor") and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".go"):
                yield os.path.join(root, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goroot", required=True, help="the Go installation whose src/ is read")
    ap.add_argument("--out", required=True, help="output folder")
    a = ap.parse_args()
    src = os.path.join(a.goroot, "src")
    if not os.path.isdir(src):
        sys.exit(f"corpus: {src} is not a folder (is --goroot a Go installation?)")
    version = open(os.path.join(a.goroot, "VERSION")).readline().strip() if os.path.exists(os.path.join(a.goroot, "VERSION")) else "unknown"
    os.makedirs(a.out, exist_ok=True)
    stats = {"go_version": version, "skipped_generated": 0, "skipped_long": 0, "skipped_not_utf8": 0,
             "train": {"files": 0, "bytes": 0}, "heldout": {"files": 0, "bytes": 0}}
    outs = {k: open(os.path.join(a.out, k + ".jsonl.tmp"), "w") for k in ("train", "heldout")}
    for path in walk(src):
        rel = os.path.relpath(path, src)
        raw = open(path, "rb").read()
        if len(raw) > MAX_BYTES:
            stats["skipped_long"] += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats["skipped_not_utf8"] += 1
            continue
        if is_generated(text):
            stats["skipped_generated"] += 1
            continue
        k = split_of(rel)
        outs[k].write(json.dumps({"path": rel, "text": text}) + "\n")
        stats[k]["files"] += 1
        stats[k]["bytes"] += len(raw)
    for k, f in outs.items():
        f.close()
        os.replace(os.path.join(a.out, k + ".jsonl.tmp"), os.path.join(a.out, k + ".jsonl"))
    if stats["heldout"]["files"] == 0 or stats["train"]["files"] == 0:
        sys.exit(f"corpus: an empty split: {stats}")
    with open(os.path.join(a.out, "corpus.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
