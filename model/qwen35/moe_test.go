package qwen35_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// moeCases are qwen3_5_moe checkpoints of several expert counts, top-k, precisions and
// both layouts; bits > 0 converts the written checkpoint with mlx-lm (its quant_predicate
// puts the router and the shared expert's gate at 8 bits).
var moeCases = []struct {
	name        string
	mod         func(*modelgen.Qwen35Spec)
	bits, group int
}{
	{name: "mlx-f32-e8-k2", mod: func(s *modelgen.Qwen35Spec) { s.Dtype = mlxc.Float32 }},
	{name: "hf-f32-e4-k1-nonorm-untied", mod: func(s *modelgen.Qwen35Spec) {
		s.Dtype, s.Layout, s.Tied, s.Seed = mlxc.Float32, modelgen.Qwen35HF, false, 11
		s.Experts, s.TopK, s.NormTopK, s.SharedInter = 4, 1, false, 32
	}},
	{name: "mlx-bf16-e8-k2", mod: func(s *modelgen.Qwen35Spec) { s.Seed = 12 }},
	// 20 rows × 4 experts is past the sort threshold: the sorted gather path.
	{name: "hf-bf16-e16-k4-untied", mod: func(s *modelgen.Qwen35Spec) {
		s.Layout, s.Tied, s.Seed = modelgen.Qwen35HF, false, 13
		s.Experts, s.TopK, s.MoEInter = 16, 4, 32
	}},
	{name: "mlx-4bit-g64-e8-k2", mod: func(s *modelgen.Qwen35Spec) { s.Seed = 14; s.QuantBits, s.QuantGroup = 4, 64 }},
	{name: "mlx-4bit-g32-e16-k4", mod: func(s *modelgen.Qwen35Spec) {
		s.Seed, s.Experts, s.TopK = 15, 16, 4
		s.QuantBits, s.QuantGroup = 4, 32
	}},
	{name: "hf-converted-4bit-g64", mod: func(s *modelgen.Qwen35Spec) { s.Layout, s.Tied, s.Seed = modelgen.Qwen35HF, false, 16 }, bits: 4, group: 64},
}

// Logits, every layer's hidden rows and 48 greedy tokens of qwen3_5_moe checkpoints
// against mlx-lm. On the CPU both run the same kernels in the same order (bf16 dense
// experts through gather_mm on float32 casts on both sides), so all must agree bit for
// bit; on a GPU within 1/32 of the largest magnitude, greedy up to the first difference.
func TestMoEMatchesMLXLM(t *testing.T) {
	py := reftest.Python(t)
	exact := !testenv.GPU()
	script := filepath.Join(reftest.RepoRoot(), "model", "qwen35", "testdata", "mlxlm_ref.py")
	for _, tc := range moeCases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35MoE()
			tc.mod(&spec)
			tmp := t.TempDir()
			dir := filepath.Join(tmp, "ckpt")
			writeModel(t, dir, spec)
			if tc.bits > 0 {
				q := filepath.Join(tmp, "mlx")
				reftest.Run(t, py, script, "convert", dir, q, strconv.Itoa(tc.bits), strconv.Itoa(tc.group))
				dir = q
			}
			refPath := filepath.Join(tmp, "ref.safetensors")
			const nGreedy = 48
			reftest.Run(t, py, script, "ref", dir, refPath, tokens(prompt), strconv.Itoa(nGreedy))
			m := loadModel(t, dir)
			a := m.Arch()
			if a.Family != "qwen3_5_moe" {
				t.Errorf("arch family %q", a.Family)
			}
			compareWithRef(t, m, refPath, exact, nGreedy)
		})
	}
}

func compareWithRef(t *testing.T, m model.Model, refPath string, exact bool, nGreedy int) {
	t.Helper()
	a := m.Arch()
	agree := func(got, want []float32) (float64, int, bool) {
		d, at := maxAbsDiff(got, want)
		if exact || d == 0 {
			return d, at, d == 0
		}
		scale := 0.0
		for _, w := range want {
			scale = max(scale, float64(w), -float64(w))
		}
		return d, at, d <= scale/32
	}
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		ref, _ := mlxc.LoadSafetensors(refPath)
		if d, _, ok := agree(ref["logits"].Float32s(), ref["logits_model"].Float32s()); !ok {
			t.Errorf("the reference layer loop disagrees with mlx-lm's own forward by %g", d)
		}
		taps := make([]int, a.NumLayers)
		for i := range taps {
			taps[i] = i
		}
		c := m.NewCache()
		defer c.Free()
		out := m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Taps: taps, Logits: model.LogitsAll})
		if d, at, ok := agree(mlxc.AsType(out.Logits, mlxc.Float32).Float32s(), ref["logits"].Float32s()); !ok {
			t.Errorf("logits differ from mlx-lm: max |Δ| = %g at %d", d, at)
		} else if d != 0 {
			t.Logf("logits differ from mlx-lm on the GPU by at most %g", d)
		}
		hidden := mlxc.AsType(out.Hidden, mlxc.Float32).Float32s()
		H, L := a.HiddenSize, len(prompt)
		for i := 0; i < a.NumLayers; i++ {
			g := make([]float32, 0, L*H)
			for p := 0; p < L; p++ {
				g = append(g, hidden[p*len(taps)*H+i*H:p*len(taps)*H+(i+1)*H]...)
			}
			if d, at, ok := agree(g, ref["hidden_"+strconv.Itoa(i)].Float32s()); !ok {
				t.Errorf("hidden rows of layer %d differ: max |Δ| = %g at %d", i, d, at)
			}
		}
		gen := greedy(m, prompt, nGreedy)
		want := ref["greedy"].Int32s()
		for i := range want {
			if gen[i] != want[i] {
				if exact {
					t.Errorf("greedy token %d = %d, mlx-lm %d (ours %v, mlx-lm %v)", i, gen[i], want[i], gen, want)
				} else {
					t.Logf("greedy token %d = %d, mlx-lm %d on the GPU; the rest is not compared", i, gen[i], want[i])
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Incremental decode of a MoE model gives the full forward's logits (bit for bit on the
// CPU: routing and each pair's products do not depend on the block's size, the sorted
// path included), and both layouts of one spec are one model.
func TestMoEIncrementalAndLayouts(t *testing.T) {
	var byLayout [2][][]float32
	for li, layout := range []modelgen.Qwen35Layout{modelgen.Qwen35HF, modelgen.Qwen35MLX} {
		spec := modelgen.TinyQwen35MoE()
		spec.Layout, spec.Tied = layout, false
		spec.Experts, spec.TopK = 16, 4 // a 20-token block is past the sort threshold
		dir := filepath.Join(t.TempDir(), "m")
		writeModel(t, dir, spec)
		m := loadModel(t, dir)
		err := mlxc.Do(func() error {
			full := logitsOf(m, m.NewCache(), [][]int32{prompt}, nil)
			byLayout[li] = full
			c := m.NewCache()
			defer c.Free()
			inc := logitsOf(m, c, split(prompt, 7, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1), nil)
			for r := range full {
				if d, at := maxAbsDiff(inc[r], full[r]); d > tol() {
					t.Errorf("layout %d row %d: incremental logits differ from the full forward by %g at %d", layout, r, d, at)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for r := range byLayout[0] {
		if d, at := maxAbsDiff(byLayout[0][r], byLayout[1][r]); d != 0 {
			t.Fatalf("row %d: HF and mlx-community MoE layouts differ by %g at %d", r, d, at)
		}
	}
}

// Importing the package registers both model types.
func TestMoEFamilyRegistered(t *testing.T) {
	fs := model.Families()
	for _, want := range []string{"qwen3_5", "qwen3_5_moe"} {
		if !slices.Contains(fs, want) {
			t.Errorf("model.Families() = %v, want %s in it", fs, want)
		}
	}
}

// Load errors name the problem: an expert count that disagrees with the weights, a
// missing expert tensor, the dense qwen3_5 type refusing experts.
func TestMoELoadErrors(t *testing.T) {
	cases := []struct {
		name string
		edit func(t *testing.T, dir string)
		want string
	}{
		{"expert count", func(t *testing.T, dir string) {
			editConfig(t, dir, func(tc map[string]any) { tc["num_experts"] = 6 })
		}, "has 8 experts but the config has num_experts 6"},
		{"missing expert", func(t *testing.T, dir string) {
			dropTensors(t, dir, "language_model.model.layers.2.mlp.switch_mlp.up_proj.weight")
		}, "language_model.model.layers.2.mlp.switch_mlp.up_proj.weight is missing"},
		{"hf missing down", func(t *testing.T, dir string) {
			dropTensors(t, dir, "model.language_model.layers.1.mlp.experts.down_proj")
		}, "tensor model.language_model.layers.1.mlp.experts.down_proj is missing"},
		{"qwen3_5 with experts", func(t *testing.T, dir string) {
			editTop(t, dir, func(c map[string]any) { c["model_type"] = "qwen3_5" })
		}, "(they are qwen3_5_moe)"},
		{"top-k", func(t *testing.T, dir string) {
			editConfig(t, dir, func(tc map[string]any) { tc["num_experts_per_tok"] = 9 })
		}, "num_experts_per_tok 9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35MoE()
			if strings.HasPrefix(tc.name, "hf ") {
				spec.Layout = modelgen.Qwen35HF
			}
			dir := filepath.Join(t.TempDir(), "m")
			writeModel(t, dir, spec)
			tc.edit(t, dir)
			err := mlxc.Do(func() error {
				s := settings.ForTests()
				m, err := model.Load(dir, model.LoadOptions{Settings: &s})
				if err == nil {
					m.Free()
				}
				return err
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// editTop rewrites dir/config.json through f.
func editTop(t *testing.T, dir string, f func(map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	f(c)
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// editConfig rewrites config.json's text_config through f.
func editConfig(t *testing.T, dir string, f func(map[string]any)) {
	t.Helper()
	editTop(t, dir, func(c map[string]any) { f(c["text_config"].(map[string]any)) })
}

// dropTensors rewrites dir/model.safetensors without the named tensors.
func dropTensors(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := mlxc.Do(func() error { return modelgen.DropTensors(dir, names...) }); err != nil {
		t.Fatal(err)
	}
}
