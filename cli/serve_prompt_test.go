package cli

import (
	"strings"
	"testing"
)

// A prompt far over the context is refused as context_length_exceeded, for raw and chat
// prompts, after counting only about as much text as the context spans (the message gives
// a lower bound, not the full count), and a prompt that fits is still answered.
func TestServeRefusesOversizedPromptsEarly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the server; skipped with -short")
	}
	base, _, logs := startServe(t, "--no-draft")
	long := strings.Repeat("word ", 400_000) // 2 MB, 400 000 tokens; the context holds 40 960
	cases := []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"model": "tiny-qwen3", "prompt": long, "max_tokens": 2}},
		{"/v1/chat/completions", map[string]any{"model": "tiny-qwen3", "max_tokens": 2,
			"messages": []map[string]any{{"role": "user", "content": long}}}},
	}
	for _, c := range cases {
		code, resp := postJSON(t, base+c.path, c.body)
		e, _ := resp["error"].(map[string]any)
		if code != 400 || e["code"] != "context_length_exceeded" {
			t.Fatalf("%s: status %d %v, want 400 context_length_exceeded\n%s", c.path, code, resp, logs.String())
		}
		if msg, _ := e["message"].(string); !strings.Contains(msg, "at least") || strings.Contains(msg, "400001") {
			t.Errorf("%s: message %q: want a lower bound from a partial count, not the whole prompt's count", c.path, msg)
		}
	}
	code, resp := postJSON(t, base+"/v1/completions", map[string]any{"model": "tiny-qwen3", "prompt": strings.Repeat("word ", 2_000), "max_tokens": 2})
	if code != 200 {
		t.Errorf("a prompt that fits: status %d %v", code, resp)
	}
}
