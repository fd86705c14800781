package modelgen

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Qwen35Layout is the on-disk form of a Qwen3.5 checkpoint.
type Qwen35Layout int

const (
	// Qwen35HF is the raw Hugging Face export: model.language_model.* and lm_head.* names,
	// vision and MTP tensors alongside, conv1d weights [C, 1, K], zero-centred norm weights.
	Qwen35HF Qwen35Layout = iota
	// Qwen35MLX is the mlx-community layout: language_model.* names (mlx-lm's sanitize
	// already applied), conv1d weights [C, K, 1], norm weights shifted by one.
	Qwen35MLX
)

// Qwen35Spec sizes a random Qwen3.5 (dense, hybrid GatedDeltaNet/attention) checkpoint.
type Qwen35Spec struct {
	Hidden, Layers, Interval       int // Interval: every Interval-th layer is full attention
	Heads, KVHeads, HeadDim        int
	LinKeyHeads, LinValueHeads     int
	LinKeyDim, LinValueDim, Kernel int // Kernel: linear_conv_kernel_dim
	Partial                        float64
	Inter, Vocab                   int
	Tied                           bool
	Layout                         Qwen35Layout
	Dtype                          mlxc.Dtype
	Seed                           uint64
	RopeTheta                      float64
	MaxPositions                   int
	EOS                            []int
	// WeightStd is the std of the random matrices (see Qwen3Spec.WeightStd).
	WeightStd float32
	// QuantBits (4 or 8) and QuantGroup quantize every Linear and the embedding whose input
	// width the group divides, the way mlx-lm's converter does.
	QuantBits, QuantGroup int
	// Experts > 0 makes a qwen3_5_moe checkpoint: every layer's MLP is a sparse MoE block
	// of Experts routed experts of width MoEInter, TopK chosen per token, and a shared
	// expert of width SharedInter (mlx-lm always has one).
	Experts, TopK, MoEInter, SharedInter int
	NormTopK                             bool
	// MTP writes a complete multi-token-prediction head (mtpTensors) in the layout's form:
	// raw HF names mtp.* with zero-centred norms and fused experts; in the MLX layout names
	// language_model.mtp.* with norms shifted by one, split experts and the target's
	// quantization (an mlx-community "-MTP" conversion). Without it an HF checkpoint still
	// carries a few stray mtp.* tensors that loaders must drop (hfExtras), and an MLX one
	// none, while both configs declare mtp_num_hidden_layers 1, as published ones do.
	MTP bool
}

// TinyQwen35MoE is TinyQwen35 with an eight-expert, top-2 MoE MLP in every layer.
func TinyQwen35MoE() Qwen35Spec {
	s := TinyQwen35()
	s.Experts, s.TopK, s.MoEInter, s.SharedInter, s.NormTopK = 8, 2, 64, 64, true
	return s
}

// TinyQwen35 is a small but complete hybrid shape: two linear layers then one attention
// layer, repeated; Hv ≠ Hk, Dk ≠ Dv, head_dim ≠ hidden/heads, partial rotary.
func TinyQwen35() Qwen35Spec {
	return Qwen35Spec{Hidden: 64, Layers: 6, Interval: 3, Heads: 4, KVHeads: 2, HeadDim: 32,
		LinKeyHeads: 2, LinValueHeads: 4, LinKeyDim: 16, LinValueDim: 24, Kernel: 4, Partial: 0.25,
		Inter: 128, Vocab: 256, Tied: true, Layout: Qwen35MLX, Dtype: mlxc.BFloat16, Seed: 1,
		RopeTheta: 10000000, MaxPositions: 4096, EOS: []int{2}, WeightStd: 0.08}
}

// Qwen35IsLinear reports whether layer i is a GatedDeltaNet layer (mlx-lm's rule).
func Qwen35IsLinear(i, interval int) bool { return (i+1)%interval != 0 }

func (s Qwen35Spec) textConfig() map[string]any {
	types := make([]string, s.Layers)
	for i := range types {
		types[i] = "full_attention"
		if Qwen35IsLinear(i, s.Interval) {
			types[i] = "linear_attention"
		}
	}
	tc := map[string]any{
		"model_type":              "qwen3_5_text",
		"hidden_size":             s.Hidden,
		"num_hidden_layers":       s.Layers,
		"num_attention_heads":     s.Heads,
		"num_key_value_heads":     s.KVHeads,
		"head_dim":                s.HeadDim,
		"intermediate_size":       s.Inter,
		"vocab_size":              s.Vocab,
		"rms_norm_eps":            1e-6,
		"max_position_embeddings": s.MaxPositions,
		"tie_word_embeddings":     s.Tied,
		"hidden_act":              "silu",
		"attention_bias":          false,
		"attn_output_gate":        true,
		"full_attention_interval": s.Interval,
		"layer_types":             types,
		"linear_num_key_heads":    s.LinKeyHeads,
		"linear_num_value_heads":  s.LinValueHeads,
		"linear_key_head_dim":     s.LinKeyDim,
		"linear_value_head_dim":   s.LinValueDim,
		"linear_conv_kernel_dim":  s.Kernel,
		"mamba_ssm_dtype":         "float32",
		"mtp_num_hidden_layers":   1,
		"rope_parameters": map[string]any{
			"rope_type": "default", "rope_theta": s.RopeTheta, "partial_rotary_factor": s.Partial,
			"mrope_section": []int{2, 1, 1}, "mrope_interleaved": true,
		},
		"dtype": s.Dtype.String(),
	}
	if s.Experts > 0 {
		tc["model_type"] = "qwen3_5_moe_text"
		tc["num_experts"], tc["num_experts_per_tok"] = s.Experts, s.TopK
		tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"] = s.MoEInter, s.SharedInter
		tc["norm_topk_prob"] = s.NormTopK
	}
	if len(s.EOS) > 0 {
		tc["eos_token_id"] = s.EOS[0]
	}
	return tc
}

func (s Qwen35Spec) config() map[string]any {
	cfg := map[string]any{
		"architectures":       []string{"Qwen3_5ForConditionalGeneration"},
		"model_type":          "qwen3_5",
		"text_config":         s.textConfig(),
		"tie_word_embeddings": s.Tied,
		"image_token_id":      s.Vocab - 3,
		"video_token_id":      s.Vocab - 4,
	}
	if s.Layout == Qwen35HF {
		cfg["vision_config"] = map[string]any{
			"model_type": "qwen3_5", "depth": 1, "hidden_size": 8, "num_heads": 2, "patch_size": 2,
			"temporal_patch_size": 2, "in_channels": 3, "out_hidden_size": s.Hidden,
		}
	}
	switch len(s.EOS) {
	case 0:
	case 1:
		cfg["eos_token_id"] = s.EOS[0]
	default:
		cfg["eos_token_id"] = s.EOS
	}
	addQuantization(cfg, s.QuantBits, s.QuantGroup)
	if s.Experts > 0 {
		cfg["architectures"] = []string{"Qwen3_5MoeForConditionalGeneration"}
		cfg["model_type"] = "qwen3_5_moe"
		if s.QuantBits > 0 {
			// mlx-lm's converter records its quant_predicate's per-module choice (the router
			// and the shared expert's gate at 8 bits, group 64) under each module's path.
			q := cfg["quantization"].(map[string]any)
			for i := 0; i < s.Layers; i++ {
				for _, m := range []string{"mlp.gate", "mlp.shared_expert_gate"} {
					q[fmt.Sprintf("language_model.model.layers.%d.%s", i, m)] = map[string]any{"group_size": 64, "bits": 8}
				}
			}
			if s.MTP {
				for _, m := range []string{"mlp.gate", "mlp.shared_expert_gate"} {
					q[s.storedMTPName("mtp.layers.0."+m)] = map[string]any{"group_size": 64, "bits": 8}
				}
			}
		}
	}
	return cfg
}

// q35Kind says how a tensor's random values are drawn and stored.
type q35Kind int

const (
	q35Matrix q35Kind = iota // a Linear or Embedding weight: N(0, std), quantizable
	q35Norm                  // one of the five norm families: zero-centred in HF, +1 in MLX
	q35Gated                 // linear_attn.norm.weight: around 1 in both layouts
	q35Conv                  // depthwise conv weight, drawn [C, K, 1]
	q35ALog                  // A_log, float32 in both layouts
	q35Bias                  // dt_bias
	q35Router                // mlp.gate: wider than the matrices so that routing is decisive
)

type q35Tensor struct {
	name  string // without the layout's prefix: model.* or lm_head.*
	shape []int
	kind  q35Kind
}

func (s Qwen35Spec) tensors() []q35Tensor {
	H, hd := s.Hidden, s.HeadDim
	kd, vd := s.LinKeyHeads*s.LinKeyDim, s.LinValueHeads*s.LinValueDim
	C := 2*kd + vd
	ts := []q35Tensor{{"model.embed_tokens.weight", []int{s.Vocab, H}, q35Matrix}}
	for i := 0; i < s.Layers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		ts = append(ts, q35Tensor{p + "input_layernorm.weight", []int{H}, q35Norm},
			q35Tensor{p + "post_attention_layernorm.weight", []int{H}, q35Norm})
		if Qwen35IsLinear(i, s.Interval) {
			a := p + "linear_attn."
			ts = append(ts,
				q35Tensor{a + "in_proj_qkv.weight", []int{C, H}, q35Matrix},
				q35Tensor{a + "in_proj_z.weight", []int{vd, H}, q35Matrix},
				q35Tensor{a + "in_proj_b.weight", []int{s.LinValueHeads, H}, q35Matrix},
				q35Tensor{a + "in_proj_a.weight", []int{s.LinValueHeads, H}, q35Matrix},
				q35Tensor{a + "conv1d.weight", []int{C, s.Kernel, 1}, q35Conv},
				q35Tensor{a + "dt_bias", []int{s.LinValueHeads}, q35Bias},
				q35Tensor{a + "A_log", []int{s.LinValueHeads}, q35ALog},
				q35Tensor{a + "norm.weight", []int{s.LinValueDim}, q35Gated},
				q35Tensor{a + "out_proj.weight", []int{H, vd}, q35Matrix})
		} else {
			a := p + "self_attn."
			ts = append(ts,
				q35Tensor{a + "q_proj.weight", []int{2 * s.Heads * hd, H}, q35Matrix},
				q35Tensor{a + "k_proj.weight", []int{s.KVHeads * hd, H}, q35Matrix},
				q35Tensor{a + "v_proj.weight", []int{s.KVHeads * hd, H}, q35Matrix},
				q35Tensor{a + "o_proj.weight", []int{H, s.Heads * hd}, q35Matrix},
				q35Tensor{a + "q_norm.weight", []int{hd}, q35Norm},
				q35Tensor{a + "k_norm.weight", []int{hd}, q35Norm})
		}
		if s.Experts > 0 {
			ts = append(ts, s.moeTensors(p+"mlp.")...)
			continue
		}
		ts = append(ts,
			q35Tensor{p + "mlp.gate_proj.weight", []int{s.Inter, H}, q35Matrix},
			q35Tensor{p + "mlp.up_proj.weight", []int{s.Inter, H}, q35Matrix},
			q35Tensor{p + "mlp.down_proj.weight", []int{H, s.Inter}, q35Matrix})
	}
	ts = append(ts, q35Tensor{"model.norm.weight", []int{H}, q35Norm})
	if !s.Tied {
		ts = append(ts, q35Tensor{"lm_head.weight", []int{s.Vocab, H}, q35Matrix})
	}
	return ts
}

// moeTensors are one layer's MoE tensors under prefix p (…mlp.), drawn in the raw HF form:
// the routed experts' gate and up projections fused in experts.gate_up_proj [E, 2·I, H],
// and experts.down_proj [E, H, I] (expertParts splits them for the MLX layout).
func (s Qwen35Spec) moeTensors(p string) []q35Tensor {
	H, E, I, S := s.Hidden, s.Experts, s.MoEInter, s.SharedInter
	ts := []q35Tensor{{p + "gate.weight", []int{E, H}, q35Router}}
	ts = append(ts, q35Tensor{p + "experts.gate_up_proj", []int{E, 2 * I, H}, q35Matrix},
		q35Tensor{p + "experts.down_proj", []int{E, H, I}, q35Matrix})
	return append(ts,
		q35Tensor{p + "shared_expert.gate_proj.weight", []int{S, H}, q35Matrix},
		q35Tensor{p + "shared_expert.up_proj.weight", []int{S, H}, q35Matrix},
		q35Tensor{p + "shared_expert.down_proj.weight", []int{H, S}, q35Matrix},
		q35Tensor{p + "shared_expert_gate.weight", []int{1, H}, q35Matrix})
}

// storedName is a tensor's name in the layout.
func (s Qwen35Spec) storedName(name string) string {
	if s.Layout == Qwen35MLX {
		return "language_model." + name
	}
	if len(name) > len("model.") && name[:len("model.")] == "model." {
		return "model.language_model." + name[len("model."):]
	}
	return name
}

// hfExtras are tensors a raw HF export carries that the text model does not use (the
// vision tower and, unless the spec writes a whole head, a few of the multi-token-prediction
// head's): loaders must drop them.
func (s Qwen35Spec) hfExtras() []q35Tensor {
	H := s.Hidden
	ts := []q35Tensor{
		{"model.visual.patch_embed.proj.weight", []int{8, 3, 2, 2, 2}, q35Matrix},
		{"model.visual.blocks.0.norm1.weight", []int{8}, q35Gated},
		{"model.visual.merger.linear_fc1.weight", []int{H, 8}, q35Matrix},
	}
	if s.MTP {
		return ts
	}
	return append(ts,
		q35Tensor{"mtp.fc.weight", []int{H, 2 * H}, q35Matrix},
		q35Tensor{"mtp.norm.weight", []int{H}, q35Norm},
		q35Tensor{"mtp.layers.0.input_layernorm.weight", []int{H}, q35Norm},
		q35Tensor{"mtp.layers.0.mlp.gate_proj.weight", []int{s.Inter, H}, q35Matrix})
}

// mtpTensors is the whole multi-token-prediction head, in the raw HF names: fc over the
// concatenated normed embedding and hidden, its two pre-fc norms, one full-attention
// decoder layer of the target's shapes (gated q_proj; the MoE MLP in a qwen3_5_moe
// checkpoint) and the head's final norm.
func (s Qwen35Spec) mtpTensors() []q35Tensor {
	H, hd := s.Hidden, s.HeadDim
	p := "mtp.layers.0."
	a := p + "self_attn."
	ts := []q35Tensor{
		{"mtp.fc.weight", []int{H, 2 * H}, q35Matrix},
		{"mtp.pre_fc_norm_embedding.weight", []int{H}, q35Norm},
		{"mtp.pre_fc_norm_hidden.weight", []int{H}, q35Norm},
		{p + "input_layernorm.weight", []int{H}, q35Norm},
		{p + "post_attention_layernorm.weight", []int{H}, q35Norm},
		{a + "q_proj.weight", []int{2 * s.Heads * hd, H}, q35Matrix},
		{a + "k_proj.weight", []int{s.KVHeads * hd, H}, q35Matrix},
		{a + "v_proj.weight", []int{s.KVHeads * hd, H}, q35Matrix},
		{a + "o_proj.weight", []int{H, s.Heads * hd}, q35Matrix},
		{a + "q_norm.weight", []int{hd}, q35Norm},
		{a + "k_norm.weight", []int{hd}, q35Norm},
		{"mtp.norm.weight", []int{H}, q35Norm},
	}
	if s.Experts > 0 {
		return append(ts, s.moeTensors(p+"mlp.")...)
	}
	return append(ts,
		q35Tensor{p + "mlp.gate_proj.weight", []int{s.Inter, H}, q35Matrix},
		q35Tensor{p + "mlp.up_proj.weight", []int{s.Inter, H}, q35Matrix},
		q35Tensor{p + "mlp.down_proj.weight", []int{H, s.Inter}, q35Matrix})
}

// storedMTPName is an MTP tensor's name (given as mtp.*) in the layout: as it is in a raw
// HF export, under language_model. in the MLX layout.
func (s Qwen35Spec) storedMTPName(name string) string {
	if s.Layout == Qwen35MLX {
		return "language_model." + name
	}
	return name
}

// WriteQwen35 writes the checkpoint into dir (created). The same spec in either layout
// holds the same model after mlx-lm's sanitize: the MLX layout's norms are the HF ones
// plus one, rounded in the stored dtype, and its conv weights the HF ones with the axes
// moved. It must run on the MLX thread.
func WriteQwen35(dir string, s Qwen35Spec) error {
	if s.Dtype == 0 {
		s.Dtype = mlxc.BFloat16
	}
	if s.WeightStd == 0 {
		s.WeightStd = 0.05
	}
	if s.Interval <= 0 {
		return fmt.Errorf("modelgen: full-attention interval must be positive, got %d", s.Interval)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), s.config()); err != nil {
		return err
	}
	return mlxc.Catch(func() {
		sc := mlxc.NewScope()
		defer sc.Close()
		out := map[string]*mlxc.Array{}
		defer func() {
			for _, a := range out {
				a.Free() // drawOne detached them
			}
		}()
		s.draw(out, s.tensors(), s.Seed, s.storedName)
		if s.Layout == Qwen35HF {
			s.draw(out, s.hfExtras(), s.Seed+7919, func(n string) string { return n })
		}
		if s.MTP {
			// A seed of its own: the target's weights are the same with or without a head.
			s.draw(out, s.mtpTensors(), s.Seed+104729, s.storedMTPName)
		}
		mlxc.SaveSafetensors(filepath.Join(dir, "model.safetensors"), out, map[string]string{"format": "mlx"})
	})
}

// draw puts seeded random values for ts into out under the names stored gives.
func (s Qwen35Spec) draw(out map[string]*mlxc.Array, ts []q35Tensor, seed uint64, stored func(string) string) {
	dt := s.Dtype
	keys := mlxc.RandomSplit(mlxc.RandomKey(seed), len(ts))
	for i, t := range ts {
		s.drawOne(out, t, mlxc.Reshape(mlxc.SliceAxis(keys, 0, i, i+1), 2), dt, stored)
	}
}

// drawOne draws tensor t with key k into out. Its intermediates (the float32 draw, the
// cast, the halves of a fused stack) die with its own scope once the stored arrays,
// detached from it, are evaluated: a large model's draws would not all fit in memory at
// once. The caller frees what out holds.
func (s Qwen35Spec) drawOne(out map[string]*mlxc.Array, t q35Tensor, k *mlxc.Array, dt mlxc.Dtype, stored func(string) string) {
	sc := mlxc.NewScope()
	defer sc.Close()
	name := stored(t.name)
	{
		var a *mlxc.Array
		switch t.kind {
		case q35Matrix:
			a = normalIn(t.shape, s.WeightStd, k, dt)
		case q35Norm:
			a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, 0.1, k), dt)
			if s.Layout == Qwen35MLX {
				a = mlxc.Add(a, mlxc.Scalar(1, dt)) // mlx-lm's sanitize, in the stored dtype
			}
		case q35Gated:
			a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 1, 0.1, k), dt)
		case q35Conv:
			a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, 0.3, k), dt)
			if s.Layout == Qwen35HF {
				a = mlxc.Contiguous(mlxc.SwapAxes(a, 1, 2)) // PyTorch's [C, 1, K]
			}
		case q35ALog:
			a = mlxc.Uniform(-1, 2, t.shape, mlxc.Float32, k)
		case q35Bias:
			a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, 0.5, k), dt)
		case q35Router:
			a = mlxc.AsType(mlxc.Normal(t.shape, mlxc.Float32, 0, 3/float32(math.Sqrt(float64(s.Hidden))), k), dt)
		}
		for _, part := range s.expertParts(name, a) {
			for _, key := range s.store(out, part.name, part.a, quantizable(t.kind) && !s.unquantized(t.name)) {
				out[key].Detach()
			}
		}
	}
}

type namedArray struct {
	name string
	a    *mlxc.Array
}

// expertParts is how the MLX layout stores a drawn fused expert tensor: gate_up_proj
// [E, 2·I, H] as switch_mlp.gate_proj and up_proj (its halves along the output axis, as
// mlx-lm's sanitize splits it), down_proj renamed; anything else is stored as drawn.
func (s Qwen35Spec) expertParts(name string, a *mlxc.Array) []namedArray {
	if s.Layout != Qwen35MLX {
		return []namedArray{{name, a}}
	}
	if base, ok := strings.CutSuffix(name, "experts.gate_up_proj"); ok {
		I := a.Dim(1) / 2
		return []namedArray{{base + "switch_mlp.gate_proj.weight", mlxc.SliceAxis(a, 1, 0, I)},
			{base + "switch_mlp.up_proj.weight", mlxc.SliceAxis(a, 1, I, 2*I)}}
	}
	if base, ok := strings.CutSuffix(name, "experts.down_proj"); ok {
		return []namedArray{{base + "switch_mlp.down_proj.weight", a}}
	}
	return []namedArray{{name, a}}
}

func quantizable(k q35Kind) bool { return k == q35Matrix || k == q35Router }

// store puts a into out under name (returning the names it wrote), quantized (with its scales and biases) when the spec
// quantizes and the tensor is a .weight whose input width the group divides.
func (s Qwen35Spec) store(out map[string]*mlxc.Array, name string, a *mlxc.Array, canQuantize bool) []string {
	bits, group := s.QuantBits, s.QuantGroup
	if s.eightBit(name) {
		bits, group = 8, 64
	}
	base, isWeight := strings.CutSuffix(name, ".weight")
	if bits > 0 && canQuantize && isWeight && (a.Ndim() == 2 || a.Ndim() == 3) && a.Dim(-1)%group == 0 {
		q := quantizeInSlices(a, group, bits)
		out[name], out[base+".scales"], out[base+".biases"] = q.W, q.Scales, q.Biases
		// One tensor at a time: the float32 draws of a large model's expert stacks would
		// not all fit in memory at once.
		mlxc.Eval(q.W, q.Scales, q.Biases)
		return []string{name, base + ".scales", base + ".biases"}
	}
	out[name] = mlxc.Contiguous(a)
	mlxc.Eval(out[name])
	return []string{name}
}

// eightBit reports whether a quantized MoE checkpoint stores tensor name at 8 bits, group
// 64 (mlx-lm's quant_predicate for the router and the shared expert's gate).
func (s Qwen35Spec) eightBit(name string) bool {
	if s.Experts == 0 || s.QuantBits == 0 {
		return false
	}
	return strings.HasSuffix(name, "mlp.gate.weight") || strings.HasSuffix(name, "shared_expert_gate.weight")
}

// unquantized reports whether a tensor is stored in float even in a quantized checkpoint:
// the vision tower's and stray MTP tensors, which mlx-lm's converter drops; a whole MTP head
// (spec.MTP) is quantized like the target, as the "-MTP-4bit" conversions store it.
func (s Qwen35Spec) unquantized(name string) bool {
	if strings.HasPrefix(name, "model.visual.") {
		return true
	}
	return strings.HasPrefix(name, "mtp.") && !s.MTP
}

// normalIn draws N(0, std) values of shape in dtype dt. A tensor of 2^28 elements or more
// (a large model's expert stack) is drawn in slices along its first axis, each from its
// own key and cast before they are joined: no float32 buffer of 2^31 bytes or more is
// made, which MLX's CUDA allocator refuses.
func normalIn(shape []int, std float32, key *mlxc.Array, dt mlxc.Dtype) *mlxc.Array {
	n := 1
	for _, d := range shape {
		n *= d
	}
	const limit = 1 << 28
	if n < limit || len(shape) < 2 || shape[0] < 2 {
		return mlxc.AsType(mlxc.Normal(shape, mlxc.Float32, 0, std, key), dt)
	}
	per := max(1, limit/(n/shape[0])) // rows of the first axis per slice
	slices := (shape[0] + per - 1) / per
	keys := mlxc.RandomSplit(key, slices)
	parts := make([]*mlxc.Array, slices)
	for i := range parts {
		sh := append([]int{min(per, shape[0]-i*per)}, shape[1:]...)
		k := mlxc.Reshape(mlxc.SliceAxis(keys, 0, i, i+1), 2)
		parts[i] = mlxc.AsType(mlxc.Normal(sh, mlxc.Float32, 0, std, k), dt)
		mlxc.Eval(parts[i])
	}
	return mlxc.Concatenate(parts, 0)
}

// quantizeInSlices quantizes a (affine, along its last axis) like mlxc.Quantize; a large
// matrix or stack goes in slices along its first axis (the result is the same, each row being
// quantized on its own), so that no intermediate reaches the sizes MLX's CUDA allocator
// refuses.
func quantizeInSlices(a *mlxc.Array, group, bits int) mlxc.Quantized {
	return quantizeInSlicesOf(a, group, bits, 1<<27)
}

// quantizeInSlicesOf is quantizeInSlices with slices of about limit elements.
func quantizeInSlicesOf(a *mlxc.Array, group, bits, limit int) mlxc.Quantized {
	if a.Ndim() < 2 || a.Size() < limit || a.Dim(0) < 2 {
		return mlxc.Quantize(mlxc.Contiguous(a), group, bits, "affine")
	}
	per := max(1, limit/(a.Size()/a.Dim(0)))
	var ws, ss, bs []*mlxc.Array
	for lo := 0; lo < a.Dim(0); lo += per {
		q := mlxc.Quantize(mlxc.Contiguous(mlxc.SliceAxis(a, 0, lo, min(lo+per, a.Dim(0)))), group, bits, "affine")
		mlxc.Eval(q.W, q.Scales, q.Biases)
		ws, ss, bs = append(ws, q.W), append(ss, q.Scales), append(bs, q.Biases)
	}
	return mlxc.Quantized{W: mlxc.Concatenate(ws, 0), Scales: mlxc.Concatenate(ss, 0), Biases: mlxc.Concatenate(bs, 0),
		GroupSize: group, Bits: bits, Mode: "affine"}
}
