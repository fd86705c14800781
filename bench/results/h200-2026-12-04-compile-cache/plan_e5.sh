# Call E5: the 35B-A3B shape, all prompts, fixed block 16 (no probe), replayed τ.
R=/tmp/resE5; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/e5.tgz" -C "$R" .; }
stamp "qwen3.5-35b-a3b"
DFLASH_ADAPTIVE_BLOCK=0 timeout 360 "$B/dflash-mlx" bench --random qwen3.5-35b-a3b --dir /tmp/r-35b -n 128 --repeats 1 --warmup 1 --replay-drafts 0.1 --json > "$R/a3b.json" 2> "$R/a3b.err"
echo "exit $?"; tail -4 "$R/a3b.err"; python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))
print({k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']})
for x in r['rows']: print(round(x.get('plain_tok_s',0),1), round(x.get('dflash_tok_s',0),1), round(x.get('tau',0),2))" "$R/a3b.json"; pack
stamp done
