package server_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// lockedBuffer is a log sink the server's goroutines and the test can share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) lines() [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n"))
}

func TestOneLogLinePerRequest(t *testing.T) {
	var logs lockedBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	srv := servertest.Start(t, server.Config{}, &servertest.Fake{}, logger)
	chatOnce(t, srv.URL, userChat("hello"))
	do(t, http.MethodPost, srv.URL+"/v1/chat/completions", `{"n": 2}`)
	do(t, http.MethodGet, srv.URL+"/health", nil) // probes log at debug level only
	if err := srv.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	var requests []map[string]any
	for _, line := range logs.lines() {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if rec["msg"] == "request" {
			requests = append(requests, rec)
		}
	}
	if len(requests) != 2 {
		t.Fatalf("%d request log lines, want 2 (chat and the 400):\n%s", len(requests), bytes.Join(logs.lines(), []byte("\n")))
	}
	ok := requests[0]
	for _, key := range []string{"id", "status", "prompt_tokens", "completion_tokens", "tau", "tok_per_s", "finish", "queued", "elapsed"} {
		if _, present := ok[key]; !present {
			t.Errorf("generation log line lacks %q: %v", key, ok)
		}
	}
	if ok["finish"] != "stop" || ok["status"] != float64(200) || ok["completion_tokens"].(float64) <= 0 {
		t.Errorf("generation log line %v", ok)
	}
	if bad := requests[1]; bad["status"] != float64(400) || bad["prompt_tokens"] != nil {
		t.Errorf("rejected request log line %v", bad)
	}
}
