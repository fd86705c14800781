# Call F5 (goal 1, after the padded DFlash2 window keys): the Qwen3.8-27B 4-bit shape with a random DFlash2 drafter, replayed
# acceptance (error rate 0.08: τ ≈ 6 at the drafter's block of 8), the width the policy
# chooses; plain and DFlash alternating in one process.
R=/tmp/resF5; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/f5.tgz" -C "$R" .; }
"$B/dflash-mlx" version
stamp "qwen3.8-27b-4bit"
timeout 390 "$B/dflash-mlx" bench --random qwen3.8-27b-4bit --dir /tmp/r38 --replay-drafts 0.08 -n 128 --repeats 1 --warmup 1 --num-prompts 2 \
  > "$R/qwen3.8-27b-4bit.txt" 2> "$R/qwen3.8-27b-4bit.err"
echo "exit $?"; tail -25 "$R/qwen3.8-27b-4bit.txt"; tail -5 "$R/qwen3.8-27b-4bit.err"; pack
stamp done
