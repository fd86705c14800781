package cli

import (
	"reflect"
	"testing"
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
	if _, _, err := pairShape("qwen3-4b-wide"); err == nil || err.Error() != `unknown shape "qwen3-4b-wide" (demo, tiny, qwen3-4b, qwen3-4b-thin, qwen3-8b)` {
		t.Errorf("unknown shape: error %v", err)
	}
}
