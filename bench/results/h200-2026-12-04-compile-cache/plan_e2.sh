# Call E2: DFlash and plain with and without GPU-exact verification, speed and flips (goal 7).
R=/tmp/resE2; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/e2.tgz" -C "$R" .; }
speed() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]
print(sys.argv[2], {k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']}, 'plain runs', [round(v) for v in x['plain_runs_tok_s']], 'dflash runs', [round(v) for v in x['dflash_runs_tok_s']])" "$1" "$2"; }
for shape in qwen3-4b qwen3.5-4b; do
  d=/tmp/r4b; [ $shape = qwen3-4b ] || d=/tmp/r-$shape
  for m in default exact; do
    f=""; [ $m = exact ] && f=--gpu-exact
    stamp "speed $shape $m"
    timeout 100 "$B/dflash-mlx" bench --random $shape --dir $d -n 256 --num-prompts 1 --repeats 3 --replay-drafts 0.14 $f --json > "$R/speed_${shape}_$m.json" 2> "$R/speed_${shape}_$m.err"; speed "$R/speed_${shape}_$m.json" "$shape $m" || tail -2 "$R/speed_${shape}_$m.err"
    stamp "flips $shape $m"
    timeout 80 "$B/dflash-mlx" bench --random $shape --dir $d -n 128 --num-prompts 2 --flips $f --json > "$R/flips_${shape}_$m.json" 2> "$R/flips_${shape}_$m.err"
    python3 -c "import json,sys;r=json.load(open(sys.argv[1]));[print(x['positions'],len(x['flips'] or []),x['max_abs_logprob_diff'],x['median_decode_gap']) for x in r['reports']]" "$R/flips_${shape}_$m.json" || tail -2 "$R/flips_${shape}_$m.err"
    pack
  done
done
stamp done
