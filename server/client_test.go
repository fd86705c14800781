package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// rawPost writes a POST with a JSON body on a new loopback connection, byte for byte, so
// that a test can do what net/http's client never does (half-close, stop reading).
func rawPost(t *testing.T, baseURL, path string, body any) *net.TCPConn {
	t.Helper()
	return rawPostProto(t, baseURL, path, "HTTP/1.1", body)
}

func rawPostProto(t *testing.T, baseURL, path, proto string, body any) *net.TCPConn {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatalf("encoding the request: %v", err)
	}
	addr := strings.TrimPrefix(baseURL, "http://")
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	conn := c.(*net.TCPConn)
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatalf("setting the deadline: %v", err)
	}
	req := fmt.Sprintf("POST %s %s\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		path, proto, addr, len(data))
	if _, err := conn.Write(append([]byte(req), data...)); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	return conn
}

// readFinalResponse reads the response from r, skipping informational (1xx) responses as
// every HTTP/1.1 client must, and returns it with its body read.
func readFinalResponse(t *testing.T, r *bufio.Reader) (*http.Response, []byte) {
	t.Helper()
	for {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("reading the response body: %v", err)
		}
		return resp, data
	}
}

// A client may half-close its sending side once the request is sent (legal in HTTP/1.1):
// it must get the whole answer, running or queued, streaming or not.
func TestHalfClosedClientGetsTheWholeAnswer(t *testing.T) {
	tests := []struct {
		name   string
		path   string
		proto  string
		stream bool
		queued bool // another generation holds the slot when the request arrives
	}{
		{"chat", "/v1/chat/completions", "HTTP/1.1", false, false},
		{"chat stream", "/v1/chat/completions", "HTTP/1.1", true, false},
		{"completion", "/v1/completions", "HTTP/1.1", false, false},
		{"completion stream", "/v1/completions", "HTTP/1.1", true, false},
		{"chat while queued", "/v1/chat/completions", "HTTP/1.1", false, true},
		{"chat stream while queued", "/v1/chat/completions", "HTTP/1.1", true, true},
		// HTTP/1.0 has no informational responses to probe with: the answer is made anyway.
		{"chat over HTTP/1.0", "/v1/chat/completions", "HTTP/1.0", false, false},
		{"chat stream over HTTP/1.0", "/v1/chat/completions", "HTTP/1.0", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// 40 deltas of 5 ms after a 50 ms prefill: the half-close is seen mid-request.
			fake := &servertest.Fake{Script: longScript(40), Delay: 5 * time.Millisecond, PrefillDelay: 50 * time.Millisecond}
			srv := newFakeServer(t, server.Config{}, fake)
			var first <-chan *http.Response
			if tt.queued {
				var cancel func()
				cancel, first = startAsync(t, srv.URL+"/v1/completions", map[string]any{"prompt": "first"})
				defer cancel()
				waitFor(t, "the first generation", 5*time.Second, func() bool { return fake.Active() == 1 })
			}
			body := map[string]any{"stream": tt.stream}
			if strings.Contains(tt.path, "chat") {
				body["messages"] = []map[string]any{{"role": "user", "content": "hello"}}
			} else {
				body["prompt"] = "hello"
			}
			conn := rawPostProto(t, srv.URL, tt.path, tt.proto, body)
			if err := conn.CloseWrite(); err != nil {
				t.Fatalf("half-closing: %v", err)
			}
			resp, data := readFinalResponse(t, bufio.NewReader(conn))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			var text, finish string
			if tt.stream {
				events, done := sseEvents(t, bytes.NewReader(data))
				if !done {
					t.Fatalf("stream did not end with [DONE]:\n%s", data)
				}
				for _, raw := range events {
					var ch struct {
						Choices []struct {
							Text         string                   `json:"text"`
							Delta        struct{ Content string } `json:"delta"`
							FinishReason *string                  `json:"finish_reason"`
						} `json:"choices"`
					}
					decode(t, raw, &ch)
					for _, c := range ch.Choices {
						text += c.Text + c.Delta.Content
						if c.FinishReason != nil {
							finish = *c.FinishReason
						}
					}
				}
			} else {
				if resp.ContentLength <= 0 {
					t.Fatalf("Content-Length %d: %s", resp.ContentLength, data)
				}
				var full struct {
					Choices []struct {
						Text         string                   `json:"text"`
						Message      struct{ Content string } `json:"message"`
						FinishReason string                   `json:"finish_reason"`
					} `json:"choices"`
				}
				decode(t, data, &full)
				if len(full.Choices) != 1 {
					t.Fatalf("answer %s", data)
				}
				text, finish = full.Choices[0].Text+full.Choices[0].Message.Content, full.Choices[0].FinishReason
			}
			if finish != "stop" || len(strings.Fields(text)) != 40 {
				t.Fatalf("finish %q with %d words, want stop with 40: %q", finish, len(strings.Fields(text)), text)
			}
			if first != nil {
				if r := <-first; r == nil || r.StatusCode != http.StatusOK {
					t.Fatalf("the first request: %v", r)
				}
			}
			for _, run := range fake.Runs() {
				if run.ContextCancelled {
					t.Fatalf("a generation was cancelled: %+v", run)
				}
			}
		})
	}
}

// --write-timeout bounds a stall writing a stream: a client that stops reading frees the
// generation slot about that long after the connection's buffers fill, not when the
// generation would have ended.
func TestWriteTimeoutCutsAStreamNobodyReads(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	// 4 000 deltas of 1 KB at 1 ms each: 4 MB over at least 4 s.
	delta := strings.Repeat("x", 1023) + " "
	fake := &servertest.Fake{Delay: time.Millisecond, Script: func(in servertest.Input) []string {
		if in.Prompt != "stall" {
			return nil // the default short answer
		}
		out := make([]string, 4000)
		for i := range out {
			out[i] = delta
		}
		return out
	}}
	srv := newFakeServer(t, server.Config{WriteTimeout: writeTimeout}, fake)
	conn := rawPost(t, srv.URL, "/v1/completions", map[string]any{"prompt": "stall", "stream": true, "max_tokens": 4000})
	// The client reads nothing: only what the kernel buffers gets through.
	if err := conn.SetReadBuffer(4096); err != nil {
		t.Fatalf("shrinking the read buffer: %v", err)
	}
	start := time.Now()
	waitFor(t, "the generation to start", 5*time.Second, func() bool { return fake.Active() == 1 })
	if !fake.WaitIdle(3 * time.Second) {
		t.Fatalf("the generation still ran %v after the client stopped reading, with a %v write timeout",
			time.Since(start).Round(time.Millisecond), writeTimeout)
	}
	runs := fake.Runs()
	if last := runs[len(runs)-1]; last.Finish != server.FinishCancelled || last.CompletionTokens >= 4000 {
		t.Fatalf("run %+v: want a cancelled generation", last)
	}
	t.Logf("the slot was freed %v after the request", time.Since(start).Round(time.Millisecond))
	if a := chatOnce(t, srv.URL, userChat("next")); a.Content == "" {
		t.Fatal("no answer after the stalled stream")
	}
}
