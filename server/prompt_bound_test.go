package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// exactBytesFake is the fake telling the server what its tokenizer guarantees: a token
// never covers more than one byte.
type exactBytesFake struct{ *servertest.Fake }

func (exactBytesFake) MaxTokenBytes() int { return 1 }

// A prompt whose text is too long to fit in the context whatever the tokenizer makes of
// it is refused before it is tokenized; one that might fit is tokenized and measured.
func TestOversizedPromptIsRefusedBeforeTokenizing(t *testing.T) {
	const context = 4096
	defaultBound := (context - 1) * server.DefaultMaxTokenBytes // the most bytes that may fit
	chat := func(msgs ...map[string]any) map[string]any { return map[string]any{"messages": msgs} }
	msg := func(role, content string) map[string]any { return map[string]any{"role": role, "content": content} }
	tests := []struct {
		name      string
		exact     bool // the backend reports one byte per token
		path      string
		body      map[string]any
		status    int
		param     string
		tokenized bool // the prompt reached the tokenizer
	}{
		{"completion prompt over the bound", false, "/v1/completions",
			map[string]any{"prompt": strings.Repeat("x", defaultBound+1)}, 400, "prompt", false},
		{"chat content over the bound", false, "/v1/chat/completions",
			chat(msg("user", strings.Repeat("x", defaultBound+1))), 400, "messages", false},
		{"chat contents add up", false, "/v1/chat/completions",
			chat(msg("system", strings.Repeat("s", defaultBound/2)), msg("user", "q"),
				msg("user", strings.Repeat("u", defaultBound/2+1))), 400, "messages", false},
		// A template may drop earlier reasoning from assistant turns, so they are not counted.
		{"assistant history is measured by tokenizing", false, "/v1/chat/completions",
			chat(msg("user", "q"), msg("assistant", strings.Repeat("a", defaultBound+1)), msg("user", "q")),
			400, "messages", true},
		// A template may trim contents, so surrounding whitespace is not counted.
		{"whitespace around a content is measured by tokenizing", false, "/v1/chat/completions",
			chat(msg("user", strings.Repeat(" ", defaultBound+1)+"q")), 400, "messages", true},
		{"the backend's bound: a prompt that fits", true, "/v1/completions",
			map[string]any{"prompt": strings.Repeat("x", context-1), "max_tokens": 1}, 200, "", true},
		{"the backend's bound: one byte more", true, "/v1/completions",
			map[string]any{"prompt": strings.Repeat("x", context)}, 400, "prompt", false},
		{"the backend's bound: chat", true, "/v1/chat/completions",
			chat(msg("user", strings.Repeat("x", context))), 400, "messages", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := &servertest.Fake{Context: context, Script: func(servertest.Input) []string { return []string{"ok"} }}
			var backend server.Backend = fake
			if tt.exact {
				backend = exactBytesFake{fake}
			}
			srv := servertest.Start(t, server.Config{}, backend, nil)
			resp, data := do(t, http.MethodPost, srv.URL+tt.path, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tt.status, data)
			}
			if tokenized := fake.Tokenized() > 0; tokenized != tt.tokenized {
				t.Fatalf("prompt tokenized: %v, want %v (%d bytes)", tokenized, tt.tokenized, fake.Tokenized())
			}
			if tt.status == 200 {
				return
			}
			var er errorResponse
			decode(t, data, &er)
			e := er.Error
			if e == nil || e.Type != "invalid_request_error" || e.Code == nil || *e.Code != "context_length_exceeded" ||
				e.Param == nil || *e.Param != tt.param || !strings.Contains(e.Message, "context is 4096 tokens") {
				t.Fatalf("error %s, want context_length_exceeded naming %s", data, tt.param)
			}
		})
	}
}
