package modelgen_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// Every layout and precision WriteQwen35 writes loads in mlx-lm strictly: no tensor
// missing, none left over, every shape what mlx-lm's modules (after its sanitize and its
// quantization rule) expect.
func TestQwen35LoadsInMLXLM(t *testing.T) {
	py := reftest.Python(t)
	script := filepath.Join(reftest.RepoRoot(), "model", "qwen35", "testdata", "mlxlm_ref.py")
	cases := []struct {
		name string
		mod  func(*modelgen.Qwen35Spec)
	}{
		{"hf-bf16-tied", func(s *modelgen.Qwen35Spec) { s.Layout = modelgen.Qwen35HF }},
		{"hf-bf16-untied", func(s *modelgen.Qwen35Spec) { s.Layout = modelgen.Qwen35HF; s.Tied = false }},
		{"mlx-bf16-untied", func(s *modelgen.Qwen35Spec) { s.Tied = false }},
		{"mlx-4bit-tied", func(s *modelgen.Qwen35Spec) { s.QuantBits, s.QuantGroup = 4, 64 }},
		{"mlx-8bit-untied", func(s *modelgen.Qwen35Spec) { s.Tied = false; s.QuantBits, s.QuantGroup = 8, 32 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35()
			tc.mod(&spec)
			dir := t.TempDir()
			if err := mlxc.Do(func() error { return modelgen.WriteQwen35(dir, spec) }); err != nil {
				t.Fatal(err)
			}
			if spec.Layout == modelgen.Qwen35HF {
				b, err := os.ReadFile(filepath.Join(dir, "config.json"))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(b), "vision_config") {
					t.Error("the HF layout's config.json has no vision_config")
				}
			}
			if out := reftest.Run(t, py, script, "load", dir); !strings.HasPrefix(out, "ok") {
				t.Errorf("mlx-lm load: %s", out)
			}
		})
	}
}

// With MTP set, WriteQwen35 writes the whole head: the 15 tensors of a dense head (fc, two
// pre-fc norms, a gated attention layer with its dense MLP, the final norm) or the MoE
// layer's, under mtp.* in the HF layout and language_model.mtp.* in the MLX one, quantized
// with the target in the MLX layout (the router and shared expert gate at 8 bits), and the
// checkpoint still loads in mlx-lm, which drops the head.
func TestQwen35WritesMTPHead(t *testing.T) {
	py := reftest.Python(t)
	script := filepath.Join(reftest.RepoRoot(), "model", "qwen35", "testdata", "mlxlm_ref.py")
	dense := []string{"fc.weight", "layers.0.input_layernorm.weight", "layers.0.mlp.down_proj.weight",
		"layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.post_attention_layernorm.weight",
		"layers.0.self_attn.k_norm.weight", "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.o_proj.weight",
		"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.v_proj.weight",
		"norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight"}
	cases := []struct {
		name string
		mod  func(*modelgen.Qwen35Spec)
		moe  bool
		want []string // without the layout's prefix
	}{
		{"hf-bf16-dense", func(s *modelgen.Qwen35Spec) { s.Layout = modelgen.Qwen35HF }, false, dense},
		{"mlx-f32-dense", func(s *modelgen.Qwen35Spec) { s.Dtype = mlxc.Float32 }, false, dense},
		{"mlx-4bit-dense", func(s *modelgen.Qwen35Spec) { s.QuantBits, s.QuantGroup = 4, 64 }, false,
			withQuant(dense, "fc", "layers.0.mlp.down_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
				"layers.0.self_attn.k_proj", "layers.0.self_attn.o_proj", "layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj")},
		{"hf-bf16-moe", func(s *modelgen.Qwen35Spec) { s.Layout = modelgen.Qwen35HF }, true, moeHead("experts.gate_up_proj", "experts.down_proj")},
		{"mlx-8bit-moe", func(s *modelgen.Qwen35Spec) { s.QuantBits, s.QuantGroup = 8, 32 }, true,
			withQuant(moeHead("switch_mlp.gate_proj.weight", "switch_mlp.up_proj.weight", "switch_mlp.down_proj.weight"),
				"fc", "layers.0.mlp.gate", "layers.0.mlp.shared_expert.down_proj", "layers.0.mlp.shared_expert.gate_proj",
				"layers.0.mlp.shared_expert.up_proj", "layers.0.mlp.shared_expert_gate", "layers.0.mlp.switch_mlp.down_proj",
				"layers.0.mlp.switch_mlp.gate_proj", "layers.0.mlp.switch_mlp.up_proj", "layers.0.self_attn.k_proj",
				"layers.0.self_attn.o_proj", "layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35()
			if tc.moe {
				spec = modelgen.TinyQwen35MoE()
			}
			spec.MTP = true
			tc.mod(&spec)
			dir := t.TempDir()
			if err := mlxc.Do(func() error { return modelgen.WriteQwen35(dir, spec) }); err != nil {
				t.Fatal(err)
			}
			h, err := model.ReadSafetensorsHeader(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			pre := "mtp."
			if spec.Layout == modelgen.Qwen35MLX {
				pre = "language_model.mtp."
			}
			var got []string
			for name := range h.Tensors {
				if rest, ok := strings.CutPrefix(name, pre); ok {
					got = append(got, rest)
				} else if strings.Contains(name, "mtp.") {
					t.Errorf("tensor %s is outside %s", name, pre)
				}
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("MTP tensors (-want +got):\n%s", diff)
			}
			if spec.QuantBits > 0 && tc.moe {
				if b := h.Tensors[pre+"layers.0.mlp.gate.weight"].Shape; b[1] != spec.Hidden*8/32 {
					t.Errorf("the head's router is stored %v, want 8 bits", b)
				}
			}
			if out := reftest.Run(t, py, script, "load", dir); !strings.HasPrefix(out, "ok") {
				t.Errorf("mlx-lm load: %s", out)
			}
		})
	}
}

// moeHead is the MoE head's tensor names with the routed experts' names given.
func moeHead(experts ...string) []string {
	out := []string{"fc.weight", "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight",
		"layers.0.self_attn.k_norm.weight", "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.o_proj.weight",
		"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.v_proj.weight",
		"norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight",
		"layers.0.mlp.gate.weight", "layers.0.mlp.shared_expert.gate_proj.weight", "layers.0.mlp.shared_expert.up_proj.weight",
		"layers.0.mlp.shared_expert.down_proj.weight", "layers.0.mlp.shared_expert_gate.weight"}
	for _, e := range experts {
		out = append(out, "layers.0.mlp."+e)
	}
	return out
}

// withQuant adds the scales and biases of the quantized modules to names.
func withQuant(names []string, modules ...string) []string {
	out := append([]string{}, names...)
	for _, m := range modules {
		out = append(out, m+".scales", m+".biases")
	}
	return out
}
