package server_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// A client that disconnects mid-answer cancels its generation on both APIs, streamed or
// not, and the slot is free for the next request at once.
func TestAgentAPIClientDisconnectCancelsGeneration(t *testing.T) {
	tests := []struct {
		name, path string
		body       map[string]any
		firstDelta string // a line of the stream that shows generation has begun
	}{
		{"responses", "/v1/responses", map[string]any{"input": "long"}, "event: response.output_text.delta"},
		{"messages", "/v1/messages", map[string]any{"max_tokens": 4000,
			"messages": []any{map[string]any{"role": "user", "content": "long"}}}, "event: content_block_delta"},
	}
	for _, tt := range tests {
		for _, stream := range []bool{true, false} {
			t.Run(tt.name+map[bool]string{true: " stream", false: ""}[stream], func(t *testing.T) {
				// 2000 deltas of 5 ms: 10 s unless the disconnect cancels it.
				long := longScript(2000)
				fake := &servertest.Fake{Delay: 5 * time.Millisecond, Script: func(in servertest.Input) []string {
					if strings.Contains(in.Prompt, "long") {
						return long(in)
					}
					return nil
				}}
				srv := newFakeServer(t, server.Config{}, fake)
				body := map[string]any{"stream": stream}
				for k, v := range tt.body {
					body[k] = v
				}
				if stream {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					resp, err := httpClient.Do(newRequest(t, ctx, http.MethodPost, srv.URL+tt.path, body, anthropicHeaders...))
					if err != nil {
						t.Fatal(err)
					}
					r := bufio.NewReader(resp.Body)
					for {
						line, err := r.ReadString('\n')
						if err != nil {
							t.Fatalf("stream ended before any delta: %v", err)
						}
						if strings.HasPrefix(line, tt.firstDelta) {
							break
						}
					}
					cancel()
					resp.Body.Close()
				} else {
					cancel, done := startAsync(t, srv.URL+tt.path, body)
					waitFor(t, "the generation to start", 5*time.Second, func() bool { return fake.Active() == 1 })
					cancel()
					if resp := <-done; resp != nil {
						t.Fatalf("got a response %d after hanging up", resp.StatusCode)
					}
				}
				if !fake.WaitIdle(time.Second) {
					t.Fatal("the backend kept generating for over 1 s after the client left")
				}
				runs := fake.Runs()
				if last := runs[len(runs)-1]; !last.ContextCancelled || last.Finish != server.FinishCancelled {
					t.Fatalf("run %+v: want a cancelled context and finish cancelled", last)
				}
				postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "next", "stream": false})
			})
		}
	}
}

// A generation that fails mid-stream ends a Responses stream with an error event and then
// response.failed (agents wait for a terminal event), and a Messages stream with an error
// event in Anthropic's shape.
func TestAgentAPIStreamFailureEndsWithTerminalEvent(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Fail: servertest.ErrScripted})
	events := postNamedStream(t, srv.URL+"/v1/responses", map[string]any{"input": "hi", "stream": true})
	n := len(events)
	if n < 2 || events[n-2].Name != "error" || events[n-1].Name != "response.failed" ||
		jsonPath(events[n-1].Data, "response", "status") != "failed" || str(jsonPath(events[n-1].Data, "response", "error", "message")) == "" {
		t.Errorf("responses stream ends with %v", events[max(n-2, 0):])
	}
	events = postNamedStream(t, srv.URL+"/v1/messages", map[string]any{"max_tokens": 50, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, anthropicHeaders...)
	last := events[len(events)-1]
	if last.Name != "error" || jsonPath(last.Data, "error", "type") != "api_error" {
		t.Errorf("messages stream ends with %v", last)
	}
}
