package server

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeChatRequest checks that the chat request decoder never panics, that every
// rejection is a 400 naming what is wrong, and that every accepted request satisfies the
// invariants the rest of the server relies on. Seeds: testdata/fuzz/FuzzDecodeChatRequest.
func FuzzDecodeChatRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeChatRequest(body)
		if err != nil {
			var apiErr *apiError
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v is not an *apiError", err)
			}
			if apiErr.Status != 400 || apiErr.Message == "" || apiErr.Type != typeInvalidRequest {
				t.Fatalf("rejection %+v: want a 400 invalid_request_error with a message", apiErr)
			}
			return
		}
		checkChatRequestInvariants(t, req)
	})
}

func checkChatRequestInvariants(t *testing.T, req *chatRequest) {
	t.Helper()
	if len(req.Messages) == 0 {
		t.Fatal("accepted a request without messages")
	}
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			t.Fatalf("message %d has role %q", i, m.Role)
		}
		for _, c := range m.ToolCalls {
			var args map[string]any
			if c.Name == "" || json.Unmarshal([]byte(c.Arguments), &args) != nil {
				t.Fatalf("message %d: tool call %+v without a name or with arguments that are not a JSON object", i, c)
			}
		}
	}
	if len(req.Stop) > maxStopStrings {
		t.Fatalf("accepted %d stop strings", len(req.Stop))
	}
	for _, s := range req.Stop {
		if s == "" {
			t.Fatal("accepted an empty stop string")
		}
	}
	if req.MaxTokens != nil && *req.MaxTokens < 1 {
		t.Fatalf("accepted max tokens %d", *req.MaxTokens)
	}
	if v := req.Temperature; v != nil && (*v < 0 || *v > 2) {
		t.Fatalf("accepted temperature %g", *v)
	}
	if v := req.TopP; v != nil && (*v < 0 || *v > 1) {
		t.Fatalf("accepted top_p %g", *v)
	}
	if v := req.TopK; v != nil && *v < 0 {
		t.Fatalf("accepted top_k %d", *v)
	}
	names := map[string]bool{}
	for _, tool := range req.Tools {
		if tool.Name == "" || names[tool.Name] || !json.Valid(tool.Raw) {
			t.Fatalf("accepted tool %+v (empty, duplicate or invalid raw JSON)", tool)
		}
		names[tool.Name] = true
	}
	switch req.ToolChoice.Mode {
	case "auto", "none":
	case "required":
		if len(req.Tools) == 0 {
			t.Fatal("accepted tool_choice required without tools")
		}
	case "function":
		if !names[req.ToolChoice.Function] {
			t.Fatalf("accepted tool_choice naming undeclared %q", req.ToolChoice.Function)
		}
	default:
		t.Fatalf("tool choice mode %q", req.ToolChoice.Mode)
	}
}
