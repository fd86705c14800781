# Call E1: a fresh user's first and second run with the compiled-kernel cache (goal 6),
# then long context default vs the tensor-core pass 1 (goal 3).
R=/tmp/resE; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/e.tgz" -C "$R" .; }
ts() { local t0; t0=$(date +%s%N); while IFS= read -r l; do echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms: $l"; done; }
write_pair() {
  rm -f /tmp/w.err; "$B/dflash-mlx" bench --random "$1" --dir "$2" -n 8 --num-prompts 1 --repeats 1 --warmup 0 > /dev/null 2> /tmp/w.err & local pid=$!
  for i in $(seq 240); do grep -q "^wrote random" /tmp/w.err && break; sleep 0.5; done; kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep "^wrote" /tmp/w.err; }
cold() {
  local c=/tmp/cold-$1; rm -rf "$c"; mkdir -p "$c"
  for k in 1 2 3; do
    stamp "$1 run $k"
    s=$(date +%s%N)
    env -u MLX_PTX_CACHE_DIR XDG_CACHE_HOME="$c" HOME="$c" timeout 200 "$B/dflash-mlx" run --target-model "$2/target" --draft-model "$2/draft" --prompt "hello world" -n 64 --ignore-eos --no-chat-template --stats 2> >(sed -u 's/\r/\n/g' | ts > "$R/cold_$1_$k.err") > "$R/cold_$1_$k.out"
    echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"; sleep 0.5
    grep -v "^[0-9]* ms: *$" "$R/cold_$1_$k.err" | grep -E "loading|kernel|probe|time split|prompt:|generation|error|compiled" | tail -12
  done; ls "$c/dflash-mlx" 2>/dev/null; ls "$c/dflash-mlx/nvrtc" 2>/dev/null | wc -l; du -sh "$c/dflash-mlx/nvrtc" 2>/dev/null; }
stamp "write qwen3-4b"; write_pair qwen3-4b /tmp/r4b
cold qwen3-4b /tmp/r4b; pack
stamp "write qwen3.5-4b"; write_pair qwen3.5-4b /tmp/r-qwen3.5-4b
cold qwen3.5-4b /tmp/r-qwen3.5-4b; pack
stamp "doctor"; timeout 60 "$B/dflash-mlx" doctor --json > "$R/doctor.json" 2> "$R/doctor.err"; python3 -c "import json;r=json.load(open('$R/doctor.json'));print(r['compile_cache'], r['problems'])"
ctx() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))
for x in r['points']:
  print({k:(round(v,1) if isinstance(v,float) else v) for k,v in x.items() if not isinstance(v,(list,dict))})" "$1"; }
for v in "DFLASH_SPLIT_KEYS_MMA=1" "-"; do
  stamp "long context, ${v}"; w="$v"; [ "$v" = - ] && w=""
  env $w timeout 200 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b --context 1k,8k,32k -n 256 --repeats 2 --replay-drafts 0.14 --json > "$R/ctx_${v//=/_}.json" 2> "$R/ctx_${v//=/_}.err"
  echo "exit $?"; ctx "$R/ctx_${v//=/_}.json" || tail -3 "$R/ctx_${v//=/_}.err"; pack
done
stamp done
