# Call G2 (goal 6, after the compiles-ahead fix): a fresh machine's first run and the second, with compiles ahead and the
# self-checks in processes of their own; the first run again with DFLASH_COMPILE_AHEAD=0.
# A fresh user: own HOME, XDG_CACHE_HOME and MLX PTX folder.
R=/tmp/resG2; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/g2.tgz" -C "$R" .; }
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
[ -f /tmp/r4b/target/config.json ] || { stamp "write qwen3-4b"; write_pair qwen3-4b /tmp/r4b; }
cold qwen3-4b /tmp/r4b ahead 2 NOTHING=1; pack
[ -f /tmp/r35/target/config.json ] || { stamp "write qwen3.5-4b"; write_pair qwen3.5-4b /tmp/r35; }
cold qwen3.5-4b /tmp/r35 ahead 2 NOTHING=1; pack
cold qwen3-4b /tmp/r4b serial 1 DFLASH_COMPILE_AHEAD=0; pack
python3 - "$R" <<'PY'
import json,sys,glob
for f in sorted(glob.glob(sys.argv[1]+"/verdicts_*.json")):
    v=json.load(open(f))["verdicts"]; print(f.split("/")[-1], sorted(round(x["seconds"],1) for x in v.values()))
PY
python3 - <<'PY'
import glob,struct,difflib
def rd(p):
    s=open(p,'rb').read();m=b"dflash-mlx nvrtc cache 1\n";i=len(m)
    n=struct.unpack('<Q',s[i:i+8])[0];k=s[i+8:i+8+n];j=k.index(b"\n")+1
    def u():
        nonlocal j;v=struct.unpack('<Q',k[j:j+8])[0];j+=8;return v
    def b():
        nonlocal j;l=u();v=k[j:j+l];j+=l;return v
    o=[b() for _ in range(u())];nm=[b() for _ in range(u())];src=b();fn=b()
    return src.decode(errors='replace'),fn
by={}
for p in glob.glob('/tmp/cold-*-ahead/dflash-mlx/nvrtc/*.bin'):
    try:src,fn=rd(p)
    except Exception:continue
    if '__global__ void custom_kernel_' in src:by.setdefault(src.split('__global__ void ')[1].split('(')[0],[]).append((src,fn))
dup=[f for f,v in by.items() if len(set(x[0] for x in v))>1]
print('custom kernels',len(by),'with two programs',len(dup))
for f in dup[:2]:
    a,b=by[f][0],by[f][1];print(f,a[1],b[1])
    for l in list(difflib.unified_diff(a[0].splitlines(),b[0].splitlines(),lineterm='',n=1))[:20]:print(l)
PY
stamp done
