package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
)

// joinGapRun is one way of admitting the long prompt: its prefill sliced between the
// running rows' steps, at most SliceMS at a time (whole when the measured prefill rate
// runs it within that), or whole regardless (SliceMS 0).
type joinGapRun struct {
	SliceMS float64 `json:"slice_ms"`
	// The longest wait between two tokens of a running row, before the long prompt
	// arrived and from its arrival to its first token (its admission).
	GapBeforeMS float64 `json:"gap_before_ms"`
	GapDuringMS float64 `json:"gap_during_ms"`
	// TTFTMS is the long prompt's time to its first token.
	TTFTMS float64 `json:"ttft_ms"`
}

// joinGapReport is --join-gap's report.
type joinGapReport struct {
	Target       string       `json:"target"`
	Backend      string       `json:"backend"`
	Device       string       `json:"device"`
	Rows         int          `json:"running_rows"`
	PromptTokens int          `json:"prompt_tokens"`
	Runs         []joinGapRun `json:"runs"`
}

// benchJoinGap (--join-gap N) measures how a long prompt joining a running batch delays
// the rows already decoding: rows plain greedy requests run; once each has emitted a few
// tokens, a request with an N-token prompt arrives; the longest gap between two tokens of
// a running row is reported before it arrived and while it was admitted, with the
// prefill sliced (the scheduler's default slice) and whole, each the second of two runs.
func benchJoinGap(c *cli.Context, s *Session, n, rows int, rep joinGapReport) error {
	ctxLen := s.Engine.ContextLen()
	if n < 2 || n+2 > ctxLen {
		return cli.Exit(fmt.Sprintf("--join-gap %d: give a prompt length from 2 to %d (the context less room for tokens)", n, ctxLen-2), 2)
	}
	if rows < 1 {
		return cli.Exit(fmt.Sprintf("--join-rows %d: give 1 or more", rows), 2)
	}
	vocab := s.Engine.Target.Arch().VocabSize
	long := make([]int32, n)
	for i := range long {
		long[i] = int32((i*7919 + 13) % vocab)
	}
	rep.Rows, rep.PromptTokens = rows, n
	slice := time.Duration(s.Settings.Loop.PrefillSliceMS) * time.Millisecond
	if slice == 0 {
		slice = engine.DefaultPrefillSlice
	}
	// Each way runs twice and the second is reported: the first compiles the kernels of
	// its shapes (on a GPU, seconds on first use), which is not the stall being measured.
	for _, il := range []time.Duration{slice, -1} {
		if _, err := joinGap(s.Engine, long, rows, il); err != nil {
			return err
		}
		run, err := joinGap(s.Engine, long, rows, il)
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, run)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Printf("target %s, %s on %s: %d rows decoding, a %d-token prompt joins\n", rep.Target, rep.Backend, rep.Device, rows, n)
	fmt.Printf("%-22s %16s %16s %12s\n", "prefill", "gap before, ms", "gap joining, ms", "its TTFT, ms")
	for _, r := range rep.Runs {
		how := fmt.Sprintf("sliced, ≤ %.0f ms a step", r.SliceMS)
		if r.SliceMS == 0 {
			how = "whole"
		}
		fmt.Printf("%-22s %16.0f %16.0f %12.0f\n", how, r.GapBeforeMS, r.GapDuringMS, r.TTFTMS)
	}
	return nil
}

// joinGap runs one measurement with the given prefill chunk.
func joinGap(e *engine.Engine, long []int32, rows int, slice time.Duration) (joinGapRun, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sched := e.NewScheduler(engine.SchedulerConfig{MaxBatch: rows + 1, PrefillSlice: slice})
	var mu sync.Mutex
	var arrived, admitted time.Time
	var before, during time.Duration
	started := make(chan struct{}, rows)
	var wg sync.WaitGroup
	errs := make(chan error, rows+1)
	for r := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last time.Time
			events := 0
			_, err := sched.Generate(ctx, engine.Request{Prompt: []int32{int32(r + 1), 2, 3}, MaxTokens: 1 << 20, IgnoreEOS: true, NoDraft: true},
				func(engine.Event) error {
					now := time.Now()
					mu.Lock()
					if !last.IsZero() {
						gap := now.Sub(last)
						switch {
						case arrived.IsZero():
							before = max(before, gap)
						case admitted.IsZero() || last.Before(admitted):
							during = max(during, gap) // ends after the arrival, starts before the admission
						}
					}
					mu.Unlock()
					last = now
					if events++; events == 8 {
						started <- struct{}{}
					}
					return nil
				})
			if err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	for range rows {
		<-started
	}
	time.Sleep(200 * time.Millisecond) // gaps of the running rows alone
	mu.Lock()
	arrived = time.Now()
	mu.Unlock()
	res, err := sched.Generate(ctx, engine.Request{Prompt: long, MaxTokens: 2, IgnoreEOS: true, NoDraft: true}, func(engine.Event) error {
		mu.Lock()
		if admitted.IsZero() {
			admitted = time.Now()
		}
		mu.Unlock()
		return nil
	})
	time.Sleep(200 * time.Millisecond) // the running rows' next token after the admission
	cancel()
	wg.Wait()
	close(errs)
	if err != nil {
		return joinGapRun{}, fmt.Errorf("the long prompt: %w", err)
	}
	for err := range errs {
		return joinGapRun{}, fmt.Errorf("a running row: %w", err)
	}
	return joinGapRun{SliceMS: ms(max(slice, 0)), GapBeforeMS: ms(before), GapDuringMS: ms(during),
		TTFTMS: ms(res.Stats.FirstTokenTime)}, nil
}
