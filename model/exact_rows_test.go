package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// In GPU-exact mode (a few-row kernel that serves one-row products) quantized products of
// 2..16 rows go one row at a time: every row equals its one-row product bit for bit, on any
// device. Outside that mode the block goes to MLX's quantized matmul whole, which on a GPU
// may round differently (checked within bf16 steps there).
func TestQuantizedProductRows(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		w := mlxc.Normal([]int{48, 128}, mlxc.BFloat16, 0, 0.2, mlxc.RandomKey(3))
		q := mlxc.Quantize(w, 64, 4, "")
		exact := &SkinnyGEMM{minRows: 1}
		for _, rows := range []int{1, 3, 16, 17} {
			x := mlxc.Normal([]int{rows, 128}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(rows)))
			for _, sk := range []*SkinnyGEMM{nil, exact} {
				got := mlxc.AsType(quantizedProduct(x, q, sk, nil), mlxc.Float32).Float32s()
				for r := 0; r < rows; r++ {
					one := mlxc.AsType(mlxc.QuantizedMatmul(mlxc.SliceAxis(x, 0, r, r+1), q, true), mlxc.Float32).Float32s()
					for j := range one {
						d := math.Abs(float64(got[r*48+j] - one[j]))
						rowwise := rows == 1 || sk != nil && rows <= 16
						if rowwise && d != 0 || d > 0.02*(1+math.Abs(float64(one[j]))) {
							return fmt.Errorf("rows %d, exact %v: row %d col %d = %g, one-row product %g", rows, sk != nil, r, j, got[r*48+j], one[j])
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
