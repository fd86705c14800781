package modelgen

import (
	"fmt"
	"testing"
)

// A Qwen3.5 target's drafter taps the layers z-lab's drafters tap (evenly from 1 to N−3)
// and takes the target's hidden size and vocabulary; a short target still gets taps
// inside its layers.
func TestDrafterForQwen35(t *testing.T) {
	for _, c := range []struct {
		layers, n int
		want      string
	}{{64, 5, "[1 16 31 46 61]"}, {32, 5, "[1 8 15 22 29]"}, {6, 3, "[1 2 3]"}, {3, 2, "[0 2]"}, {32, 1, "[16]"}} {
		s := TinyQwen35()
		s.Layers = c.layers
		d := DrafterForQwen35(s, c.n)
		if got := fmt.Sprint(d.TargetLayerIDs); got != c.want {
			t.Errorf("%d target layers, %d taps: %s, want %s", c.layers, c.n, got, c.want)
		}
		if d.Hidden != s.Hidden || d.Vocab != s.Vocab || d.NumTargetLayers != c.layers || d.Layers != c.n {
			t.Errorf("drafter %+v does not fit the target %+v", d, s)
		}
	}
}
