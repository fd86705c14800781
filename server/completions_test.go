package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

func TestCompletionsStreamingEqualsNonStreaming(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	tests := []struct {
		name string
		body map[string]any
	}{
		{"string prompt", map[string]any{"prompt": "[[id:c1]] Once upon a time"}},
		{"list prompt", map[string]any{"prompt": []string{"[[id:c2]] Once upon a time"}, "temperature": 0.5, "seed": 5}},
		{"max tokens", map[string]any{"prompt": "[[id:c3]] x", "max_tokens": 4}},
		{"stop", map[string]any{"prompt": "[[id:c4]] x", "stop": []string{"c4-river", "c4-stone", "c4-amber"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, finish, u := completionOnce(t, srv.URL, tt.body)
			tt.body["stream_options"] = map[string]any{"include_usage": true}
			sText, sFinish, sU, sawUsage := completionStream(t, srv.URL, tt.body)
			if text != sText || finish != sFinish || u != sU || !sawUsage {
				t.Fatalf("full %q %s %+v\nstream %q %s %+v usage chunk %v", text, finish, u, sText, sFinish, sU, sawUsage)
			}
			if _, ok := tt.body["stop"]; !ok {
				prompt := fmt.Sprint(tt.body["prompt"])
				everyWordTagged(t, text, servertest.Marker(prompt))
			}
			if u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.CompletionTokens == 0 {
				t.Fatalf("usage %+v", u)
			}
			if tt.name == "max tokens" && (finish != "length" || u.CompletionTokens != 4) {
				t.Fatalf("max_tokens 4: finish %s, %d tokens", finish, u.CompletionTokens)
			}
			if tt.name == "stop" {
				for _, s := range []string{"c4-river", "c4-stone", "c4-amber"} {
					if strings.Contains(text, s) {
						t.Fatalf("stop string %q in %q", s, text)
					}
				}
			}
		})
	}
}

func TestCompletionsReturnRawMarkers(t *testing.T) {
	// Text completions are not chat: tool and reasoning markers stay in the text.
	raw := "<think>x</think><tool_call>{\"name\": \"f\"}</tool_call>"
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Script: func(servertest.Input) []string { return []string{raw} }})
	text, finish, _ := completionOnce(t, srv.URL, map[string]any{"prompt": "p"})
	if text != raw || finish != "stop" {
		t.Fatalf("got %q (%s), want %q (stop)", text, finish, raw)
	}
}

func TestModelsAndHealth(t *testing.T) {
	srv := newFakeServer(t, server.Config{ModelAliases: []string{"alias"}}, &servertest.Fake{Model: "org/model-4B", Context: 1234})
	resp, data := do(t, http.MethodGet, srv.URL+"/v1/models", nil)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID            string `json:"id"`
			Object        string `json:"object"`
			Created       int64  `json:"created"`
			OwnedBy       string `json:"owned_by"`
			ContextLength int    `json:"context_length"`
		} `json:"data"`
	}
	decode(t, data, &list)
	if resp.StatusCode != 200 || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "org/model-4B" ||
		list.Data[0].Object != "model" || list.Data[0].Created == 0 || list.Data[0].ContextLength != 1234 {
		t.Fatalf("/v1/models: %d %s", resp.StatusCode, data)
	}
	for path, want := range map[string]int{"/v1/models/org/model-4B": 200, "/v1/models/alias": 200, "/v1/models/other": 404} {
		if resp, data := do(t, http.MethodGet, srv.URL+path, nil); resp.StatusCode != want {
			t.Errorf("GET %s: %d %s, want %d", path, resp.StatusCode, data, want)
		}
	}
	resp, data = do(t, http.MethodGet, srv.URL+"/health", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(data), `"status":"ok"`) {
		t.Fatalf("/health: %d %s", resp.StatusCode, data)
	}
}
