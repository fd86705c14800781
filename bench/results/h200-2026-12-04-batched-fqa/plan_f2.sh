# Call F2: the Qwen3-4B batched-speculation table with the few-query change to 16 clients,
# then a Go CPU profile of the Qwen3.5-4B shape at 8 clients (where batched speculation
# trails plain batching).
R=/tmp/resF2; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/f2.tgz" -C "$R" .; }
"$B/dflash-mlx" version
stamp "qwen3-4b fqa"
timeout 330 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b --replay-drafts 0.14 \
  --concurrency 1,2,4,8,16 --requests-per-client 2 -n 128 --warmup 1 > "$R/conc_qwen3-4b_fqa.txt" 2> "$R/conc_qwen3-4b_fqa.err"
echo "exit $?"; pack
stamp "qwen3.5-4b 8 clients, profiled"
DFLASH_CPUPROFILE="$R/q35_c8.prof" timeout 200 "$B/dflash-mlx" bench --random qwen3.5-4b --dir /tmp/r35 --replay-drafts 0.14 \
  --concurrency 8 --requests-per-client 2 -n 128 --warmup 1 > "$R/conc_qwen3.5-4b_c8.txt" 2> "$R/conc_qwen3.5-4b_c8.err"
echo "exit $?"; pack
stamp done
