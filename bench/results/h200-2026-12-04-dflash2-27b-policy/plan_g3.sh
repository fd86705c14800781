# Call G3 (goal 1): the Qwen3.8-27B 4-bit shape with a random DFlash2 drafter, replayed
# acceptance (error rate 0.08: τ ≈ 6 at the drafter's block of 8), the width the policy
# chooses (its costs no longer raised to the largest before them); plain and DFlash
# alternating in one process.
R=/tmp/resG3; mkdir -p "$R"; T0=$(date +%s)
stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf "$OUT/g3.tgz" -C "$R" .; }
"$B/dflash-mlx" version
stamp "qwen3.8-27b-4bit"
timeout 540 "$B/dflash-mlx" bench --random qwen3.8-27b-4bit --dir /tmp/r38 --replay-drafts 0.08 -n 128 --repeats 1 --warmup 1 --num-prompts 2 \
  > "$R/qwen3.8-27b-4bit.txt" 2> "$R/qwen3.8-27b-4bit.err"
echo "exit $?"; tail -30 "$R/qwen3.8-27b-4bit.txt"; grep -v "^\s*$" "$R/qwen3.8-27b-4bit.err" | tail -8; pack
stamp done
