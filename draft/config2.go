package draft

import (
	"fmt"
	"math"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/model"
)

// Architecture names in config.json that pick a drafter generation.
const (
	archDFlash1 = "DFlashDraftModel"
	archDFlash2 = "DFlash2DraftModel"
)

// kindOf reads the drafter generation from architectures: DFlash2DraftModel is DFlash2,
// DFlashDraftModel or no architectures at all (older checkpoints) DFlash1, anything else
// an error naming it.
func kindOf(cfg *model.RawConfig) (Kind, error) {
	raw, ok := cfg.M["architectures"]
	if !ok || raw == nil {
		return DFlash1, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return DFlash1, fmt.Errorf("%s: architectures must be a list of strings", cfg.Path)
	}
	var names []string
	for _, e := range list {
		s, ok := e.(string)
		if !ok {
			return DFlash1, fmt.Errorf("%s: architectures must be a list of strings", cfg.Path)
		}
		names = append(names, s)
	}
	switch {
	case slices.Contains(names, archDFlash2):
		return DFlash2, nil
	case slices.Contains(names, archDFlash1) || len(names) == 0:
		return DFlash1, nil
	}
	return DFlash1, fmt.Errorf("%s: architectures %v names no drafter this build knows (%s or %s)", cfg.Path, names, archDFlash1, archDFlash2)
}

// blockSizeOf is the trained block: dflash_config.block_size (where DFlash2 keeps it),
// else the top-level block_size, else 16.
func blockSizeOf(cfg *model.RawConfig) (int, error) {
	if dc, ok := cfg.M["dflash_config"].(map[string]any); ok {
		if v, ok := dc["block_size"]; ok && v != nil {
			f, ok := v.(float64)
			if !ok || f != math.Trunc(f) {
				return 0, fmt.Errorf("%s: dflash_config.block_size must be an integer", cfg.Path)
			}
			return int(f), nil
		}
	}
	return cfg.IntOr("block_size", 16)
}

// maxConvKernel bounds the convolution's taps this build serves (the published
// drafters have 2; a tap never reaches past the block either).
const maxConvKernel = 8

// parseDFlash2 reads and checks the DFlash2 settings of dflash_config dc: each problem
// is one error naming the key.
func parseDFlash2(cfg *model.RawConfig, dc map[string]any, c *Config) error {
	if dc == nil {
		return fmt.Errorf("%s: a DFlash2 drafter needs a dflash_config object", cfg.Path)
	}
	ints := []struct {
		key string
		dst *int
	}{
		{"conv_kernel_size", &c.ConvKernel}, {"conv_group_size", &c.ConvGroup},
		{"selector_rank", &c.SelectorRank}, {"selector_top_k", &c.SelectorTopK},
	}
	for _, f := range ints {
		v, ok := dc[f.key]
		if !ok || v == nil {
			return fmt.Errorf("%s: a DFlash2 drafter needs dflash_config.%s", cfg.Path, f.key)
		}
		x, ok := v.(float64)
		if !ok || x != math.Trunc(x) || x < 1 {
			return fmt.Errorf("%s: dflash_config.%s must be a positive integer, got %v", cfg.Path, f.key, v)
		}
		*f.dst = int(x)
	}
	if c.ConvKernel > maxConvKernel || c.ConvKernel > c.BlockSize {
		return fmt.Errorf("%s: dflash_config.conv_kernel_size %d is not supported (1 to %d taps, at most the block size %d)", cfg.Path, c.ConvKernel, maxConvKernel, c.BlockSize)
	}
	if c.HiddenSize%c.ConvGroup != 0 {
		return fmt.Errorf("%s: dflash_config.conv_group_size %d does not divide hidden_size %d", cfg.Path, c.ConvGroup, c.HiddenSize)
	}
	if c.SelectorTopK > c.VocabSize {
		return fmt.Errorf("%s: dflash_config.selector_top_k %d exceeds vocab_size %d", cfg.Path, c.SelectorTopK, c.VocabSize)
	}
	var err error
	if c.InputEmbeddingScale, err = dflashFloat(cfg, dc, "input_embedding_scale", 1); err != nil {
		return err
	}
	if c.OutputMultiplier, err = dflashFloat(cfg, dc, "output_multiplier", 1); err != nil {
		return err
	}
	if c.LogitCap, err = dflashFloat(cfg, dc, "final_logit_softcapping", 0); err != nil {
		return err
	}
	if c.LogitCap == 0 {
		if c.LogitCap, err = cfg.FloatOr("final_logit_softcapping", 0); err != nil {
			return err
		}
	}
	// The forward is bidirectional inside the block and reads a bounded window of
	// context in every layer: that is the architecture, not a choice.
	if c.Causal != nil && *c.Causal {
		return fmt.Errorf("%s: is_causal true is not supported for a DFlash2 drafter (its block attention is bidirectional)", cfg.Path)
	}
	for i, t := range c.LayerTypes {
		if t != SlidingAttention {
			return fmt.Errorf("%s: layer_types[%d] is %q; every DFlash2 layer is %q", cfg.Path, i, t, SlidingAttention)
		}
	}
	if c.SlidingWindow <= c.BlockSize {
		return fmt.Errorf("%s: sliding_window %d must exceed the block size %d", cfg.Path, c.SlidingWindow, c.BlockSize)
	}
	causal := false
	c.Causal = &causal
	return nil
}

// dflashFloat reads an optional number of dflash_config.
func dflashFloat(cfg *model.RawConfig, dc map[string]any, key string, def float64) (float64, error) {
	v, ok := dc[key]
	if !ok || v == nil {
		return def, nil
	}
	f, ok := v.(float64)
	if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%s: dflash_config.%s must be a number, got %v", cfg.Path, key, v)
	}
	return f, nil
}
