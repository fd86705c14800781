# Call C: where a warm process's start and first tokens go (goal 6), then the DFlash2 27B shape.
R=/tmp/resC; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/c.tgz" -C "$R" .; }
ts() { local t0; t0=$(date +%s%N); while IFS= read -r l; do echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms: $l"; done; }
c=/tmp/cold-qwen3-4b
i=0
while IFS='|' read -r envs args; do
  i=$((i+1)); stamp "diag $i: $envs $args"; s=$(date +%s%N)
  env -u MLX_PTX_CACHE_DIR XDG_CACHE_HOME="$c" HOME="$c" $envs timeout 60 "$B/dflash-mlx" run --target-model /tmp/r4b/target --prompt "hello world" --ignore-eos --no-chat-template --stats $args 2> >(sed -u 's/\r/\n/g' | ts > "$R/diag_$i.err") > /dev/null
  echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"; sleep 0.3
  grep -E "loading|adaptive|generation|time split|prompt:" "$R/diag_$i.err"
done <<'LIST'
DFLASH_ADAPTIVE_BLOCK=0|--draft-model /tmp/r4b/draft -n 64
DFLASH_ADAPTIVE_BLOCK=0|--draft-model /tmp/r4b/draft -n 512
DFLASH_ADAPTIVE_BLOCK=0|--draft-model /tmp/r4b/draft -n 64
-u DFLASH_X|--no-draft -n 64
-u DFLASH_X|--no-draft -n 512
DFLASH_ADAPTIVE_BLOCK=0 MLX_USE_CUDA_GRAPHS=0|--draft-model /tmp/r4b/draft -n 64
DFLASH_ADAPTIVE_BLOCK=0 DFLASH_KERNELS=off|--draft-model /tmp/r4b/draft -n 64
LIST
pack
stamp "DFlash2 27B, fixed block 8, load timed"
DFLASH_ADAPTIVE_BLOCK=0 timeout 280 "$B/dflash-mlx" bench --random qwen3.8-27b-4bit --dir /tmp/r-27b -n 128 --num-prompts 1 --repeats 1 --warmup 1 --replay-drafts 0.08 --json 2> >(sed -u 's/\r/\n/g' | ts > "$R/dflash2_27b.err") > "$R/dflash2_27b.json"
echo "exit $?"; sleep 0.3; grep -v "ms: *$" "$R/dflash2_27b.err" | tail -5
python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]
print({k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']})
print({k:(round(v,2) if isinstance(v,float) else v) for k,v in x.items() if not isinstance(v,(list,dict))})" "$R/dflash2_27b.json"; pack
stamp done
