package modelgen

import (
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Quantizing a stack in slices gives the packed weights, scales and biases of quantizing
// it whole, bit for bit (each row is quantized on its own).
func TestQuantizeInSlicesMatchesWhole(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		a := mlxc.AsType(mlxc.Normal([]int{7, 32, 128}, mlxc.Float32, 0, 1, mlxc.RandomKey(3)), mlxc.BFloat16)
		whole := mlxc.Quantize(a, 64, 4, "affine")
		for _, limit := range []int{32 * 128, 3 * 32 * 128, 1 << 20, 1000} {
			part := quantizeInSlicesOf(a, 64, 4, limit)
			if limit == 1000 { // a matrix in slices of a few rows
				part = quantizeInSlicesOf(mlxc.Reshape(a, 7*32, 128), 64, 4, limit)
				part.W, part.Scales, part.Biases = mlxc.Reshape(part.W, 7, 32, -1), mlxc.Reshape(part.Scales, 7, 32, -1), mlxc.Reshape(part.Biases, 7, 32, -1)
			}
			if !slices.Equal(mlxc.ToSlice[uint32](part.W), mlxc.ToSlice[uint32](whole.W)) ||
				!slices.Equal(mlxc.AsType(part.Scales, mlxc.Float32).Float32s(), mlxc.AsType(whole.Scales, mlxc.Float32).Float32s()) ||
				!slices.Equal(mlxc.AsType(part.Biases, mlxc.Float32).Float32s(), mlxc.AsType(whole.Biases, mlxc.Float32).Float32s()) {
				t.Errorf("slices of %d elements: differ from the whole", limit)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
