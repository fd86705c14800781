package model_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

func editJSON(t *testing.T, path string, fn func(m map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Bad checkpoints give one clear error that names the file and the field, never a crash
// or a half-loaded model.
func TestLoadErrors(t *testing.T) {
	base := t.TempDir()
	single := filepath.Join(base, "single")
	sharded := filepath.Join(base, "sharded")
	quant := filepath.Join(base, "quant")
	spec := modelgen.TinyQwen3()
	writeModel(t, single, spec)
	spec.Shards = 2
	writeModel(t, sharded, spec)
	spec.Shards = 0
	spec.QuantBits, spec.QuantGroup = 4, 64
	writeModel(t, quant, spec)
	moeHF := filepath.Join(base, "moe-hf")
	moeMLX := filepath.Join(base, "moe-mlx")
	moeSpec := modelgen.TinyQwen3MoE()
	writeModel(t, moeHF, moeSpec)
	moeSpec.PerExpert = false
	writeModel(t, moeMLX, moeSpec)
	setKey := func(key string, v any) func(t *testing.T, d string) {
		return func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) { m[key] = v })
		}
	}

	cases := []struct {
		name   string
		from   string
		break_ func(t *testing.T, dir string)
		want   []string // substrings of the error
	}{
		{"missing config", single, func(t *testing.T, d string) { os.Remove(filepath.Join(d, "config.json")) }, []string{"no config.json"}},
		{"bad json", single, func(t *testing.T, d string) { os.WriteFile(filepath.Join(d, "config.json"), []byte("{oops"), 0o644) }, []string{"config.json", "invalid JSON"}},
		{"unknown model_type", single, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) { m["model_type"] = "llama9" })
		}, []string{"config.json", "llama9", "not supported"}},
		{"missing key", single, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) { delete(m, "head_dim") })
		}, []string{"config.json", "head_dim"}},
		{"wrong type", single, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) { m["hidden_size"] = "big" })
		}, []string{"config.json", "hidden_size", "integer"}},
		{"non-positive size", single, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) { m["num_key_value_heads"] = 0 })
		}, []string{"config.json", "num_key_value_heads", "must be positive, got 0"}},
		{"missing shard", sharded, func(t *testing.T, d string) { os.Remove(filepath.Join(d, "model-00002-of-00002.safetensors")) }, []string{"model-00002-of-00002.safetensors", "missing"}},
		{"truncated safetensors", single, func(t *testing.T, d string) {
			p := filepath.Join(d, "model.safetensors")
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-100)
		}, []string{"model.safetensors", "truncated"}},
		{"garbage safetensors", single, func(t *testing.T, d string) {
			os.WriteFile(filepath.Join(d, "model.safetensors"), []byte("this is not a tensor file at all"), 0o644)
		}, []string{"model.safetensors"}},
		{"wrong shape", single, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) { m["intermediate_size"] = 96.0 })
		}, []string{"mlp.gate_proj.weight", "shape", "[96 64]"}},
		{"no weights", single, func(t *testing.T, d string) { os.Remove(filepath.Join(d, "model.safetensors")) }, []string{"no *.safetensors"}},
		{"quantized without scales", quant, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) {
				m["quantization"] = map[string]any{"group_size": 64.0, "bits": 4.0, "model.layers.0.mlp.up_proj": map[string]any{"group_size": 64.0, "bits": 8.0}}
				delete(m, "quantization_config")
			})
		}, []string{"model.layers.0.mlp.up_proj"}},
		{"packed weights without quantization config", quant, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) {
				delete(m, "quantization")
				delete(m, "quantization_config")
			})
		}, []string{"uint32", "quantization"}},
		{"bad quantization bits", quant, func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(m map[string]any) {
				m["quantization"] = map[string]any{"group_size": 64.0, "bits": 7.0}
			})
		}, []string{"config.json", "bits 7"}},
		// qwen3_moe: the expert count and the expert tensors, in both layouts.
		{"moe: more experts in the config (per expert)", moeHF, setKey("num_experts", 16.0),
			[]string{"expert tensor model.layers.1.mlp.experts.8.down_proj.weight is missing", "num_experts 16"}},
		{"moe: fewer experts in the config (per expert)", moeHF, setKey("num_experts", 4.0),
			[]string{"the checkpoint has 8 experts (model.layers.1.mlp.experts.7.down_proj.weight) but the config has num_experts 4"}},
		{"moe: expert count (stacked)", moeMLX, setKey("num_experts", 16.0),
			[]string{"model.layers.1.mlp.gate.weight has 8 experts but the config has num_experts 16"}},
		{"moe: missing expert tensor (per expert)", moeHF, func(t *testing.T, d string) {
			dropTensor(t, d, "model.layers.2.mlp.experts.5.down_proj.weight")
		}, []string{"expert tensor model.layers.2.mlp.experts.5.down_proj.weight is missing"}},
		{"moe: missing expert tensor (stacked)", moeMLX, func(t *testing.T, d string) {
			dropTensor(t, d, "model.layers.3.mlp.switch_mlp.up_proj.weight")
		}, []string{"expert tensor model.layers.3.mlp.switch_mlp.up_proj.weight is missing"}},
		{"moe: top-k above the expert count", moeHF, setKey("num_experts_per_tok", 9.0),
			[]string{"config.json", "num_experts_per_tok 9 must be at most num_experts 8"}},
		{"moe: dense-only layer out of range", moeHF, setKey("mlp_only_layers", []any{0.0, 4.0}),
			[]string{"config.json", "mlp_only_layers lists layer 4"}},
		{"moe: sparse step zero", moeHF, setKey("decoder_sparse_step", 0.0),
			[]string{"config.json", "decoder_sparse_step must be positive"}},
		{"moe: a dense layer's MLP where the config puts experts", moeHF, setKey("mlp_only_layers", []any{}),
			[]string{"expert tensor model.layers.0.mlp.switch_mlp.gate_proj.weight is missing"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			copyDir(t, tc.from, dir)
			tc.break_(t, dir)
			before := uint64(0)
			var err error
			_ = mlxc.Do(func() error {
				before = mlxc.LiveArrays()
				var m model.Model
				m, err = model.Load(dir, model.LoadOptions{})
				if err == nil {
					m.Free()
				}
				if after := mlxc.LiveArrays(); after != before {
					t.Errorf("failed load leaked %d arrays", after-before)
				}
				return nil
			})
			if err == nil {
				t.Fatal("load succeeded on a broken checkpoint")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// dropTensor rewrites dir's model.safetensors without tensor name.
func dropTensor(t *testing.T, dir, name string) {
	t.Helper()
	if err := mlxc.Do(func() error { return modelgen.DropTensors(dir, name) }); err != nil {
		t.Fatal(err)
	}
}
