package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// Bad input gets each API's own error shape and status, and no request's failure touches
// the next: after the table, both APIs still answer.
func TestAgentAPIBadInput(t *testing.T) {
	srv := newFakeServer(t, server.Config{MaxBodyBytes: 64 << 10}, &servertest.Fake{Context: 512})
	user := []any{map[string]any{"role": "user", "content": "hi"}}
	big := strings.Repeat("x", 70<<10)
	long := strings.Repeat("word ", 20000) // far over the 512-token context at 128 bytes a token
	tests := []struct {
		name, path string
		body       any
		status     int
		// errType is the OpenAI error type or the Anthropic error.type; param (OpenAI only)
		// the field named.
		errType, param string
	}{
		{"responses: bad JSON", "/v1/responses", `{"input": `, 400, "invalid_request_error", ""},
		{"responses: unknown item type", "/v1/responses", map[string]any{"input": []any{map[string]any{"type": "computer_call"}}},
			400, "invalid_request_error", "input[0].type"},
		{"responses: output with no matching call", "/v1/responses", map[string]any{"input": []any{
			map[string]any{"role": "user", "content": "hi"},
			map[string]any{"type": "function_call_output", "call_id": "call_nope", "output": "x"}}},
			400, "invalid_request_error", "input[1].call_id"},
		{"responses: unknown previous_response_id", "/v1/responses", map[string]any{"input": "hi", "previous_response_id": "resp_gone"},
			404, "invalid_request_error", "previous_response_id"},
		{"responses: tool schema not an object", "/v1/responses", map[string]any{"input": "hi", "tools": []any{
			map[string]any{"type": "function", "name": "f", "parameters": "string"}}}, 400, "invalid_request_error", "tools[0].parameters"},
		{"responses: tool schema of another type", "/v1/responses", map[string]any{"input": "hi", "tools": []any{
			map[string]any{"type": "function", "name": "f", "parameters": map[string]any{"type": "array"}}}},
			400, "invalid_request_error", "tools[0].parameters.type"},
		{"responses: tool without a type", "/v1/responses", map[string]any{"input": "hi", "tools": []any{map[string]any{"name": "f"}}},
			400, "invalid_request_error", "tools[0].type"},
		{"responses: a named hosted tool", "/v1/responses", map[string]any{"input": "hi", "tools": []any{
			map[string]any{"type": "web_search"}}, "tool_choice": map[string]any{"type": "function", "name": "web_search"}},
			400, "invalid_request_error", "tool_choice.name"},
		{"responses: image input", "/v1/responses", map[string]any{"input": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_image", "image_url": "http://x/y.png"}}}}}, 400, "invalid_request_error", "input[0].content[0].type"},
		{"responses: json_schema format", "/v1/responses", map[string]any{"input": "hi", "text": map[string]any{"format": map[string]any{
			"type": "json_schema", "name": "x", "schema": map[string]any{"type": "object"}}}}, 400, "invalid_request_error", "text.format"},
		{"responses: no input", "/v1/responses", map[string]any{"model": "dflash-fake"}, 400, "invalid_request_error", "input"},
		{"responses: named tool not declared", "/v1/responses", map[string]any{"input": "hi", "tools": []any{weatherTool},
			"tool_choice": map[string]any{"type": "function", "name": "other"}}, 400, "invalid_request_error", "tool_choice.name"},
		{"responses: oversized body", "/v1/responses", map[string]any{"input": big}, 413, "invalid_request_error", ""},
		{"responses: over the context", "/v1/responses", map[string]any{"input": long[:60000]}, 400, "invalid_request_error", "input"},
		{"responses: unknown model", "/v1/responses", map[string]any{"model": "gpt-9", "input": "hi"}, 404, "invalid_request_error", "model"},

		{"messages: bad JSON", "/v1/messages", `{"max_tokens": 5,`, 400, "invalid_request_error", ""},
		{"messages: no max_tokens", "/v1/messages", map[string]any{"messages": user}, 400, "invalid_request_error", ""},
		{"messages: no messages", "/v1/messages", map[string]any{"max_tokens": 5}, 400, "invalid_request_error", ""},
		{"messages: image block", "/v1/messages", map[string]any{"max_tokens": 5, "messages": []any{map[string]any{"role": "user",
			"content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": "AA=="}}}}}},
			400, "invalid_request_error", ""},
		{"messages: unknown block type", "/v1/messages", map[string]any{"max_tokens": 5, "messages": []any{map[string]any{"role": "user",
			"content": []any{map[string]any{"type": "hologram"}}}}}, 400, "invalid_request_error", ""},
		{"messages: tool_result with no matching tool_use", "/v1/messages", map[string]any{"max_tokens": 5, "messages": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_x", "content": "y"}}}}},
			400, "invalid_request_error", ""},
		{"messages: tool schema not an object", "/v1/messages", map[string]any{"max_tokens": 5, "messages": user,
			"tools": []any{map[string]any{"name": "f", "input_schema": []any{1}}}}, 400, "invalid_request_error", ""},
		{"messages: server tool", "/v1/messages", map[string]any{"max_tokens": 5, "messages": user,
			"tools": []any{map[string]any{"type": "bash_20250124", "name": "bash"}}}, 400, "invalid_request_error", ""},
		{"messages: thinking budget over max_tokens", "/v1/messages", map[string]any{"max_tokens": 5, "messages": user,
			"thinking": map[string]any{"type": "enabled", "budget_tokens": 1024}}, 400, "invalid_request_error", ""},
		{"messages: structured output", "/v1/messages", map[string]any{"max_tokens": 5, "messages": user,
			"output_config": map[string]any{"format": map[string]any{"type": "json_schema", "schema": map[string]any{}}}},
			400, "invalid_request_error", ""},
		{"messages: temperature out of range", "/v1/messages", map[string]any{"max_tokens": 5, "messages": user, "temperature": 1.5},
			400, "invalid_request_error", ""},
		{"messages: oversized body", "/v1/messages", map[string]any{"max_tokens": 5, "messages": []any{
			map[string]any{"role": "user", "content": big}}}, 413, "request_too_large", ""},
		{"messages: over the context", "/v1/messages", map[string]any{"max_tokens": 5, "messages": []any{
			map[string]any{"role": "user", "content": long[:60000]}}}, 400, "invalid_request_error", ""},
		{"messages: unknown model", "/v1/messages", map[string]any{"model": "claude-x", "max_tokens": 5, "messages": user},
			404, "not_found_error", ""},
		{"count_tokens: bad JSON", "/v1/messages/count_tokens", `[`, 400, "invalid_request_error", ""},
		{"messages: wrong method", "/v1/messages/count_tokens", nil, 405, "invalid_request_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodPost
			if tt.status == 405 {
				method = http.MethodGet
			}
			resp, data := do(t, method, srv.URL+tt.path, tt.body, anthropicHeaders...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, data)
			}
			var body map[string]any
			decode(t, data, &body)
			if strings.HasPrefix(tt.path, "/v1/messages") {
				if body["type"] != "error" || jsonPath(body, "error", "type") != tt.errType || str(jsonPath(body, "error", "message")) == "" {
					t.Errorf("not Anthropic's error shape with type %s: %s", tt.errType, data)
				}
				return
			}
			if jsonPath(body, "error", "type") != tt.errType || str(jsonPath(body, "error", "message")) == "" {
				t.Errorf("not OpenAI's error shape with type %s: %s", tt.errType, data)
			}
			if tt.param != "" && jsonPath(body, "error", "param") != tt.param {
				t.Errorf("param %v, want %s: %s", jsonPath(body, "error", "param"), tt.param, data)
			}
		})
	}
	postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "still there?"})
	postJSONOK(t, srv.URL+"/v1/messages", map[string]any{"max_tokens": 5, "messages": user}, anthropicHeaders...)
}

// Agents send one large max_tokens whatever the model (Claude Code, Codex): on the agent APIs
// it is a cap, shortened to the context, not the 400 chat completions answers.
func TestAgentAPIMaxTokensIsACap(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Context: 512})
	msg := postJSONOK(t, srv.URL+"/v1/messages", map[string]any{"max_tokens": 64000,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, anthropicHeaders...)
	if msg["stop_reason"] != "end_turn" || messageText(msg) == "" {
		t.Errorf("messages with max_tokens over the context: %v", msg)
	}
	// An answer that runs out of context says so.
	endless := newFakeServer(t, server.Config{}, &servertest.Fake{Context: 512, Script: longScript(2000)})
	msg = postJSONOK(t, endless.URL+"/v1/messages", map[string]any{"max_tokens": 64000,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, anthropicHeaders...)
	if msg["stop_reason"] != "model_context_window_exceeded" {
		t.Errorf("an answer cut by the context: stop_reason %v", msg["stop_reason"])
	}
	msg = postJSONOK(t, endless.URL+"/v1/messages", map[string]any{"max_tokens": 10,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, anthropicHeaders...)
	if msg["stop_reason"] != "max_tokens" {
		t.Errorf("an answer cut by max_tokens: stop_reason %v", msg["stop_reason"])
	}
	resp := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 64000})
	if resp["status"] != "completed" || responseText(resp) == "" {
		t.Errorf("responses with max_output_tokens over the context: %v", resp)
	}
	if r, data := do(t, http.MethodPost, srv.URL+"/v1/chat/completions", userChat("hi", "max_tokens", 64000)); r.StatusCode != 400 {
		t.Errorf("chat completions with max_tokens over the context: %d %s", r.StatusCode, data)
	}
}
