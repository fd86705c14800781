package mlxc

import "testing"

func TestSmokeAdd(t *testing.T) {
	onMLX(t, func() {
		a := f32([]float32{1, 2, 3}, 3)
		b := f32([]float32{10, 20, 30}, 3)
		closeTo(t, "add", Add(a, b).Float32s(), []float32{11, 22, 33}, 0)
		t.Logf("mlx %s headers %s backend %s device %v", Version(), HeaderVersion(), Backend(), CurrentDevice())
	})
}
