package model

import (
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// KVCache.Window grows the buffers in kvStep rows to hold a window, keeping every row they
// held (rows past the offset too: an unread block's), and returns the same buffers while
// they are large enough: what an in-place write (Fused.HeadPrepInto, through InPlace) needs.
func TestKVCacheWindow(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		c := &KVCache{}
		defer c.Free()
		shape := []int{1, 2, 3, 4}
		k, _ := c.Window(300, shape, shape, mlxc.Float32)
		if got := k.Shape(); got[2] != 512 || got[1] != 2 || got[3] != 4 {
			t.Errorf("window 300: buffer %v, want [1 2 512 4]", got)
		}
		rows := mlxc.Add(mlxc.Zeros(shape, mlxc.Float32), mlxc.Scalar(7, mlxc.Float32))
		c.Append(rows, rows)
		c.Trim(3) // rows past the offset must survive growth
		k, v := c.Window(600, shape, shape, mlxc.Float32)
		if got := k.Shape(); got[2] != 768 {
			t.Errorf("window 600: buffer %v, want 768 rows", got)
		}
		kept := mlxc.SliceAxis(k, 2, 0, 3).Float32s()
		for i, x := range kept {
			if x != 7 {
				t.Fatalf("row data %d = %g after growth, want 7", i, x)
			}
		}
		if tail := mlxc.Sum(mlxc.SliceAxis(v, 2, 3, 768), nil, false).Float32s()[0]; tail != 0 {
			t.Errorf("new rows sum to %g, want 0", tail)
		}
		if k2, _ := c.Window(100, shape, shape, mlxc.Float32); k2 != k {
			t.Error("a smaller window replaced the buffers")
		}
		// InPlace hands out the same buffers for rows of their type, none for another.
		if k2, v2 := c.InPlace(100, 2, 4, mlxc.Float32); k2 != k || v2 != v {
			t.Error("InPlace did not return the cache's buffers")
		}
		if k2, v2 := c.InPlace(100, 2, 4, mlxc.BFloat16); k2 != nil || v2 != nil {
			t.Error("InPlace returned float32 buffers for bfloat16 rows")
		}
		if a := mlxc.Scalar(1, mlxc.Float32); OnDevice(a) != a && !mlxc.CUDAKernelsAvailable() {
			t.Error("OnDevice copied an array without CUDA kernels")
		}
		// Its copy: at least 16 bytes, the meaningful elements first; a position costs one node.
		for _, c := range []struct {
			in        []int32
			shape     []int
			wantLen   int
			wantNodes int
		}{
			{[]int32{7}, []int{1}, 4, 1},
			{[]int32{7}, nil, 4, 2}, // 0-d (Visible): reshaped first
			{[]int32{3, 4, 5, 6, 7, 8}, []int{6}, 10, 4},
		} {
			a := mlxc.FromSlice(c.in, c.shape...)
			p := padForDevice(a)
			if n := mlxc.GraphNodes(p); n > c.wantNodes {
				t.Errorf("padForDevice(%v, shape %v): %d nodes, want ≤ %d", c.in, c.shape, n, c.wantNodes)
			}
			got := mlxc.ToSlice[int32](p)
			if len(got) != c.wantLen || !slices.Equal(got[:len(c.in)], c.in) {
				t.Errorf("padForDevice(%v, shape %v) = %v, want %d elements starting with the input", c.in, c.shape, got, c.wantLen)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
