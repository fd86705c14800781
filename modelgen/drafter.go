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
	// DFlash2 writes a second-generation drafter in the published layout: every layer
	// sliding (SlidingWindow), non-causal, the block settings nested in dflash_config,
	// RoPE under rope_parameters, each layer's two grouped dynamic convolutions
	// (ConvKernel taps, groups of ConvGroup channels) and the candidate selector
	// (SelectorRank, SelectorTopK) with its codebooks stored without ".weight".
	DFlash2                                           bool
	ConvKernel, ConvGroup, SelectorRank, SelectorTopK int
}

// DFlash2For turns s into a DFlash2 drafter with the published settings scaled to a
// small model: 2 taps, groups of 16 (or the hidden size when smaller), rank 32, 8
// candidates, block 8, window 64.
func (s DrafterSpec) DFlash2For() DrafterSpec {
	s.DFlash2 = true
	s.ConvKernel, s.ConvGroup = 2, min(16, s.Hidden)
	s.SelectorRank, s.SelectorTopK = 32, min(8, s.Vocab)
	s.BlockSize, s.SlidingWindow = 8, 64
	s.LayerTypes = make([]string, s.Layers)
	for i := range s.LayerTypes {
		s.LayerTypes[i] = "sliding_attention"
	}
	return s
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
	if s.DFlash2 {
		s.dflash2Config(cfg)
	}
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
		p := fmt.Sprintf("layers.%d.", i)
		ts = append(ts, decoderLayer(p, H, hd, s.Heads, s.KVHeads, s.Inter)...)
		if s.DFlash2 {
			G := H / s.ConvGroup
			for _, c := range []string{"attention_conv", "mlp_conv"} {
				// The base kernel is drawn around 1 (z-lab's initial value is 0, which would
				// leave the base path unexercised).
				ts = append(ts, tensorSpec{name: p + c + ".base_kernel", shape: []int{2, s.ConvKernel, H}, norm: true},
					tensorSpec{name: p + c + ".kernel_projection.weight", shape: []int{2 * s.ConvKernel * G, H}, quant: true})
			}
		}
	}
	if s.DFlash2 {
		R := s.SelectorRank
		ts = append(ts, tensorSpec{name: "candidate_selector.hidden_projection.weight", shape: []int{R, H}, quant: true},
			tensorSpec{name: "candidate_selector.predecessor_codebook.weight", shape: []int{s.Vocab, R}, quant: true, bare: true},
			tensorSpec{name: "candidate_selector.successor_codebook.weight", shape: []int{s.Vocab, R}, quant: true, bare: true})
	}
	return ts
}

// dflash2Config rewrites a DFlash1 config into DFlash2's published layout.
func (s DrafterSpec) dflash2Config(cfg map[string]any) {
	cfg["architectures"] = []string{"DFlash2DraftModel"}
	cfg["is_causal"] = false
	cfg["max_window_layers"] = s.Layers
	cfg["rope_parameters"] = map[string]any{"rope_theta": s.RopeTheta, "rope_type": "default"}
	delete(cfg, "rope_theta")
	delete(cfg, "rope_scaling")
	delete(cfg, "block_size")
	dc := cfg["dflash_config"].(map[string]any)
	dc["block_size"] = s.BlockSize
	dc["conv_kernel_size"] = s.ConvKernel
	dc["conv_group_size"] = s.ConvGroup
	dc["selector_rank"] = s.SelectorRank
	dc["selector_top_k"] = s.SelectorTopK
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
