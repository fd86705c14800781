# Call F3: batched speculation with every drafting row at the full block
# (DFLASH_ADAPTIVE_BLOCK=0), both 4B shapes, against the policy's widths (F1/F2).
R=/tmp/resF3; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/f3.tgz" -C "$R" .; }
"$B/dflash-mlx" version
for s in qwen3-4b:/tmp/r4b qwen3.5-4b:/tmp/r35; do
  shape=${s%%:*} dir=${s#*:}
  stamp "$shape fixed block"
  DFLASH_ADAPTIVE_BLOCK=0 timeout 250 "$B/dflash-mlx" bench --random "$shape" --dir "$dir" --replay-drafts 0.14 \
    --concurrency 1,2,4,8,16 --requests-per-client 2 -n 128 --warmup 1 > "$R/conc_${shape}_fixed.txt" 2> "$R/conc_${shape}_fixed.err"
  echo "exit $?"; pack
done
stamp done
