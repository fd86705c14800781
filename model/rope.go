package model

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Rope is a configured rotary embedding (non-traditional, as in every Qwen model).
type Rope struct {
	Dims   int
	Base   float32
	Scale  float32
	MScale float32   // YaRN attention scaling of q and k (1 = none)
	freqs  []float32 // YaRN frequencies; nil = use Base
	freqsA *mlxc.Array
}

// ParseRope builds the rotary embedding from rope_theta and rope_scaling ("default",
// "linear" or "yarn"; others are refused rather than silently ignored).
func ParseRope(cfg *RawConfig, dims int, theta float64, maxPos int) (*Rope, error) {
	r := &Rope{Dims: dims, Base: float32(theta), Scale: 1, MScale: 1}
	raw, ok := cfg.M["rope_scaling"]
	if !ok || raw == nil {
		return r, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: rope_scaling must be an object or null", cfg.Path)
	}
	typ, _ := m["type"].(string)
	if t, ok := m["rope_type"].(string); ok {
		typ = t
	}
	num := func(k string, def float64) float64 {
		if f, ok := m[k].(float64); ok {
			return f
		}
		return def
	}
	switch typ {
	case "", "default", "mrope":
		return r, nil
	case "linear":
		f := num("factor", 1)
		if f <= 0 {
			return nil, fmt.Errorf("%s: rope_scaling.factor must be > 0", cfg.Path)
		}
		r.Scale = float32(1 / f)
		return r, nil
	case "yarn":
		s := num("factor", 1)
		orig := num("original_max_position_embeddings", 4096)
		betaFast, betaSlow := num("beta_fast", 32), num("beta_slow", 1)
		mscale, mscaleAll := num("mscale", 1), num("mscale_all_dim", 0)
		corr := func(n float64) float64 {
			return float64(dims) * math.Log(orig/(2*math.Pi*n)) / (2 * math.Log(theta))
		}
		low := math.Max(math.Floor(corr(betaFast)), 0)
		high := math.Min(math.Ceil(corr(betaSlow)), float64(dims-1))
		if low == high {
			high += 0.001
		}
		half := dims / 2
		r.freqs = make([]float32, half)
		for i := 0; i < half; i++ {
			ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
			mask := 1 - ramp
			extra := math.Pow(theta, float64(2*i)/float64(dims))
			inter := s * extra
			r.freqs[i] = float32(inter * extra / (inter*mask + extra*(1-mask)))
		}
		g := func(s, m float64) float64 {
			if s <= 1 {
				return 1
			}
			return 0.1*m*math.Log(s) + 1
		}
		r.MScale = float32(g(s, mscale) / g(s, mscaleAll))
		return r, nil
	}
	return nil, fmt.Errorf("%s: rope_scaling type %q is not supported (default, linear, yarn)", cfg.Path, typ)
}

// Apply rotates x [B, heads, L, D] for positions offset… .
func (r *Rope) Apply(x *mlxc.Array, offset int) *mlxc.Array {
	x, base, freqs := r.inputs(x)
	return mlxc.RoPE(x, r.Dims, false, base, r.Scale, offset, freqs)
}

// ApplyAt is Apply with the first position pos (int32 [1]) computed on the device.
func (r *Rope) ApplyAt(x, pos *mlxc.Array) *mlxc.Array {
	x, base, freqs := r.inputs(x)
	return mlxc.RoPEDynamic(x, r.Dims, false, base, r.Scale, pos, freqs)
}

// inputs are MLX's rope arguments: x scaled by YaRN's MScale, and the base or (YaRN) the
// frequencies array, made once.
func (r *Rope) inputs(x *mlxc.Array) (*mlxc.Array, float32, *mlxc.Array) {
	if r.MScale != 1 {
		x = mlxc.Multiply(x, mlxc.Scalar(float64(r.MScale), x.Dtype()))
	}
	if r.freqs == nil {
		return x, r.Base, nil
	}
	if r.freqsA == nil || !r.freqsA.Valid() {
		r.freqsA = mlxc.FromSlice(r.freqs, len(r.freqs)).Detach()
	}
	return x, 0, r.freqsA
}

func (r *Rope) Free() { r.freqsA.Free() }

// LiftRopeParameters reads the rotary settings of a config that transformers ≥ 5 wrote,
// which nests rope_theta and rope_scaling under rope_parameters: as mlx-lm, a flat
// rope_theta or rope_scaling wins, and the nested block fills what is absent (the block
// itself becomes rope_scaling, its rope_type naming the kind). cfg.M is updated in place,
// before the flat keys are read.
func (c *RawConfig) LiftRopeParameters() error {
	raw, ok := c.M["rope_parameters"]
	if !ok || raw == nil {
		return nil
	}
	rp, ok := raw.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: rope_parameters must be an object or null, got %v", c.Path, raw)
	}
	if len(rp) == 0 {
		return nil
	}
	if v, ok := c.M["rope_theta"]; !ok || v == nil {
		if t, ok := rp["rope_theta"]; ok {
			c.M["rope_theta"] = t
		}
	}
	if v, ok := c.M["rope_scaling"]; !ok || v == nil {
		c.M["rope_scaling"] = rp
	}
	return nil
}
