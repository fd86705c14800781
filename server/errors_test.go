package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

func TestClientMistakesGetOpenAIErrors(t *testing.T) {
	fake := &servertest.Fake{Context: 200}
	srv := newFakeServer(t, server.Config{MaxTokensLimit: 100, MaxBodyBytes: 4096}, fake)
	chat, completions := srv.URL+"/v1/chat/completions", srv.URL+"/v1/completions"
	user := `[{"role":"user","content":"hi"}]`
	tests := []struct {
		name    string
		method  string
		url     string
		body    string
		status  int
		param   string // "" when the error names no param
		code    string // "" when not checked
		message string // a substring of the message
	}{
		{"malformed JSON", "POST", chat, `{"messages": [`, 400, "", "invalid_json", "not valid JSON"},
		{"empty body", "POST", chat, ``, 400, "", "invalid_json", "empty"},
		{"body not an object", "POST", chat, `[1, 2]`, 400, "", "invalid_json", "JSON object"},
		{"max_tokens wrong type", "POST", chat, `{"messages":` + user + `,"max_tokens":"x"}`, 400, "max_tokens", "", "max_tokens must be an integer"},
		{"max_tokens zero", "POST", chat, `{"messages":` + user + `,"max_tokens":0}`, 400, "max_tokens", "", "at least 1"},
		{"max_tokens fractional", "POST", chat, `{"messages":` + user + `,"max_tokens":1.5}`, 400, "max_tokens", "", "integer"},
		{"max_completion_tokens negative", "POST", chat, `{"messages":` + user + `,"max_completion_tokens":-1}`, 400, "max_completion_tokens", "", "at least 1"},
		{"max_tokens over the limit", "POST", chat, `{"messages":` + user + `,"max_tokens":150}`, 400, "max_tokens", "", "limit of 100"},
		{"temperature wrong type", "POST", chat, `{"messages":` + user + `,"temperature":"hot"}`, 400, "temperature", "", "must be a number"},
		{"temperature out of range", "POST", chat, `{"messages":` + user + `,"temperature":3}`, 400, "temperature", "", "between 0 and 2"},
		{"top_p out of range", "POST", chat, `{"messages":` + user + `,"top_p":1.5}`, 400, "top_p", "", "between 0 and 1"},
		{"top_k negative", "POST", chat, `{"messages":` + user + `,"top_k":-5}`, 400, "top_k", "", "top_k"},
		{"seed wrong type", "POST", chat, `{"messages":` + user + `,"seed":"abc"}`, 400, "seed", "", "integer"},
		{"stream wrong type", "POST", chat, `{"messages":` + user + `,"stream":"yes"}`, 400, "stream", "", "boolean"},
		{"stream_options wrong type", "POST", chat, `{"messages":` + user + `,"stream_options":true}`, 400, "stream_options", "", "object"},
		{"too many stop strings", "POST", chat, `{"messages":` + user + `,"stop":["a","b","c","d","e"]}`, 400, "stop", "", "at most 4"},
		{"stop wrong type", "POST", chat, `{"messages":` + user + `,"stop":3}`, 400, "stop", "", "string or an array"},
		{"empty stop string", "POST", chat, `{"messages":` + user + `,"stop":[""]}`, 400, "stop", "", "empty"},
		{"stop list item wrong type", "POST", chat, `{"messages":` + user + `,"stop":["a",1]}`, 400, "stop[1]", "", "string"},
		{"n is 2", "POST", chat, `{"messages":` + user + `,"n":2}`, 400, "n", "", "n must be 1"},
		{"logprobs", "POST", chat, `{"messages":` + user + `,"logprobs":true}`, 400, "logprobs", "unsupported_parameter", "not supported"},
		{"response_format json", "POST", chat, `{"messages":` + user + `,"response_format":{"type":"json_object"}}`, 400, "response_format", "unsupported_parameter", "json_object"},
		{"presence_penalty out of range", "POST", chat, `{"messages":` + user + `,"presence_penalty":5}`, 400, "presence_penalty", "", "between -2 and 2"},
		{"unknown model", "POST", chat, `{"model":"gpt-4","messages":` + user + `}`, 404, "model", "model_not_found", "gpt-4"},
		{"model wrong type", "POST", chat, `{"model":7,"messages":` + user + `}`, 400, "model", "", "string"},
		{"messages missing", "POST", chat, `{"model":"dflash-fake"}`, 400, "messages", "", "non-empty array"},
		{"messages empty", "POST", chat, `{"messages":[]}`, 400, "messages", "", "non-empty array"},
		{"messages not an array", "POST", chat, `{"messages":"hi"}`, 400, "messages", "", "array"},
		{"message not an object", "POST", chat, `{"messages":["hi"]}`, 400, "messages[0]", "", "object"},
		{"role missing", "POST", chat, `{"messages":[{"content":"hi"}]}`, 400, "messages[0].role", "", "required"},
		{"role unknown", "POST", chat, `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages[0].role", "", "wizard"},
		{"user content missing", "POST", chat, `{"messages":[{"role":"user"}]}`, 400, "messages[0].content", "", "required"},
		{"content wrong type", "POST", chat, `{"messages":[{"role":"user","content":5}]}`, 400, "messages[0].content", "", "string or an array"},
		{"image part", "POST", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "", "text-only"},
		{"text part without text", "POST", chat, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, "messages[0].content[0].text", "", "required"},
		{"tool call arguments not an object", "POST", chat, `{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}`, 400, "messages[1].tool_calls[0].function.arguments", "", "object"},
		{"tool call without name", "POST", chat, `{"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]}`, 400, "messages[0].tool_calls[0].function.name", "", "required"},
		{"tools wrong type", "POST", chat, `{"messages":` + user + `,"tools":{"name":"f"}}`, 400, "tools", "", "array"},
		{"tool without function", "POST", chat, `{"messages":` + user + `,"tools":[{"type":"function"}]}`, 400, "tools[0].function", "", "required"},
		{"duplicate tool", "POST", chat, `{"messages":` + user + `,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}`, 400, "tools[1].function.name", "", "twice"},
		{"tool_choice unknown function", "POST", chat, `{"messages":` + user + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`, 400, "tool_choice.function.name", "", "not among the tools"},
		{"tool_choice required without tools", "POST", chat, `{"messages":` + user + `,"tool_choice":"required"}`, 400, "tool_choice", "", "no tools"},
		{"tool_choice bad string", "POST", chat, `{"messages":` + user + `,"tool_choice":"always"}`, 400, "tool_choice", "", "always"},
		{"template kwargs not an object", "POST", chat, `{"messages":` + user + `,"chat_template_kwargs":[1]}`, 400, "chat_template_kwargs", "", "object"},
		{"template kwarg enable_thinking wrong type", "POST", chat, `{"messages":` + user + `,"chat_template_kwargs":{"enable_thinking":"yes"}}`, 400, "chat_template_kwargs.enable_thinking", "", "boolean"},
		{"template kwarg messages is reserved", "POST", chat, `{"messages":` + user + `,"chat_template_kwargs":{"messages":[]}}`, 400, "chat_template_kwargs.messages", "", "chat_template_kwargs.messages is set by the server"},
		{"template kwarg tools is reserved", "POST", chat, `{"messages":` + user + `,"chat_template_kwargs":{"tools":null}}`, 400, "chat_template_kwargs.tools", "", "send tools"},
		{"template kwarg documents is reserved", "POST", chat, `{"messages":` + user + `,"chat_template_kwargs":{"documents":[]}}`, 400, "chat_template_kwargs.documents", "", "set by the server"},
		{"template kwarg add_generation_prompt is reserved", "POST", chat, `{"messages":` + user + `,"chat_template_kwargs":{"add_generation_prompt":false}}`, 400, "chat_template_kwargs.add_generation_prompt", "", "set by the server"},
		{"chat template refuses the history", "POST", chat, `{"messages":[{"role":"tool","content":"result"}]}`, 400, "messages", "", "chat template"},
		{"prompt longer than the context", "POST", chat, `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 300) + `"}]}`, 400, "messages", "context_length_exceeded", "context is 200 tokens"},
		{"prompt plus max_tokens over the context", "POST", chat, `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 120) + `"}],"max_tokens":90}`, 400, "max_tokens", "context_length_exceeded", "at most"},
		{"completion prompt missing", "POST", completions, `{"max_tokens":5}`, 400, "prompt", "", "prompt is required"},
		{"completion prompt of token ids", "POST", completions, `{"prompt":[1,2,3]}`, 400, "prompt", "", ""},
		{"completion prompt list of two", "POST", completions, `{"prompt":["a","b"]}`, 400, "prompt", "", "exactly one"},
		{"completion prompt wrong type", "POST", completions, `{"prompt":5}`, 400, "prompt", "", "string"},
		{"completion prompt empty", "POST", completions, `{"prompt":""}`, 400, "prompt", "", "empty"},
		{"completion echo", "POST", completions, `{"prompt":"a","echo":true}`, 400, "echo", "unsupported_parameter", "echo"},
		{"completion best_of", "POST", completions, `{"prompt":"a","best_of":3}`, 400, "best_of", "", "best_of"},
		{"completion n", "POST", completions, `{"prompt":"a","n":3}`, 400, "n", "", "n must be 1"},
		{"body over the size limit", "POST", chat, `{"messages":[{"role":"user","content":"` + strings.Repeat("y", 5000) + `"}]}`, 413, "", "request_too_large", "4096 bytes"},
		{"wrong method on chat", "GET", chat, ``, 405, "", "method_not_allowed", "POST"},
		{"wrong method on models", "POST", srv.URL + "/v1/models", `{}`, 405, "", "method_not_allowed", "GET"},
		{"unknown path", "GET", srv.URL + "/v1/embeddings", ``, 404, "", "not_found", "/v1/embeddings"},
		{"query string is fine, unknown path is not", "POST", srv.URL + "/v2/chat/completions?x=1", `{}`, 404, "", "not_found", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, data := do(t, tt.method, tt.url, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, data)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			var er errorResponse
			decode(t, data, &er)
			e := er.Error
			if e == nil || e.Message == "" || e.Type == "" {
				t.Fatalf("not an OpenAI error: %s", data)
			}
			if wantType := "invalid_request_error"; e.Type != wantType {
				t.Errorf("type %q, want %q", e.Type, wantType)
			}
			gotParam := ""
			if e.Param != nil {
				gotParam = *e.Param
			}
			if gotParam != tt.param {
				t.Errorf("param %q, want %q (%s)", gotParam, tt.param, e.Message)
			}
			if tt.code != "" && (e.Code == nil || *e.Code != tt.code) {
				t.Errorf("code %v, want %q", e.Code, tt.code)
			}
			if !strings.Contains(e.Message, tt.message) {
				t.Errorf("message %q lacks %q", e.Message, tt.message)
			}
			if tt.status == 405 && resp.Header.Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
		})
	}
	if runs := fake.Runs(); len(runs) != 0 {
		t.Errorf("%d generations ran for rejected requests", len(runs))
	}
}

// Fields that OpenAI defines and the server does not act on are accepted.
func TestToleratedFieldsAreAccepted(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	body := userChat("hi",
		"presence_penalty", 0.5, "frequency_penalty", -0.5, "logit_bias", map[string]any{"42": -100},
		"user", "someone", "metadata", map[string]any{"k": "v"}, "store", false, "service_tier", "auto",
		"logprobs", false, "response_format", map[string]any{"type": "text"}, "parallel_tool_calls", true,
		"n", 1, "top_k", -1, "some_future_field", map[string]any{"x": 1}, "max_tokens", nil, "stop", nil)
	if a := chatOnce(t, srv.URL, body); a.Content == "" {
		t.Fatalf("empty answer %+v", a)
	}
}

// panicky is a backend whose chat template panics: the server must answer 500 JSON and keep
// serving.
type panicky struct{ *servertest.Fake }

func (p panicky) ChatPrompt([]server.ChatMessage, []server.Tool, server.TemplateOptions) (server.Prompt, error) {
	panic("template exploded")
}

func TestPanicBecomes500JSON(t *testing.T) {
	srv := servertest.Start(t, server.Config{}, panicky{&servertest.Fake{}}, nil)
	resp, data := do(t, http.MethodPost, srv.URL+"/v1/chat/completions", userChat("hi"))
	var er errorResponse
	decode(t, data, &er)
	if resp.StatusCode != 500 || er.Error == nil || er.Error.Type != "server_error" {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	// The server still works: text completions do not use the chat template.
	if text, _, _ := completionOnce(t, srv.URL, map[string]any{"prompt": "p"}); text == "" {
		t.Fatal("no answer after the panic")
	}
}

func TestBackendFailureIsA500(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Fail: servertest.ErrScripted})
	resp, data := do(t, http.MethodPost, srv.URL+"/v1/chat/completions", userChat("hi"))
	var er errorResponse
	decode(t, data, &er)
	if resp.StatusCode != 500 || er.Error == nil || !strings.Contains(er.Error.Message, "scripted backend failure") {
		t.Fatalf("non-streaming: %d %s", resp.StatusCode, data)
	}
	// Streaming: the headers are out, so the error comes as an event, then [DONE].
	_, events, done := postStream(t, srv.URL+"/v1/chat/completions", userChat("hi", "stream", true))
	var last chatChunk
	decode(t, events[len(events)-1], &last)
	if !done || last.Error == nil || last.Error.Type != "server_error" {
		t.Fatalf("streaming: last event %s, done %v", events[len(events)-1], done)
	}
}
