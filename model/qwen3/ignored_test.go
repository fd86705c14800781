package qwen3

import "testing"

// Loading skips the tensors a Qwen3 checkpoint may carry without using them: the rotary
// frequencies some exporters save, and lm_head with tied embeddings; nothing else.
func TestQwen3IgnoredTensors(t *testing.T) {
	cases := []struct {
		name string
		tied bool
		want bool
	}{
		{"model.layers.0.self_attn.rotary_emb.inv_freq", false, true},
		{"model.layers.35.self_attn.rotary_emb.inv_freq", true, true},
		{"rotary_emb.inv_freq", false, false},
		{"model.layers.0.self_attn.rotary_emb.inv_freq.extra", false, false},
		{"lm_head.weight", true, true},
		{"lm_head.scales", true, true},
		{"lm_head.weight", false, false},
		{"model.norm.weight", true, false},
		{"model.layers.0.self_attn.q_proj.weight", false, false},
	}
	for _, c := range cases {
		if got := qwen3Ignored(c.tied)(c.name); got != c.want {
			t.Errorf("ignored(%q, tied %v) = %v, want %v", c.name, c.tied, got, c.want)
		}
	}
}
