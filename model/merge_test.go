package model_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// Merged q/k/v and gate/up projections (the CUDA default) compute the same products as
// separate ones: bit for bit on the CPU backend, for a prompt block and single steps.
func TestMergedProjectionsMatchSeparate(t *testing.T) {
	dir := t.TempDir()
	writeModel(t, dir, modelgen.TinyQwen3())
	t.Setenv("DFLASH_MERGE_PROJ", "0")
	plain := loadModel(t, dir)
	t.Setenv("DFLASH_MERGE_PROJ", "1")
	merged := loadModel(t, dir)
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

// A launch rule that cannot be read fails the load with the variable's name, on any
// backend, rather than running other shapes than the ones asked for.
func TestBadTCRuleFailsLoad(t *testing.T) {
	dir := t.TempDir()
	writeModel(t, dir, modelgen.TinyQwen3())
	t.Setenv("DFLASH_TC_RULE", "wide=3/8/4")
	err := mlxc.Do(func() error {
		m, err := model.Load(dir, model.LoadOptions{})
		if err == nil {
			m.Free()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "DFLASH_TC_RULE") || !strings.Contains(err.Error(), "tiles must be") {
		t.Fatalf("load with a bad DFLASH_TC_RULE: %v", err)
	}
}
