#!/usr/bin/env bash
# Plain greedy decoding: ours vs mlx-lm's stream_generate, same tiny model, same prompt, same
# machine, one run. Prints tok/s of both and the ratio. Run via `make bench-ref`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${DFLASH_PYREF:-third_party/pyref/bin/python}"
DIR="${BENCH_DIR:-build/benchref}"
N="${BENCH_TOKENS:-128}"
PROMPT="${BENCH_PROMPT:-Write a short story about a robot learning to paint.}"
bin/dflash-mlx demo --dir "$DIR" --max-new-tokens 2 > /dev/null 2>&1
T="$DIR/target"
ours() { bin/dflash-mlx run -q --target-model "$T" --no-draft --ignore-eos -n "$N" --prompt "$PROMPT" --json | "$PY" -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["generation_tps"], s["prompt_tokens"], s["generated_tokens"])'; }
ref() { "$PY" - "$T" "$N" "$PROMPT" <<'PYEOF'
import sys
from mlx_lm import load, stream_generate
model, tok = load(sys.argv[1])
tok._eos_token_ids = set()
msgs = [{"role": "user", "content": sys.argv[3]}]
prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=False)
last = None
for r in stream_generate(model, tok, prompt, max_tokens=int(sys.argv[2])):
    last = r
print(last.generation_tps, last.prompt_tokens, last.generation_tokens)
PYEOF
}
ours >/dev/null; ref >/dev/null   # warm-up (kernel caches)
read -r o_tps o_p o_n < <(ours)
read -r r_tps r_p r_n < <(ref)
printf "plain greedy decoding, tiny Qwen3 (hidden 64, 4 layers, vocab 151936, bf16), %s backend, %s new tokens\n" "$(bin/dflash-mlx version --json | "$PY" -c 'import json,sys;print(json.load(sys.stdin)["backend"])')" "$N"
printf "  dflash-mlx (Go): %8.1f tok/s  (prompt %s tokens, generated %s)\n" "$o_tps" "$o_p" "$o_n"
printf "  mlx-lm (Python): %8.1f tok/s  (prompt %s tokens, generated %s)\n" "$r_tps" "$r_p" "$r_n"
"$PY" -c "print('  ratio ours/mlx-lm: %.2fx' % ($o_tps/$r_tps))"
