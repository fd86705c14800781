package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// TestLoad runs N concurrent clients for T seconds against a loopback server, mixing
// streaming and non-streaming chat and text completions with clients that hang up
// mid-stream. Every request must get a complete answer, a 429 with Retry-After, or (for
// the ones that hang up) nothing; every answer must carry only its own request's marker,
// so no text is ever mixed between requests; and the backend must never run two
// generations at once. N and T come from DFLASH_LOAD_CLIENTS and DFLASH_LOAD_SECONDS
// (default 8 and 3; the release check is 32 and 60). It stops by itself.
func TestLoad(t *testing.T) {
	clients := envInt(t, "DFLASH_LOAD_CLIENTS", 8)
	seconds := envInt(t, "DFLASH_LOAD_SECONDS", 3)
	fake := &servertest.Fake{Delay: time.Millisecond, PrefillDelay: 2 * time.Millisecond}
	srv := newFakeServer(t, server.Config{MaxQueue: max(clients/4, 1)}, fake)

	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var counts loadCounts
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			client := &http.Client{Timeout: 2*time.Minute + time.Duration(seconds)*time.Second}
			for k := 0; time.Now().Before(deadline); k++ {
				marker := fmt.Sprintf("c%dr%d", c, k)
				if err := loadRequest(client, srv.URL, marker, rng.IntN(5), &counts); err != nil {
					t.Errorf("client %d request %d: %v", c, k, err)
					return
				}
			}
		}()
	}
	wg.Wait()

	if !fake.WaitIdle(5 * time.Second) {
		t.Fatal("backend still generating after every client finished")
	}
	if fake.MaxActive() != 1 {
		t.Errorf("backend ran %d generations at once, want 1", fake.MaxActive())
	}
	if q := queued(t, srv.URL); q != 0 {
		t.Errorf("%d requests still queued", q)
	}
	t.Logf("%d clients for %ds: %d answered, %d refused with 429, %d hung up, %d generations ran",
		clients, seconds, counts.answered.Load(), counts.refused.Load(), counts.hungUp.Load(), len(fake.Runs()))
	if counts.answered.Load() == 0 {
		t.Error("no request was answered")
	}
}

type loadCounts struct {
	answered, refused, hungUp atomic.Int64
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// loadRequest sends one request of the given kind and checks its outcome.
func loadRequest(client *http.Client, baseURL, marker string, kind int, counts *loadCounts) error {
	prompt := "[[id:" + marker + "]] write something"
	chat := map[string]any{"messages": []map[string]any{{"role": "user", "content": prompt}}}
	completion := map[string]any{"prompt": prompt}
	switch kind {
	case 0:
		return loadOnce(client, baseURL+"/v1/chat/completions", chat, marker, counts)
	case 1:
		return loadStream(client, baseURL+"/v1/chat/completions", chat, marker, false, counts)
	case 2:
		return loadOnce(client, baseURL+"/v1/completions", completion, marker, counts)
	case 3:
		return loadStream(client, baseURL+"/v1/completions", completion, marker, false, counts)
	default:
		return loadStream(client, baseURL+"/v1/chat/completions", chat, marker, true, counts)
	}
}

func post(ctx context.Context, client *http.Client, url string, body map[string]any) (*http.Response, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return client.Do(req)
}

// refused checks a non-200 answer: only a 429 with Retry-After is acceptable under load.
func refused(resp *http.Response, counts *loadCounts) error {
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		return fmt.Errorf("status %d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), data)
	}
	counts.refused.Add(1)
	// Back off a little, as a client should, but far less than Retry-After so the queue
	// stays under pressure.
	time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond)
	return nil
}

func loadOnce(client *http.Client, url string, body map[string]any, marker string, counts *loadCounts) error {
	resp, err := post(context.Background(), client, url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refused(resp, counts)
	}
	var r struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usageJSON `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("decoding the answer: %w", err)
	}
	if len(r.Choices) != 1 || r.Choices[0].FinishReason != "stop" && r.Choices[0].FinishReason != "length" {
		return fmt.Errorf("incomplete answer %+v", r)
	}
	if err := taggedOnly(r.Choices[0].Text+r.Choices[0].Message.Content, marker); err != nil {
		return err
	}
	if r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens || r.Usage.CompletionTokens == 0 {
		return fmt.Errorf("usage %+v", r.Usage)
	}
	counts.answered.Add(1)
	return nil
}

func loadStream(client *http.Client, url string, body map[string]any, marker string, hangUp bool, counts *loadCounts) error {
	body["stream"] = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(ctx, client, url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refused(resp, counts)
	}
	var text strings.Builder
	finished, done := false, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if line == "data: [DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error *errorDetail `json:"error"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &chunk); err != nil {
			return fmt.Errorf("bad event %q: %w", line, err)
		}
		if chunk.Error != nil {
			return fmt.Errorf("error event %s", line)
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Text + c.Delta.Content)
			finished = finished || c.FinishReason != nil
		}
		if hangUp && text.Len() > 0 {
			cancel() // leave mid-stream
			counts.hungUp.Add(1)
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the stream: %w", err)
	}
	if !done || !finished {
		return fmt.Errorf("stream ended without a finish chunk and [DONE] (%q)", text.String())
	}
	if err := taggedOnly(text.String(), marker); err != nil {
		return err
	}
	counts.answered.Add(1)
	return nil
}

// taggedOnly checks that every word of an answer carries this request's marker.
func taggedOnly(text, marker string) error {
	words := strings.Fields(text)
	if len(words) == 0 {
		return fmt.Errorf("empty answer")
	}
	for _, w := range words {
		if !strings.HasPrefix(w, marker+"-") {
			return fmt.Errorf("answer for %s contains %q, which is not its own", marker, w)
		}
	}
	return nil
}
