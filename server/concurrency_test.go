package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// scrapeLines returns /metrics as a set of its sample lines, after checking it parses.
func scrapeLines(t *testing.T, baseURL string) map[string]bool {
	t.Helper()
	resp, data := do(t, http.MethodGet, baseURL+"/metrics", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	if _, err := parsePromText(string(data)); err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v\n%s", err, data)
	}
	lines := make(map[string]bool)
	for _, l := range strings.Split(string(data), "\n") {
		lines[l] = true
	}
	return lines
}

// wantLines fails the test for each line missing from a scrape.
func wantLines(t *testing.T, got map[string]bool, want []string) {
	t.Helper()
	for _, l := range want {
		if !got[l] {
			t.Errorf("/metrics lacks %q", l)
		}
	}
}

// A backend that batches three requests gets three Generate calls at once; a fourth request
// waits for a slot, a fifth is refused, and /health, /metrics and the 429 say so.
func TestConcurrentBackendRunsItsBatchAtOnce(t *testing.T) {
	fake := &servertest.Fake{Concurrent: 3, Gate: make(chan struct{})}
	srv := newFakeServer(t, server.Config{MaxQueue: 1}, fake)
	chat := srv.URL + "/v1/chat/completions"

	var dones []<-chan *http.Response
	for i := range 3 {
		cancel, done := startAsync(t, chat, userChat(fmt.Sprintf("running %d", i)))
		defer cancel()
		dones = append(dones, done)
	}
	waitFor(t, "three generations to run", 5*time.Second, func() bool { return fake.Active() == 3 })
	cancel, done := startAsync(t, chat, userChat("waiting"))
	defer cancel()
	dones = append(dones, done)
	waitFor(t, "the fourth request to queue", 5*time.Second, func() bool { return queued(t, srv.URL) == 1 })
	if n := fake.Active(); n != 3 {
		t.Fatalf("%d generations run with three slots", n)
	}

	resp, data := do(t, http.MethodPost, chat, userChat("refused"))
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("fifth request: %d %s, want 429", resp.StatusCode, data)
	}
	var er errorResponse
	decode(t, data, &er)
	if er.Error == nil || !strings.Contains(er.Error.Message, "3 generations run and 1 requests wait") {
		t.Fatalf("429 body %s", data)
	}

	_, data = do(t, http.MethodGet, srv.URL+"/health", nil)
	var health struct {
		Queued, Running int
	}
	decode(t, data, &health)
	if health.Queued != 1 || health.Running != 3 {
		t.Errorf("/health queued %d running %d, want 1 3", health.Queued, health.Running)
	}
	// Five arrivals: three found nobody waiting, so did the fourth, the fifth found one.
	wantLines(t, scrapeLines(t, srv.URL), []string{
		"dflash_queue_waiting 1",
		"dflash_generation_running 3",
		"dflash_generation_slots 3",
		`dflash_queue_depth_bucket{le="0"} 4`,
		`dflash_queue_depth_bucket{le="1"} 5`,
		`dflash_queue_depth_bucket{le="64"} 5`,
		`dflash_queue_depth_bucket{le="+Inf"} 5`,
		"dflash_queue_depth_sum 1",
		"dflash_queue_depth_count 5",
	})

	close(fake.Gate)
	for i, done := range dones {
		if resp := <-done; resp == nil || resp.StatusCode != http.StatusOK {
			t.Errorf("request %d: %v, want 200", i, resp)
		}
	}
	if !fake.WaitIdle(2 * time.Second) {
		t.Fatal("backend still busy after every answer")
	}
	if got := fake.MaxActive(); got != 3 {
		t.Errorf("at most %d generations ran at once, want 3", got)
	}
	if got := len(fake.Runs()); got != 4 {
		t.Errorf("%d generations ran, want 4", got)
	}
	wantLines(t, scrapeLines(t, srv.URL), []string{"dflash_queue_waiting 0", "dflash_generation_running 0"})
}

// stepBackend hands the server's step observer to the test, which plays the decode loop.
type stepBackend struct {
	*servertest.Fake
	observe chan func(rows int)
}

func (b stepBackend) ObserveSteps(observe func(rows int)) { b.observe <- observe }

// The rows of each decode step reach dflash_batch_rows, also when steps are reported from
// several goroutines at once (run it under -race).
func TestBatchRowsHistogramCountsEveryStep(t *testing.T) {
	backend := stepBackend{Fake: &servertest.Fake{}, observe: make(chan func(int), 1)}
	srv := servertest.Start(t, server.Config{}, backend, nil)
	var observe func(int)
	select {
	case observe = <-backend.observe:
	default:
		t.Fatal("server.New did not pass a step observer to the backend")
	}
	if observe == nil {
		t.Fatal("the step observer is nil")
	}

	// Each of four goroutines reports these steps 100 times.
	steps := []int{1, 1, 2, 3, 8, 9, 64, 65}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				for _, rows := range steps {
					observe(rows)
				}
			}
		}()
	}
	wg.Wait()

	wantLines(t, scrapeLines(t, srv.URL), []string{
		`dflash_batch_rows_bucket{le="1"} 800`,
		`dflash_batch_rows_bucket{le="2"} 1200`,
		`dflash_batch_rows_bucket{le="4"} 1600`,
		`dflash_batch_rows_bucket{le="8"} 2000`,
		`dflash_batch_rows_bucket{le="16"} 2400`,
		`dflash_batch_rows_bucket{le="32"} 2400`,
		`dflash_batch_rows_bucket{le="64"} 2800`,
		`dflash_batch_rows_bucket{le="+Inf"} 3200`,
		"dflash_batch_rows_sum 61200", // 400 × (1+1+2+3+8+9+64+65)
		"dflash_batch_rows_count 3200",
	})
}

// memoryFake is the fake backend reporting fixed device memory.
type memoryFake struct{ *servertest.Fake }

func (memoryFake) DeviceMemory() (active, cached int64) { return 123456, 789 }

// A backend that reports its device memory gets it exported as two gauges; one that does
// not gets neither.
func TestMetricsDeviceMemory(t *testing.T) {
	srv := servertest.Start(t, server.Config{}, memoryFake{&servertest.Fake{}}, nil)
	wantLines(t, scrapeLines(t, srv.URL), []string{"dflash_device_active_bytes 123456", "dflash_device_cached_bytes 789"})
	plain := newFakeServer(t, server.Config{}, &servertest.Fake{})
	for l := range scrapeLines(t, plain.URL) {
		if strings.HasPrefix(l, "dflash_device_") {
			t.Errorf("a backend without memory reports exports %q", l)
		}
	}
}
