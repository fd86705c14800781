package cli

import (
	"testing"
)

// Sampling settings reach the engine through the server: a temperature too cold for 1/T
// answers as greedy decoding does, while top_p 0.9 at temperature 1 samples (a bf16 top-p
// once made them give the same text). top_p 0.001 and min_p 1 keep the best token and its
// exact ties, which this near-flat random model has many of in bf16; their sets are
// checked against mlx-lm in package sample.
func TestServeSamplingSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the server; skipped with -short")
	}
	base, _, logs := startServe(t, "--no-draft")
	ask := func(extra map[string]any) string {
		t.Helper()
		body := map[string]any{"model": "tiny-qwen3", "prompt": "The colours of the sea are", "max_tokens": 8, "seed": 3}
		for k, v := range extra {
			body[k] = v
		}
		code, resp := postJSON(t, base+"/v1/completions", body)
		if code != 200 {
			t.Fatalf("%v: status %d: %v\n%s", extra, code, resp, logs.String())
		}
		return resp["choices"].([]any)[0].(map[string]any)["text"].(string)
	}
	greedy := ask(map[string]any{"temperature": 0})
	for _, extra := range []map[string]any{
		{"temperature": 1e-40},
		{"temperature": 1e-9, "top_p": 0.9},
	} {
		if got := ask(extra); got != greedy {
			t.Errorf("%v answered %q, want the greedy %q", extra, got, greedy)
		}
	}
	distinct := map[string]bool{}
	for seed := 1; seed <= 4; seed++ {
		distinct[ask(map[string]any{"temperature": 1, "top_p": 0.9, "seed": seed})] = true
	}
	if distinct[greedy] && len(distinct) == 1 {
		t.Errorf("top_p 0.9 at temperature 1 gave the greedy text for every seed: not sampling")
	}
	if len(distinct) < 2 {
		t.Errorf("four seeds at top_p 0.9 gave %d distinct texts", len(distinct))
	}
}
