package cli

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// Qwen3.5 vocabulary facts the random Qwen3.5 pairs share with the real models.
const (
	qwen35Vocab     = 248320
	qwen35ImEnd     = 248046
	qwen35EndOfText = 248044
	qwen35MaskToken = 248070 // z-lab's Qwen3.5 drafters' mask_token_id
)

// qwen35Shape is a random Qwen3.5 pair of a named shape (ok false: not a Qwen3.5 shape),
// in the mlx-community layout and bf16.
func qwen35Shape(shape string) (t modelgen.Qwen35Spec, d modelgen.DrafterSpec, ok bool) {
	t = modelgen.Qwen35Spec{Interval: 4, LinKeyHeads: 16, LinKeyDim: 128, LinValueDim: 128, Kernel: 4, Partial: 0.25,
		Vocab: qwen35Vocab, Layout: modelgen.Qwen35MLX, Dtype: mlxc.BFloat16, Seed: 7, RopeTheta: 10000000,
		MaxPositions: 262144, EOS: []int{qwen35ImEnd, qwen35EndOfText}, WeightStd: 0.02}
	// The z-lab drafters: 5 layers of 32 query and 8 KV heads of 128, reading 5 target
	// layers spread from 1 to N−3.
	d = modelgen.DrafterSpec{Layers: 5, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: qwen35Vocab, BlockSize: 16,
		MaskTokenID: qwen35MaskToken, Dtype: mlxc.BFloat16, Seed: 1007, RopeTheta: 10000000, WeightStd: 0.02}
	switch shape {
	case "qwen3.5-4b", "qwen3.5-4b-thin":
		// Qwen3.5-4B: 32 layers, every 4th full attention (16 query, 4 KV heads of 256),
		// the others GatedDeltaNet (16 key, 32 value heads of 128), tied embedding.
		t.Hidden, t.Layers, t.Inter, t.Heads, t.KVHeads, t.HeadDim, t.LinValueHeads, t.Tied = 2560, 32, 9216, 16, 4, 256, 32, true
		d.Inter, d.TargetLayerIDs = 9728, []int{1, 8, 15, 22, 29}
		if shape == "qwen3.5-4b-thin" {
			// The 4B's layers, pattern, head counts and vocabulary around 256-wide hidden
			// and MLP matrices and 32-wide recurrent heads: its cycle's graph (the same
			// nodes) and rollback at a small fraction of the work, so that it runs on a
			// CPU in seconds.
			t.Hidden, t.Inter, t.LinKeyDim, t.LinValueDim = 256, 256, 32, 32
			d.Inter = 256
		}
	case "qwen3.5-9b":
		// Qwen3.5-9B (MODELS.md §3.1): 32 layers of 4096, 16 query and 4 KV heads of 256,
		// GatedDeltaNet 16 key and 32 value heads of 128, MLP 12288, untied. Its drafter is
		// assumed shaped like z-lab's others (5 layers, 32 and 8 heads of 128) with the
		// target's MLP width, reading 5 layers spread from 1 to N−3.
		t.Hidden, t.Layers, t.Inter, t.Heads, t.KVHeads, t.HeadDim, t.LinValueHeads = 4096, 32, 12288, 16, 4, 256, 32
		d.Inter, d.TargetLayerIDs = 12288, []int{1, 8, 15, 22, 29}
	case "qwen3.5-27b", "qwen3.5-27b-4bit":
		// Qwen3.5-27B: 64 layers (24 query, 4 KV heads of 256; 16 key, 48 value heads of
		// 128), untied; its drafter's shape is z-lab's (DFLASH.md §3.1).
		t.Hidden, t.Layers, t.Inter, t.Heads, t.KVHeads, t.HeadDim, t.LinValueHeads = 5120, 64, 17408, 24, 4, 256, 48
		d.Inter, d.TargetLayerIDs = 17408, []int{1, 16, 31, 46, 61}
		if shape == "qwen3.5-27b-4bit" {
			// mlx-community's Qwen3.5-27B-4bit: every product 4-bit in groups of 64 (the
			// drafter stays bf16, as z-lab ships it).
			t.QuantBits, t.QuantGroup = 4, 64
		}
	case "qwen3.5-35b-a3b", "qwen3.5-35b-a3b-thin":
		// Qwen3.5-35B-A3B as mlx-community's 4-bit (MODELS.md §3.1): 40 layers of 2048, 16
		// query and 2 KV heads of 256, GatedDeltaNet 16 key and 32 value heads of 128; a
		// sparse MLP of 256 experts of 512, 8 per token, and a shared expert of 512;
		// untied; the routers and shared-expert gates at 8 bits, the rest 4-bit, group 64.
		// The drafter is assumed Qwen3-shaped like z-lab's others (5 layers, 32 and 8
		// heads of 128, MLP 6144), reading 5 layers spread from 1 to N−3.
		t.Hidden, t.Layers, t.Heads, t.KVHeads, t.HeadDim, t.LinValueHeads = 2048, 40, 16, 2, 256, 32
		t.Experts, t.TopK, t.MoEInter, t.SharedInter, t.NormTopK = 256, 8, 512, 512, true
		t.Inter, t.QuantBits, t.QuantGroup = 512, 4, 64
		d.Inter, d.TargetLayerIDs = 6144, []int{1, 10, 19, 28, 37}
		if shape == "qwen3.5-35b-a3b-thin" {
			// The same layers, pattern, heads, vocabulary and routing (256 experts, 8 per
			// token: a verify block of 16 rows reads up to 128 experts a layer) around
			// 256-wide hidden rows, 64-wide experts and 32-wide recurrent heads: how
			// verify cost grows with the block, at a size a CPU runs.
			// In bf16: MLX's CPU quantized products run at a small fraction of its float
			// ones (the 248k-row head alone would take most of a 4-bit step).
			t.Hidden, t.MoEInter, t.SharedInter, t.Inter, t.LinKeyDim, t.LinValueDim = 256, 64, 64, 64, 32, 32
			t.QuantBits, t.QuantGroup = 0, 0
			d.Inter = 256
		}
	case "qwen3.8-27b-4bit", "qwen3.8-27b-thin":
		// Qwen3.8-27B (model_type qwen3_5, the 3.6-27B's layout) as mlx-community's 4-bit,
		// with its DFlash2 drafter as z-lab publishes it (DFLASH2.md §3): 5 sliding,
		// non-causal layers of 32 query and 8 KV heads of 128, MLP 17408, window 2048,
		// block 8, 2-tap convolutions in groups of 16, a selector of rank 256 over 16
		// candidates, reading target layers 5, 19, 33, 47 and 61; bf16.
		t.Hidden, t.Layers, t.Inter, t.Heads, t.KVHeads, t.HeadDim, t.LinValueHeads = 5120, 64, 17408, 24, 4, 256, 48
		t.QuantBits, t.QuantGroup = 4, 64
		d.Inter, d.TargetLayerIDs = 17408, []int{5, 19, 33, 47, 61}
		if shape == "qwen3.8-27b-thin" {
			// Its layers, pattern, heads, vocabulary and drafter (selector included) around
			// 256-wide hidden and MLP matrices and 32-wide recurrent heads, in bf16 (MLX's
			// CPU quantized products would dominate): the cycle's graph at a size a CPU
			// runs, the selector's share of it in proportion to a small drafter.
			t.Hidden, t.Inter, t.LinKeyDim, t.LinValueDim = 256, 256, 32, 32
			t.QuantBits, t.QuantGroup = 0, 0
			d.Inter = 256
		}
		d.Hidden, d.NumTargetLayers = t.Hidden, t.Layers
		d = d.DFlash2For()
		d.SelectorRank, d.SelectorTopK, d.SlidingWindow = 256, 16, 2048
		return t, d, true
	default:
		return t, d, false
	}
	d.Hidden, d.NumTargetLayers = t.Hidden, t.Layers
	return t, d, true
}

// writePair35 writes a Qwen3.5 target and its drafter like writePair: the target gets
// the Qwen3 tokenizer files (the bench's random prompts are token ids) and a
// generation_config.json with Qwen3.5's end tokens.
func writePair35(td, dd string, t modelgen.Qwen35Spec, d modelgen.DrafterSpec) error {
	return writePairWith(td, dd, func() error { return modelgen.WriteQwen35(td, t) }, t.EOS, d)
}
