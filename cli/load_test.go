package cli

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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func envIntOr(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// rssKiB is process pid's resident set in KiB from Linux's /proc/PID/status, 0 where there is
// no /proc (macOS): TestServeLoad's memory check then says it was not made.
func rssKiB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// A bounded load test of the real server and engine on loopback: N clients for T seconds
// (DFLASH_LOAD_CLIENTS, DFLASH_LOAD_SECONDS; default 8 × 5, the release check is 32 × 60)
// mix streaming, non-streaming and hang-ups over a few prompts. Greedy answers are
// deterministic, so every complete answer must equal its prompt's answer computed alone: no
// text is ever mixed between requests. Every request gets a complete answer, a clean 4xx or a
// 429. The mix runs twice; the second round grows the server's RSS by at most 10%.
func TestServeLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test; skipped with -short")
	}
	clients, seconds := envIntOr("DFLASH_LOAD_CLIENTS", 8), envIntOr("DFLASH_LOAD_SECONDS", 5)
	base, cmd, logs := startServe(t, "--max-queue", fmt.Sprint(max(clients/2, 1)))
	prompts := []string{"alpha one", "bravo two", "charlie three", "delta four"}
	ask := func(p string, stream bool) (string, int, error) {
		body, _ := json.Marshal(map[string]any{"model": "tiny-qwen3", "messages": []map[string]any{{"role": "user", "content": p}},
			"max_tokens": 8, "temperature": 0, "stream": stream})
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return "", 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			io.Copy(io.Discard, resp.Body)
			return "", resp.StatusCode, nil
		}
		if !stream {
			var r struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) == 0 {
				return "", 200, fmt.Errorf("bad body: %v", err)
			}
			return r.Choices[0].Message.Content, 200, nil
		}
		var text strings.Builder
		sc := bufio.NewScanner(resp.Body)
		done := false
		for sc.Scan() {
			line := sc.Text()
			if line == "data: [DONE]" {
				done = true
				break
			}
			if !strings.HasPrefix(line, "data: ") {
				continue
			}
			var ch struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			json.Unmarshal([]byte(line[6:]), &ch)
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
			}
		}
		if !done {
			return "", 200, fmt.Errorf("stream ended without [DONE]")
		}
		return text.String(), 200, nil
	}
	want := map[string]string{}
	for _, p := range prompts {
		a, code, err := ask(p, false)
		if err != nil || code != 200 {
			t.Fatalf("warm-up %q: %d %v", p, code, err)
		}
		want[p] = a
	}
	// One round of the client mix for the test's duration. The first round is the warm-up:
	// batches of every size form, their shapes allocate, and the allocators keep what they
	// freed; the second round must then not grow the server's memory.
	var ok, rejected, hungUp atomic.Int64
	load := func(round uint64) {
		var wg sync.WaitGroup
		deadline := time.Now().Add(time.Duration(seconds) * time.Second)
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(c), 3+round))
				for time.Now().Before(deadline) {
					p := prompts[r.IntN(len(prompts))]
					switch r.IntN(5) {
					case 0: // hang up mid-request
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+r.IntN(200))*time.Millisecond)
						body, _ := json.Marshal(map[string]any{"model": "tiny-qwen3", "messages": []map[string]any{{"role": "user", "content": p}}, "max_tokens": 64, "stream": true})
						req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", bytes.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						if resp, err := http.DefaultClient.Do(req); err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						cancel()
						hungUp.Add(1)
					default:
						got, code, err := ask(p, r.IntN(2) == 0)
						switch {
						case err != nil:
							t.Errorf("client %d: %v", c, err)
							return
						case code == 429:
							rejected.Add(1)
							time.Sleep(50 * time.Millisecond)
						case code != 200:
							t.Errorf("client %d: status %d", c, code)
							return
						case got != want[p]:
							t.Errorf("client %d: answer for %q is %q, alone it is %q (mixed output?)", c, p, got, want[p])
							return
						default:
							ok.Add(1)
						}
					}
				}
			}(c)
		}
		wg.Wait()
		time.Sleep(time.Second)
	}
	load(0)
	before := rssKiB(cmd.Process.Pid)
	load(1)
	after := rssKiB(cmd.Process.Pid)
	t.Logf("%d clients × %d s: %d complete answers, %d 429s, %d hang-ups; RSS %d KiB after the first round, %d KiB after the second", clients, seconds, ok.Load(), rejected.Load(), hungUp.Load(), before, after)
	if ok.Load() == 0 {
		t.Errorf("no request completed:\n%s", logs.String())
	}
	if before > 0 && float64(after) > 1.10*float64(before) {
		t.Errorf("RSS grew from %d to %d KiB (> 10%%)", before, after)
	}
	if before == 0 {
		t.Logf("RSS not checked: it is read from Linux's /proc, which %s lacks", runtime.GOOS)
	}
	// The server is still healthy.
	if a, code, err := ask(prompts[0], false); err != nil || code != 200 || a != want[prompts[0]] {
		t.Errorf("after load: %q %d %v", a, code, err)
	}
}
