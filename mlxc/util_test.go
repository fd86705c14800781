package mlxc

import (
	"math"
	"strings"
	"testing"
)

// near reports whether got is within abs + rel·|want| of want (NaN matches only NaN, ±Inf
// only the same infinity).
func near(got, want, abs, rel float64) bool {
	if math.IsNaN(want) || math.IsNaN(got) {
		return math.IsNaN(want) && math.IsNaN(got)
	}
	if math.IsInf(want, 0) || math.IsInf(got, 0) {
		return got == want
	}
	return math.Abs(got-want) <= abs+rel*math.Abs(want)
}

// nearAll compares float32 results against float64 references.
func nearAll(t *testing.T, what string, got []float32, want []float64, abs, rel float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: len %d, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if !near(float64(got[i]), want[i], abs, rel) {
			t.Errorf("%s[%d] = %.9g, want %.9g (abs %g, rel %g)", what, i, got[i], want[i], abs, rel)
			return
		}
	}
}

func eqSlice[T comparable](t *testing.T, what string, got, want []T) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s = %v, want %v (first difference at %d)", what, got, want, i)
			return
		}
	}
}

// wantErr runs fn (on the MLX thread) and checks that it fails with an *Error whose text
// contains sub.
func wantErr(t *testing.T, what, sub string, fn func()) {
	t.Helper()
	err := Catch(fn)
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	if _, ok := err.(*Error); !ok {
		t.Errorf("%s: error %T %v, want *Error", what, err, err)
	}
	if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(sub)) {
		t.Errorf("%s: error %q does not mention %q", what, err, sub)
	}
}

func i32(data []int32, shape ...int) *Array { return FromSlice(data, shape...) }

// seq returns 0, 1, ..., n-1 as float32.
func seq(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(i)
	}
	return out
}

func to64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// lcg is a tiny deterministic generator for test data (independent of MLX's PRNG).
type lcg uint64

func (g *lcg) next() uint64 {
	*g = *g*6364136223846793005 + 1442695040888963407
	return uint64(*g)
}

func (g *lcg) u32() uint32 { return uint32(g.next() >> 32) }

// float returns a value uniform in [lo, hi).
func (g *lcg) float(lo, hi float64) float64 {
	return lo + (hi-lo)*float64(g.next()>>11)/(1<<53)
}

func (g *lcg) floats(n int, lo, hi float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(g.float(lo, hi))
	}
	return out
}
