package modelgen

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

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
	// Experts > 0 makes a qwen3_moe checkpoint: the MLP of each sparse layer (see
	// SparseLayer) is a MoE block of Experts routed experts of width MoEInter, TopK chosen
	// per token and no shared expert; the other layers keep the dense MLP of Inter.
	Experts, TopK, MoEInter int
	NormTopK                bool
	SparseStep              int   // decoder_sparse_step (0: 1, every layer)
	MLPOnly                 []int // mlp_only_layers: dense whatever the step says
	// PerExpert stores the routed experts the way Hugging Face exports do, one tensor per
	// expert (mlp.experts.{e}.{gate,up,down}_proj.weight); false: mlx-community's stacked
	// mlp.switch_mlp.* (the same values).
	PerExpert bool
}

// TinyQwen3MoE is TinyQwen3 with an eight-expert, top-2 MoE MLP in every layer but the
// first (mlp_only_layers), stored per expert as Hugging Face exports it.
func TinyQwen3MoE() Qwen3Spec {
	s := TinyQwen3()
	s.Experts, s.TopK, s.MoEInter, s.NormTopK, s.MLPOnly, s.PerExpert = 8, 2, 64, true, []int{0}, true
	return s
}

// SparseLayer reports whether layer i has the MoE MLP (mlx-lm's qwen3_moe rule).
func (s Qwen3Spec) SparseLayer(i int) bool {
	step := max(s.SparseStep, 1)
	for _, d := range s.MLPOnly {
		if d == i {
			return false
		}
	}
	return s.Experts > 0 && (i+1)%step == 0
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
	if s.Experts > 0 {
		s.moeConfig(cfg)
	}
	return cfg
}

// moeConfig adds the qwen3_moe keys to cfg and, when quantized, the per-module override
// mlx-lm's converter records for each router (its quant_predicate: 8 bits, group 64).
func (s Qwen3Spec) moeConfig(cfg map[string]any) {
	cfg["architectures"] = []string{"Qwen3MoeForCausalLM"}
	cfg["model_type"] = "qwen3_moe"
	cfg["num_experts"] = s.Experts
	cfg["num_experts_per_tok"] = s.TopK
	cfg["moe_intermediate_size"] = s.MoEInter
	cfg["norm_topk_prob"] = s.NormTopK
	cfg["decoder_sparse_step"] = max(s.SparseStep, 1)
	cfg["mlp_only_layers"] = append([]int{}, s.MLPOnly...)
	if s.QuantBits > 0 {
		q := cfg["quantization"].(map[string]any)
		for i := 0; i < s.Layers; i++ {
			if s.SparseLayer(i) {
				q[fmt.Sprintf("model.layers.%d.mlp.gate", i)] = map[string]any{"group_size": 64, "bits": 8}
			}
		}
	}
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
	// router: a MoE router, drawn wider than the matrices so that routing is decisive and
	// quantized at 8 bits, group 64 (mlx-lm's quant_predicate for mlp.gate).
	router bool
	// perExpert: a stacked expert tensor [E, out, in] stored as E tensors named
	// name's prefix + "experts.{e}." + part (see expertName).
	perExpert bool
	// bare: stored without its ".weight" suffix unless quantized (DFlash2's codebooks).
	bare bool
}

func (s Qwen3Spec) tensors() []tensorSpec {
	H, hd := s.Hidden, s.HeadDim
	ts := []tensorSpec{{name: "model.embed_tokens.weight", shape: []int{s.Vocab, H}, quant: true}}
	for i := 0; i < s.Layers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		layer := decoderLayer(p, H, hd, s.Heads, s.KVHeads, s.Inter)
		if s.SparseLayer(i) {
			layer = append(layer[:len(layer)-3], s.moeTensors(p+"mlp.")...)
		}
		ts = append(ts, layer...)
	}
	ts = append(ts, tensorSpec{name: "model.norm.weight", shape: []int{H}, norm: true})
	if !s.Tied {
		ts = append(ts, tensorSpec{name: "lm_head.weight", shape: []int{s.Vocab, H}, quant: true})
	}
	return ts
}

// moeTensors are one sparse layer's MLP tensors under prefix p (…mlp.): the router and
// the stacked experts, in the mlx-community names (per expert in the HF layout).
func (s Qwen3Spec) moeTensors(p string) []tensorSpec {
	H, E, I := s.Hidden, s.Experts, s.MoEInter
	ts := []tensorSpec{{name: p + "gate.weight", shape: []int{E, H}, quant: true, router: true}}
	for _, x := range []struct {
		part    string
		out, in int
	}{{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}} {
		ts = append(ts, tensorSpec{name: p + "switch_mlp." + x.part + ".weight", shape: []int{E, x.out, x.in}, quant: true, perExpert: s.PerExpert})
	}
	return ts
}

// expertName is the HF per-expert name of expert e of a stacked tensor
// (…mlp.switch_mlp.gate_proj.weight → …mlp.experts.{e}.gate_proj.weight).
func expertName(stacked string, e int) string {
	base, part, _ := strings.Cut(stacked, "switch_mlp.")
	return fmt.Sprintf("%sexperts.%d.%s", base, e, part)
}

// WriteQwen3 writes the checkpoint into dir (created). It must run on the MLX thread.
func WriteQwen3(dir string, s Qwen3Spec) error {
	if s.Dtype == 0 {
		s.Dtype = mlxc.BFloat16
	}
	if s.WeightStd == 0 {
		s.WeightStd = 0.05
	}
	if s.PerExpert && s.QuantBits > 0 {
		return fmt.Errorf("modelgen: a per-expert (Hugging Face) qwen3_moe checkpoint is not quantized; quantize the stacked layout")
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
			switch {
			case t.norm:
				a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 1, 0.1, k), dt)
			case t.router:
				a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, 3/float32(math.Sqrt(float64(t.shape[1]))), k), dt)
			default:
				a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, std, k), dt)
			}
			part := parts[i*shards/len(ts)]
			if t.perExpert {
				// The HF export's experts are never quantized (a converter stacks them first).
				for e := 0; e < t.shape[0]; e++ {
					part[expertName(t.name, e)] = mlxc.Contiguous(mlxc.Reshape(mlxc.SliceAxis(a, 0, e, e+1), t.shape[1:]...))
				}
				continue
			}
			bits, group := qbits, qgroup
			if t.router {
				bits, group = 8, 64
			}
			base := t.name[:len(t.name)-len(".weight")]
			if qbits > 0 && t.quant && t.shape[len(t.shape)-1]%group == 0 {
				q := mlxc.Quantize(a, group, bits, "affine")
				part[t.name] = q.W
				part[base+".scales"] = q.Scales
				part[base+".biases"] = q.Biases
			} else if t.bare {
				part[base] = a
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
