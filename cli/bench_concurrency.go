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
	"github.com/dflash-mlx/dflash-mlx/mlxc"
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
	// Tau is the mean of the requests' tokens per cycle (speculating runs only), and
	// DraftedShare the share of their cycles that drafted (the rest were plain steps the
	// width policy chose).
	Tau          float64 `json:"tau,omitempty"`
	DraftedShare float64 `json:"drafted_cycles,omitempty"`
	// Builds are what the pass built on first use (zero where nothing is built: the CPU).
	Builds kernelBuilds `json:"builds"`
}

// kernelBuilds counts what one pass built for shapes it met first: the kernels NVRTC
// compiled and those the compiled-kernel cache answered (mlxc.CompileCache: our custom
// kernels and MLX's JIT kernels, on CUDA), and the multi-query attention shapes not
// attended before (mlxc.AttentionShapes: on CUDA each is a cuDNN plan MLX builds). A
// loop whose steps meet new shapes pays for these during its timed run.
type kernelBuilds struct {
	Compiles        int64 `json:"nvrtc_compiles"`
	CacheHits       int64 `json:"compile_cache_hits"`
	AttentionShapes int64 `json:"new_attention_shapes"`
}

// buildCounts reads the process's counts so far (on the MLX thread).
func buildCounts() kernelBuilds {
	var b kernelBuilds
	_ = mlxc.Do(func() error {
		cc := mlxc.CompileCache()
		b = kernelBuilds{Compiles: cc.Compiles, CacheHits: cc.Hits, AttentionShapes: mlxc.AttentionShapes()}
		return nil
	})
	return b
}

// since is what was built between then and b.
func (b kernelBuilds) since(then kernelBuilds) kernelBuilds {
	return kernelBuilds{Compiles: b.Compiles - then.Compiles, CacheHits: b.CacheHits - then.CacheHits,
		AttentionShapes: b.AttentionShapes - then.AttentionShapes}
}

func (b kernelBuilds) String() string {
	return fmt.Sprintf("%d/%d/%d", b.Compiles, b.CacheHits, b.AttentionShapes)
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
	// Plain is plain batching of the same requests (with a drafter loaded: speculation
	// off), the other way to serve them.
	Plain *levelStats `json:"plain_batched,omitempty"`
	// Speedup is the batched aggregate tok/s over the serial one; OverBest over the
	// better of the serial and the plain-batched ones.
	Speedup  float64 `json:"speedup"`
	OverBest float64 `json:"over_best,omitempty"`
	// Exact: every batched request gave the serial run's tokens for its prompt (greedy).
	Exact      *bool `json:"exact"`
	Mismatches int   `json:"mismatches"`
}

// concurrencyReport is --concurrency's report.
type concurrencyReport struct {
	Target  string `json:"target"`
	Draft   string `json:"draft"`
	Backend string `json:"backend"`
	Device  string `json:"device"`
	Note    string `json:"note,omitempty"`
	// Speculative: the requests speculate (a drafter is loaded); Replay is the replayed
	// acceptance's error rate (the tokens are then not checked).
	Speculative       bool              `json:"speculative"`
	Replay            *float64          `json:"replay_error_rate,omitempty"`
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
// greedy requests one after the other, once through a Scheduler batching up to c rows and
// once through one that decodes a request at a time (a server without batching), in this
// process, and compares throughput, TTFT and latency. With a drafter loaded the requests
// speculate, and a third pass batches them plainly (speculation off): batched speculation
// must beat the better of the two others. The serial run's tokens are the reference every
// batched request must reproduce (not checked with replayed acceptance).
func benchConcurrency(c *cli.Context, s *Session, prompts [][]int32, levels []int, rep concurrencyReport, replay float64) error {
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
	spec := s.Engine.Proposer != nil
	rep.Speculative = spec
	if replay >= 0 {
		rep.Replay = &replay
		defer func() { s.Engine.ReplayAccept = nil }()
	}
	// pass runs one way of serving a level; with replayed acceptance each pass replays
	// the same seeded pattern.
	pass := func(clients, perClient, maxBatch int, draft bool) (levelRun, error) {
		if replay >= 0 {
			s.Engine.ReplayAccept = replayAccept(replay, uint64(clients))
		}
		before := buildCounts()
		lr, err := runClients(ctx, s.Engine, clients, perClient, maxBatch, draft, prompts, rep.MaxTokens)
		lr.builds = buildCounts().since(before)
		return lr, err
	}
	// Untimed passes first: each row count compiles its own kernels on first use.
	for w := 0; w < warm; w++ {
		if _, err := pass(1, 1, 1, spec); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	for _, l := range levels {
		for w := 0; w < warm && l > 1; w++ {
			if _, err := pass(l, 1, l, spec); err != nil {
				return fmt.Errorf("warm-up, %d clients: %w", l, err)
			}
		}
		serial, err := pass(l, per, 1, spec)
		if err != nil {
			return fmt.Errorf("%d clients, serial: %w", l, err)
		}
		batched, err := pass(l, per, l, spec)
		if err != nil {
			return fmt.Errorf("%d clients, batched: %w", l, err)
		}
		row := concurrencyRow{Concurrency: l, MaxBatch: batched.maxBatch, Requests: len(batched.runs),
			Serial: serial.summary(), Batched: batched.summary()}
		best := row.Serial.TPS
		if spec {
			plain, err := pass(l, per, l, false)
			if err != nil {
				return fmt.Errorf("%d clients, plain batched: %w", l, err)
			}
			ps := plain.summary()
			row.Plain = &ps
			best = max(best, ps.TPS)
		}
		if replay < 0 {
			row.Mismatches = mismatches(serial.runs, batched.runs)
			exact := row.Mismatches == 0
			row.Exact = &exact
		}
		for _, r := range batched.runs {
			row.Tokens += r.res.Stats.GeneratedTokens
		}
		if row.Serial.TPS > 0 {
			row.Speedup = row.Batched.TPS / row.Serial.TPS
		}
		if best > 0 {
			row.OverBest = row.Batched.TPS / best
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
	builds   kernelBuilds // what the pass built (benchConcurrency's pass)
}

// runClients runs clients goroutines, each sending perClient greedy requests in turn
// (speculating when draft is set and a drafter is loaded) through one Scheduler of
// maxBatch rows; request i (round j of client k is j·clients+k) takes prompt i mod
// len(prompts). Scheduler.Generate runs on these goroutines, never inside mlxc.Do: it
// queues its own work on the MLX thread.
func runClients(ctx context.Context, e *engine.Engine, clients, perClient, maxBatch int, draft bool, prompts [][]int32, maxTokens int) (levelRun, error) {
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
				req := engine.Request{Prompt: prompts[p], MaxTokens: maxTokens, IgnoreEOS: true, NoDraft: !draft}
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
	tokens, tauRuns, cycles, drafting := 0, 0, 0, 0
	tau := 0.0
	for _, r := range lr.runs {
		tokens += r.res.Stats.GeneratedTokens
		if st := r.res.Stats; st.Cycles > 0 {
			tau += st.Tau
			tauRuns++
			cycles += st.Cycles
			drafting += st.Cycles - st.BlockSizes[1]
		}
		tps = append(tps, r.res.Stats.GenerationTPS)
		ttft = append(ttft, ms(r.res.Stats.FirstTokenTime))
		lat = append(lat, ms(r.latency))
	}
	st := levelStats{WallS: lr.wall.Seconds(), RequestTPS: median(tps), BatchSize: lr.batch,
		TTFTP50MS: percentile(ttft, 50), TTFTP95MS: percentile(ttft, 95),
		LatencyP50MS: percentile(lat, 50), LatencyP95MS: percentile(lat, 95), Builds: lr.builds}
	if lr.wall > 0 {
		st.TPS = float64(tokens) / lr.wall.Seconds()
	}
	if tauRuns > 0 {
		st.Tau = tau / float64(tauRuns)
		st.DraftedShare = float64(drafting) / float64(cycles)
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
// serial path's (and, speculating, plain batching's) beside them, and whether every
// request's tokens matched.
func printConcurrency(r concurrencyReport) {
	mode := "plain greedy decoding"
	if r.Speculative {
		mode = "greedy speculative decoding"
		if r.Replay != nil {
			mode += fmt.Sprintf(" with replayed acceptance (draft error rate %g: τ set, tokens not checked)", *r.Replay)
		}
	}
	fmt.Printf("target %s, %s on %s, %s, %d new tokens a request, %d requests per client, %d prompts round-robin\n",
		r.Target, r.Backend, r.Device, mode, r.MaxTokens, r.RequestsPerClient, r.Prompts)
	if r.Note != "" {
		fmt.Printf("note: %s\n", r.Note)
	}
	if r.Speculative {
		fmt.Println("batched: one scheduler, up to c requests per forward, each speculating at the width the policy gives it;")
		fmt.Println("serial: the same requests speculating one at a time; plain: batched with speculation off")
		fmt.Printf("%7s %9s %9s %9s %9s %9s %9s %9s %17s %10s  %s\n", "clients", "max batch", "tok/s", "serial", "plain", "vs best", "τ", "drafted", "ttft ms p50/p95", "mean batch", "same")
		for _, x := range r.Rows {
			b := x.Batched
			plain := 0.0
			if x.Plain != nil {
				plain = x.Plain.TPS
			}
			fmt.Printf("%7d %9d %9.1f %9.1f %9.1f %8.2fx %9.2f %8.0f%% %17s %10.2f  %s\n", x.Concurrency, x.MaxBatch, b.TPS, x.Serial.TPS, plain, x.OverBest,
				b.Tau, 100*b.DraftedShare, fmt.Sprintf("%.0f/%.0f", b.TTFTP50MS, b.TTFTP95MS), b.BatchSize, sameMark(x))
		}
		fmt.Printf("τ of the serial runs:")
		for _, x := range r.Rows {
			fmt.Printf(" %d clients %.2f;", x.Concurrency, x.Serial.Tau)
		}
		fmt.Println()
		printBuilds(r)
		return
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
	printBuilds(r)
}

// printBuilds prints what each level's passes built (kernelBuilds), timed runs only.
func printBuilds(r concurrencyReport) {
	fmt.Println("built during the timed runs (NVRTC compiles/compile-cache hits/new multi-query attention shapes):")
	for _, x := range r.Rows {
		fmt.Printf("%7d clients: batched %s, serial %s", x.Concurrency, x.Batched.Builds, x.Serial.Builds)
		if x.Plain != nil {
			fmt.Printf(", plain %s", x.Plain.Builds)
		}
		fmt.Println()
	}
}
