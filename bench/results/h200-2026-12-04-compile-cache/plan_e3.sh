# Call E3: batches with speculation (goal 2), then the 35B-A3B shape (goal 4).
R=/tmp/resE3; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/e3.tgz" -C "$R" .; }
for shape in qwen3-4b; do
  d=/tmp/r4b; [ $shape = qwen3-4b ] || d=/tmp/r-$shape
  stamp "concurrency $shape (batched speculation, replayed τ)"
  timeout 200 "$B/dflash-mlx" bench --random $shape --dir $d --replay-drafts 0.14 --concurrency 1,2,4,8,16 --requests-per-client 2 -n 128 --warmup 1 > "$R/conc_$shape.txt" 2>&1
  echo "exit $?"; grep -E "^ +[0-9]+ |clients|adaptive|τ of" "$R/conc_$shape.txt" | head -12; pack
done
stamp "qwen3.5-35b-a3b, all prompts, replayed τ"
timeout 240 "$B/dflash-mlx" bench --random qwen3.5-35b-a3b --dir /tmp/r-35b -n 256 --repeats 1 --replay-drafts 0.1 --json > "$R/a3b.json" 2> "$R/a3b.err"
echo "exit $?"; tail -3 "$R/a3b.err"; python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))
print({k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']})" "$R/a3b.json"; pack
stamp done
