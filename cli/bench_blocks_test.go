package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
)

func TestFormatBlockSizes(t *testing.T) {
	if got := formatBlockSizes(map[int]int{16: 30, 4: 2, 8: 5}); got != "16×30 8×5 4×2" {
		t.Errorf("formatBlockSizes = %q", got)
	}
}

// bench on a MoE target with the block pinned (the curve's estimates read the table's
// per-position acceptance, which one-token steps would leave empty on a CPU): every cycle
// is counted in block_sizes, the τ-vs-cost curve has each probed block with its cost and,
// with --block-sweep, a measured run; and the loaded models hold no more than their
// checkpoints' tensors.
func TestBenchMoEBlockCurve(t *testing.T) {
	t.Setenv("DFLASH_ADAPTIVE_BLOCK", "0")
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
	if x.Adaptive || x.BlockSizes["16"] == 0 {
		t.Errorf("a pinned block adapted: %+v", x)
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

// bench --compare-widths: plain, the adaptive block and each fixed block up to
// --block-size in one report, every greedy run exact, each DFlash row's cycles counted by
// block (a fixed row's at its block but where the token budget cuts the last ones); a
// width outside the drafter's block is refused.
func TestBenchCompareWidths(t *testing.T) {
	tokDir := filepath.Join(reftest.RepoRoot(), "third_party", "testdata", "qwen3")
	if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err != nil {
		reftest.Missing(t, "Qwen3 tokenizer asset "+tokDir)
	}
	t.Setenv("DFLASH_TOKENIZER_DIR", tokDir)
	dir := t.TempDir()
	args := []string{"bench", "--random", "tiny", "--dir", dir, "-n", "12", "--prompt-tokens", "8", "--repeats", "2",
		"--warmup", "0", "--num-prompts", "1", "--block-size", "4", "--compare-widths", "--json", "-q"}
	out, errOut, code := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Costs struct {
			Sizes []int `json:"sizes"`
		} `json:"block_costs"`
		Rows []struct {
			Mode       string         `json:"mode"`
			Block      int            `json:"block"`
			TPS        float64        `json:"tok_s"`
			Runs       []float64      `json:"runs_tok_s"`
			Tau        float64        `json:"tau"`
			Exact      *bool          `json:"exact"`
			BlockSizes map[string]int `json:"block_sizes"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	var modes []string
	for _, x := range r.Rows {
		modes = append(modes, fmt.Sprintf("%s%d", x.Mode, x.Block))
		if x.TPS <= 0 || len(x.Runs) != 2 {
			t.Errorf("%s %d: %.1f tok/s from runs %v", x.Mode, x.Block, x.TPS, x.Runs)
		}
		if x.Mode == "plain" {
			continue
		}
		if x.Exact == nil || !*x.Exact || x.Tau < 1 {
			t.Errorf("%s %d: exact %v, τ %.2f", x.Mode, x.Block, x.Exact, x.Tau)
		}
		cycles := 0
		for b, k := range x.BlockSizes {
			cycles += k
			// A fixed block is cut only by the token budget, at the end.
			if n, _ := strconv.Atoi(b); x.Mode == "fixed" && (n > x.Block || n < x.Block && k > 2) {
				t.Errorf("fixed %d ran %d cycles of block %s", x.Block, k, b)
			}
		}
		// 12 tokens a run: the first from the prompt, then at least 1 a cycle.
		if cycles < 2 || cycles > 2*11 {
			t.Errorf("%s %d: %d cycles over 2 runs (%v)", x.Mode, x.Block, cycles, x.BlockSizes)
		}
	}
	// --block-size 4 caps the probe and the fixed widths.
	if got := strings.Join(modes, " "); got != "plain0 adaptive0 fixed2 fixed3 fixed4" {
		t.Errorf("modes %q, want plain, adaptive, fixed 2, 3, 4", got)
	}
	if fmt.Sprint(r.Costs.Sizes) != "[1 2 3 4]" {
		t.Errorf("probed sizes %v, want [1 2 3 4]", r.Costs.Sizes)
	}
	if _, errOut, code := runCLI(t, append(args[:len(args)-2], "--widths", "32", "-q")...); code != 2 || !strings.Contains(errOut, "--widths: 32") {
		t.Errorf("--widths 32: exit %d, %s", code, errOut)
	}
}
