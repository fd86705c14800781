package draft

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/model"
)

// Config is a DFlash drafter's config.json.
type Config struct {
	HiddenSize, NumLayers, NumHeads, NumKVHeads, HeadDim, Intermediate, VocabSize int
	RMSNormEps                                                                    float32
	RopeTheta                                                                     float64
	BlockSize                                                                     int
	MaskTokenID                                                                   int
	TargetLayerIDs                                                                []int
	NumTargetLayers                                                               int
	AttentionBias                                                                 bool
	// LayerTypes holds each layer's attention kind ("full_attention" when the config has
	// none); SlidingWindow is the window of the "sliding_attention" layers.
	LayerTypes    []string
	SlidingWindow int
	// Causal is the config's is_causal when it sets one (nil: sliding layers are causal
	// inside the block and full layers are not, as in z-lab's drafter).
	Causal *bool
	// Kind is the drafter generation, from config.json's architectures.
	Kind Kind
	// DFlash2 settings (zero for DFlash1): the grouped dynamic convolution's taps and
	// group size, the candidate selector's rank and candidates per position, and the
	// optional input and output scalings (1 and none when absent).
	ConvKernel, ConvGroup      int
	SelectorRank, SelectorTopK int
	InputEmbeddingScale        float64
	OutputMultiplier, LogitCap float64
}

// Kind is a drafter generation.
type Kind int

const (
	// DFlash1 is z-lab's first-generation block drafter (DFlashDraftModel).
	DFlash1 Kind = iota
	// DFlash2 adds a grouped dynamic convolution around each sublayer, bounded
	// non-causal sliding attention and a candidate selector (DFlash2DraftModel).
	DFlash2
)

func (k Kind) String() string {
	if k == DFlash2 {
		return "dflash2"
	}
	return "dflash"
}

// Layer attention kinds a drafter's layer_types may name.
const (
	FullAttention    = "full_attention"
	SlidingAttention = "sliding_attention"
)

// LayerMask is how layer i attends: window > 0 limits its keys to the last window
// positions, and causal hides the block's later rows (see layer.window).
func (c Config) LayerMask(i int) (window int, causal bool) {
	sliding := c.LayerTypes[i] == SlidingAttention
	if sliding {
		window = c.SlidingWindow
	}
	causal = sliding
	if c.Causal != nil {
		causal = *c.Causal
	}
	return window, causal
}

// FallbackLayerIDs is z-lab's build_target_layer_ids: evenly spaced from 1 to N−3
// (N//2 for a one-layer drafter), rounding half to even like Python.
func FallbackLayerIDs(numTarget, numDraft int) []int {
	if numDraft == 1 {
		return []int{numTarget / 2}
	}
	ids := make([]int, numDraft)
	for i := range ids {
		ids[i] = int(math.RoundToEven(1 + float64(i)*float64(numTarget-4)/float64(numDraft-1)))
	}
	return ids
}

func parseConfig(cfg *model.RawConfig) (Config, *model.Rope, error) {
	var c Config
	err := cfg.PositiveInts(model.Field("hidden_size", &c.HiddenSize), model.Field("num_hidden_layers", &c.NumLayers),
		model.Field("num_attention_heads", &c.NumHeads), model.Field("num_key_value_heads", &c.NumKVHeads), model.Field("head_dim", &c.HeadDim),
		model.Field("intermediate_size", &c.Intermediate), model.Field("vocab_size", &c.VocabSize))
	if err != nil {
		return c, nil, err
	}
	eps, err := cfg.FloatOr("rms_norm_eps", 1e-6)
	if err != nil {
		return c, nil, err
	}
	c.RMSNormEps = float32(eps)
	if err := cfg.LiftRopeParameters(); err != nil {
		return c, nil, err
	}
	if c.RopeTheta, err = cfg.FloatOr("rope_theta", 1000000); err != nil {
		return c, nil, err
	}
	if c.Kind, err = kindOf(cfg); err != nil {
		return c, nil, err
	}
	if c.BlockSize, err = blockSizeOf(cfg); err != nil {
		return c, nil, err
	}
	if c.BlockSize < 2 {
		return c, nil, fmt.Errorf("%s: block_size must be ≥ 2, got %d", cfg.Path, c.BlockSize)
	}
	if c.NumTargetLayers, err = cfg.IntOr("num_target_layers", 0); err != nil {
		return c, nil, err
	}
	if c.AttentionBias, err = cfg.BoolOr("attention_bias", false); err != nil {
		return c, nil, err
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return c, nil, fmt.Errorf("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", cfg.Path, c.NumHeads, c.NumKVHeads)
	}
	dc, _ := cfg.M["dflash_config"].(map[string]any)
	if raw, ok := cfg.M["dflash_config"]; ok && raw != nil && dc == nil {
		return c, nil, fmt.Errorf("%s: dflash_config must be an object", cfg.Path)
	}
	c.MaskTokenID = -1
	if dc != nil {
		if v, ok := dc["mask_token_id"]; ok && v != nil {
			f, ok := v.(float64)
			if !ok || f < 0 || f != math.Trunc(f) {
				return c, nil, fmt.Errorf("%s: dflash_config.mask_token_id must be a non-negative integer", cfg.Path)
			}
			c.MaskTokenID = int(f)
		}
		if v, ok := dc["target_layer_ids"]; ok && v != nil {
			list, ok := v.([]any)
			if !ok || len(list) == 0 {
				return c, nil, fmt.Errorf("%s: dflash_config.target_layer_ids must be a non-empty list", cfg.Path)
			}
			for _, e := range list {
				f, ok := e.(float64)
				if !ok || f != math.Trunc(f) {
					return c, nil, fmt.Errorf("%s: dflash_config.target_layer_ids must list integers", cfg.Path)
				}
				c.TargetLayerIDs = append(c.TargetLayerIDs, int(f))
			}
		}
	}
	if c.MaskTokenID < 0 {
		return c, nil, fmt.Errorf("%s: missing dflash_config.mask_token_id (is this a DFlash drafter?)", cfg.Path)
	}
	if len(c.TargetLayerIDs) == 0 {
		if c.NumTargetLayers <= 0 {
			return c, nil, fmt.Errorf("%s: needs dflash_config.target_layer_ids or num_target_layers", cfg.Path)
		}
		c.TargetLayerIDs = FallbackLayerIDs(c.NumTargetLayers, c.NumLayers)
	}
	if err := parseLayerTypes(cfg, &c); err != nil {
		return c, nil, err
	}
	if c.Kind == DFlash2 {
		if err := parseDFlash2(cfg, dc, &c); err != nil {
			return c, nil, err
		}
	}
	rope, err := model.ParseRope(cfg, c.HeadDim, c.RopeTheta, 0)
	if err != nil {
		return c, nil, err
	}
	return c, rope, nil
}

// parseLayerTypes reads layer_types (one known kind per layer), sliding_window (positive
// where a layer slides) and is_causal (optional) into c.
func parseLayerTypes(cfg *model.RawConfig, c *Config) error {
	c.LayerTypes = make([]string, c.NumLayers)
	for i := range c.LayerTypes {
		c.LayerTypes[i] = FullAttention
	}
	sliding := false
	if v, ok := cfg.M["layer_types"]; ok && v != nil {
		list, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: layer_types must be a list of strings", cfg.Path)
		}
		if len(list) != c.NumLayers {
			return fmt.Errorf("%s: layer_types has %d entries for %d layers (num_hidden_layers)", cfg.Path, len(list), c.NumLayers)
		}
		for i, e := range list {
			s, _ := e.(string)
			if s != FullAttention && s != SlidingAttention {
				return fmt.Errorf("%s: layer_types[%d] is %v; a DFlash drafter layer is %q or %q", cfg.Path, i, e, FullAttention, SlidingAttention)
			}
			c.LayerTypes[i] = s
			sliding = sliding || s == SlidingAttention
		}
	}
	if sliding {
		w, err := cfg.IntOr("sliding_window", 0)
		if err != nil {
			return err
		}
		if w <= 0 {
			return fmt.Errorf("%s: sliding_attention layers need a positive sliding_window, got %d", cfg.Path, w)
		}
		c.SlidingWindow = w
	}
	if v, ok := cfg.M["is_causal"]; ok && v != nil {
		b, ok := v.(bool)
		if !ok {
			return fmt.Errorf("%s: is_causal must be true, false or null", cfg.Path)
		}
		c.Causal = &b
	}
	return nil
}
