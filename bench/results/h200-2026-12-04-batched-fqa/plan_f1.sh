# Call F1: batched speculation after the few-query change, side by side with the behaviour
# before it (MLX attention at exact key lengths), Qwen3-4B shape, then the Qwen3.5-4B shape.
R=/tmp/resF1; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/f1.tgz" -C "$R" .; }
conc() { # $1 name, $2 shape, $3 dir, $4 seconds, rest: env
  name=$1 shape=$2 dir=$3 lim=$4; shift 4
  stamp "$name $shape ($*)"
  env "$@" timeout "$lim" "$B/dflash-mlx" bench --random "$shape" --dir "$dir" --replay-drafts 0.14 \
    --concurrency 1,2,4,8,16 --requests-per-client 2 -n 128 --warmup 1 \
    > "$R/conc_${shape}_$name.txt" 2> "$R/conc_${shape}_$name.err"
  echo "exit $?"; grep -A8 "^clients" "$R/conc_${shape}_$name.txt"; grep -A6 "built during" "$R/conc_${shape}_$name.txt"; pack
}
"$B/dflash-mlx" version
conc fqa qwen3-4b /tmp/r4b 200 DFLASH_BATCH_FQA=1
conc before qwen3-4b /tmp/r4b 170 DFLASH_BATCH_FQA=0 DFLASH_KV_BUCKET=0
conc fqa qwen3.5-4b /tmp/r35 190 DFLASH_BATCH_FQA=1
stamp done
