# Call B: batches with speculation (goal 2) beside mlx-lm's server, the DFlash2 27B shape (goal 1).
R=/tmp/resB; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/b.tgz" -C "$R" .; }
conc() { # shape dir timeout
  stamp "concurrency $1 (batched speculation, replayed τ)"
  timeout "$3" "$B/dflash-mlx" bench --random "$1" --dir "$2" --replay-drafts 0.14 --concurrency 1,2,4,8,16 --requests-per-client 1 -n 128 --warmup 1 > "$R/conc_$1.txt" 2>&1
  echo "exit $?"; grep -E "^ +[0-9]+ |clients max|adaptive|τ of" "$R/conc_$1.txt"; pack; }
stamp "DFlash2: qwen3.8-27b-4bit, replayed error 0.08 (τ ≈ 6 at block 8)"
timeout 230 "$B/dflash-mlx" bench --random qwen3.8-27b-4bit --dir /tmp/r-27b -n 256 --num-prompts 1 --repeats 2 --replay-drafts 0.08 --json > "$R/dflash2_27b.json" 2> "$R/dflash2_27b.err"
echo "exit $?"; tail -4 "$R/dflash2_27b.err"
python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]
print({k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']})
print({k:(round(v,2) if isinstance(v,float) else v) for k,v in x.items() if not isinstance(v,(list,dict))})" "$R/dflash2_27b.json"; pack
stamp "servers under one load: mlx-lm, ours plain (qwen3-4b shape)"
install_mlxlm
export DFLASH_MLX_BIN="$B/dflash-mlx" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
for srv in mlxlm ours; do
  PYTHONPATH="$P" PYTHONUNBUFFERED=1 timeout 85 python3 scripts/bench_serve_load.py --server $srv --model /tmp/r4b/target --clients 1,4,16 --requests 1 --max-tokens 128 --ready-timeout 90 > "$R/serve_$srv.txt" 2>&1
  echo "exit $?"; tail -5 "$R/serve_$srv.txt"; pack
done
conc qwen3-4b /tmp/r4b 170
stamp done
