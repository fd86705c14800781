#!/usr/bin/env bash
# Reproduces the Go-code pair (testdata/gocode) from scratch: corpus → tokenizer → token
# streams → target → drafter → the PyTorch check of greedy DFlash → a 4-bit copy of the
# target (mlx-lm's converter). Each step is one of train/'s scripts (its --help says more).
#
#   bash train/make_pair.sh OUT            # the H200 recipe: 6 min target, then the drafter
#   PROFILE=cpu-trial bash train/make_pair.sh OUT   # a few minutes on a CPU, tiny shapes
#
# PYTHON: an interpreter with torch, transformers, tokenizers, numpy and safetensors
# (default python3); MLX_PYTHON: one with mlx-lm for the 4-bit copy (default the reference
# venv third_party/pyref; the step is skipped when it is missing). GOROOT: the Go sources
# of the corpus (default: `go env GOROOT`).
set -euo pipefail
OUT="${1:?usage: make_pair.sh OUT}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
MLX_PY="${MLX_PYTHON:-$HERE/../third_party/pyref/bin/python}"
GOROOT="${GOROOT:-$(go env GOROOT)}"
case "${PROFILE:-h200}" in
  h200) TARGET_ARGS=(--minutes 6); DRAFT_ARGS=(--gen-seqs 16384 --gen-batch 4096 --max-steps 3000) ;;
  cpu-trial) TARGET_ARGS=(--hidden 64 --layers 2 --heads 2 --kv-heads 1 --head-dim 32 --inter 128 --seq 256 --batch 16 --max-steps 300)
             DRAFT_ARGS=(--layers 1 --gen-seqs 128 --gen-len 128 --gen-batch 128 --batch 8 --anchors 8 --max-steps 200) ;;
  *) echo "make_pair: PROFILE is h200 or cpu-trial, got ${PROFILE}" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
step() { echo "== $*"; }
step corpus;    "$PY" "$HERE/corpus.py" --goroot "$GOROOT" --out "$OUT/corpus"
step tokenizer; "$PY" "$HERE/tokenizer.py" --corpus "$OUT/corpus" --vocab 8192 --out "$OUT/tokenizer"
step data;      "$PY" "$HERE/data.py" --corpus "$OUT/corpus" --tokenizer "$OUT/tokenizer" --out "$OUT/data"
step target;    "$PY" "$HERE/target.py" --data "$OUT/data" --tokenizer "$OUT/tokenizer" --out "$OUT/target" "${TARGET_ARGS[@]}"
step drafter;   "$PY" "$HERE/drafter.py" --data "$OUT/data" --target "$OUT/target" --out "$OUT/draft" "${DRAFT_ARGS[@]}"
step simulate
"$PY" -c 'import json,sys
for l in list(open(sys.argv[1]))[:4]: print(json.dumps(json.loads(l)["completion"]))' "$OUT/data/heldout_prompts.jsonl" > "$OUT/simulate_prompts.jsonl"
"$PY" "$HERE/simulate.py" --target "$OUT/target" --draft "$OUT/draft" --prompt-file "$OUT/simulate_prompts.jsonl" -n 128 | tail -1
if [ -x "$MLX_PY" ]; then
  step "4-bit copy (mlx-lm)"
  rm -rf "$OUT/target-4bit"
  "$MLX_PY" -m mlx_lm convert --hf-path "$OUT/target" --mlx-path "$OUT/target-4bit" -q --q-bits 4 --q-group-size 64
else
  echo "make_pair: no mlx-lm interpreter at $MLX_PY (make deps); the 4-bit copy is left out"
fi
echo "pair in $OUT/target and $OUT/draft"
