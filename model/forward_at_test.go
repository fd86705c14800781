package model_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// A block placed by a device position (ForwardOptions.Pos, the run-ahead loop's verify)
// computes what the same block at the cache's offset does: same logits and hidden taps,
// for a window that ends at the block and for one with stale rows after it (a rejected
// block written there before), and the cache rows it leaves equal the ordinary path's once
// the offset is set. Checked on the CPU within a few float32 steps (the two paths mask
// attention differently); YaRN rotary embeddings too. In bfloat16 too, within bf16 steps:
// on a CUDA GPU that dtype takes the fused head-prep and few-query attention kernels, which
// read the position from the device array.
func TestForwardAtDevicePosition(t *testing.T) {
	for _, tc := range []struct {
		yarn    bool
		dt      mlxc.Dtype
		tol     float64
		headDim int // 0: the tiny shape's 32; 64 takes the fused head prep on a GPU, which writes the cache in place
	}{{false, mlxc.Float32, 1e-4, 0}, {true, mlxc.Float32, 1e-4, 0}, {false, mlxc.BFloat16, 2e-2, 0}, {false, mlxc.BFloat16, 2e-2, 64}} {
		yarn, tol := tc.yarn, tc.tol
		spec := modelgen.TinyQwen3()
		spec.Dtype = tc.dt
		if tc.headDim > 0 {
			spec.HeadDim = tc.headDim
		}
		if yarn {
			spec.RopeScaling = map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
		}
		dir := t.TempDir()
		writeModel(t, dir, spec)
		m := loadModel(t, dir)
		err := mlxc.Do(func() error {
			s := mlxc.NewScope()
			defer s.Close()
			prompt := []int32{3, 14, 15, 92, 65, 35, 89, 79, 32}
			block := []int32{38, 46, 26, 43, 38}
			stale := []int32{7, 7, 7, 7, 7}
			L := len(block)
			opt := model.ForwardOptions{Taps: []int{1, 3}, Logits: model.LogitsAll}
			ref := m.NewCache()
			defer ref.Free()
			m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), ref, model.ForwardOptions{Logits: model.LogitsNone})
			want := m.Forward(mlxc.FromSlice(block, 1, L), ref, opt)
			for _, extra := range []int{0, 7} {
				c := m.NewCache()
				m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Logits: model.LogitsNone})
				off := c.Offset()
				pos := mlxc.FromSlice([]int32{int32(off)}, 1)
				at := opt
				at.Pos, at.Window = pos, off+L+extra
				if extra > 0 { // a rejected block at the same rows first
					m.Forward(mlxc.FromSlice(stale, 1, L), c, at)
				}
				got := m.Forward(mlxc.FromSlice(block, 1, L), c, at)
				if c.Offset() != off {
					c.Free()
					return fmt.Errorf("offset moved to %d by a device-placed block", c.Offset())
				}
				name := fmt.Sprintf("%s head dim %d yarn %v, window +%d", tc.dt, spec.HeadDim, yarn, extra)
				err := closeArrays(name+" logits", got.Logits, want.Logits, tol)
				if err == nil {
					err = closeArrays(name+" hidden", got.Hidden, want.Hidden, tol)
				}
				if err == nil {
					err = c.(*model.KVCaches).SetOffset(off + L)
				}
				for i, l := range c.(*model.KVCaches).Layers {
					if err != nil {
						break
					}
					k1, v1 := l.State()
					k2, v2 := ref.(*model.KVCaches).Layers[i].State()
					if err = closeArrays(fmt.Sprintf("%s layer %d keys", name, i), k1, k2, tol); err == nil {
						err = closeArrays(fmt.Sprintf("%s layer %d values", name, i), v1, v2, tol)
					}
				}
				c.Free()
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func closeArrays(what string, got, want *mlxc.Array, tol float64) error {
	if fmt.Sprint(got.Shape()) != fmt.Sprint(want.Shape()) {
		return fmt.Errorf("%s: shape %v, want %v", what, got.Shape(), want.Shape())
	}
	g, w := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
	for i := range w {
		if d := math.Abs(float64(g[i] - w[i])); d > tol+tol*math.Abs(float64(w[i])) || math.IsNaN(float64(g[i])) {
			return fmt.Errorf("%s[%d] = %g, want %g", what, i, g[i], w[i])
		}
	}
	return nil
}

// Blocks placed by device positions one after another, the way the run-ahead loop places
// its verify blocks (a one-token prompt, a reserved cache, positions computed on the device
// from earlier results), give the logits that one-token decode steps give at the same
// positions: values within bf16 steps, the same greedy token on every row on the CPU, and
// bit for bit the same values on a GPU in GPU-exact mode. Decode is the reference the
// engine's equality tests hold DFlash to.
func TestForwardAtBlocksMatchDecode(t *testing.T) {
	for _, hd := range []int{32, 64} { // 64: the fused head prep on a GPU (keys written in place)
		t.Run(fmt.Sprintf("head dim %d", hd), func(t *testing.T) { forwardAtBlocksMatchDecode(t, hd) })
	}
}

func forwardAtBlocksMatchDecode(t *testing.T, headDim int) {
	spec := modelgen.TinyQwen3()
	spec.Seed, spec.WeightStd, spec.HeadDim = 11, 0.12, headDim
	dir := t.TempDir()
	writeModel(t, dir, spec)
	m := loadModel(t, dir)
	const steps, L = 13, 4
	for _, lazy := range []bool{false, true} {
		err := mlxc.Do(func() error {
			s := mlxc.NewScope()
			defer s.Close()
			// Decode: the reference tokens and logits.
			ref := m.NewCache()
			defer ref.Free()
			toks := []int32{7}
			var want [][]float32
			for range steps {
				out := m.Forward(mlxc.FromSlice(toks[len(toks)-1:], 1, 1), ref, model.ForwardOptions{Logits: model.LogitsLast})
				row := mlxc.AsType(mlxc.Reshape(out.Logits, -1), mlxc.Float32).Float32s()
				want = append(want, row)
				toks = append(toks, int32(argmaxF(row)))
			}
			c := m.NewCache()
			defer c.Free()
			c.(*model.KVCaches).Reserve(64)
			m.Forward(mlxc.FromSlice(toks[:1], 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
			for p := 1; p+L <= steps; p += L - 1 { // blocks overlap by one row: the last is redone
				pos := mlxc.FromSlice([]int32{int32(p)}, 1)
				if lazy { // computed on the device, as from an acceptance count
					pos = mlxc.Add(mlxc.FromSlice([]int32{int32(p - 2)}, 1), mlxc.Sum(mlxc.FromSlice([]int32{1, 1}, 2), nil, true))
				}
				out := m.Forward(mlxc.FromSlice(toks[p:p+L], 1, L), c, model.ForwardOptions{Logits: model.LogitsAll, Pos: pos, Window: p + L + 2})
				got := mlxc.AsType(out.Logits, mlxc.Float32).Float32s()
				V := len(got) / L
				for i := range L {
					row, w := got[i*V:(i+1)*V], want[p+i]
					d := 0.0
					for j := range row {
						d = math.Max(d, math.Abs(float64(row[j]-w[j])))
					}
					// A GPU block and a decode step may round differently (near-ties flip)
					// unless GPU-exact mode makes them equal bit for bit.
					exact := !mlxc.CurrentDevice().GPU || settings.ForTests().Loop.GPUExact
					if d > 0.25 || exact && argmaxF(row) != argmaxF(w) || settings.ForTests().Loop.GPUExact && d != 0 {
						return fmt.Errorf("lazy %v, block at %d, row %d: argmax %d (decode %d), max |Δlogit| %g", lazy, p, i, argmaxF(row), argmaxF(w), d)
					}
				}
				if err := c.(*model.KVCaches).SetOffset(p + L - 1); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func argmaxF(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
