package mlxc

import "testing"

// Shapes are read from MLX once per array and cached: Shape hands out a copy, so a caller
// that changes it changes neither the array's later answers nor another caller's slice;
// Dim and Ndim agree with it, for ranks past the 16 the first C call reads.
func TestShapeCacheIsPrivate(t *testing.T) {
	onMLX(t, func() {
		for _, shape := range [][]int{{}, {3}, {2, 3, 4}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2}} {
			a := Zeros(shape, Float32)
			first := a.Shape()
			if len(first) != len(shape) || a.Ndim() != len(shape) {
				t.Fatalf("shape %v: Shape %v, Ndim %d", shape, first, a.Ndim())
			}
			for i := range first {
				if first[i] != shape[i] || a.Dim(i) != shape[i] || a.Dim(i-len(shape)) != shape[i] {
					t.Fatalf("shape %v: Shape %v, Dim(%d) %d", shape, first, i, a.Dim(i))
				}
				first[i] = 99
			}
			again := a.Shape()
			for i := range again {
				if again[i] != shape[i] || a.Dim(i) != shape[i] {
					t.Errorf("shape %v: after a caller changed its copy, Shape %v, Dim(%d) %d", shape, again, i, a.Dim(i))
				}
			}
		}
	})
}
