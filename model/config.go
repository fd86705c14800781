package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// RawConfig is config.json as a JSON object, with typed accessors that name the file and
// key in their errors.
type RawConfig struct {
	Path string
	M    map[string]any
}

// ReadConfig reads and parses dir/config.json. If generation_config.json has a truthy
// eos_token_id it overrides config's (mlx-lm does the same).
func ReadConfig(dir string) (*RawConfig, error) {
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: no config.json (is this a model folder?)", dir)
		}
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", p, err)
	}
	c := &RawConfig{Path: p, M: m}
	gp := filepath.Join(dir, "generation_config.json")
	if gb, err := os.ReadFile(gp); err == nil {
		var g map[string]any
		if err := json.Unmarshal(gb, &g); err != nil {
			return nil, fmt.Errorf("%s: invalid JSON: %w", gp, err)
		}
		if v, ok := g["eos_token_id"]; ok && v != nil && v != false {
			m["eos_token_id"] = v
		}
	}
	return c, nil
}

func (c *RawConfig) missing(key string) error {
	return fmt.Errorf("%s: missing required key %q", c.Path, key)
}

// Int reads a required integer key.
func (c *RawConfig) Int(key string) (int, error) {
	v, ok := c.M[key]
	if !ok || v == nil {
		return 0, c.missing(key)
	}
	f, ok := v.(float64)
	if !ok || f != float64(int(f)) {
		return 0, fmt.Errorf("%s: key %q must be an integer, got %v", c.Path, key, v)
	}
	return int(f), nil
}

// IntField names a required positive integer key and where to store it.
type IntField struct {
	Key string
	Dst *int
}

// Field pairs a key with its destination for PositiveInts.
func Field(key string, dst *int) IntField { return IntField{Key: key, Dst: dst} }

// PositiveInts reads required positive integer keys in order, stopping at the first one
// that is missing, not an integer, or not positive.
func (c *RawConfig) PositiveInts(fields ...IntField) error {
	for _, f := range fields {
		v, err := c.Int(f.Key)
		if err != nil {
			return err
		}
		if v <= 0 {
			return fmt.Errorf("%s: %q must be positive, got %d", c.Path, f.Key, v)
		}
		*f.Dst = v
	}
	return nil
}

// IntOr reads an optional integer key.
func (c *RawConfig) IntOr(key string, def int) (int, error) {
	if v, ok := c.M[key]; !ok || v == nil {
		return def, nil
	}
	return c.Int(key)
}

// Float reads a required number.
func (c *RawConfig) Float(key string) (float64, error) {
	v, ok := c.M[key]
	if !ok || v == nil {
		return 0, c.missing(key)
	}
	f, ok := v.(float64)
	if !ok {
		return 0, fmt.Errorf("%s: key %q must be a number, got %v", c.Path, key, v)
	}
	return f, nil
}

// FloatOr reads an optional number.
func (c *RawConfig) FloatOr(key string, def float64) (float64, error) {
	if v, ok := c.M[key]; !ok || v == nil {
		return def, nil
	}
	return c.Float(key)
}

// Bool reads an optional boolean.
func (c *RawConfig) BoolOr(key string, def bool) (bool, error) {
	v, ok := c.M[key]
	if !ok || v == nil {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("%s: key %q must be true or false, got %v", c.Path, key, v)
	}
	return b, nil
}

// String reads an optional string.
func (c *RawConfig) StringOr(key, def string) (string, error) {
	v, ok := c.M[key]
	if !ok || v == nil {
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: key %q must be a string, got %v", c.Path, key, v)
	}
	return s, nil
}

// IntList reads an int or a list of ints (eos_token_id style); absent gives nil.
func (c *RawConfig) IntList(key string) ([]int, error) {
	v, ok := c.M[key]
	if !ok || v == nil {
		return nil, nil
	}
	switch x := v.(type) {
	case float64:
		return []int{int(x)}, nil
	case []any:
		out := make([]int, 0, len(x))
		for _, e := range x {
			f, ok := e.(float64)
			if !ok {
				return nil, fmt.Errorf("%s: key %q must list integers, got %v", c.Path, key, e)
			}
			out = append(out, int(f))
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: key %q must be an integer or a list, got %v", c.Path, key, v)
}

// Quant is one module's quantization parameters.
type Quant struct {
	GroupSize, Bits int
	Mode            string
}

// QuantConfig is config.json's "quantization" block: global parameters plus per-module
// overrides (a Quant, or nil for "not quantized").
type QuantConfig struct {
	Global    *Quant
	Overrides map[string]*Quant
}

// ParseQuantization reads "quantization" (or the identical "quantization_config" mlx-lm
// writes). It returns nil when the model is not quantized.
func (c *RawConfig) ParseQuantization() (*QuantConfig, error) {
	raw, ok := c.M["quantization"]
	if !ok || raw == nil {
		raw, ok = c.M["quantization_config"]
		if !ok || raw == nil {
			return nil, nil
		}
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: \"quantization\" must be an object", c.Path)
	}
	qc := &QuantConfig{Overrides: map[string]*Quant{}}
	g, err := parseQuant(c.Path, "quantization", m, nil)
	if err != nil {
		return nil, err
	}
	qc.Global = g
	if err := parseOverrides(c.Path, m, qc); err != nil {
		return nil, err
	}
	return qc, nil
}

// parseQuant reads one block d (where names it in the errors of config path) over def
// (nil: mlx-lm's defaults, 64-wide groups of 4-bit affine), then checks the result.
func parseQuant(path, where string, d map[string]any, def *Quant) (*Quant, error) {
	q := &Quant{GroupSize: 64, Bits: 4, Mode: "affine"}
	if def != nil {
		*q = *def
	}
	if v, ok := d["group_size"]; ok {
		f, ok := v.(float64)
		if !ok {
			return nil, fmt.Errorf("%s: %s.group_size must be an integer", path, where)
		}
		q.GroupSize = int(f)
	}
	if v, ok := d["bits"]; ok {
		f, ok := v.(float64)
		if !ok {
			return nil, fmt.Errorf("%s: %s.bits must be an integer", path, where)
		}
		q.Bits = int(f)
	}
	if v, ok := d["mode"]; ok {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%s: %s.mode must be a string", path, where)
		}
		q.Mode = s
	}
	if err := checkQuant(path, where, q); err != nil {
		return nil, err
	}
	return q, nil
}

// checkQuant rejects a mode, group size or width that MLX's quantized kernels do not
// have, so a bad checkpoint fails at load rather than in the first product.
func checkQuant(path, where string, q *Quant) error {
	switch q.Mode {
	case "affine":
		if q.GroupSize != 32 && q.GroupSize != 64 && q.GroupSize != 128 {
			return fmt.Errorf("%s: %s.group_size %d not supported (32, 64 or 128)", path, where, q.GroupSize)
		}
		switch q.Bits {
		case 2, 3, 4, 5, 6, 8:
		default:
			return fmt.Errorf("%s: %s.bits %d not supported (2, 3, 4, 5, 6 or 8)", path, where, q.Bits)
		}
	case "mxfp4", "mxfp8", "nvfp4":
	default:
		return fmt.Errorf("%s: %s.mode %q is unknown", path, where, q.Mode)
	}
	return nil
}

// parseOverrides fills qc.Overrides from the per-module entries of block m (true: the
// global quantization, false: dense, an object: over the global), in sorted key order so
// that the first error is the same on every run.
func parseOverrides(path string, m map[string]any, qc *QuantConfig) error {
	g := qc.Global
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch k {
		case "group_size", "bits", "mode", "quant_method":
			continue
		}
		switch v := m[k].(type) {
		case bool:
			if v {
				qc.Overrides[k] = g
			} else {
				qc.Overrides[k] = nil
			}
		case map[string]any:
			q, err := parseQuant(path, "quantization."+k, v, g)
			if err != nil {
				return err
			}
			qc.Overrides[k] = q
		default:
			if strings.Contains(k, ".") {
				return fmt.Errorf("%s: quantization override %q must be an object or a boolean", path, k)
			}
		}
	}
	return nil
}

// For returns the quantization of the module at path (nil: dense), following mlx-lm's rule:
// an explicit override wins; otherwise quantized iff the checkpoint has path.scales.
func (qc *QuantConfig) For(path string, hasScales bool) *Quant {
	if qc == nil {
		return nil
	}
	if q, ok := qc.Overrides[path]; ok {
		return q
	}
	if hasScales {
		return qc.Global
	}
	return nil
}
