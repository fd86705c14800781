# Call E4: long context again with the kernels compiled (the MMA pass 1's 1k row of E1
# compiled inside its measurement), and the hybrid's exactness cost with more repeats.
R=/tmp/resE4; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/e4.tgz" -C "$R" .; }
ctx() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))
for x in r['points']:
  print({k:(round(v,1) if isinstance(v,float) else v) for k,v in x.items() if not isinstance(v,(list,dict))})" "$1"; }
stamp "long context, MMA pass 1"
DFLASH_SPLIT_KEYS_MMA=1 timeout 130 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b --context 1k,32k -n 256 --repeats 2 --replay-drafts 0.14 --json > "$R/ctx_mma.json" 2> "$R/ctx_mma.err"
echo "exit $?"; ctx "$R/ctx_mma.json" || tail -3 "$R/ctx_mma.err"; pack
speed() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]
print(sys.argv[2], {k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']}, 'plain runs', [round(v) for v in x['plain_runs_tok_s']], 'dflash runs', [round(v) for v in x['dflash_runs_tok_s']])" "$1" "$2"; }
for m in default exact; do
  f=""; [ $m = exact ] && f=--gpu-exact
  stamp "speed qwen3.5-4b $m"
  timeout 110 "$B/dflash-mlx" bench --random qwen3.5-4b --dir /tmp/r-qwen3.5-4b -n 256 --num-prompts 1 --repeats 5 --warmup 2 --replay-drafts 0.14 $f --json > "$R/speed_q35_$m.json" 2> "$R/speed_q35_$m.err"; speed "$R/speed_q35_$m.json" "qwen3.5-4b $m" || tail -2 "$R/speed_q35_$m.err"; pack
done
stamp done
