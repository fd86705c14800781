package server_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// While a long prefill keeps the model silent, a Responses stream gets comments and a
// Messages stream ping events, so that agents with idle timeouts keep waiting; the answer
// that follows is whole.
func TestAgentStreamsKeepAliveDuringPrefill(t *testing.T) {
	// A prefill 40 times the keep-alive interval: several keep-alives whatever the scheduling.
	fake := &servertest.Fake{PrefillDelay: 400 * time.Millisecond}
	srv := newFakeServer(t, server.Config{StreamKeepAlive: 10 * time.Millisecond}, fake)
	tests := []struct {
		path      string
		body      map[string]any
		keepAlive string // the line a keep-alive starts with
		firstText string // the line that shows the answer has begun
		last      string
	}{
		{"/v1/responses", map[string]any{"input": "hi", "stream": true}, ": ping", "event: response.output_text.delta",
			"event: response.completed"},
		{"/v1/messages", map[string]any{"max_tokens": 100, "stream": true, "messages": []any{
			map[string]any{"role": "user", "content": "hi"}}}, "event: ping", "event: content_block_delta", "event: message_stop"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, err := httpClient.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL+tt.path, tt.body, anthropicHeaders...))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			keepAlives, answering, lastEvent := 0, false, ""
			for sc.Scan() {
				line := sc.Text()
				switch {
				case strings.HasPrefix(line, tt.firstText):
					answering = true
				case strings.HasPrefix(line, tt.keepAlive) && !answering:
					keepAlives++
				}
				if strings.HasPrefix(line, "event: ") {
					lastEvent = line
				}
			}
			// Messages streams open with one ping of their own; more show the keep-alive.
			if want := map[bool]int{true: 2, false: 1}[tt.keepAlive == "event: ping"]; keepAlives < want {
				t.Errorf("%d keep-alives before the answer, want at least %d", keepAlives, want)
			}
			if !answering || lastEvent != tt.last {
				t.Errorf("answer began: %v; last event %q, want %q", answering, lastEvent, tt.last)
			}
		})
	}
}
