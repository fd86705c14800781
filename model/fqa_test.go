package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// On CUDA: causal blocks (verify) and full blocks (drafts), GQA, a key count that is not a
// multiple of the 32-key tile, queries given as a transposed view and keys as a view into a
// larger cache buffer, all against MLX's attention.
func TestFewQueryAttentionMatchesSDPA(t *testing.T) {
	onCUDA(t, func() error {
		a := newFewQueryAttention()
		defer a.Free()
		for _, c := range []struct{ H, Hkv, L, n, D int }{
			{4, 4, 2, 2, 32}, {32, 8, 16, 16, 128}, {32, 8, 16, 100, 128}, {32, 8, 7, 1000, 128}, {16, 2, 16, 4099, 64},
		} {
			for _, causal := range []bool{true, false} {
				s := mlxc.NewScope()
				D := c.D
				scale := float32(1 / math.Sqrt(float64(D)))
				// q as [1, L, H, D] transposed to [1, H, L, D], like the model's.
				q := mlxc.Transpose(mlxc.Normal([]int{1, c.L, c.H, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(c.n))), 0, 2, 1, 3)
				buf := mlxc.Normal([]int{1, c.Hkv, c.n + 300, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(c.n+1)))
				vbuf := mlxc.Normal([]int{1, c.Hkv, c.n + 300, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(c.n+2)))
				mlxc.Eval(q, buf, vbuf)
				k, v := mlxc.SliceAxis(buf, 2, 0, c.n), mlxc.SliceAxis(vbuf, 2, 0, c.n)
				visible := c.n
				if causal {
					visible = c.n - c.L // the block is the last L keys
				}
				sa := mlxc.Scalar(float64(scale), mlxc.Float32)
				got := mlxc.Reshape(a.Apply(q, k, v, sa, Visible(visible), causal), 1, c.L, -1, q.Dim(3)) // [1, L, H, D]
				mode := mlxc.MaskNone
				if causal {
					mode = mlxc.MaskCausal
				}
				want := mlxc.Transpose(mlxc.ScaledDotProductAttention(q, k, v, scale, mode, nil, nil), 0, 2, 1, 3)
				if causal && c.L > 1 {
					// GPU-exact mode: each row of the block equals a one-query call at its
					// position (the decode step there), bit for bit.
					a.minQueries = 1
					for i := 0; i < c.L; i += max(1, c.L/3) {
						one := mlxc.Reshape(a.Apply(mlxc.SliceAxis(q, 2, i, i+1), k, v, sa, Visible(visible+i), true), 1, 1, -1, q.Dim(3))
						if err := sameBits(fmt.Sprintf("%+v row %d alone", c, i), one, mlxc.SliceAxis(got, 1, i, i+1)); err != nil {
							s.Close()
							return err
						}
					}
					a.minQueries = 2
				}
				g, w := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
				s.Close()
				for i := range w {
					if d := math.Abs(float64(g[i] - w[i])); d > 0.02+0.02*math.Abs(float64(w[i])) || math.IsNaN(float64(g[i])) {
						return fmt.Errorf("%+v causal %v: out[%d] = %g, want %g", c, causal, i, g[i], w[i])
					}
				}
			}
		}
		return nil
	})
}
