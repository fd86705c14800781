package modelgen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Qwen3Spec sizes a random Qwen3 checkpoint.
type Qwen3Spec struct {
	Hidden, Layers, Heads, KVHeads, HeadDim, Inter, Vocab int
	Tied                                                  bool
	Shards                                                int  // 0 or 1: single model.safetensors
	NoIndex                                               bool // sharded without model.safetensors.index.json
	Dtype                                                 mlxc.Dtype
	Seed                                                  uint64
	RopeTheta                                             float64
	MaxPositions                                          int
	EOS                                                   []int
	// WeightStd is the std of the random matrices; larger values make logits decisive
	// (no near-ties between the top tokens), which exact-equality tests need.
	WeightStd float32
	// RopeScaling is written as config.json's rope_scaling (nil: null).
	RopeScaling map[string]any
	// Quantize (bits 4 or 8) writes the mlx-community layout directly.
	QuantBits, QuantGroup int
}

// TinyQwen3 is a small but complete shape (GQA, head_dim ≠ hidden/heads).
func TinyQwen3() Qwen3Spec {
	return Qwen3Spec{Hidden: 64, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 32, Inter: 128, Vocab: 256,
		Tied: true, Dtype: mlxc.BFloat16, Seed: 1, RopeTheta: 1000000, MaxPositions: 4096, EOS: []int{2}, WeightStd: 0.08}
}

func (s Qwen3Spec) config() map[string]any {
	cfg := map[string]any{
		"architectures":           []string{"Qwen3ForCausalLM"},
		"model_type":              "qwen3",
		"hidden_size":             s.Hidden,
		"num_hidden_layers":       s.Layers,
		"num_attention_heads":     s.Heads,
		"num_key_value_heads":     s.KVHeads,
		"head_dim":                s.HeadDim,
		"intermediate_size":       s.Inter,
		"vocab_size":              s.Vocab,
		"rms_norm_eps":            1e-6,
		"rope_theta":              s.RopeTheta,
		"rope_scaling":            s.RopeScaling,
		"max_position_embeddings": s.MaxPositions,
		"tie_word_embeddings":     s.Tied,
		"hidden_act":              "silu",
		"attention_bias":          false,
		"torch_dtype":             s.Dtype.String(),
		"bos_token_id":            nil,
	}
	if len(s.EOS) == 1 {
		cfg["eos_token_id"] = s.EOS[0]
	} else if len(s.EOS) > 1 {
		cfg["eos_token_id"] = s.EOS
	}
	addQuantization(cfg, s.QuantBits, s.QuantGroup)
	return cfg
}

// addQuantization records affine quantization in a config.json the way mlx-lm writes it:
// under both "quantization" and "quantization_config" (nothing when bits is 0).
func addQuantization(cfg map[string]any, bits, group int) {
	if bits > 0 {
		q := map[string]any{"group_size": group, "bits": bits, "mode": "affine"}
		cfg["quantization"] = q
		cfg["quantization_config"] = q
	}
}

type tensorSpec struct {
	name  string
	shape []int
	norm  bool // RMSNorm weight: around 1
	quant bool // a Linear/Embedding weight that quantization applies to
}

func (s Qwen3Spec) tensors() []tensorSpec {
	H, hd := s.Hidden, s.HeadDim
	ts := []tensorSpec{{name: "model.embed_tokens.weight", shape: []int{s.Vocab, H}, quant: true}}
	for i := 0; i < s.Layers; i++ {
		ts = append(ts, decoderLayer(fmt.Sprintf("model.layers.%d.", i), H, hd, s.Heads, s.KVHeads, s.Inter)...)
	}
	ts = append(ts, tensorSpec{name: "model.norm.weight", shape: []int{H}, norm: true})
	if !s.Tied {
		ts = append(ts, tensorSpec{name: "lm_head.weight", shape: []int{s.Vocab, H}, quant: true})
	}
	return ts
}

// WriteQwen3 writes the checkpoint into dir (created). It must run on the MLX thread.
func WriteQwen3(dir string, s Qwen3Spec) error {
	if s.Dtype == 0 {
		s.Dtype = mlxc.BFloat16
	}
	if s.WeightStd == 0 {
		s.WeightStd = 0.05
	}
	return writeCheckpoint(dir, s.config(), s.tensors(), s.Seed, s.Dtype, s.WeightStd, s.Shards, s.NoIndex, s.QuantBits, s.QuantGroup)
}

func writeCheckpoint(dir string, cfg map[string]any, ts []tensorSpec, seed uint64, dt mlxc.Dtype, std float32, shards int, noIndex bool, qbits, qgroup int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), cfg); err != nil {
		return err
	}
	if shards < 1 {
		shards = 1
	}
	return mlxc.Catch(func() {
		s := mlxc.NewScope()
		defer s.Close()
		key := mlxc.RandomKey(seed)
		keys := mlxc.RandomSplit(key, len(ts))
		parts := make([]map[string]*mlxc.Array, shards)
		for i := range parts {
			parts[i] = map[string]*mlxc.Array{}
		}
		for i, t := range ts {
			k := mlxc.Reshape(mlxc.SliceAxis(keys, 0, i, i+1), 2)
			var a *mlxc.Array
			if t.norm {
				a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 1, 0.1, k), dt)
			} else {
				a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, std, k), dt)
			}
			part := parts[i*shards/len(ts)]
			base := t.name[:len(t.name)-len(".weight")]
			if qbits > 0 && t.quant && t.shape[len(t.shape)-1]%qgroup == 0 {
				q := mlxc.Quantize(a, qgroup, qbits, "affine")
				part[t.name] = q.W
				part[base+".scales"] = q.Scales
				part[base+".biases"] = q.Biases
			} else {
				part[t.name] = a
			}
		}
		meta := map[string]string{"format": "mlx"}
		if shards == 1 {
			mlxc.SaveSafetensors(filepath.Join(dir, "model.safetensors"), parts[0], meta)
			return
		}
		weightMap := map[string]string{}
		for i, p := range parts {
			name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, shards)
			mlxc.SaveSafetensors(filepath.Join(dir, name), p, meta)
			for k := range p {
				weightMap[k] = name
			}
		}
		if !noIndex {
			idx := map[string]any{"metadata": map[string]any{}, "weight_map": sortedMap(weightMap)}
			if err := writeJSON(filepath.Join(dir, "model.safetensors.index.json"), idx); err != nil {
				panic(&mlxc.Error{Op: "write index", Msg: err.Error()})
			}
		}
	})
}

func sortedMap(m map[string]string) map[string]string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string]string, len(m))
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// decoderLayer lists one Qwen3-shaped decoder layer's tensors (targets and drafters share it).
func decoderLayer(p string, H, hd, heads, kvHeads, inter int) []tensorSpec {
	return []tensorSpec{
		{name: p + "input_layernorm.weight", shape: []int{H}, norm: true},
		{name: p + "post_attention_layernorm.weight", shape: []int{H}, norm: true},
		{name: p + "self_attn.q_proj.weight", shape: []int{heads * hd, H}, quant: true},
		{name: p + "self_attn.k_proj.weight", shape: []int{kvHeads * hd, H}, quant: true},
		{name: p + "self_attn.v_proj.weight", shape: []int{kvHeads * hd, H}, quant: true},
		{name: p + "self_attn.o_proj.weight", shape: []int{H, heads * hd}, quant: true},
		{name: p + "self_attn.q_norm.weight", shape: []int{hd}, norm: true},
		{name: p + "self_attn.k_norm.weight", shape: []int{hd}, norm: true},
		{name: p + "mlp.gate_proj.weight", shape: []int{inter, H}, quant: true},
		{name: p + "mlp.up_proj.weight", shape: []int{inter, H}, quant: true},
		{name: p + "mlp.down_proj.weight", shape: []int{H, inter}, quant: true},
	}
}
