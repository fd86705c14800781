package cli

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
)

func TestFormatBlockSizes(t *testing.T) {
	if got := formatBlockSizes(map[int]int{16: 30, 4: 2, 8: 5}); got != "16×30 8×5 4×2" {
		t.Errorf("formatBlockSizes = %q", got)
	}
}

// bench on a MoE target: the block adapts by default, every cycle is counted in
// block_sizes, the τ-vs-cost curve has each probed block with its cost and, with
// --block-sweep, a measured run; and the loaded models hold no more than their
// checkpoints' tensors.
func TestBenchMoEBlockCurve(t *testing.T) {
	tokDir := filepath.Join(reftest.RepoRoot(), "third_party", "testdata", "qwen3")
	if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err != nil {
		reftest.Missing(t, "Qwen3 tokenizer asset "+tokDir)
	}
	t.Setenv("DFLASH_TOKENIZER_DIR", tokDir)
	out, errOut, code := runCLI(t, "bench", "--random", "tiny-moe", "--dir", t.TempDir(), "--replay-drafts", "0.3", "-n", "60",
		"--prompt-tokens", "12", "--repeats", "1", "--warmup", "0", "--num-prompts", "1", "--block-sweep", "--json", "-q")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Resident   int64   `json:"resident_bytes"`
		Checkpoint int64   `json:"checkpoint_bytes"`
		Ratio      float64 `json:"resident_over_checkpoint"`
		Rows       []struct {
			Adaptive   bool           `json:"adaptive_block"`
			BlockSizes map[string]int `json:"block_sizes"`
			Curve      []blockPoint   `json:"block_curve"`
			Tau        float64        `json:"tau"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Rows) != 1 {
		t.Fatalf("not one JSON row (%v):\n%s", err, out)
	}
	if r.Checkpoint <= 0 || r.Ratio < 0.98 || r.Ratio > 1.05 {
		t.Errorf("resident %d bytes for checkpoints of %d (%.3f×): want about equal", r.Resident, r.Checkpoint, r.Ratio)
	}
	x := r.Rows[0]
	if !x.Adaptive || len(x.BlockSizes) == 0 {
		t.Errorf("a MoE target's block did not adapt: %+v", x)
	}
	var sizes []int
	for _, p := range x.Curve {
		sizes = append(sizes, p.Block)
		if p.CycleMS <= 0 || p.TPS <= 0 || p.Tau < 1 || p.TauEstimated < 1 || p.TPSEstimated <= 0 {
			t.Errorf("curve point %+v", p)
		}
	}
	if want := engine.ProbeBlockSizes; len(sizes) != len(want) {
		t.Errorf("curve blocks %v, want %v", sizes, want)
	}
	// Replayed drafts are right with probability 0.7 each, whatever the block: the
	// sweep's measured τ follows 1 + Σ 0.7^i within sampling error, and the estimates
	// grow with the block without passing it.
	prev := 0.0
	for _, p := range x.Curve {
		want := 1.0
		for i := 1; i < p.Block; i++ {
			want += math.Pow(0.7, float64(i))
		}
		if math.Abs(p.Tau-want) > 0.4*want {
			t.Errorf("block %d: measured τ %.2f, the replay's %.2f", p.Block, p.Tau, want)
		}
		if p.TauEstimated < prev || p.TauEstimated > float64(p.Block) {
			t.Errorf("block %d: estimated τ %.2f after %.2f", p.Block, p.TauEstimated, prev)
		}
		prev = p.TauEstimated
	}
}
