# Call A: cold start (goal 6), long context (goal 3), exactness and its cost (goal 7).
R=/tmp/resA; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/a.tgz" -C "$R" .; }
ts() { local t0; t0=$(date +%s%N); while IFS= read -r l; do echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms: $l"; done; }
write_pair() { # shape dir: writes the random pair, stops the bench before it loads
  rm -f /tmp/w.err; "$B/dflash-mlx" bench --random "$1" --dir "$2" -n 8 --num-prompts 1 --repeats 1 --warmup 0 > /dev/null 2> /tmp/w.err & local pid=$!
  for i in $(seq 240); do grep -q "^wrote random" /tmp/w.err && break; sleep 0.5; done; kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep "^wrote" /tmp/w.err; }
cold() { # shape dir: first and second run of a fresh user (no PTX cache, no kernel verdicts)
  local c=/tmp/cold-$1; rm -rf "$c"; mkdir -p "$c"
  for k in 1 2; do
    stamp "$1 run $k"
    s=$(date +%s%N)
    env -u MLX_PTX_CACHE_DIR XDG_CACHE_HOME="$c" HOME="$c" timeout 240 "$B/dflash-mlx" run --target-model "$2/target" --draft-model "$2/draft" --prompt "hello world" -n 64 --ignore-eos --no-chat-template --stats 2> >(sed -u 's/\r/\n/g' | ts > "$R/cold_$1_$k.err") > "$R/cold_$1_$k.out"
    echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"; sleep 0.5
    grep -v "^[0-9]* ms: *$" "$R/cold_$1_$k.err" | tail -25
  done; ls "$c" "$c"/* 2>/dev/null | head; du -sh /tmp/mlx 2>/dev/null; }
stamp "write qwen3-4b"; write_pair qwen3-4b /tmp/r4b
cold qwen3-4b /tmp/r4b; pack
stamp "write qwen3.5-4b"; write_pair qwen3.5-4b /tmp/r-qwen3.5-4b
cold qwen3.5-4b /tmp/r-qwen3.5-4b; pack
ctx() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))
for x in r['points']:
  print({k:(round(v,1) if isinstance(v,float) else v) for k,v in x.items() if not isinstance(v,(list,dict))})" "$1"; }
for v in "DFLASH_SPLIT_KEYS_MMA=1" "-"; do
  stamp "long context, ${v}"; w="$v"; [ "$v" = - ] && w=""
  env $w timeout 170 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b --context 1k,8k,32k -n 256 --repeats 2 --replay-drafts 0.14 --json > "$R/ctx_${v//=/_}.json" 2> "$R/ctx_${v//=/_}.err"
  echo "exit $?"; ctx "$R/ctx_${v//=/_}.json" || tail -3 "$R/ctx_${v//=/_}.err"; pack
done
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
