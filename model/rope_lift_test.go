package model

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// transformers ≥ 5 writes rope_parameters in place of the flat keys; the rotary embedding
// read from either form must be the same (mlx-lm's qwen3 ModelArgs rule).
func TestLiftRopeParameters(t *testing.T) {
	nested := map[string]any{"rope_theta": 10000.0, "rope_type": "default"}
	cases := []struct {
		name      string
		m         map[string]any
		wantTheta any
		wantScale any
		wantErr   string
	}{
		{"nested only", map[string]any{"rope_parameters": nested}, 10000.0, nested, ""},
		{"flat theta wins", map[string]any{"rope_theta": 5e5, "rope_parameters": nested}, 5e5, nested, ""},
		{"flat scaling wins", map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 2.0}, "rope_parameters": nested},
			10000.0, map[string]any{"type": "linear", "factor": 2.0}, ""},
		{"flat only", map[string]any{"rope_theta": 1e6}, 1e6, nil, ""},
		{"null block", map[string]any{"rope_theta": 1e6, "rope_parameters": nil}, 1e6, nil, ""},
		{"empty block", map[string]any{"rope_parameters": map[string]any{}}, nil, nil, ""},
		{"not an object", map[string]any{"rope_parameters": 3.0}, nil, nil, "rope_parameters must be an object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := &RawConfig{Path: "config.json", M: c.m}
			err := cfg.LiftRopeParameters()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.wantTheta, cfg.M["rope_theta"]); d != "" {
				t.Errorf("rope_theta (-want +got):\n%s", d)
			}
			if d := cmp.Diff(c.wantScale, cfg.M["rope_scaling"]); d != "" {
				t.Errorf("rope_scaling (-want +got):\n%s", d)
			}
		})
	}
	// The nested form's rotary embedding is the flat form's.
	cfg := &RawConfig{Path: "config.json", M: map[string]any{"rope_parameters": nested}}
	if err := cfg.LiftRopeParameters(); err != nil {
		t.Fatal(err)
	}
	theta, err := cfg.Float("rope_theta")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRope(cfg, 64, theta, 2048)
	if err != nil {
		t.Fatal(err)
	}
	if r.Base != 10000 || r.Scale != 1 || r.MScale != 1 || r.freqs != nil {
		t.Errorf("nested rope gives base %v scale %v mscale %v freqs %v, want 10000 1 1 none", r.Base, r.Scale, r.MScale, r.freqs)
	}
}
