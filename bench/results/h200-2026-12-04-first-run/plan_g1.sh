# Call G1 (goal 6): a fresh machine's first run and the second, with compiles ahead and the
# self-checks in processes of their own; the first run again with DFLASH_COMPILE_AHEAD=0.
# A fresh user: own HOME, XDG_CACHE_HOME and MLX PTX folder.
R=/tmp/resG1; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/g1.tgz" -C "$R" .; }
ts() { local t0; t0=$(date +%s%N); while IFS= read -r l; do echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms: $l"; done; }
write_pair() {
  rm -f /tmp/w.err; "$B/dflash-mlx" bench --random "$1" --dir "$2" -n 8 --num-prompts 1 --repeats 1 --warmup 0 > /dev/null 2> /tmp/w.err & local pid=$!
  for i in $(seq 240); do grep -q "^wrote random" /tmp/w.err && break; sleep 0.5; done; kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep "^wrote" /tmp/w.err; }
cold() { # shape dir tag runs env...
  local shape=$1 dir=$2 tag=$3 runs=$4; shift 4
  local c=/tmp/cold-$shape-$tag; rm -rf "$c"; mkdir -p "$c/ptx"
  for k in $(seq $runs); do
    stamp "$shape $tag run $k"
    s=$(date +%s%N)
    env "$@" XDG_CACHE_HOME="$c" HOME="$c" MLX_PTX_CACHE_DIR="$c/ptx" timeout 230 "$B/dflash-mlx" run --target-model "$dir/target" --draft-model "$dir/draft" --prompt "hello world" -n 64 --ignore-eos --no-chat-template --stats 2> >(sed -u 's/\r/\n/g' | ts > "$R/cold_${shape}_${tag}_$k.err") > "$R/cold_${shape}_${tag}_$k.out"
    echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"; sleep 0.5
    grep -v "^[0-9]* ms: *$" "$R/cold_${shape}_${tag}_$k.err" | grep -E "first use|checks done|loading|kernel|ahead|probe|block size|time split|prompt:|generation|error|warning" | tail -14
  done
  cp "$c/dflash-mlx/kernel-verdicts.json" "$R/verdicts_${shape}_${tag}.json" 2>/dev/null
  ls "$c/dflash-mlx/nvrtc" 2>/dev/null | wc -l; du -sh "$c/dflash-mlx/nvrtc" "$c/ptx" 2>/dev/null; }
"$B/dflash-mlx" version
stamp "write qwen3-4b"; write_pair qwen3-4b /tmp/r4b
cold qwen3-4b /tmp/r4b ahead 2 NOTHING=1; pack
stamp "write qwen3.5-4b"; write_pair qwen3.5-4b /tmp/r35
cold qwen3.5-4b /tmp/r35 ahead 2 NOTHING=1; pack
cold qwen3-4b /tmp/r4b serial 1 DFLASH_COMPILE_AHEAD=0; pack
python3 - "$R" <<'PY'
import json,sys,glob
for f in sorted(glob.glob(sys.argv[1]+"/verdicts_*.json")):
    v=json.load(open(f))["verdicts"]; print(f.split("/")[-1], sorted(round(x["seconds"],1) for x in v.values()))
PY
stamp done
