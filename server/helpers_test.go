package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// The response shapes as a client reads them, written from OpenAI's API reference
// independently of the server's own types.

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type dflashJSON struct {
	Tau             float64 `json:"tau"`
	Cycles          int     `json:"cycles"`
	DraftMS         float64 `json:"draft_ms"`
	VerifyMS        float64 `json:"verify_ms"`
	TokensPerSecond float64 `json:"tokens_per_second"`
}

type toolCallJSON struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role             string         `json:"role"`
			Content          *string        `json:"content"`
			ReasoningContent string         `json:"reasoning_content"`
			ToolCalls        []toolCallJSON `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage  *usageJSON  `json:"usage"`
	DFlash *dflashJSON `json:"dflash"`
}

type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role             string         `json:"role"`
			Content          *string        `json:"content"`
			ReasoningContent string         `json:"reasoning_content"`
			ToolCalls        []toolCallJSON `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage  json.RawMessage `json:"usage"`
	DFlash *dflashJSON     `json:"dflash"`
	Error  *errorDetail    `json:"error"`
}

type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text         string  `json:"text"`
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage  json.RawMessage `json:"usage"`
	DFlash *dflashJSON     `json:"dflash"`
	Error  *errorDetail    `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type errorResponse struct {
	Error *errorDetail `json:"error"`
}

// chatAnswer is a chat answer merged from either shape, for comparisons.
type chatAnswer struct {
	Content   string
	Reasoning string
	ToolCalls []string // "name args"
	Finish    string
	Usage     usageJSON
}

// newFakeServer starts a server over a fresh fake on loopback.
func newFakeServer(t *testing.T, cfg server.Config, fake *servertest.Fake) *servertest.Running {
	t.Helper()
	return servertest.Start(t, cfg, fake, nil)
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

// do sends a request with a JSON body (a string is sent as it is) and returns the
// response with its body read.
func do(t *testing.T, method, url string, body any, headers ...string) (*http.Response, []byte) {
	t.Helper()
	resp, err := httpClient.Do(newRequest(t, context.Background(), method, url, body, headers...))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body of %s %s: %v", method, url, err)
	}
	return resp, data
}

func newRequest(t *testing.T, ctx context.Context, method, url string, body any, headers ...string) *http.Request {
	t.Helper()
	var reader io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		reader = strings.NewReader(b)
	case []byte:
		reader = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encoding the request: %v", err)
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, reader)
	if err != nil {
		t.Fatalf("building the request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

// decode unmarshals data into v or fails the test showing the body.
func decode(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
}

// sseEvents splits an SSE body into its data payloads and reports whether it ended with
// [DONE]. Comment lines (":..."), which the server sends to probe a client that closed its
// sending side, are skipped; any other line that is not "data: ..." or blank fails the test.
func sseEvents(t *testing.T, body io.Reader) (events [][]byte, done bool) {
	t.Helper()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" || strings.HasPrefix(line, ":"):
		case line == "data: [DONE]":
			if done {
				t.Fatal("[DONE] sent twice")
			}
			done = true
		case strings.HasPrefix(line, "data: "):
			if done {
				t.Fatalf("event after [DONE]: %s", line)
			}
			events = append(events, []byte(strings.TrimPrefix(line, "data: ")))
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return events, done
}

// postStream posts a streaming request and returns the status and the SSE events.
func postStream(t *testing.T, url string, body any, headers ...string) (int, [][]byte, bool) {
	t.Helper()
	resp, err := httpClient.Do(newRequest(t, context.Background(), http.MethodPost, url, body, headers...))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s (stream): status %d: %s", url, resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("stream Content-Type %q", ct)
	}
	events, done := sseEvents(t, resp.Body)
	return resp.StatusCode, events, done
}

// chatOnce posts a non-streaming chat request and returns its merged answer.
func chatOnce(t *testing.T, baseURL string, body map[string]any) chatAnswer {
	t.Helper()
	body["stream"] = false
	resp, data := do(t, http.MethodPost, baseURL+"/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: status %d: %s", resp.StatusCode, data)
	}
	var cr chatResponse
	decode(t, data, &cr)
	if cr.Object != "chat.completion" || !strings.HasPrefix(cr.ID, "chatcmpl-") || len(cr.Choices) != 1 || cr.Usage == nil || cr.DFlash == nil {
		t.Fatalf("chat response shape: %s", data)
	}
	c := cr.Choices[0]
	a := chatAnswer{Reasoning: c.Message.ReasoningContent, Finish: c.FinishReason, Usage: *cr.Usage}
	if c.Message.Content != nil {
		a.Content = *c.Message.Content
	}
	for _, tc := range c.Message.ToolCalls {
		if tc.Type != "function" || !strings.HasPrefix(tc.ID, "call_") {
			t.Fatalf("tool call shape: %+v", tc)
		}
		a.ToolCalls = append(a.ToolCalls, tc.Function.Name+" "+tc.Function.Arguments)
	}
	return a
}

// chatStream posts a streaming chat request and merges its chunks into an answer,
// checking the chunk sequence on the way.
func chatStream(t *testing.T, baseURL string, body map[string]any) chatAnswer {
	t.Helper()
	body["stream"] = true
	_, events, done := postStream(t, baseURL+"/v1/chat/completions", body)
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	includeUsage := false
	if opts, ok := body["stream_options"].(map[string]any); ok {
		includeUsage, _ = opts["include_usage"].(bool)
	}
	var a chatAnswer
	var id string
	finished, sawUsage := false, false
	for i, raw := range events {
		var ch chatChunk
		decode(t, raw, &ch)
		if ch.Error != nil {
			t.Fatalf("error event: %s", raw)
		}
		if ch.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %d object %q", i, ch.Object)
		}
		if id == "" {
			id = ch.ID
		} else if ch.ID != id {
			t.Fatalf("chunk %d id %q differs from %q", i, ch.ID, id)
		}
		if includeUsage && string(ch.Usage) == "" {
			t.Fatalf("chunk %d has no usage field although include_usage is set: %s", i, raw)
		}
		if !includeUsage && string(ch.Usage) != "" {
			t.Fatalf("chunk %d has a usage field without include_usage: %s", i, raw)
		}
		if len(ch.Choices) == 0 {
			// The usage chunk: last, after the finish chunk, only with include_usage.
			if !includeUsage || !finished || i != len(events)-1 {
				t.Fatalf("chunk %d without choices: %s", i, raw)
			}
			decode(t, ch.Usage, &a.Usage)
			sawUsage = true
			continue
		}
		if string(ch.Usage) != "" && string(ch.Usage) != "null" {
			t.Fatalf("chunk %d with choices carries usage %s", i, ch.Usage)
		}
		c := ch.Choices[0]
		if finished {
			t.Fatalf("chunk %d after the finish chunk: %s", i, raw)
		}
		if i == 0 && c.Delta.Role != "assistant" {
			t.Fatalf("first chunk has no assistant role: %s", raw)
		}
		if c.Delta.Content != nil {
			a.Content += *c.Delta.Content
		}
		a.Reasoning += c.Delta.ReasoningContent
		for _, tc := range c.Delta.ToolCalls {
			if tc.Index == nil || tc.ID == "" || tc.Function.Name == "" {
				t.Fatalf("streamed tool call without index, id or name: %s", raw)
			}
			a.ToolCalls = append(a.ToolCalls, tc.Function.Name+" "+tc.Function.Arguments)
		}
		if c.FinishReason != nil {
			a.Finish, finished = *c.FinishReason, true
			if ch.DFlash == nil {
				t.Fatalf("finish chunk without dflash stats: %s", raw)
			}
		}
	}
	if !finished {
		t.Fatal("stream had no finish chunk")
	}
	if includeUsage != sawUsage {
		t.Fatalf("include_usage %v but usage chunk seen %v", includeUsage, sawUsage)
	}
	return a
}

// completionOnce posts a non-streaming text completion.
func completionOnce(t *testing.T, baseURL string, body map[string]any) (text, finish string, u usageJSON) {
	t.Helper()
	body["stream"] = false
	resp, data := do(t, http.MethodPost, baseURL+"/v1/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: status %d: %s", resp.StatusCode, data)
	}
	var cr completionResponse
	decode(t, data, &cr)
	if cr.Object != "text_completion" || !strings.HasPrefix(cr.ID, "cmpl-") || len(cr.Choices) != 1 ||
		cr.Choices[0].FinishReason == nil || cr.DFlash == nil {
		t.Fatalf("completion response shape: %s", data)
	}
	decode(t, cr.Usage, &u)
	return cr.Choices[0].Text, *cr.Choices[0].FinishReason, u
}

// completionStream posts a streaming text completion and merges it.
func completionStream(t *testing.T, baseURL string, body map[string]any) (text, finish string, u usageJSON, sawUsage bool) {
	t.Helper()
	body["stream"] = true
	_, events, done := postStream(t, baseURL+"/v1/completions", body)
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	for i, raw := range events {
		var cr completionResponse
		decode(t, raw, &cr)
		if cr.Error != nil || cr.Object != "text_completion" {
			t.Fatalf("chunk %d: %s", i, raw)
		}
		if len(cr.Choices) == 0 {
			decode(t, cr.Usage, &u)
			sawUsage = true
			continue
		}
		text += cr.Choices[0].Text
		if cr.Choices[0].FinishReason != nil {
			finish = *cr.Choices[0].FinishReason
		}
	}
	return text, finish, u, sawUsage
}

func userChat(content string, extra ...any) map[string]any {
	body := map[string]any{"model": "dflash-fake", "messages": []map[string]any{{"role": "user", "content": content}}}
	for i := 0; i+1 < len(extra); i += 2 {
		body[fmt.Sprint(extra[i])] = extra[i+1]
	}
	return body
}
