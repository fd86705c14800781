package mlxc

import (
	"math"
	"testing"
)

// onMLX runs fn on the MLX thread inside a scope; failures inside fn must use t.Error
// (t.Fatal would end the MLX goroutine). A panicking op fails the test with its message.
func onMLX(t *testing.T, fn func()) {
	t.Helper()
	err := Do(func() error {
		s := NewScope()
		defer s.Close()
		fn()
		return nil
	})
	if err != nil {
		t.Fatalf("mlx: %v", err)
	}
}

func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: len %d, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > tol || math.IsNaN(float64(got[i])) != math.IsNaN(float64(want[i])) {
			t.Errorf("%s[%d] = %g, want %g (tol %g)", what, i, got[i], want[i], tol)
			return
		}
	}
}

func eqShape(t *testing.T, what string, got, want []int) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s shape %v, want %v", what, got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s shape %v, want %v", what, got, want)
			return
		}
	}
}

func f32(data []float32, shape ...int) *Array { return FromSlice(data, shape...) }
