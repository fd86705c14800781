package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
)

// qwen3-4b-thin keeps the 4B pair's graph — layers, heads, head size, vocabulary, the
// 5-layer drafter reading the same target layers — and shrinks only the hidden and MLP
// widths; an unknown shape is an error that lists the known ones.
func TestPairShapeThin(t *testing.T) {
	full, fullD, err := pairShape("qwen3-4b")
	if err != nil {
		t.Fatal(err)
	}
	thin, thinD, err := pairShape("qwen3-4b-thin")
	if err != nil {
		t.Fatal(err)
	}
	if thin.Hidden != 256 || thin.Inter != 256 || thinD.Hidden != 256 || thinD.Inter != 256 {
		t.Errorf("thin widths: target %d/%d, drafter %d/%d, want 256/256", thin.Hidden, thin.Inter, thinD.Hidden, thinD.Inter)
	}
	full.Hidden, full.Inter, fullD.Hidden, fullD.Inter = 256, 256, 256, 256
	if !reflect.DeepEqual(thin, full) {
		t.Errorf("thin target %+v differs from the 4B target beyond its widths %+v", thin, full)
	}
	if !reflect.DeepEqual(thinD, fullD) {
		t.Errorf("thin drafter %+v differs from the 4B drafter beyond its widths %+v", thinD, fullD)
	}
	// The 4-bit shape is the 4B target quantized (groups of 64), with the same drafter.
	full, fullD, _ = pairShape("qwen3-4b")
	q4, q4D, err := pairShape("qwen3-4b-4bit")
	if err != nil || q4.QuantBits != 4 || q4.QuantGroup != 64 {
		t.Errorf("qwen3-4b-4bit: %d-bit groups of %d, %v; want 4-bit groups of 64", q4.QuantBits, q4.QuantGroup, err)
	}
	q4.QuantBits, q4.QuantGroup = 0, 0
	if !reflect.DeepEqual(q4, full) || !reflect.DeepEqual(q4D, fullD) {
		t.Errorf("qwen3-4b-4bit %+v differs from the 4B pair beyond its quantization %+v", q4, full)
	}
	// The thin 4-bit shape is the thin pair quantized.
	thin, thinD, _ = pairShape("qwen3-4b-thin")
	t4, t4D, err := pairShape("qwen3-4b-thin-4bit")
	if err != nil || t4.QuantBits != 4 || t4.QuantGroup != 64 {
		t.Errorf("qwen3-4b-thin-4bit: %d-bit groups of %d, %v; want 4-bit groups of 64", t4.QuantBits, t4.QuantGroup, err)
	}
	t4.QuantBits, t4.QuantGroup = 0, 0
	if !reflect.DeepEqual(t4, thin) || !reflect.DeepEqual(t4D, thinD) {
		t.Errorf("qwen3-4b-thin-4bit %+v differs from the thin pair beyond its quantization %+v", t4, thin)
	}
	if _, _, err := pairShape("qwen3-4b-wide"); err == nil || err.Error() != `unknown shape "qwen3-4b-wide" (demo, tiny, tiny-moe, qwen3-4b, qwen3-4b-4bit, qwen3-4b-thin, qwen3-4b-thin-4bit, qwen3-8b, qwen3.5-4b, qwen3.5-4b-thin, qwen3.5-9b, qwen3.5-27b, qwen3.5-27b-4bit, qwen3.5-35b-a3b, qwen3.5-35b-a3b-thin, qwen3.8-27b-4bit, qwen3.8-27b-thin)` {
		t.Errorf("unknown shape: error %v", err)
	}
}

// bench --random qwen3.5-4b-thin runs on the CPU with replayed acceptance and reports the
// rollback (the recurrent layers' restore and tape replay) timed on its own and its share
// of the cycle.
func TestBenchQwen35ThinRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and runs a 32-layer random Qwen3.5 pair")
	}
	tokDir := filepath.Join(reftest.RepoRoot(), "third_party", "testdata", "qwen3")
	if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err != nil {
		reftest.Missing(t, "Qwen3 tokenizer asset "+tokDir)
	}
	t.Setenv("DFLASH_TOKENIZER_DIR", tokDir) // the random pair gets the Qwen3 tokenizer files
	dir := t.TempDir()
	args := []string{"bench", "--random", "qwen3.5-4b-thin", "--dir", dir, "--replay-drafts", "0.3", "-n", "8",
		"--prompt-tokens", "8", "--repeats", "1", "--warmup", "0", "--num-prompts", "1", "-q"}
	out, errOut, code := runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Rows []struct {
			CycleMS    float64 `json:"cycle_ms"`
			RollbackMS float64 `json:"rollback_eval_ms_per_cycle"`
			Share      float64 `json:"rollback_share_of_cycle"`
			Keep       int     `json:"rollback_probe_keep"`
			Tau        float64 `json:"tau"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(r.Rows) != 1 {
		t.Fatalf("rows: %s", out)
	}
	x := r.Rows[0]
	if x.RollbackMS <= 0 || x.Share <= 0 || x.Share >= 1 || x.Keep < 1 || x.Keep > 16 || x.CycleMS <= 0 {
		t.Errorf("rollback split %+v", x)
	}
}

// The Qwen3.5 shapes pair each target with a drafter that fits it (hidden size,
// vocabulary, taps inside its layers), and qwen3.5-4b-thin differs from qwen3.5-4b only in
// its widths.
func TestQwen35Shapes(t *testing.T) {
	for _, shape := range []string{"qwen3.5-4b", "qwen3.5-4b-thin", "qwen3.5-9b", "qwen3.5-27b", "qwen3.5-27b-4bit", "qwen3.5-35b-a3b", "qwen3.5-35b-a3b-thin", "qwen3.8-27b-4bit", "qwen3.8-27b-thin"} {
		tg, d, ok := qwen35Shape(shape)
		if !ok {
			t.Fatalf("%s: not a Qwen3.5 shape", shape)
		}
		if d.Hidden != tg.Hidden || d.Vocab != tg.Vocab || d.NumTargetLayers != tg.Layers || tg.Layers%tg.Interval != 0 {
			t.Errorf("%s: drafter %+v does not fit target %+v", shape, d, tg)
		}
		for _, id := range d.TargetLayerIDs {
			if id < 0 || id >= tg.Layers {
				t.Errorf("%s: tap %d outside %d layers", shape, id, tg.Layers)
			}
		}
	}
	full, fullD, _ := qwen35Shape("qwen3.5-4b")
	thin, thinD, _ := qwen35Shape("qwen3.5-4b-thin")
	full.Hidden, full.Inter, full.LinKeyDim, full.LinValueDim = thin.Hidden, thin.Inter, thin.LinKeyDim, thin.LinValueDim
	fullD.Hidden, fullD.Inter = thinD.Hidden, thinD.Inter
	if !reflect.DeepEqual(thin, full) || !reflect.DeepEqual(thinD, fullD) {
		t.Errorf("thin pair %+v / %+v differs from the 4B beyond its widths", thin, thinD)
	}
	// Qwen3.8-27B's drafter as published: DFlash2, taps counted from 0, block 8 over a
	// window of 2048, the selector's rank and candidates.
	_, q38, _ := qwen35Shape("qwen3.8-27b-4bit")
	if !q38.DFlash2 || !reflect.DeepEqual(q38.TargetLayerIDs, []int{5, 19, 33, 47, 61}) || q38.BlockSize != 8 || q38.SlidingWindow != 2048 ||
		q38.ConvKernel != 2 || q38.ConvGroup != 16 || q38.SelectorRank != 256 || q38.SelectorTopK != 16 || q38.MaskTokenID != qwen35MaskToken {
		t.Errorf("qwen3.8-27b-4bit drafter %+v is not the published DFlash2 shape", q38)
	}
	if _, _, ok := qwen35Shape("qwen3-4b"); ok {
		t.Error("qwen3-4b taken for a Qwen3.5 shape")
	}
}
