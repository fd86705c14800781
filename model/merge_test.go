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
// separate ones: bit for bit on the CPU backend, for a prompt block and single steps, dense
// and 4-bit.
func TestMergedProjectionsMatchSeparate(t *testing.T) {
	quant := modelgen.TinyQwen3()
	quant.QuantBits, quant.QuantGroup = 4, 32
	for name, spec := range map[string]modelgen.Qwen3Spec{"bf16": modelgen.TinyQwen3(), "4-bit": quant} {
		t.Run(name, func(t *testing.T) { mergedMatchesSeparate(t, spec) })
	}
}

func mergedMatchesSeparate(t *testing.T, spec modelgen.Qwen3Spec) {
	dir := t.TempDir()
	writeModel(t, dir, spec)
	plain := loadModel(t, dir)
	*model.MergeProjections = true
	merged := loadModel(t, dir)
	*model.MergeProjections = false
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		products := map[model.Model]int{}
		run := func(m model.Model) [][]float32 {
			c := m.NewCache()
			defer c.Free()
			var out [][]float32
			prompt := []int32{1, 5, 9, 2, 6, 5, 3, 5}
			o := m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Logits: model.LogitsAll, Taps: []int{1, 3}})
			out = append(out, mlxc.AsType(o.Logits, mlxc.Float32).Float32s(), mlxc.AsType(o.Hidden, mlxc.Float32).Float32s())
			for _, tok := range []int32{7, 11, 13} {
				o := m.Forward(mlxc.FromSlice([]int32{tok}, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
				ops := mlxc.GraphOps(o.Logits)
				products[m] = ops["Matmul"] + ops["QuantizedMatmul"]
				out = append(out, mlxc.AsType(o.Logits, mlxc.Float32).Float32s())
			}
			return out
		}
		want, got := run(plain), run(merged)
		// Per layer q/k/v become one product and gate/up another: three fewer.
		if layers := spec.Layers; products[merged] != products[plain]-3*layers {
			return fmt.Errorf("a merged step has %d products, a separate one %d: want %d fewer", products[merged], products[plain], 3*layers)
		}
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

// Quantized parts stack when their bits, groups, modes and inputs agree: the split product
// is each part's product bit for bit (CPU) and the parts still compute alone, as views;
// parts of other bits or group sizes are left alone.
func TestMergeQuantizedLinears(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		mk := func(n, bits, group int, seed uint64) *model.Linear {
			w := mlxc.Normal([]int{n, 64}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(seed))
			q := mlxc.Quantize(w, group, bits, "affine")
			for _, a := range []*mlxc.Array{q.W, q.Scales, q.Biases} {
				a.Detach()
			}
			mlxc.Eval(q.W, q.Scales, q.Biases)
			return &model.Linear{Q: &q}
		}
		x := mlxc.Normal([]int{3, 64}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(9))
		a, b, c := mk(48, 4, 32, 1), mk(16, 4, 32, 2), mk(8, 4, 32, 3)
		defer func() { a.Free(); b.Free(); c.Free() }()
		want := []*mlxc.Array{a.Apply(x), b.Apply(x), c.Apply(x)}
		mlxc.Eval(want...)
		m := model.MergeQuantizedLinears(a, b, c)
		if m == nil {
			return fmt.Errorf("4-bit parts of one group size did not merge")
		}
		defer m.Free()
		got := m.Apply(x)
		for i := range want {
			if err := sameFloats(fmt.Sprintf("part %d of the split product", i), got[i], want[i]); err != nil {
				return err
			}
		}
		if err := sameFloats("part 1 alone after the merge", b.Apply(x), want[1]); err != nil {
			return err
		}
		if m.Span(0, 2) != nil {
			return fmt.Errorf("Span of a quantized stack is not nil")
		}
		e8, g64 := mk(16, 8, 32, 4), mk(16, 4, 64, 5)
		defer func() { e8.Free(); g64.Free() }()
		if model.MergeQuantizedLinears(a, e8) != nil || model.MergeQuantizedLinears(a, g64) != nil {
			return fmt.Errorf("parts of other bits or group sizes merged")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sameFloats reports whether got and want have the same shape and bits (as float32).
func sameFloats(what string, got, want *mlxc.Array) error {
	if fmt.Sprint(got.Shape()) != fmt.Sprint(want.Shape()) {
		return fmt.Errorf("%s: shape %v, want %v", what, got.Shape(), want.Shape())
	}
	g, w := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
	for i := range w {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			return fmt.Errorf("%s: element %d is %g, want %g", what, i, g[i], w[i])
		}
	}
	return nil
}
