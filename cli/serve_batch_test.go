package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// chatReq is a chat completion request of the batching tests.
func chatReq(prompt string, maxTokens int, sampling map[string]any) map[string]any {
	req := map[string]any{"model": "tiny-qwen3", "messages": []map[string]any{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens, "temperature": 0, "chat_template_kwargs": map[string]any{"enable_thinking": false}}
	for k, v := range sampling {
		req[k] = v
	}
	return req
}

func contentOf(t *testing.T, resp map[string]any) string {
	t.Helper()
	choices, _ := resp["choices"].([]any)
	if len(choices) == 0 {
		t.Fatalf("no choices in %v", resp)
	}
	msg, _ := choices[0].(map[string]any)["message"].(map[string]any)
	s, _ := msg["content"].(string)
	return s
}

// The batching server: requests sent at once, of different lengths and sampling, get the
// answers they get alone; beside them a bad request is refused, a client that disconnects
// mid-stream and one that stops reading cost only themselves; /metrics saw batched steps.
func TestServeBatchesRequestsExactly(t *testing.T) {
	base, _, logs := startServe(t, "--no-draft", "--max-batch", "4", "--write-timeout", "2s")
	reqs := []map[string]any{
		chatReq("Name three colours.", 24, nil),
		chatReq("Write a Go function that adds two ints.", 40, nil),
		chatReq(strings.Repeat("Explain slices and maps in Go. ", 12), 16, nil),
		chatReq("Count to five.", 30, map[string]any{"temperature": 0.8, "top_p": 0.9, "seed": 42}),
		chatReq("Say hi.", 8, nil),
		chatReq("What is a goroutine?", 33, map[string]any{"temperature": 1.0, "top_k": 20, "seed": 7}),
	}
	solo := make([]string, len(reqs))
	for i, r := range reqs {
		code, resp := postJSON(t, base+"/v1/chat/completions", r)
		if code != 200 {
			t.Fatalf("solo %d: %d %v\n%s", i, code, resp, logs.String())
		}
		solo[i] = contentOf(t, resp)
	}

	var wg sync.WaitGroup
	got := make([]string, 2*len(reqs))
	codes := make([]int, 2*len(reqs))
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, resp := postJSON(t, base+"/v1/chat/completions", reqs[i%len(reqs)])
			codes[i] = code
			if code == 200 {
				got[i] = contentOf(t, resp)
			}
		}()
	}
	// Beside them: a bad sampling value, a client gone mid-stream, one that stops reading.
	bad, _ := postJSON(t, base+"/v1/chat/completions", chatReq("x", 5, map[string]any{"top_p": 2}))
	gone := streamAndLeave(t, base, chatReq("Tell a long story.", 200, nil), 3)
	stalled := stallReading(t, base, chatReq("Tell another long story.", 400, nil))
	wg.Wait()
	stalled.Close()
	for i, g := range got {
		if codes[i] != 200 {
			t.Errorf("batched request %d: status %d", i, codes[i])
			continue
		}
		if g != solo[i%len(reqs)] {
			t.Errorf("batched request %d differs from alone:\n got %q\nwant %q", i, g, solo[i%len(reqs)])
		}
	}
	if bad != 400 {
		t.Errorf("top_p 2: status %d, want 400", bad)
	}
	if !gone {
		t.Error("the client that left never got its first chunks")
	}
	metrics := getText(t, base+"/metrics")
	total, single := histCount(metrics, "dflash_batch_rows", "+Inf"), histCount(metrics, "dflash_batch_rows", "1")
	if total == 0 || single >= total {
		t.Errorf("no step decoded more than one row (%d of %d steps had one)", single, total)
	}
	// The server is idle again.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(getText(t, base+"/health"), `"running":0`) {
		if time.Now().After(deadline) {
			t.Fatalf("generations still running: %s", getText(t, base+"/health"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// streamAndLeave starts a streaming request, reads n data lines and closes the connection;
// it reports whether the n lines came.
func streamAndLeave(t *testing.T, base string, req map[string]any, n int) bool {
	t.Helper()
	req["stream"] = true
	conn := rawPost(t, base, req)
	defer conn.Close()
	r := bufio.NewReader(conn)
	for seen := 0; seen < n; {
		line, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		if strings.HasPrefix(line, "data: ") {
			seen++
		}
	}
	return true
}

// stallReading starts a streaming request and never reads its answer.
func stallReading(t *testing.T, base string, req map[string]any) net.Conn {
	t.Helper()
	req["stream"] = true
	return rawPost(t, base, req)
}

// rawPost sends a POST of req to /v1/chat/completions on a connection of its own.
func rawPost(t *testing.T, base string, req map[string]any) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := mustJSON(t, req)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return conn
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// histCount is a Prometheus histogram's cumulative count at bucket le.
func histCount(metrics, name, le string) int {
	m := regexp.MustCompile(`(?m)^` + name + `_bucket\{le="` + regexp.QuoteMeta(le) + `"\} (\d+)$`).FindStringSubmatch(metrics)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
