package server_test

import (
	"bufio"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// longScript answers with n one-word deltas.
func longScript(n int) func(servertest.Input) []string {
	return func(servertest.Input) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "w" + strconv.Itoa(i) + " "
		}
		return out
	}
}

// queued reads the number of waiting requests from /health.
func queued(t *testing.T, baseURL string) int {
	t.Helper()
	_, data := do(t, http.MethodGet, baseURL+"/health", nil)
	var h struct {
		Queued int `json:"queued"`
	}
	decode(t, data, &h)
	return h.Queued
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// startAsync sends a request in the background; cancel ends it from the client side.
func startAsync(t *testing.T, url string, body any) (cancel context.CancelFunc, result <-chan *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *http.Response, 1)
	req := newRequest(t, ctx, http.MethodPost, url, body)
	go func() {
		resp, err := httpClient.Do(req)
		if err != nil {
			out <- nil
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out <- resp
	}()
	return cancel, out
}

func TestQueueFullGets429WithRetryAfter(t *testing.T) {
	fake := &servertest.Fake{Script: longScript(400), Delay: 5 * time.Millisecond}
	srv := newFakeServer(t, server.Config{MaxQueue: 1}, fake)
	chat := srv.URL + "/v1/chat/completions"
	cancelA, doneA := startAsync(t, chat, userChat("a", "stream", true))
	defer cancelA()
	waitFor(t, "the first generation to run", 5*time.Second, func() bool { return fake.Active() == 1 })
	cancelB, doneB := startAsync(t, chat, userChat("b"))
	defer cancelB()
	waitFor(t, "the second request to queue", 5*time.Second, func() bool { return queued(t, srv.URL) == 1 })

	resp, data := do(t, http.MethodPost, chat, userChat("c"))
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third request: %d %s, want 429", resp.StatusCode, data)
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	var er errorResponse
	decode(t, data, &er)
	if er.Error == nil || er.Error.Type != "rate_limit_error" || *er.Error.Code != "queue_full" {
		t.Fatalf("429 body %s", data)
	}
	cancelA()
	cancelB()
	<-doneA
	<-doneB
	if !fake.WaitIdle(2 * time.Second) {
		t.Fatal("backend still busy after both clients left")
	}
	if fake.MaxActive() != 1 {
		t.Fatalf("%d generations ran at once", fake.MaxActive())
	}
}

// With no queue only the running generation is served: every other request gets 429 at
// once, and the slot serves again once it is free.
func TestNoQueueServesOnlyTheRunningGeneration(t *testing.T) {
	fake := &servertest.Fake{Script: longScript(400), Delay: 5 * time.Millisecond}
	srv := newFakeServer(t, server.Config{MaxQueue: server.NoQueue}, fake)
	chat := srv.URL + "/v1/chat/completions"
	cancelA, doneA := startAsync(t, chat, userChat("a", "stream", true))
	defer cancelA()
	waitFor(t, "the first generation to run", 5*time.Second, func() bool { return fake.Active() == 1 })
	for _, body := range []map[string]any{userChat("b"), userChat("c", "stream", true)} {
		resp, data := do(t, http.MethodPost, chat, body)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("request behind the running one: %d %s, want 429", resp.StatusCode, data)
		}
		var er errorResponse
		decode(t, data, &er)
		if er.Error == nil || er.Error.Code == nil || *er.Error.Code != "queue_full" ||
			!strings.Contains(er.Error.Message, "0 requests wait") {
			t.Fatalf("429 body %s", data)
		}
	}
	cancelA()
	<-doneA
	if !fake.WaitIdle(2 * time.Second) {
		t.Fatal("backend still busy after the client left")
	}
	if a := completionText(t, srv.URL); a == "" {
		t.Fatal("no answer once the slot was free")
	}
	if runs := fake.Runs(); len(runs) != 2 {
		t.Fatalf("%d generations ran, want 2 (the refused ones never run)", len(runs))
	}
}

func completionText(t *testing.T, baseURL string) string {
	t.Helper()
	text, _, _ := completionOnce(t, baseURL, map[string]any{"prompt": "free", "max_tokens": 3})
	return text
}

func TestClientDisconnectCancelsGeneration(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			// 2000 deltas of 5 ms: 10 s unless the disconnect cancels it.
			long := longScript(2000)
			fake := &servertest.Fake{Delay: 5 * time.Millisecond, Script: func(in servertest.Input) []string {
				if strings.Contains(in.Prompt, "long") {
					return long(in)
				}
				return nil // the default short answer
			}}
			srv := newFakeServer(t, server.Config{}, fake)
			var hungUp time.Time
			if stream {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp, err := httpClient.Do(newRequest(t, ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
					userChat("long", "stream", true)))
				if err != nil {
					t.Fatal(err)
				}
				// Read until the first content arrives, then hang up mid-stream.
				r := bufio.NewReader(resp.Body)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						t.Fatalf("stream ended before any content: %v", err)
					}
					if strings.Contains(line, `"content":"w`) {
						break
					}
				}
				hungUp = time.Now()
				cancel()
				resp.Body.Close()
			} else {
				cancel, done := startAsync(t, srv.URL+"/v1/chat/completions", userChat("long"))
				waitFor(t, "the generation to start", 5*time.Second, func() bool { return fake.Active() == 1 })
				hungUp = time.Now()
				cancel()
				if resp := <-done; resp != nil {
					t.Fatalf("got a response %d after hanging up", resp.StatusCode)
				}
			}
			if !fake.WaitIdle(time.Second) {
				t.Fatal("the backend kept generating for over 1 s after the client left")
			}
			runs := fake.Runs()
			last := runs[len(runs)-1]
			if !last.ContextCancelled || last.Finish != server.FinishCancelled {
				t.Fatalf("run %+v: want a cancelled context and finish cancelled", last)
			}
			t.Logf("backend stopped %v after the hang-up", last.End.Sub(hungUp).Round(time.Millisecond))
			// The slot is free: a new request is served at once.
			if a := chatOnce(t, srv.URL, userChat("next")); a.Content == "" {
				t.Fatal("no answer after the disconnect")
			}
		})
	}
}

func TestClientLeavingTheQueueNeverRuns(t *testing.T) {
	fake := &servertest.Fake{Script: longScript(60), Delay: 5 * time.Millisecond}
	srv := newFakeServer(t, server.Config{}, fake)
	chat := srv.URL + "/v1/chat/completions"
	_, doneA := startAsync(t, chat, userChat("[[id:first]] a"))
	waitFor(t, "the first generation", 5*time.Second, func() bool { return fake.Active() == 1 })
	cancelB, doneB := startAsync(t, chat, userChat("b"))
	waitFor(t, "the second request to queue", 5*time.Second, func() bool { return queued(t, srv.URL) == 1 })
	cancelB()
	<-doneB
	waitFor(t, "the queue to empty", 2*time.Second, func() bool { return queued(t, srv.URL) == 0 })
	if resp := <-doneA; resp == nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v", resp)
	}
	if !fake.WaitIdle(2 * time.Second) {
		t.Fatal("backend busy")
	}
	if runs := fake.Runs(); len(runs) != 1 {
		t.Fatalf("%d generations ran, want only the first (the second left the queue)", len(runs))
	}
}

func TestDrainLetsRunningWorkFinish(t *testing.T) {
	fake := &servertest.Fake{Script: longScript(60), Delay: 5 * time.Millisecond} // about 300 ms
	srv := newFakeServer(t, server.Config{DrainTimeout: 10 * time.Second}, fake)
	resp, err := httpClient.Do(newRequest(t, context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions",
		userChat("x", "stream", true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, "the generation", 5*time.Second, func() bool { return fake.Active() == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Stop(15 * time.Second) }()

	events, done := sseEvents(t, resp.Body)
	var last chatChunk
	decode(t, events[len(events)-1], &last)
	if !done || len(last.Choices) == 0 || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "stop" {
		t.Fatalf("stream during drain did not finish normally: %s", events[len(events)-1])
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Serve after drain: %v, want nil", err)
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.URL, "http://"), time.Second); err == nil {
		t.Fatal("still accepting connections after the drain")
	}
}

func TestDrainCancelsWorkAfterTheDeadline(t *testing.T) {
	fake := &servertest.Fake{Script: longScript(4000), Delay: 5 * time.Millisecond} // 20 s
	srv := newFakeServer(t, server.Config{DrainTimeout: 200 * time.Millisecond}, fake)
	resp, err := httpClient.Do(newRequest(t, context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions",
		userChat("x", "stream", true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, "the generation", 5*time.Second, func() bool { return fake.Active() == 1 })
	_, queuedDone := startAsync(t, srv.URL+"/v1/completions", map[string]any{"prompt": "waiting"})
	waitFor(t, "a request to queue", 5*time.Second, func() bool { return queued(t, srv.URL) == 1 })

	start := time.Now()
	if err := srv.Stop(10 * time.Second); err != nil {
		t.Fatalf("Serve after drain: %v, want nil", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("drain took %v with a 200 ms deadline", took)
	}
	events, done := sseEvents(t, resp.Body)
	var last chatChunk
	decode(t, events[len(events)-1], &last)
	if !done || last.Error == nil || !strings.Contains(last.Error.Message, "shutting down") {
		t.Fatalf("cancelled stream should end with a shutdown error event and [DONE]: %s", events[len(events)-1])
	}
	if r := <-queuedDone; r == nil || r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("queued request: %v, want 503", r)
	}
	if fake.Active() != 0 {
		t.Fatal("backend still running after Serve returned")
	}
}

func TestReadTimeoutDoesNotCutLongGenerations(t *testing.T) {
	// ReadTimeout bounds reading the request, not the answer: a 600 ms generation must
	// outlive a 150 ms read timeout, streaming or not.
	fake := &servertest.Fake{Script: longScript(60), Delay: 10 * time.Millisecond}
	srv := newFakeServer(t, server.Config{ReadTimeout: 150 * time.Millisecond}, fake)
	if a := chatOnce(t, srv.URL, userChat("x")); a.Finish != "stop" || len(strings.Fields(a.Content)) != 60 {
		t.Fatalf("non-streaming: %+v", a)
	}
	if a := chatStream(t, srv.URL, userChat("x")); a.Finish != "stop" || len(strings.Fields(a.Content)) != 60 {
		t.Fatalf("streaming: %+v", a)
	}
	if n := len(fake.Runs()); n != 2 {
		t.Fatalf("%d runs", n)
	}
}

func TestMetricsParseAndCount(t *testing.T) {
	// A delay per delta makes each decode long enough to time, so each has a speed.
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{Delay: time.Millisecond})
	chatOnce(t, srv.URL, userChat("one"))
	chatStream(t, srv.URL, userChat("two"))
	completionOnce(t, srv.URL, map[string]any{"prompt": "three"})
	do(t, http.MethodPost, srv.URL+"/v1/chat/completions", `{"n": 2}`)
	do(t, http.MethodGet, srv.URL+"/nowhere/\"quoted\"", nil)

	resp, data := do(t, http.MethodGet, srv.URL+"/metrics", nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("/metrics: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	families, err := parsePromText(string(data))
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v\n%s", err, data)
	}
	checks := []struct {
		family, name string
		labels       map[string]string
		ok           func(float64) bool
		want         string
	}{
		{"dflash_http_requests_total", "dflash_http_requests_total", map[string]string{"endpoint": "/v1/chat/completions", "code": "200"},
			func(v float64) bool { return v == 2 }, "2"},
		{"dflash_http_requests_total", "dflash_http_requests_total", map[string]string{"endpoint": "/v1/chat/completions", "code": "400"},
			func(v float64) bool { return v == 1 }, "1"},
		{"dflash_http_requests_total", "dflash_http_requests_total", map[string]string{"endpoint": "/v1/completions", "code": "200"},
			func(v float64) bool { return v == 1 }, "1"},
		{"dflash_http_requests_total", "dflash_http_requests_total", map[string]string{"endpoint": "other", "code": "404"},
			func(v float64) bool { return v == 1 }, "1"},
		{"dflash_generations_total", "dflash_generations_total", map[string]string{"endpoint": "/v1/chat/completions", "outcome": "stop"},
			func(v float64) bool { return v == 2 }, "2"},
		{"dflash_generations_total", "dflash_generations_total", map[string]string{"endpoint": "/v1/completions", "outcome": "stop"},
			func(v float64) bool { return v == 1 }, "1"},
		{"dflash_completion_tokens_total", "dflash_completion_tokens_total", map[string]string{},
			func(v float64) bool { return v > 0 }, "> 0"},
		{"dflash_prompt_tokens_total", "dflash_prompt_tokens_total", map[string]string{},
			func(v float64) bool { return v > 0 }, "> 0"},
		{"dflash_tau", "dflash_tau_count", map[string]string{}, func(v float64) bool { return v == 3 }, "3"},
		// The fake drafts nothing: no request has an acceptance rate.
		{"dflash_acceptance_rate", "dflash_acceptance_rate_count", map[string]string{}, func(v float64) bool { return v == 0 }, "0"},
		{"dflash_tokens_per_second", "dflash_tokens_per_second_count", map[string]string{}, func(v float64) bool { return v == 3 }, "3"},
		{"dflash_queue_waiting", "dflash_queue_waiting", map[string]string{}, func(v float64) bool { return v == 0 }, "0"},
		{"dflash_generation_running", "dflash_generation_running", map[string]string{}, func(v float64) bool { return v == 0 }, "0"},
		{"dflash_generation_slots", "dflash_generation_slots", map[string]string{}, func(v float64) bool { return v == 1 }, "1"},
		// Three requests reached the queue (the 400 never did), each finding it empty.
		{"dflash_queue_depth", "dflash_queue_depth_bucket", map[string]string{"le": "0"}, func(v float64) bool { return v == 3 }, "3"},
		{"dflash_queue_depth", "dflash_queue_depth_count", map[string]string{}, func(v float64) bool { return v == 3 }, "3"},
	}
	for _, c := range checks {
		v := promValue(families, c.family, c.name, c.labels)
		if math.IsNaN(v) || !c.ok(v) {
			t.Errorf("%s%v = %g, want %s", c.name, c.labels, v, c.want)
		}
	}
	for name, typ := range map[string]string{"dflash_http_requests_total": "counter", "dflash_tau": "histogram",
		"dflash_queue_waiting": "gauge", "dflash_queue_depth": "histogram", "dflash_queue_wait_seconds": "histogram",
		"dflash_batch_rows": "histogram", "dflash_generation_running": "gauge", "dflash_draft_tokens_total": "counter",
		"dflash_accepted_draft_tokens_total": "counter", "dflash_acceptance_rate": "histogram"} {
		if f := families[name]; f == nil || f.typ != typ || f.help == "" {
			t.Errorf("family %s: want TYPE %s with HELP", name, typ)
		}
	}
}

// The strict reader must itself reject broken exposition text, or the metrics test proves
// nothing.
func TestPromTextReaderRejectsBrokenText(t *testing.T) {
	bad := []string{
		"m 1",                      // no trailing newline
		"m{a=\"x} 1\n",             // unterminated label
		"m{a=x} 1\n",               // unquoted label
		"# TYPE m counter\nm -1\n", // negative counter
		"m 1\nm 2\n",               // duplicate series
		"m 1\n# TYPE m gauge\n",    // TYPE after samples
		"a 1\nb 1\na{x=\"1\"} 2\n", // family not contiguous
		"# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", // not cumulative
		"# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",                          // no +Inf
		"2m 1\n", // bad name
		"m one\n",
	}
	for _, text := range bad {
		if _, err := parsePromText(text); err == nil {
			t.Errorf("accepted %q", text)
		}
	}
	good := "# HELP m A metric.\n# TYPE m counter\nm{a=\"q\\\"\\\\\\n\"} 3\n"
	fams, err := parsePromText(good)
	if err != nil || promValue(fams, "m", "m", map[string]string{"a": "q\"\\\n"}) != 3 {
		t.Errorf("rejected or misread %q: %v", good, err)
	}
}
