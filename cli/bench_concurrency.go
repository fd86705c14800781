package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// levelStats is one way of serving a concurrency level's requests: batched (a
// Scheduler decoding up to c rows per forward) or serial (one at a time).
type levelStats struct {
	WallS float64 `json:"wall_s"`
	// TPS is every generated token of the level over its wall time (aggregate throughput);
	// RequestTPS the median of each request's own decode rate.
	TPS        float64 `json:"tok_s"`
	RequestTPS float64 `json:"request_tok_s_p50"`
	// TTFT counts from submission, so it includes the wait for admission; latency runs from
	// submission to the request's last token.
	TTFTP50MS    float64 `json:"ttft_ms_p50"`
	TTFTP95MS    float64 `json:"ttft_ms_p95"`
	LatencyP50MS float64 `json:"latency_ms_p50"`
	LatencyP95MS float64 `json:"latency_ms_p95"`
	// BatchSize is the mean rows per decode forward.
	BatchSize float64 `json:"batch_size"`
}

// concurrencyRow is one level of --concurrency.
type concurrencyRow struct {
	Concurrency int `json:"concurrency"`
	// MaxBatch is the scheduler's bound after the engine's cap (1 for a target that
	// cannot batch).
	MaxBatch int        `json:"max_batch"`
	Requests int        `json:"requests"`
	Tokens   int        `json:"tokens"`
	Batched  levelStats `json:"batched"`
	Serial   levelStats `json:"serial"`
	// Speedup is the batched aggregate tok/s over the serial one.
	Speedup float64 `json:"speedup"`
	// Exact: every batched request gave the serial run's tokens for its prompt (greedy).
	Exact      *bool `json:"exact"`
	Mismatches int   `json:"mismatches"`
}

// concurrencyReport is --concurrency's report.
type concurrencyReport struct {
	Target            string            `json:"target"`
	Draft             string            `json:"draft"`
	Backend           string            `json:"backend"`
	Device            string            `json:"device"`
	Note              string            `json:"note,omitempty"`
	MaxTokens         int               `json:"max_new_tokens"`
	RequestsPerClient int               `json:"requests_per_client"`
	Prompts           int               `json:"prompts"`
	Rows              []concurrencyRow  `json:"rows"`
	Settings          settings.Settings `json:"settings"`
}

// requestRun is one request's outcome and its latency as its client saw it.
type requestRun struct {
	prompt  int
	res     engine.Result
	latency time.Duration
}

// benchConcurrency (--concurrency) serves, per level c, c clients each sending perClient
// greedy plain requests one after the other, once through a Scheduler batching up to c
// rows and once through one that decodes a request at a time (a server without
// batching), in this process, and compares throughput, TTFT and latency. The serial run's
// tokens are the reference every batched request must reproduce.
func benchConcurrency(c *cli.Context, s *Session, prompts [][]int32, levels []int, rep concurrencyReport) error {
	for _, l := range levels {
		if l < 1 {
			return cli.Exit(fmt.Sprintf("--concurrency: %d is not a number of clients", l), 2)
		}
	}
	if rep.RequestsPerClient < 1 {
		return cli.Exit(fmt.Sprintf("--requests-per-client must be at least 1, got %d", rep.RequestsPerClient), 2)
	}
	ctx := context.Background()
	per, warm := rep.RequestsPerClient, c.Int("warmup")
	// Untimed passes first: each row count compiles its own kernels on first use.
	for w := 0; w < warm; w++ {
		if _, err := runClients(ctx, s.Engine, 1, 1, 1, prompts, rep.MaxTokens); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	for _, l := range levels {
		for w := 0; w < warm && l > 1; w++ {
			if _, err := runClients(ctx, s.Engine, l, 1, l, prompts, rep.MaxTokens); err != nil {
				return fmt.Errorf("warm-up, %d clients: %w", l, err)
			}
		}
		serial, err := runClients(ctx, s.Engine, l, per, 1, prompts, rep.MaxTokens)
		if err != nil {
			return fmt.Errorf("%d clients, serial: %w", l, err)
		}
		batched, err := runClients(ctx, s.Engine, l, per, l, prompts, rep.MaxTokens)
		if err != nil {
			return fmt.Errorf("%d clients, batched: %w", l, err)
		}
		row := concurrencyRow{Concurrency: l, MaxBatch: batched.maxBatch, Requests: len(batched.runs),
			Serial: serial.summary(), Batched: batched.summary()}
		row.Mismatches = mismatches(serial.runs, batched.runs)
		exact := row.Mismatches == 0
		row.Exact = &exact
		for _, r := range batched.runs {
			row.Tokens += r.res.Stats.GeneratedTokens
		}
		if row.Serial.TPS > 0 {
			row.Speedup = row.Batched.TPS / row.Serial.TPS
		}
		rep.Rows = append(rep.Rows, row)
		if !c.Bool("json") {
			fmt.Fprintf(os.Stderr, "%d clients: batched %.1f tok/s, serial %.1f tok/s\n", l, row.Batched.TPS, row.Serial.TPS)
		}
	}
	if c.Bool("json") {
		return printJSON(rep)
	}
	printConcurrency(rep)
	return nil
}

// levelRun is one pass over a level's requests through one Scheduler.
type levelRun struct {
	runs []requestRun // by request index
	// wall runs from the first submission to the last end; batch is the mean rows per
	// decode step and maxBatch the scheduler's bound after the engine's cap.
	wall     time.Duration
	batch    float64
	maxBatch int
}

// runClients runs clients goroutines, each sending perClient greedy plain requests in turn
// through one Scheduler of maxBatch rows; request i (round j of client k is j·clients+k)
// takes prompt i mod len(prompts). Scheduler.Generate runs on these goroutines, never
// inside mlxc.Do: it queues its own work on the MLX thread.
func runClients(ctx context.Context, e *engine.Engine, clients, perClient, maxBatch int, prompts [][]int32, maxTokens int) (levelRun, error) {
	var rows, steps atomic.Int64
	sched := e.NewScheduler(engine.SchedulerConfig{MaxBatch: maxBatch, OnStep: func(r, _ int) {
		rows.Add(int64(r))
		steps.Add(1)
	}})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runs := make([]requestRun, clients*perClient)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range perClient {
				i := j*clients + k
				p := i % len(prompts)
				t0 := time.Now()
				req := engine.Request{Prompt: prompts[p], MaxTokens: maxTokens, IgnoreEOS: true, NoDraft: true}
				res, err := sched.Generate(ctx, req, nil)
				if err == nil && res.FinishReason == engine.FinishCancelled {
					err = context.Canceled
				}
				if err != nil {
					errs[k] = fmt.Errorf("client %d, request %d: %w", k, j, err)
					cancel() // the level is void: stop the other clients too
					return
				}
				runs[i] = requestRun{prompt: p, res: res, latency: time.Since(t0)}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return levelRun{}, err
	}
	lr := levelRun{runs: runs, wall: wall, maxBatch: sched.MaxBatch()}
	if n := steps.Load(); n > 0 {
		lr.batch = float64(rows.Load()) / float64(n)
	}
	return lr, nil
}

// summary folds the runs into the level's throughput and percentiles.
func (lr levelRun) summary() levelStats {
	var tps, ttft, lat []float64
	tokens := 0
	for _, r := range lr.runs {
		tokens += r.res.Stats.GeneratedTokens
		tps = append(tps, r.res.Stats.GenerationTPS)
		ttft = append(ttft, ms(r.res.Stats.FirstTokenTime))
		lat = append(lat, ms(r.latency))
	}
	st := levelStats{WallS: lr.wall.Seconds(), RequestTPS: median(tps), BatchSize: lr.batch,
		TTFTP50MS: percentile(ttft, 50), TTFTP95MS: percentile(ttft, 95),
		LatencyP50MS: percentile(lat, 50), LatencyP95MS: percentile(lat, 95)}
	if lr.wall > 0 {
		st.TPS = float64(tokens) / lr.wall.Seconds()
	}
	return st
}

// mismatches counts the batched runs whose tokens differ from the serial run's for the
// same prompt; the serial runs of one prompt must also agree among themselves.
func mismatches(serial, batched []requestRun) int {
	ref := map[int][]int32{}
	bad := 0
	for _, r := range serial {
		if want, ok := ref[r.prompt]; !ok {
			ref[r.prompt] = r.res.Tokens
		} else if _, same := sameTokens(r.res.Tokens, want); !same {
			bad++
		}
	}
	for _, r := range batched {
		if _, same := sameTokens(r.res.Tokens, ref[r.prompt]); !same {
			bad++
		}
	}
	return bad
}

// percentile is the nearest-rank p-th percentile of v (0 when empty).
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	k := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(k, 1), len(s))-1]
}

// sameMark prints an equality check: a check mark, or how many requests differed.
func sameMark(x concurrencyRow) string {
	if x.Exact == nil {
		return "-"
	}
	if *x.Exact {
		return "✓"
	}
	return fmt.Sprintf("mismatch %d", x.Mismatches)
}

// printConcurrency prints --concurrency's table: per level the batched numbers, the
// serial path's beside them, and whether every request's tokens matched.
func printConcurrency(r concurrencyReport) {
	fmt.Printf("target %s, %s on %s, plain greedy decoding, %d new tokens a request, %d requests per client, %d prompts round-robin\n",
		r.Target, r.Backend, r.Device, r.MaxTokens, r.RequestsPerClient, r.Prompts)
	if r.Note != "" {
		fmt.Printf("note: %s\n", r.Note)
	}
	fmt.Println("batched: one scheduler decoding up to c requests per forward; serial: the same requests one at a time")
	fmt.Printf("%7s %9s %9s %9s %8s %9s %17s %19s %10s  %s\n", "clients", "max batch", "tok/s", "serial", "speedup", "req tok/s", "ttft ms p50/p95", "latency ms p50/p95", "mean batch", "same")
	for _, x := range r.Rows {
		b := x.Batched
		fmt.Printf("%7d %9d %9.1f %9.1f %7.2fx %9.1f %17s %19s %10.2f  %s\n", x.Concurrency, x.MaxBatch, b.TPS, x.Serial.TPS, x.Speedup, b.RequestTPS,
			fmt.Sprintf("%.0f/%.0f", b.TTFTP50MS, b.TTFTP95MS), fmt.Sprintf("%.0f/%.0f", b.LatencyP50MS, b.LatencyP95MS), b.BatchSize, sameMark(x))
	}
	fmt.Println("serial path (each request waits for the ones before it):")
	fmt.Printf("%7s %9s %9s %17s %19s\n", "clients", "tok/s", "req tok/s", "ttft ms p50/p95", "latency ms p50/p95")
	for _, x := range r.Rows {
		s := x.Serial
		fmt.Printf("%7d %9.1f %9.1f %17s %19s\n", x.Concurrency, s.TPS, s.RequestTPS,
			fmt.Sprintf("%.0f/%.0f", s.TTFTP50MS, s.TTFTP95MS), fmt.Sprintf("%.0f/%.0f", s.LatencyP50MS, s.LatencyP95MS))
	}
}
