package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// rowArgmaxLogits builds R rows of V logits with planted cases in the first rows: row 0 a
// maximum at two indices (the first must win), row 1 its maximum at the last index, row 2
// all −inf (index 0, as MLX's ArgMax), row 3 NaNs around a maximum (MLX's ArgMax takes
// the first NaN), row 5 a NaN after the maximum, row 4 values in [0, 1)
// with two near-maxima that the log-probabilities' rounding merges (for large V: the
// logsumexp is ≈ ln V above them), so that its argmax with the subtraction is the first of
// them and without it the second. Every value is exact in bfloat16.
func rowArgmaxLogits(R, V int, rng *rand.Rand) []float32 {
	x := make([]float32, R*V)
	for i := range x {
		x[i] = float32(math.Round(rng.NormFloat64()*4*64) / 64)
	}
	row := func(r int) []float32 { return x[r*V : (r+1)*V] }
	if R > 0 && V > 3 {
		m := row(0)
		m[1], m[V-2] = 40, 40
	}
	if R > 1 {
		row(1)[V-1] = 41
	}
	if R > 2 {
		for i := range row(2) {
			row(2)[i] = float32(math.Inf(-1))
		}
	}
	if R > 3 && V > 8 {
		m := row(3)
		m[0], m[5], m[V-1] = float32(math.NaN()), 42, float32(math.NaN())
	}
	if R > 5 && V > 12 {
		m := row(5)
		m[2], m[9], m[V-1] = 50, float32(math.NaN()), float32(math.NaN())
	}
	if R > 4 && V > 30 {
		m := row(4)
		for i := range m {
			m[i] = float32(rng.IntN(64)) / 64
		}
		m[10], m[20] = 1, 1+1.0/128
	}
	return x
}

// TestRowArgmaxMatchesOps checks RowArgmax against the MLX ops it replaces, on a GPU (the
// CUDA kernels or their Metal twins): Of without and with the logsumexp (Argmax of the
// logits, of Subtract(logits, lse)), the drafts' matches (Equal), and Leading against the
// first false match.
func TestRowArgmaxMatchesOps(t *testing.T) {
	onKernelGPU(t, func() error {
		k := NewRowArgmax(settings.Default().Kernels)
		if k == nil {
			return fmt.Errorf("NewRowArgmax: nil on a GPU with custom kernels")
		}
		defer k.Free()
		s := mlxc.NewScope()
		defer s.Close()
		rng := rand.New(rand.NewPCG(7, 11))
		merged := false
		var errs []error // all mismatches, not just the first: one GPU run tells everything
		fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16, mlxc.Float32} {
			for _, sh := range [][2]int{{16, 151936}, {15, 151936}, {5, 151936}, {1, 151936}, {6, 4099}, {5, 1000}, {3, 7}, {2, 1}} {
				R, V := sh[0], sh[1]
				host := rowArgmaxLogits(R, V, rng)
				logits := mlxc.AsType(mlxc.FromSlice(host, R, V), dt)
				if !k.Fits(logits) {
					fail("%v %v: does not fit", dt, sh)
					continue
				}
				lse := mlxc.LogSumExp(logits, []int{-1}, true)
				// Drafts: the rows' own argmax for the first half, off by one after.
				want := mlxc.ToSlice[int32](mlxc.AsType(mlxc.Argmax(mlxc.Subtract(logits, lse), -1, false), mlxc.Int32))
				drafts := make([]int32, R-1)
				for i := range drafts {
					drafts[i] = want[i]
					if i >= len(drafts)/2 {
						drafts[i] = (want[i] + 1) % int32(V)
					}
				}
				var dd *mlxc.Array
				if len(drafts) > 0 {
					dd = mlxc.FromSlice(drafts, len(drafts))
				}
				raw, none := k.Of(logits, nil, nil)
				sub, match := k.Of(logits, lse, dd)
				if none != nil {
					fail("%v %v: matches without drafts", dt, sh)
				}
				if got, ref := mlxc.ToSlice[int32](raw), mlxc.ToSlice[int32](mlxc.AsType(mlxc.Argmax(logits, -1, false), mlxc.Int32)); !slices.Equal(got, ref) {
					fail("%v %v: argmax %v, MLX %v", dt, sh, got, ref)
				}
				got := mlxc.ToSlice[int32](sub)
				if !slices.Equal(got, want) {
					fail("%v %v: argmax of logits − lse %v, MLX %v", dt, sh, got, want)
				}
				if dt == mlxc.BFloat16 && R > 4 && V == 151936 {
					// The planted near-maxima: merged by the rounding, so the first wins.
					if got[4] != 10 || mlxc.ToSlice[int32](raw)[4] != 20 {
						fail("%v %v: row 4 argmax %d (raw %d), want 10 (raw 20)", dt, sh, got[4], mlxc.ToSlice[int32](raw)[4])
					}
					merged = true
				}
				if dd == nil {
					if match != nil {
						fail("%v %v: matches without drafts", dt, sh)
					}
					continue
				}
				ref := mlxc.ToSlice[bool](mlxc.Equal(mlxc.SliceAxis(mlxc.FromSlice(want, R), 0, 0, R-1), dd))
				if gm := mlxc.ToSlice[bool](match); !slices.Equal(gm, ref) {
					fail("%v %v: matches %v, want %v", dt, sh, gm, ref)
				}
			}
		}
		if !merged {
			fail("no row exercised the merging rounding")
		}
		// Leading: every position of the first false, and none.
		next := []int32{5, 6, 7, 8, 9}
		for first := 0; first <= 4; first++ {
			m := make([]bool, 4)
			for i := range m {
				m[i] = i != first
			}
			acc, tok := k.Leading(mlxc.FromSlice(next, 5), mlxc.FromSlice(m, 4))
			a, tk := mlxc.ToSlice[int32](acc), mlxc.ToSlice[int32](tok)
			if len(a) != 1 || len(tk) != 1 || int(a[0]) != first || tk[0] != next[first] {
				fail("Leading(%v): %v %v, want [%d] [%d]", m, a, tk, first, next[first])
			}
		}
		return errors.Join(errs...)
	})
}
