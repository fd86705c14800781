package model_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Merged q/k/v and gate/up projections (the CUDA default) compute the same products as
// separate ones: bit for bit on the CPU backend, for a prompt block and single steps.
func TestMergedProjectionsMatchSeparate(t *testing.T) {
	dir := t.TempDir()
	writeModel(t, dir, modelgen.TinyQwen3())
	plain := loadModel(t, dir)
	*model.MergeProjections = true
	merged := loadModel(t, dir)
	*model.MergeProjections = false
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		run := func(m model.Model) [][]float32 {
			c := m.NewCache()
			defer c.Free()
			var out [][]float32
			prompt := []int32{1, 5, 9, 2, 6, 5, 3, 5}
			o := m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Logits: model.LogitsAll, Taps: []int{1, 3}})
			out = append(out, mlxc.AsType(o.Logits, mlxc.Float32).Float32s(), mlxc.AsType(o.Hidden, mlxc.Float32).Float32s())
			for _, tok := range []int32{7, 11, 13} {
				o := m.Forward(mlxc.FromSlice([]int32{tok}, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
				out = append(out, mlxc.AsType(o.Logits, mlxc.Float32).Float32s())
			}
			return out
		}
		want, got := run(plain), run(merged)
		exact := mlxc.CurrentDevice().GPU == false
		for i := range want {
			for j := range want[i] {
				a, b := want[i][j], got[i][j]
				if exact && math.Float32bits(a) != math.Float32bits(b) {
					return fmt.Errorf("output %d element %d: merged %g, separate %g", i, j, b, a)
				}
				if !exact && math.Abs(float64(a-b)) > 0.05*math.Abs(float64(a))+0.05 {
					return fmt.Errorf("output %d element %d: merged %g, separate %g", i, j, b, a)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A launch rule, weight layout or attention warp count that cannot be read fails (the
// settings or the load) with the variable's name, on any backend, rather than running other
// kernels than the ones asked for; accepted values load.
func TestBadTCSettingsFailLoad(t *testing.T) {
	dir := t.TempDir()
	writeModel(t, dir, modelgen.TinyQwen3())
	for _, tc := range []struct {
		name, value, want string // want: "" loads
	}{
		{"DFLASH_TC_RULE", "wide=3/8/4", "tiles must be"},
		{"DFLASH_TC_TILED", "yes", "want 0"},
		{"DFLASH_TC_TILED", "2", "want 0"},
		{"DFLASH_TC_TILED", "0", ""},
		{"DFLASH_TC_TILED", "1", ""},
		{"DFLASH_FQA_WARPS", "6", "want 2, 4, 8 or 16"},
		{"DFLASH_FQA_WARPS", "eight", "want 2, 4, 8 or 16"},
		{"DFLASH_FQA_WARPS", "8", ""},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			s, _, err := settings.Parse(func(k string) (string, bool) { return tc.value, k == tc.name }, nil)
			if err == nil {
				err = mlxc.Do(func() error {
					m, err := model.Load(dir, model.LoadOptions{Settings: &s})
					if err == nil {
						m.Free()
					}
					return err
				})
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("load: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("load with %s=%s: %v, want an error naming the variable and %q", tc.name, tc.value, err, tc.want)
			}
		})
	}
}

// A span of a merged projection is a view of the stack's rows: its product equals the
// parts' products side by side, and it leaves the stack and the parts intact.
func TestMergedSpanIsTheParts(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		mk := func(n int, seed uint64) *model.Linear {
			w := mlxc.Normal([]int{n, 32}, mlxc.Float32, 0, 1, mlxc.RandomKey(seed)).Detach()
			mlxc.Eval(w)
			return &model.Linear{W: w}
		}
		q, k, v := mk(48, 1), mk(16, 2), mk(16, 3)
		m := model.MergeLinears(q, k, v)
		defer func() { m.Free(); q.Free(); k.Free(); v.Free() }()
		kv := m.Span(1, 3)
		defer kv.Free()
		x := mlxc.Normal([]int{5, 32}, mlxc.Float32, 0, 1, mlxc.RandomKey(4))
		want := mlxc.Concatenate([]*mlxc.Array{k.Apply(x), v.Apply(x)}, 1)
		got := kv.Apply(x)
		if fmt.Sprint(got.Shape()) != "[5 32]" {
			return fmt.Errorf("span product shape %v, want [5 32]", got.Shape())
		}
		g, w := got.Float32s(), want.Float32s()
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				return fmt.Errorf("element %d: span %g, parts %g", i, g[i], w[i])
			}
		}
		for _, bad := range [][2]int{{0, 0}, {2, 1}, {-1, 2}, {1, 4}} {
			if m.Span(bad[0], bad[1]) != nil {
				return fmt.Errorf("Span(%d, %d) of 3 parts is not nil", bad[0], bad[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
