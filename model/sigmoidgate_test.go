package model

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// The compiled gates give the ops' bits in each activation dtype, with the gate broadcast
// (one value per row, as a MoE block's shared-expert gate) or not (an attention output's),
// and each is one graph node.
func TestSigmoidGatingMatchesOps(t *testing.T) {
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			sg := NewSigmoidGating()
			defer sg.Free()
			key := mlxc.RandomSplit(mlxc.RandomKey(17), 4)
			k := func(i int) *mlxc.Array { return mlxc.Reshape(mlxc.SliceAxis(key, 0, i, i+1), 2) }
			for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16, mlxc.Float32} {
				x := mlxc.AsType(mlxc.Normal([]int{5, 64}, mlxc.Float32, 0, 2, k(0)), dt)
				g := mlxc.AsType(mlxc.Normal([]int{5, 64}, mlxc.Float32, 0, 3, k(1)), dt)
				g1 := mlxc.AsType(mlxc.Normal([]int{5, 1}, mlxc.Float32, 0, 3, k(2)), dt)
				y := mlxc.AsType(mlxc.Normal([]int{5, 64}, mlxc.Float32, 0, 1, k(3)), dt)
				mlxc.Eval(x, g, g1, y)
				for _, c := range []struct {
					what      string
					got, want *mlxc.Array
				}{
					{"gate", sg.Gate(x, g), gateOps(x, g)},
					{"join, a gate per row", sg.Join(y, g1, x), joinOps(y, g1, x)},
					{"join", sg.Join(y, g, x), joinOps(y, g, x)},
				} {
					if n := mlxc.GraphNodes(c.got); n != 1 {
						t.Errorf("%s %s: %d graph nodes, want 1", dt, c.what, n)
					}
					a, b := mlxc.AsType(c.got, mlxc.Float32), mlxc.AsType(c.want, mlxc.Float32)
					mlxc.Eval(a, b)
					av, bv := a.Float32s(), b.Float32s()
					for i := range av {
						if av[i] != bv[i] {
							t.Errorf("%s %s: element %d is %v, the ops give %v", dt, c.what, i, av[i], bv[i])
							break
						}
					}
				}
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
