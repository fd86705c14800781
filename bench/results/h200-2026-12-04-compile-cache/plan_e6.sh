# Call E6: Qwen3-4B DFlash with and without GPU-exact verification, 5 repeats after 2 warmups.
R=/tmp/resE6; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/e6.tgz" -C "$R" .; }
speed() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]
print(sys.argv[2], {k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']}, 'plain runs', [round(v) for v in x['plain_runs_tok_s']], 'dflash runs', [round(v) for v in x['dflash_runs_tok_s']])" "$1" "$2"; }
for m in default exact default exact; do
  f=""; [ $m = exact ] && f=--gpu-exact
  stamp "speed qwen3-4b $m"
  timeout 80 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 256 --num-prompts 1 --repeats 5 --warmup 2 --replay-drafts 0.14 $f --json > "$R/speed_$m.json" 2> "$R/speed_$m.err"; speed "$R/speed_$m.json" "qwen3-4b $m" || tail -2 "$R/speed_$m.err"; cp "$R/speed_$m.json" "$R/speed_${m}_$(date +%s).json"; pack
done
stamp done
