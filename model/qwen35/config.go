package qwen35

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/model"
)

// Config is the text model's architecture, read with mlx-lm's rules and defaults.
type Config struct {
	Hidden, Layers, Inter, Vocab, MaxPositions int
	Heads, KVHeads, HeadDim                    int
	LinKeyHeads, LinValueHeads                 int
	LinKeyDim, LinValueDim, ConvKernel         int
	Interval                                   int // every Interval-th layer is full attention
	Eps                                        float32
	Tied, AttentionBias                        bool
	RopeTheta, PartialRotary                   float64
	RotaryDims                                 int
	EOS                                        []int
	// The sparse MoE MLP (model_type qwen3_5_moe; Experts 0: the dense MLP of Inter).
	Experts, TopK, MoEInter, SharedInter int
	NormTopK                             bool
	// rope is the config rope_scaling is read from (ParseRope's input).
	rope *model.RawConfig
}

// IsLinear reports whether layer i is a GatedDeltaNet layer; the others are full attention.
func (c *Config) IsLinear(i int) bool { return (i+1)%c.Interval != 0 }

// ConvDim is the width of the [q | k | v] projection that the depthwise conv runs over.
func (c *Config) ConvDim() int { return 2*c.LinKeyHeads*c.LinKeyDim + c.LinValueHeads*c.LinValueDim }

// textConfig is the object the text model reads: text_config, or the whole config when
// there is none (mlx-lm's rule).
func textConfig(cfg *model.RawConfig) (*model.RawConfig, error) {
	raw, ok := cfg.M["text_config"]
	if !ok {
		return cfg, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: text_config must be an object, got %v", cfg.Path, raw)
	}
	return &model.RawConfig{Path: cfg.Path + " text_config", M: m}, nil
}

// ParseConfig reads config.json (model_type qwen3_5) the way mlx-lm's TextModelArgs does:
// every key has a default except that nothing inconsistent is accepted.
func ParseConfig(cfg *model.RawConfig) (Config, error) { return parseConfig(cfg, false) }

// ParseMoEConfig reads a qwen3_5_moe config.json: the same keys plus the sparse MLP's,
// which every layer uses when num_experts > 0.
func ParseMoEConfig(cfg *model.RawConfig) (Config, error) { return parseConfig(cfg, true) }

func parseConfig(cfg *model.RawConfig, moe bool) (Config, error) {
	var c Config
	tc, err := textConfig(cfg)
	if err != nil {
		return c, err
	}
	ints := []struct {
		key string
		dst *int
		def int
	}{
		{"hidden_size", &c.Hidden, 4096}, {"intermediate_size", &c.Inter, 14336},
		{"num_hidden_layers", &c.Layers, 32}, {"num_attention_heads", &c.Heads, 32},
		{"vocab_size", &c.Vocab, 151936}, {"num_key_value_heads", &c.KVHeads, 8},
		{"max_position_embeddings", &c.MaxPositions, 131072},
		{"linear_num_value_heads", &c.LinValueHeads, 64}, {"linear_num_key_heads", &c.LinKeyHeads, 16},
		{"linear_key_head_dim", &c.LinKeyDim, 192}, {"linear_value_head_dim", &c.LinValueDim, 128},
		{"linear_conv_kernel_dim", &c.ConvKernel, 4}, {"full_attention_interval", &c.Interval, 4},
	}
	for _, f := range ints {
		v, err := tc.IntOr(f.key, f.def)
		if err != nil {
			return c, err
		}
		if v <= 0 {
			return c, fmt.Errorf("%s: %q must be positive, got %d", tc.Path, f.key, v)
		}
		*f.dst = v
	}
	if c.HeadDim, err = tc.IntOr("head_dim", 0); err != nil {
		return c, err
	}
	if c.HeadDim < 0 {
		return c, fmt.Errorf("%s: \"head_dim\" must be positive, got %d", tc.Path, c.HeadDim)
	}
	if c.HeadDim == 0 { // absent or null: hidden_size / num_attention_heads
		c.HeadDim = c.Hidden / c.Heads
	}
	eps, err := tc.FloatOr("rms_norm_eps", 1e-6)
	if err != nil {
		return c, err
	}
	c.Eps = float32(eps)
	if c.Tied, err = tc.BoolOr("tie_word_embeddings", false); err != nil {
		return c, err
	}
	if c.AttentionBias, err = tc.BoolOr("attention_bias", false); err != nil {
		return c, err
	}
	if c.EOS, err = cfg.IntList("eos_token_id"); err != nil {
		return c, err
	}
	if err := c.parseRope(tc); err != nil {
		return c, err
	}
	if err := c.check(tc, moe); err != nil {
		return c, err
	}
	// The rope block is checked here too, so that a config is refused before any weight.
	if _, err := model.ParseRope(c.rope, c.RotaryDims, c.RopeTheta, c.MaxPositions); err != nil {
		return c, err
	}
	return c, nil
}

// parseRope reads rope_parameters: absent, mlx-lm's default block; null or empty, the flat
// keys; otherwise its rope_theta and partial_rotary_factor (defaults 1e5 and 0.25) win over
// the flat keys, and it is the rope_scaling block.
func (c *Config) parseRope(tc *model.RawConfig) error {
	var err error
	raw, present := tc.M["rope_parameters"]
	if !present {
		raw = map[string]any{"type": "default", "mrope_section": []any{11.0, 11.0, 10.0}, "rope_theta": 100000.0, "partial_rotary_factor": 0.25}
	}
	rp, _ := raw.(map[string]any)
	if raw != nil && rp == nil {
		return fmt.Errorf("%s: rope_parameters must be an object or null, got %v", tc.Path, raw)
	}
	if len(rp) == 0 {
		if c.RopeTheta, err = tc.FloatOr("rope_theta", 100000); err != nil {
			return err
		}
		if c.PartialRotary, err = tc.FloatOr("partial_rotary_factor", 0.25); err != nil {
			return err
		}
		c.rope = &model.RawConfig{Path: tc.Path, M: map[string]any{"rope_scaling": tc.M["rope_scaling"]}}
	} else {
		p := &model.RawConfig{Path: tc.Path + " rope_parameters", M: rp}
		if c.RopeTheta, err = p.FloatOr("rope_theta", 100000); err != nil {
			return err
		}
		if c.PartialRotary, err = p.FloatOr("partial_rotary_factor", 0.25); err != nil {
			return err
		}
		// mlx-lm renames rope_type to type only when type is absent, and reads type first.
		sc := make(map[string]any, len(rp))
		for k, v := range rp {
			if k != "rope_type" {
				sc[k] = v
			}
		}
		if _, ok := sc["type"]; !ok {
			if v, ok := rp["rope_type"]; ok {
				sc["type"] = v
			}
		}
		if typ, _ := sc["type"].(string); typ == "mrope" {
			if s, _ := sc["mrope_section"].([]any); len(s) != 3 {
				return fmt.Errorf("%s: mrope needs three mrope_section entries, got %v", p.Path, sc["mrope_section"])
			}
		}
		c.rope = &model.RawConfig{Path: p.Path, M: map[string]any{"rope_scaling": sc}}
	}
	c.RotaryDims = int(float64(c.HeadDim) * c.PartialRotary)
	if c.RotaryDims <= 0 || c.RotaryDims > c.HeadDim || c.RotaryDims%2 != 0 || math.IsNaN(c.PartialRotary) {
		return fmt.Errorf("%s: partial_rotary_factor %g of head_dim %d gives %d rotary dims, want an even count in (0, %d]",
			tc.Path, c.PartialRotary, c.HeadDim, c.RotaryDims, c.HeadDim)
	}
	return nil
}

// check refuses head counts that do not divide, and (for qwen3_5) experts, which only the
// qwen3_5_moe registration loads with its sanitize.
func (c *Config) check(tc *model.RawConfig, moe bool) error {
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", tc.Path, c.Heads, c.KVHeads)
	}
	if c.LinValueHeads%c.LinKeyHeads != 0 {
		return fmt.Errorf("%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", tc.Path, c.LinValueHeads, c.LinKeyHeads)
	}
	if c.HeadDim <= 0 {
		return fmt.Errorf("%s: head_dim is %d (hidden_size %d / num_attention_heads %d)", tc.Path, c.HeadDim, c.Hidden, c.Heads)
	}
	experts, err := tc.IntOr("num_experts", 0)
	if err != nil {
		return err
	}
	if !moe {
		if experts > 0 {
			return fmt.Errorf("%s: num_experts %d: mixture-of-experts checkpoints are not supported yet as model_type qwen3_5 (they are qwen3_5_moe)", tc.Path, experts)
		}
		return nil
	}
	return c.parseMoE(tc, experts)
}

// parseMoE reads the sparse MLP's keys (mlx-lm's defaults: 0, and norm_topk_prob true).
func (c *Config) parseMoE(tc *model.RawConfig, experts int) error {
	var err error
	if experts < 0 {
		return fmt.Errorf("%s: \"num_experts\" must not be negative, got %d", tc.Path, experts)
	}
	c.Experts = experts
	if c.TopK, err = tc.IntOr("num_experts_per_tok", 0); err != nil {
		return err
	}
	if c.MoEInter, err = tc.IntOr("moe_intermediate_size", 0); err != nil {
		return err
	}
	if c.SharedInter, err = tc.IntOr("shared_expert_intermediate_size", 0); err != nil {
		return err
	}
	if c.NormTopK, err = tc.BoolOr("norm_topk_prob", true); err != nil {
		return err
	}
	if experts == 0 {
		return nil
	}
	if c.TopK <= 0 || c.TopK > experts {
		return fmt.Errorf("%s: num_experts_per_tok %d must be in [1, num_experts %d]", tc.Path, c.TopK, experts)
	}
	if c.MoEInter <= 0 {
		return fmt.Errorf("%s: moe_intermediate_size must be positive, got %d", tc.Path, c.MoEInter)
	}
	// mlx-lm always builds the shared expert; at width 0 its output is zero, which the
	// block without one computes exactly, but its empty tensors would not load.
	if c.SharedInter <= 0 {
		return fmt.Errorf("%s: shared_expert_intermediate_size must be positive for qwen3_5_moe, got %d", tc.Path, c.SharedInter)
	}
	return nil
}
