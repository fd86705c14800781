package draft_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// loadTarget writes and loads a tiny Qwen3 target for drafter tests.
func loadTarget(t *testing.T, dir string, spec modelgen.Qwen3Spec) model.Model {
	t.Helper()
	var target model.Model
	if err := mlxc.Do(func() error {
		if err := modelgen.WriteQwen3(filepath.Join(dir, "t"), spec); err != nil {
			return err
		}
		var err error
		target, err = model.Load(filepath.Join(dir, "t"), model.LoadOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mlxc.Do(func() error { target.Free(); return nil }) })
	return target
}

// editTensors rewrites dir's model.safetensors through edit.
func editTensors(dir string, edit func(m map[string]*mlxc.Array)) error {
	p := filepath.Join(dir, "model.safetensors")
	return mlxc.Catch(func() {
		s := mlxc.NewScope()
		defer s.Close()
		m, meta := mlxc.LoadSafetensors(p)
		edit(m)
		mlxc.SaveSafetensors(p, m, meta)
	})
}

// Every way a DFlash2 checkpoint can be wrong for its target, or for this build, is one
// clear error; the published layout loads as DFlash2.
func TestDFlash2LoadErrors(t *testing.T) {
	dir := t.TempDir()
	spec := modelgen.TinyQwen3()
	target := loadTarget(t, dir, spec)
	const sel = "candidate_selector.successor_codebook"
	dc := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) { m["dflash_config"].(map[string]any)[key] = v }
	}
	cases := []struct {
		name    string
		mod     func(*modelgen.DrafterSpec)
		config  func(map[string]any)
		tensors func(map[string]*mlxc.Array)
		want    string
	}{
		{name: "ok"},
		{name: "conv taps", config: dc("conv_kernel_size", 9), want: "conv_kernel_size 9 is not supported"},
		{name: "conv group", config: dc("conv_group_size", 48), want: "conv_group_size 48 does not divide hidden_size 64"},
		{name: "selector top-k", config: dc("selector_top_k", 100000), want: "selector_top_k 100000 exceeds vocab_size"},
		{name: "selector rank missing", config: func(m map[string]any) { delete(m["dflash_config"].(map[string]any), "selector_rank") }, want: "needs dflash_config.selector_rank"},
		{name: "selector rank zero", config: dc("selector_rank", 0), want: "selector_rank must be a positive integer"},
		{name: "causal", config: func(m map[string]any) { m["is_causal"] = true }, want: "is_causal true is not supported"},
		{name: "full layer", config: func(m map[string]any) { m["layer_types"].([]any)[0] = "full_attention" }, want: "every DFlash2 layer is \"sliding_attention\""},
		{name: "unknown architecture", config: func(m map[string]any) { m["architectures"] = []any{"DFlash9DraftModel"} }, want: "names no drafter this build knows"},
		{name: "hidden size", mod: func(s *modelgen.DrafterSpec) { s.Hidden = 32 }, want: "hidden_size 32 does not match the target's 64"},
		{name: "vocab", mod: func(s *modelgen.DrafterSpec) { s.Vocab = 300 }, want: "vocab_size 300 does not match"},
		{name: "layer id out of range", mod: func(s *modelgen.DrafterSpec) { s.TargetLayerIDs = []int{0, 9} }, want: "target_layer_ids has 9"},
		{name: "missing codebook", tensors: func(m map[string]*mlxc.Array) { delete(m, sel) }, want: "tensor " + sel + ".weight is missing"},
		{name: "missing conv", tensors: func(m map[string]*mlxc.Array) { delete(m, "layers.1.mlp_conv.base_kernel") }, want: "tensor layers.1.mlp_conv.base_kernel is missing"},
		{name: "extra tensor", tensors: func(m map[string]*mlxc.Array) {
			m["candidate_selector.bias"] = mlxc.Zeros([]int{4}, mlxc.BFloat16)
		}, want: "unexpected tensors in the checkpoint: candidate_selector.bias"},
		{name: "both codebook spellings", tensors: func(m map[string]*mlxc.Array) { m[sel+".weight"] = m[sel] }, want: "has both " + sel},
		{name: "wrong conv shape", tensors: func(m map[string]*mlxc.Array) {
			m["layers.0.attention_conv.base_kernel"] = mlxc.Zeros([]int{2, 3, 64}, mlxc.BFloat16)
		}, want: "layers.0.attention_conv.base_kernel has shape [2 3 64], want [2 2 64]"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ds := modelgen.DrafterFor(spec, 2).DFlash2For()
			if c.mod != nil {
				c.mod(&ds)
			}
			dd := filepath.Join(dir, fmt.Sprintf("d%d", i))
			var err error
			var kind string
			_ = mlxc.Do(func() error {
				if e := modelgen.WriteDrafter(dd, ds); e != nil {
					t.Error(e)
					return nil
				}
				if c.config != nil {
					p := filepath.Join(dd, "config.json")
					b, _ := os.ReadFile(p)
					var m map[string]any
					if e := json.Unmarshal(b, &m); e != nil {
						t.Error(e)
						return nil
					}
					c.config(m)
					b, _ = json.Marshal(m)
					if e := os.WriteFile(p, b, 0o644); e != nil {
						t.Error(e)
					}
				}
				if c.tensors != nil {
					if e := editTensors(dd, c.tensors); e != nil {
						t.Error(e)
						return nil
					}
				}
				var d *draft.Drafter
				d, err = draft.Load(dd, target, draft.LoadOptions{})
				if err == nil {
					kind = d.Cfg.Kind.String()
					d.Free()
				}
				return nil
			})
			if c.want == "" {
				if err != nil {
					t.Fatalf("valid drafter rejected: %v", err)
				}
				if kind != "dflash2" {
					t.Fatalf("loaded as %s, want dflash2", kind)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want mention of %q", err, c.want)
			}
		})
	}
}

// The compiled convolution equals the ops path bit for bit, and both equal the formula
// evaluated in float64 (to float32 rounding): taps never cross the block start, the
// dynamic coefficient is shared by a group's channels.
func TestConvCompiledMatchesOps(t *testing.T) {
	const L, H, group, K = 5, 32, 8, 2
	G := H / group
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			keys := mlxc.RandomSplit(mlxc.RandomKey(7), 3)
			key := func(i int) *mlxc.Array { return mlxc.Reshape(mlxc.SliceAxis(keys, 0, i, i+1), 2) }
			h := mlxc.Normal([]int{L, H}, mlxc.Float32, 0, 1, key(0))
			coeff := mlxc.Normal([]int{L, K, G}, mlxc.Float32, 0, 1, key(1))
			base := mlxc.Normal([]int{K, H}, mlxc.Float32, 1, 0.5, key(2))
			conv := draft.NewConv(group)
			defer conv.Free()
			for _, dt := range []mlxc.Dtype{mlxc.Float32, mlxc.BFloat16} {
				hc, cc := mlxc.AsType(h, dt), mlxc.AsType(coeff, dt)
				ops := mlxc.AsType(draft.ConvOps(hc, cc, base, group), mlxc.Float32)
				comp := mlxc.AsType(conv.Apply(hc, cc, base), mlxc.Float32)
				mlxc.Eval(ops, comp)
				a, b := mlxc.ToSlice[float32](ops), mlxc.ToSlice[float32](comp)
				for i := range a {
					if a[i] != b[i] {
						t.Errorf("%s: compiled %v, ops %v at %d", dt, b[i], a[i], i)
						return
					}
				}
				if dt != mlxc.Float32 {
					continue
				}
				hv, cv, bv := mlxc.ToSlice[float32](h), mlxc.ToSlice[float32](coeff), mlxc.ToSlice[float32](base)
				for l := 0; l < L; l++ {
					for c := 0; c < H; c++ {
						var want float64
						for tap := 0; tap < K && tap <= l; tap++ {
							x := float64(hv[(l-tap)*H+c])
							want += (float64(bv[tap*H+c]) + float64(cv[(l*K+tap)*G+c/group])) * x
						}
						if got := float64(a[l*H+c]); math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
							t.Errorf("y[%d,%d] = %v, want %v", l, c, got, want)
							return
						}
					}
				}
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The selector's compiled walk chooses what its ops path chooses, greedy and sampled with
// the same keys (the same tokens, and q bit for bit), and QOf gives the q of a path the
// walk drew; every drawn token is one of its row's candidates.
func TestSelectorWalkCompiledMatchesOps(t *testing.T) {
	dir := t.TempDir()
	spec := modelgen.TinyQwen3()
	spec.Dtype = mlxc.Float32
	target := loadTarget(t, dir, spec)
	ds := modelgen.DrafterFor(spec, 2).DFlash2For()
	ds.Dtype = mlxc.Float32
	var fail error
	err := withDrafter(dir, target, ds, func(d *draft.Drafter) error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			L := d.Cfg.BlockSize
			keys := mlxc.RandomSplit(mlxc.RandomKey(3), 2)
			ctx := mlxc.Normal([]int{1, 12, len(d.Cfg.TargetLayerIDs) * d.Cfg.HiddenSize}, mlxc.Float32, 0, 1, mlxc.Reshape(mlxc.SliceAxis(keys, 0, 0, 1), 2))
			block := []int32{42}
			for len(block) < L {
				block = append(block, int32(d.Cfg.MaskTokenID))
			}
			c := draft.NewWindowCache(d.Cfg.NumLayers, d.Cfg.SlidingWindow-1)
			defer c.Free()
			b, err := d.ForwardWindow(mlxc.FromSlice(block, 1, L), ctx, c)
			if err != nil {
				fail = err
				return
			}
			anchor := mlxc.FromSlice([]int32{42}, 1)
			for _, n := range []int{L - 1, 3} {
				g, go_ := d.Selector.Walk(b, anchor, n, 0, nil), d.Selector.WalkOps(b, anchor, n, 0, nil)
				if fail = sameInts(fmt.Sprintf("greedy path of %d", n), g.Tokens, go_.Tokens); fail != nil {
					return
				}
				wk := mlxc.RandomSplit(mlxc.Reshape(mlxc.SliceAxis(keys, 0, 1, 2), 2), n)
				sp, so := d.Selector.Walk(b, anchor, n, 0.7, wk), d.Selector.WalkOps(b, anchor, n, 0.7, wk)
				if fail = sameInts(fmt.Sprintf("sampled path of %d", n), sp.Tokens, so.Tokens); fail != nil {
					return
				}
				if fail = sameFloats32(fmt.Sprintf("q of %d", n), sp.Q, so.Q); fail != nil {
					return
				}
				if fail = sameFloats32("q along the path", d.Selector.QOf(b, anchor, sp.Tokens, n, 0.7), sp.Q); fail != nil {
					return
				}
				toks, cands := mlxc.ToSlice[int32](sp.Tokens), mlxc.ToSlice[int32](sp.Candidates)
				K := d.Selector.TopK
				for l, tok := range toks {
					if !slices.Contains(cands[l*K:(l+1)*K], tok) {
						fail = fmt.Errorf("row %d drew %d, not one of its candidates %v", l, tok, cands[l*K:(l+1)*K])
						return
					}
				}
			}
		})
	})
	if err == nil {
		err = fail
	}
	if err != nil {
		t.Fatal(err)
	}
}
