#!/usr/bin/env bash
# The cost of structured outputs on the CPU: tok/s of constrained against unconstrained
# decoding (plain, and DFlash with fixed blocks), the host time of the grammar's masks per
# token and per mask, and τ with and without the constraint, on the Go-code pair
# (testdata/gocode, an 8 192-token vocabulary) and, for the mask time at a large vocabulary,
# on a random pair with the Qwen3 tokenizer (151 669 tokens). Constrained DFlash runs twice:
# with greedy drafts chosen under the grammar (the default) and with the drafter's own
# (DFLASH_MASK_DRAFTS=0).
# Usage: bash bench/structured_cost.sh [tokens]   (after make build; prints one table)
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-128}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A JSON answer whose one string holds the code: the model writes Go inside it.
printf '%s' '{"type":"object","properties":{"code":{"type":"string"}},"required":["code"],"additionalProperties":false}' >"$work/code.json"
# Sixty digits: an answer whose length the grammar fixes, whatever a random model does.
printf '%s' '{"type":"object","properties":{"n":{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":60,"maxItems":60}},"required":["n"],"additionalProperties":false}' >"$work/digits.json"
prompt="Write the Go file strings/compare.go."
row() { # label, then run's arguments (DFLASH_MASK_DRAFTS passes through)
	local label="$1"
	shift
	DFLASH_ADAPTIVE_BLOCK=0 bin/dflash-mlx run --prompt "$prompt" -n "$n" --json "$@" 2>/dev/null |
		python3 -c '
import json, sys
o = json.load(sys.stdin); st = o["stats"]
masks = st.get("masks", 0); mask_ms = st.get("mask_ns", 0) / 1e6
n = st["generated_tokens"]
per_tok = f"{mask_ms / n:.3f}" if masks else "-"
per_mask = f"{mask_ms / masks * 1000:.1f}" if masks else "-"
tau = "%.2f" % st["tau"] if st.get("cycles") and st["mode"] == "dflash" else "-"
tps = st["generation_tps"]
print(f"{sys.argv[1]:<34} {n:>6} {tps:>8.1f} {tau:>6} {per_tok:>12} {per_mask:>10} {masks:>6}")
' "$label"
}
echo "Go-code pair (testdata/gocode), $n tokens, greedy, fixed blocks of 16 (DFLASH_ADAPTIVE_BLOCK=0)"
printf '%-34s %6s %8s %6s %12s %10s %6s\n' "" tokens "tok/s" "τ" "mask ms/tok" "µs/mask" masks
gc=(--target-model testdata/gocode/target)
row "plain" "${gc[@]}" --no-draft --ignore-eos
row "plain, JSON schema" "${gc[@]}" --no-draft --json-schema "$work/code.json"
row "DFlash" "${gc[@]}" --draft-model testdata/gocode/draft --ignore-eos
row "DFlash, JSON schema" "${gc[@]}" --draft-model testdata/gocode/draft --json-schema "$work/code.json"
DFLASH_MASK_DRAFTS=0 row "  the drafter's own drafts" "${gc[@]}" --draft-model testdata/gocode/draft --json-schema "$work/code.json"

# The mask time at a large vocabulary: a random pair with the Qwen3 tokenizer (demo --random).
demo="$work/demo"
bin/dflash-mlx demo --random --dir "$demo" --max-new-tokens 1 >/dev/null 2>&1
echo
echo "random pair with the Qwen3 tokenizer (151 669 tokens, a 151 936-row head), $n tokens, greedy"
printf '%-34s %6s %8s %6s %12s %10s %6s\n' "" tokens "tok/s" "τ" "mask ms/tok" "µs/mask" masks
rp=(--target-model "$demo/target")
row "plain" "${rp[@]}" --no-draft --ignore-eos
row "plain, sixty digits" "${rp[@]}" --no-draft --json-schema "$work/digits.json"
row "DFlash (block 4)" "${rp[@]}" --draft-model "$demo/draft" --block-size 4 --ignore-eos
row "DFlash (block 4), sixty digits" "${rp[@]}" --draft-model "$demo/draft" --block-size 4 --json-schema "$work/digits.json"
DFLASH_MASK_DRAFTS=0 row "  the drafter's own drafts" "${rp[@]}" --draft-model "$demo/draft" --block-size 4 --json-schema "$work/digits.json"
