package model

import (
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
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
