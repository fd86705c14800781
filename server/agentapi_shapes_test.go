package server_test

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// Requests shaped as the agents send them, with the fields this server does not act on
// (prompt caching hints, verbosity, encrypted reasoning, metadata, cache_control, betas,
// hosted and namespace tools, which the model is not offered),
// replayed reasoning and thinking, and mid-conversation system messages, are answered in
// full rather than refused.
func TestAgentShapedRequests(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	shell := map[string]any{"type": "function", "name": "shell", "description": "Runs a command.", "strict": false,
		"parameters": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"command"},
			"properties": map[string]any{"command": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
				"workdir": map[string]any{"type": "string"}, "timeout_ms": map[string]any{"type": "number"}}}}
	codex := map[string]any{
		"model": "dflash-fake", "instructions": "You are a coding agent.", "stream": true, "store": false,
		"tools": []any{shell, map[string]any{"type": "web_search", "external_web_access": false},
			map[string]any{"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": []any{
				map[string]any{"type": "function", "name": "close_agent", "parameters": map[string]any{"type": "object"}}}}},
		"tool_choice": "auto", "parallel_tool_calls": false, "client_metadata": map[string]any{"thread_id": "t"},
		"reasoning": map[string]any{"effort": "medium", "summary": "auto"}, "include": []string{"reasoning.encrypted_content"},
		"prompt_cache_key": "6f1c2a9e", "text": map[string]any{"verbosity": "medium"},
		"input": []any{
			map[string]any{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": "<permissions>"}}},
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "List the files."}}},
			map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{map[string]any{"type": "summary_text", "text": "Use ls."}},
				"encrypted_content": "opaque"},
			map[string]any{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": `{"command":["ls"]}`},
			map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "go.mod\nmain.go"},
		},
	}
	events := postNamedStream(t, srv.URL+"/v1/responses", codex)
	if last := events[len(events)-1]; last.Name != "response.completed" {
		t.Errorf("a Codex-shaped request ends with %s: %v", last.Name, last.Data)
	}

	claudeCode := map[string]any{
		"model": "dflash-fake", "max_tokens": 32000, "stream": true, "metadata": map[string]any{"user_id": "u"},
		"system":   []any{map[string]any{"type": "text", "text": "You are Claude Code.", "cache_control": map[string]any{"type": "ephemeral"}}},
		"thinking": map[string]any{"type": "enabled", "budget_tokens": 31999}, "context_management": map[string]any{"edits": []any{}},
		"tools": []any{map[string]any{"name": "Bash", "description": "Run bash.", "input_schema": map[string]any{
			"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
			"properties": map[string]any{"command": map[string]any{"type": "string"}}, "required": []string{"command"}}}},
		"messages": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "List the files.",
				"cache_control": map[string]any{"type": "ephemeral"}}}},
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "thinking", "thinking": "Use ls.", "signature": "sig"},
				map[string]any{"type": "redacted_thinking", "data": "opaque"},
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": map[string]any{"command": "ls"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1",
				"content": []any{map[string]any{"type": "text", "text": "go.mod"}}}}},
			map[string]any{"role": "system", "content": "<system-reminder>Be brief.</system-reminder>"},
			map[string]any{"role": "user", "content": "And now?"},
		},
	}
	blocks, reason, _ := streamedMessage(t, postNamedStream(t, srv.URL+"/v1/messages", claudeCode,
		"anthropic-version", "2023-06-01", "anthropic-beta", "interleaved-thinking-2025-05-14"))
	if len(blocks) == 0 || reason != "end_turn" {
		t.Errorf("a Claude Code-shaped request: blocks %v, stop_reason %s", blocks, reason)
	}
}
