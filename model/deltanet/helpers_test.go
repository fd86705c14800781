package deltanet

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// rng hands out independent random keys in a fixed order.
type rng struct{ key *mlxc.Array }

func newRNG(seed uint64) *rng { return &rng{key: mlxc.RandomKey(seed)} }

func (r *rng) next() *mlxc.Array {
	ks := mlxc.RandomSplit(r.key, 2)
	r.key = mlxc.Squeeze(mlxc.SliceAxis(ks, 0, 0, 1), 0)
	return mlxc.Squeeze(mlxc.SliceAxis(ks, 0, 1, 2), 0)
}

// normal is N(0, scale²) rounded to dt.
func (r *rng) normal(dt mlxc.Dtype, scale float32, shape ...int) *mlxc.Array {
	x := mlxc.AsType(mlxc.Normal(shape, mlxc.Float32, 0, scale, r.next()), dt)
	mlxc.Eval(x)
	return x
}

// uniform is U(lo, hi) in float32.
func (r *rng) uniform(lo, hi float64, shape ...int) *mlxc.Array {
	x := mlxc.Uniform(lo, hi, shape, mlxc.Float32, r.next())
	mlxc.Eval(x)
	return x
}

// diff describes how got differs from want, "" when they have the same dtype, shape and
// bits.
func diff(got, want *mlxc.Array) string {
	if got == nil || want == nil {
		if got == want {
			return ""
		}
		return fmt.Sprintf("one is nil (got %v, want %v)", got != nil, want != nil)
	}
	if got.Dtype() != want.Dtype() || !slices.Equal(got.Shape(), want.Shape()) {
		return fmt.Sprintf("got %v %v, want %v %v", got.Dtype(), got.Shape(), want.Dtype(), want.Shape())
	}
	if bytes.Equal(got.Bytes(), want.Bytes()) {
		return ""
	}
	g := mlxc.AsType(got, mlxc.Float32).Float32s()
	w := mlxc.AsType(want, mlxc.Float32).Float32s()
	worst, at, n := 0.0, 0, 0
	for i := range g {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			n++
			if d := math.Abs(float64(g[i] - w[i])); d >= worst {
				worst, at = d, i
			}
		}
	}
	return fmt.Sprintf("%d of %d elements differ, max |Δ| %g at %d (%g vs %g)", n, len(g), worst, at, g[at], w[at])
}

// same fails the test when got and want differ in any bit.
func same(t *testing.T, what string, got, want *mlxc.Array) {
	t.Helper()
	if d := diff(got, want); d != "" {
		t.Errorf("%s: %s", what, d)
	}
}

// do runs fn on the MLX thread inside a scope and fails the test on an MLX error.
func do(t *testing.T, fn func()) {
	t.Helper()
	if err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			fn()
		})
	}); err != nil {
		t.Fatal(err)
	}
}

// rows returns rows [from, to) of x [B, T, …] along time.
func rows(x *mlxc.Array, from, to int) *mlxc.Array { return mlxc.SliceAxis(x, 1, from, to) }
