package modelgen

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// DrafterSpec sizes a random DFlash drafter in z-lab's layout (no embedding, no head).
type DrafterSpec struct {
	Hidden, Layers, Heads, KVHeads, HeadDim, Inter, Vocab int
	BlockSize, MaskTokenID                                int
	TargetLayerIDs                                        []int
	NumTargetLayers                                       int
	Dtype                                                 mlxc.Dtype
	Seed                                                  uint64
	RopeTheta                                             float64
	WeightStd                                             float32
	// QuantBits/QuantGroup (e.g. 4/64) write an affine-quantized drafter.
	QuantBits, QuantGroup int
	// LayerTypes ("full_attention" or "sliding_attention" per layer; nil: none written)
	// and SlidingWindow, the window of the sliding layers.
	LayerTypes    []string
	SlidingWindow int
}

// DrafterFor sizes a small drafter for a target spec.
func DrafterFor(t Qwen3Spec, layers int) DrafterSpec {
	ids := []int{0}
	if t.Layers > 1 {
		ids = []int{0, t.Layers - 1}
	}
	return DrafterSpec{Hidden: t.Hidden, Layers: layers, Heads: t.Heads, KVHeads: t.KVHeads, HeadDim: t.HeadDim,
		Inter: t.Inter, Vocab: t.Vocab, BlockSize: 16, MaskTokenID: t.Vocab - 1, TargetLayerIDs: ids,
		NumTargetLayers: t.Layers, Dtype: t.Dtype, Seed: t.Seed + 1000, RopeTheta: t.RopeTheta, WeightStd: t.WeightStd}
}

// DrafterForQwen35 sizes a small drafter for a Qwen3.5 target: its hidden size and
// vocabulary, attention heads like its full-attention layers', and taps spread over its
// layers the way z-lab's drafters pick them (from 1 to N−3).
func DrafterForQwen35(t Qwen35Spec, layers int) DrafterSpec {
	return DrafterSpec{Hidden: t.Hidden, Layers: layers, Heads: t.Heads, KVHeads: t.KVHeads, HeadDim: t.HeadDim,
		Inter: t.Inter, Vocab: t.Vocab, BlockSize: 16, MaskTokenID: t.Vocab - 1, TargetLayerIDs: spreadLayerIDs(t.Layers, layers),
		NumTargetLayers: t.Layers, Dtype: t.Dtype, Seed: t.Seed + 1000, RopeTheta: t.RopeTheta, WeightStd: t.WeightStd}
}

// spreadLayerIDs picks n target layers of N: evenly from 1 to N−3 rounded half to even
// (N/2 for one), or all layers spread over what there is when N is too small for that.
func spreadLayerIDs(N, n int) []int {
	if n == 1 {
		return []int{N / 2}
	}
	lo, hi := 1, N-3
	if hi <= lo {
		lo, hi = 0, N-1
	}
	ids := make([]int, n)
	for i := range ids {
		ids[i] = int(math.RoundToEven(float64(lo) + float64(i)*float64(hi-lo)/float64(n-1)))
	}
	return ids
}

func (s DrafterSpec) config() map[string]any {
	cfg := s.baseConfig()
	if s.LayerTypes != nil {
		cfg["layer_types"] = s.LayerTypes
		cfg["sliding_window"] = s.SlidingWindow
	}
	addQuantization(cfg, s.QuantBits, s.QuantGroup)
	return cfg
}

func (s DrafterSpec) baseConfig() map[string]any {
	return map[string]any{
		"architectures":           []string{"DFlashDraftModel"},
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
		"rope_scaling":            nil,
		"max_position_embeddings": 40960,
		"tie_word_embeddings":     false,
		"attention_bias":          false,
		"block_size":              s.BlockSize,
		"num_target_layers":       s.NumTargetLayers,
		"torch_dtype":             s.Dtype.String(),
		"dflash_config": map[string]any{
			"mask_token_id":    s.MaskTokenID,
			"target_layer_ids": s.TargetLayerIDs,
		},
	}
}

func (s DrafterSpec) tensors() []tensorSpec {
	H, hd := s.Hidden, s.HeadDim
	ts := []tensorSpec{
		{name: "fc.weight", shape: []int{H, len(s.TargetLayerIDs) * H}, quant: true},
		{name: "hidden_norm.weight", shape: []int{H}, norm: true},
		{name: "norm.weight", shape: []int{H}, norm: true},
	}
	for i := 0; i < s.Layers; i++ {
		ts = append(ts, decoderLayer(fmt.Sprintf("layers.%d.", i), H, hd, s.Heads, s.KVHeads, s.Inter)...)
	}
	return ts
}

// WriteDrafter writes the drafter into dir. It must run on the MLX thread.
func WriteDrafter(dir string, s DrafterSpec) error {
	if s.Dtype == 0 {
		s.Dtype = mlxc.BFloat16
	}
	if s.WeightStd == 0 {
		s.WeightStd = 0.05
	}
	return writeCheckpoint(dir, s.config(), s.tensors(), s.Seed, s.Dtype, s.WeightStd, 1, false, s.QuantBits, s.QuantGroup)
}
