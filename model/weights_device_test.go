package model

import (
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// TestMoveToDeviceKeepsBits: moveToDevice replaces each tensor by a copy with the same
// bits (bf16 including -0 and ±Inf, float32, packed uint32 of quantized weights), and the
// originals are released (the map holds only the copies).
func TestMoveToDeviceKeepsBits(t *testing.T) {
	err := mlxc.Do(func() error {
		f := []float32{1.5, -0.0, float32(math.Inf(1)), float32(math.Inf(-1)), 3e-39, -7.25}
		u := []uint32{0, 1, 0xffffffff, 0x80000000, 12345}
		w := &Weights{Arrays: map[string]*mlxc.Array{
			"bf16": mlxc.AsType(mlxc.FromSlice(f, len(f)), mlxc.BFloat16).Detach(),
			"f32":  mlxc.FromSlice(f, len(f)).Detach(),
			"u32":  mlxc.FromSlice(u, len(u)).Detach(),
		}}
		defer w.Free()
		want := map[string][]uint32{}
		bits := func(a *mlxc.Array) []uint32 {
			s := mlxc.NewScope()
			defer s.Close()
			if a.Dtype() == mlxc.BFloat16 {
				a = mlxc.AsType(mlxc.View(a, mlxc.Uint16), mlxc.Uint32)
			} else if a.Dtype() == mlxc.Float32 {
				a = mlxc.View(a, mlxc.Uint32)
			}
			return mlxc.ToSlice[uint32](a)
		}
		for n, a := range w.Arrays {
			want[n] = bits(a)
		}
		before, dtypes := map[string]*mlxc.Array{}, map[string]mlxc.Dtype{}
		for n, a := range w.Arrays {
			before[n], dtypes[n] = a, a.Dtype()
		}
		if err := w.moveToDevice(); err != nil {
			t.Fatal(err)
		}
		for n, a := range w.Arrays {
			if a == before[n] {
				t.Errorf("%s: not replaced", n)
			}
			if a.Dtype() != dtypes[n] {
				t.Errorf("%s: dtype %v, want %v", n, a.Dtype(), dtypes[n])
			}
			got := bits(a)
			for i := range got {
				if got[i] != want[n][i] {
					t.Errorf("%s[%d]: bits %#x, want %#x", n, i, got[i], want[n][i])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
