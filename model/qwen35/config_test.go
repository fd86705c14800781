package qwen35_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

func rawConfig(t *testing.T, js string) *model.RawConfig {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	return &model.RawConfig{Path: "config.json", M: m}
}

// Absent keys take mlx-lm's defaults; rope_parameters wins over the flat rope keys unless
// it is null; a flat config (no text_config) is read whole.
func TestParseConfigDefaults(t *testing.T) {
	c, err := qwen35.ParseConfig(rawConfig(t, `{"model_type": "qwen3_5", "text_config": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Hidden != 4096 || c.Layers != 32 || c.Heads != 32 || c.KVHeads != 8 || c.HeadDim != 128 || c.Vocab != 151936 ||
		c.LinValueHeads != 64 || c.LinKeyHeads != 16 || c.LinKeyDim != 192 || c.LinValueDim != 128 || c.ConvKernel != 4 ||
		c.Interval != 4 || c.Inter != 14336 || c.MaxPositions != 131072 || c.Eps != 1e-6 || c.Tied {
		t.Errorf("defaults: %+v", c)
	}
	if c.RopeTheta != 100000 || c.PartialRotary != 0.25 || c.RotaryDims != 32 {
		t.Errorf("rope defaults: theta %g, partial %g, dims %d", c.RopeTheta, c.PartialRotary, c.RotaryDims)
	}
	if !c.IsLinear(0) || !c.IsLinear(2) || c.IsLinear(3) || c.IsLinear(7) {
		t.Error("layer pattern: layers 3, 7, … are attention, the others linear")
	}
	c, err = qwen35.ParseConfig(rawConfig(t, `{"model_type": "qwen3_5", "text_config": {"head_dim": 256,
		"rope_theta": 5, "partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 1e7 || c.PartialRotary != 0.25 || c.RotaryDims != 64 {
		t.Errorf("rope_parameters: theta %g, partial %g, dims %d (want 1e7, 0.25, 64)", c.RopeTheta, c.PartialRotary, c.RotaryDims)
	}
	c, err = qwen35.ParseConfig(rawConfig(t, `{"model_type": "qwen3_5", "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
		"rope_theta": 5, "partial_rotary_factor": 0.5, "rope_parameters": null, "eos_token_id": [1, 2]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Hidden != 64 || c.HeadDim != 32 || c.RopeTheta != 5 || c.PartialRotary != 0.5 || len(c.EOS) != 2 {
		t.Errorf("flat config with null rope_parameters: %+v", c)
	}
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"kv heads", `{"num_attention_heads": 6, "num_key_value_heads": 4}`, "not a multiple of num_key_value_heads"},
		{"linear heads", `{"linear_num_value_heads": 6, "linear_num_key_heads": 4}`, "linear_num_value_heads 6 is not a multiple of linear_num_key_heads 4"},
		{"rope type", `{"rope_parameters": {"rope_type": "wobbly"}}`, `"wobbly" is not supported`},
		{"mrope sections", `{"rope_parameters": {"type": "mrope", "mrope_section": [1, 2]}}`, "three mrope_section"},
		{"rotary dims", `{"head_dim": 10, "rope_parameters": {"partial_rotary_factor": 0.3}}`, "rotary dims"},
		{"moe", `{"num_experts": 8, "num_experts_per_tok": 2}`, "not supported yet"},
		{"bad type", `{"hidden_size": "big"}`, `"hidden_size" must be an integer`},
		{"non-positive", `{"linear_conv_kernel_dim": 0}`, `"linear_conv_kernel_dim" must be positive`},
		{"text_config", `7`, "text_config must be an object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := rawConfig(t, `{"model_type": "qwen3_5", "text_config": `+tc.text+`}`)
			_, err := qwen35.ParseConfig(raw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// The family answers to qwen3_5 only: mlx-lm has no remap for the text-only model types.
func TestRegistered(t *testing.T) {
	if _, ok := model.LookupFamily("qwen3_5"); !ok {
		t.Error("qwen3_5 is not registered")
	}
	for _, mt := range []string{"qwen3_5_text", "qwen3_5_moe_text"} {
		if _, ok := model.LookupFamily(mt); ok {
			t.Errorf("%s is registered; mlx-lm refuses it", mt)
		}
	}
}

// A checkpoint missing a layer's conv weight fails to load with one error naming it, and
// an unexpected tensor is named too (strict loading, as mlx-lm's).
func TestMissingAndExtraWeights(t *testing.T) {
	for _, layout := range []modelgen.Qwen35Layout{modelgen.Qwen35HF, modelgen.Qwen35MLX} {
		spec := modelgen.TinyQwen35()
		spec.Layout = layout
		dir := filepath.Join(t.TempDir(), "m")
		writeModel(t, dir, spec)
		conv := "language_model.model.layers.1.linear_attn.conv1d.weight"
		stored := conv
		if layout == modelgen.Qwen35HF {
			stored = "model.language_model.layers.1.linear_attn.conv1d.weight"
		}
		err := mlxc.Do(func() error {
			return mlxc.Catch(func() {
				s := mlxc.NewScope()
				defer s.Close()
				p := filepath.Join(dir, "model.safetensors")
				ts, meta := mlxc.LoadSafetensors(p)
				if _, ok := ts[stored]; !ok {
					panic(&mlxc.Error{Op: "test", Msg: "no " + stored})
				}
				delete(ts, stored)
				ts["language_model.model.layers.0.linear_attn.extra"] = mlxc.Zeros([]int{2}, mlxc.BFloat16)
				mlxc.Eval(func() []*mlxc.Array {
					var a []*mlxc.Array
					for _, x := range ts {
						a = append(a, x)
					}
					return a
				}()...)
				if err := os.Remove(p); err != nil {
					panic(err)
				}
				mlxc.SaveSafetensors(p, ts, meta)
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		err = mlxc.Do(func() error { _, err := model.Load(dir, model.LoadOptions{}); return err })
		if err == nil {
			t.Fatal("a checkpoint without a conv weight loaded")
		}
		msg := err.Error()
		if strings.Count(msg, "is missing") != 1 || !strings.Contains(msg, "tensor "+conv+" is missing") {
			t.Errorf("layout %d: %v, want one error naming %s", layout, err, conv)
		}
		if !strings.Contains(msg, "linear_attn.extra") {
			t.Errorf("layout %d: %v, want the unexpected tensor named", layout, err)
		}
	}
}
