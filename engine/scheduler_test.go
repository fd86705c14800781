package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// soloReference decodes req alone in the most direct way, independent of the engine's
// loops: the prompt but its last token in one forward, then one Forward per token, each
// token drawn from its own logits with the request's parameters and key stream.
func soloReference(t *testing.T, m model.Model, req Request) []int32 {
	t.Helper()
	stops := map[int32]bool{}
	for _, s := range req.StopTokens {
		stops[s] = true
	}
	var out []int32
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		c := m.NewCache()
		defer c.Free()
		n := len(req.Prompt)
		if n > 1 {
			o := m.Forward(mlxc.FromSlice(req.Prompt[:n-1], 1, n-1), c, model.ForwardOptions{Logits: model.LogitsNone})
			evalCache(c, o.Hidden)
		}
		keys := sample.NewKeys(req.Sampling.Seed)
		hist := []int32{req.Prompt[n-1]}
		for len(out) < req.MaxTokens {
			o := m.Forward(mlxc.FromSlice(hist[len(hist)-1:], 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
			logits := req.Sampling.PenaltyRows(mlxc.Reshape(o.Logits, 1, -1), lastN(hist, 64), nil)
			if g, ok := req.Constraint.(*testGrammar); ok {
				if g.stopAt(len(out)) {
					break // the grammar is complete
				}
				logits = maskedBy(logits, out, g.allows)
			}
			tok := mlxc.ToSlice[int32](mlxc.AsType(req.Sampling.Draw(sample.LogProbs(logits), keys.Next()), mlxc.Int32))[0]
			hist = append(hist, tok)
			if stops[tok] {
				break
			}
			out = append(out, tok)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("solo reference: %v", err)
	}
	return out
}

// batchRequests are requests of different prompt lengths (one long enough to prefill in
// several interleaved chunks), budgets (rows leave mid-run), sampling (greedy, seeded
// T>0 with filters, a repetition penalty: a row that makes the batch read before it
// builds) and stop tokens.
func batchRequests(vocab int) []Request {
	long := make([]int32, 300)
	for i := range long {
		long[i] = int32((i*7919 + 13) % vocab)
	}
	return []Request{
		{Prompt: []int32{1, 2, 3}, MaxTokens: 40},
		{Prompt: []int32{7}, MaxTokens: 9},
		{Prompt: long, MaxTokens: 25},
		{Prompt: []int32{10, 20, 30, 40, 50, 60, 70, 80, 90}, MaxTokens: 30,
			Sampling: sample.Params{Temperature: 0.8, TopP: 0.9, Seed: 5}},
		{Prompt: []int32{200, 5, 5, 5, 9}, MaxTokens: 17, Sampling: sample.Params{Temperature: 1.1, TopK: 20, Seed: 77}},
		{Prompt: []int32{int32(vocab - 2), 0, 13, 77}, MaxTokens: 22, Sampling: sample.Params{RepetitionPenalty: 1.3}},
		{Prompt: []int32{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 35},
	}
}

// runConcurrently submits every request to s from its own goroutine, request i after
// request i−1 has received its first tokens (so rows join a running batch), and returns
// each one's result.
func runConcurrently(t *testing.T, s *Scheduler, reqs []Request) []Result {
	t.Helper()
	results := make([]Result, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	prev := make(chan struct{})
	close(prev)
	for i, req := range reqs {
		started := make(chan struct{})
		var once sync.Once
		wg.Add(1)
		go func(i int, req Request, after <-chan struct{}) {
			defer wg.Done()
			defer once.Do(func() { close(started) })
			<-after
			results[i], errs[i] = s.Generate(context.Background(), req, func(Event) error {
				once.Do(func() { close(started) })
				return nil
			})
		}(i, req, prev)
		prev = started
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return results
}

// Every request decoded in a batch, rows joining (after interleaved prefills) and leaving
// mid-run, gives the tokens of the same request decoded alone: greedy and seeded T>0, on
// every family, bf16 and 4-bit.
func TestBatchedRequestsMatchSolo(t *testing.T) {
	testenv.RequireShapeExact(t)
	q4 := decisiveSpec(12)
	q4.QuantBits, q4.QuantGroup = 4, 64
	pairs := map[string]*pair{
		"qwen3-bf16": loadPair(t, "decisive-bf16", decisiveSpec(11), 2),
		"qwen3-4bit": loadPair(t, "decisive-4bit", q4, 2),
	}
	for name, p := range hybridPairs(t) {
		pairs["qwen3_5-"+name] = p
	}
	for name, p := range moePairs(t) {
		pairs[name] = p
	}
	for name, p := range pairs {
		for _, maxBatch := range []int{3, 8} {
			t.Run(fmt.Sprintf("%s/max%d", name, maxBatch), func(t *testing.T) {
				reqs := batchRequests(p.vocab)
				e := &Engine{Target: p.target}
				var mu sync.Mutex
				widest := 0
				s := e.NewScheduler(SchedulerConfig{MaxBatch: maxBatch, PrefillSlice: time.Nanosecond, OnStep: func(rows, _ int) {
					mu.Lock()
					widest = max(widest, rows)
					mu.Unlock()
				}})
				got := runConcurrently(t, s, reqs)
				for i, req := range reqs {
					want := soloReference(t, p.target, req)
					if at, ok := eqTokens(got[i].Tokens, want); !ok {
						t.Errorf("request %d: batched output differs from alone at token %d:\n got %v\nwant %v", i, at, got[i].Tokens, want)
					}
				}
				if widest < 2 || widest > maxBatch {
					t.Errorf("widest step had %d rows, want 2..%d", widest, maxBatch)
				}
			})
		}
	}
}

// Plain decoding of one request (the decoder with one row) is the direct loop's output,
// greedy and sampled, with stop tokens.
func TestPlainEqualsSoloReference(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	for i, req := range batchRequests(p.vocab) {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			want := soloReference(t, p.target, req)
			res, _ := run(t, &Engine{Target: p.target}, req)
			if at, ok := eqTokens(res.Tokens, want); !ok {
				t.Errorf("differs at %d:\n got %v\nwant %v", at, res.Tokens, want)
			}
			if res.Stats.BatchSize != 1 {
				t.Errorf("batch size %v alone, want 1", res.Stats.BatchSize)
			}
		})
	}
}

// One request's bad input, cancellation or failing reader ends that request only: the
// others in the batch give their solo tokens.
func TestSchedulerIsolation(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	e := &Engine{Target: p.target, ContextLength: 400}
	s := e.NewScheduler(SchedulerConfig{MaxBatch: 4})
	good := []Request{
		{Prompt: []int32{1, 2, 3}, MaxTokens: 60},
		{Prompt: []int32{9, 8, 7, 6}, MaxTokens: 50, Sampling: sample.Params{Temperature: 0.7, Seed: 3}},
	}
	tooLong := make([]int32, 400)
	boom := errors.New("reader gone")
	type outcome struct {
		res Result
		err error
	}
	outs := make([]outcome, 6)
	var wg sync.WaitGroup
	submit := func(i int, ctx context.Context, req Request, emit func(Event) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i].res, outs[i].err = s.Generate(ctx, req, emit)
		}()
	}
	submit(0, context.Background(), good[0], nil)
	submit(1, context.Background(), good[1], nil)
	// An invalid sampling value and a prompt over the context: refused at once.
	submit(2, context.Background(), Request{Prompt: []int32{1}, MaxTokens: 5, Sampling: sample.Params{TopP: 2}}, nil)
	submit(3, context.Background(), Request{Prompt: tooLong, MaxTokens: 5}, nil)
	// A reader that fails after a few events, and a request cancelled mid-run.
	n := 0
	submit(4, context.Background(), Request{Prompt: []int32{4, 4}, MaxTokens: 390}, func(Event) error {
		if n++; n == 3 {
			return boom
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	m := 0
	submit(5, ctx, Request{Prompt: []int32{5, 6}, MaxTokens: 390}, func(Event) error {
		if m++; m == 4 {
			cancel()
		}
		return nil
	})
	wg.Wait()
	cancel()
	for i, req := range good {
		if outs[i].err != nil {
			t.Fatalf("good request %d: %v", i, outs[i].err)
		}
		if len(outs[i].res.Tokens) != req.MaxTokens {
			t.Errorf("good request %d: %d tokens, want %d", i, len(outs[i].res.Tokens), req.MaxTokens)
		}
		if !testenv.ShapeExact() {
			continue // a GPU's batched rows round apart from a row alone
		}
		if at, ok := eqTokens(outs[i].res.Tokens, soloReference(t, p.target, req)); !ok {
			t.Errorf("good request %d differs from alone at %d", i, at)
		}
	}
	if outs[2].err == nil || outs[3].err == nil || !errors.Is(outs[3].err, ErrPromptTooLong) {
		t.Errorf("bad requests: %v, %v; want a validation error and ErrPromptTooLong", outs[2].err, outs[3].err)
	}
	if !errors.Is(outs[4].err, boom) || len(outs[4].res.Tokens) >= 390 {
		t.Errorf("failing reader: err %v after %d tokens; want its error, early", outs[4].err, len(outs[4].res.Tokens))
	}
	if outs[5].res.FinishReason != FinishCancelled || len(outs[5].res.Tokens) >= 390 {
		t.Errorf("cancelled request: finish %q after %d tokens", outs[5].res.FinishReason, len(outs[5].res.Tokens))
	}
}

// A request cancelled while it waits for admission returns at once, and the scheduler
// does not run it.
func TestSchedulerCancelWhileWaiting(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	e := &Engine{Target: p.target}
	s := e.NewScheduler(SchedulerConfig{MaxBatch: 1})
	// The first request holds the only row until the test cancels it.
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	first := make(chan struct{})
	var once sync.Once
	done := make(chan Result, 1)
	go func() {
		res, _ := s.Generate(ctx1, Request{Prompt: []int32{1, 2}, MaxTokens: 4000}, func(Event) error {
			once.Do(func() { close(first) })
			return nil
		})
		done <- res
	}()
	<-first
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	started := time.Now()
	res, err := s.Generate(ctx, Request{Prompt: []int32{3}, MaxTokens: 150}, nil)
	waited := time.Since(started)
	cancel1()
	if err != nil || res.FinishReason != FinishCancelled || len(res.Tokens) != 0 {
		t.Errorf("waiting request: %v, finish %q, %d tokens", err, res.FinishReason, len(res.Tokens))
	}
	if waited > 2*time.Second {
		t.Errorf("cancelled waiting request returned after %v", waited)
	}
	if r := <-done; r.FinishReason != FinishCancelled || len(r.Tokens) == 0 {
		t.Errorf("running request: finish %q after %d tokens, want cancelled after some", r.FinishReason, len(r.Tokens))
	}
}

// With a drafter, a request alone speculates, and so do requests that find others
// decoding (they join the batch as speculating rows). Greedy output is plain decoding's
// either way.
func TestSchedulerSpeculatesAloneAndInBatches(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft)}
	s := e.NewScheduler(SchedulerConfig{MaxBatch: 4})
	reqs := []Request{
		{Prompt: []int32{1, 2, 3}, MaxTokens: 30},
		{Prompt: []int32{7, 7}, MaxTokens: 20},
	}
	alone, err := s.Generate(context.Background(), reqs[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	if alone.Stats.Mode != "dflash" || alone.Stats.BatchSize != 1 {
		t.Errorf("alone: mode %q, batch size %v; want dflash alone", alone.Stats.Mode, alone.Stats.BatchSize)
	}
	for i, res := range runConcurrently(t, s, reqs) {
		if at, ok := eqTokens(res.Tokens, soloReference(t, p.target, reqs[i])); !ok {
			t.Errorf("request %d differs from plain decoding at %d", i, at)
		}
		if res.Stats.Mode != "dflash" || res.Stats.Cycles == 0 {
			t.Errorf("request %d: mode %q, %d cycles", i, res.Stats.Mode, res.Stats.Cycles)
		}
	}
}

// With the prefix cache, requests joining a batch resume from the prefixes that earlier
// ones left (their prompts, and prompt plus answer: a second turn), and still give their
// solo tokens; Qwen3 and the hybrid (whose recurrent state resumes at marks).
func TestBatchedRequestsResumeFromPrefixCache(t *testing.T) {
	testenv.RequireShapeExact(t)
	for name, p := range map[string]*pair{
		"qwen3":   loadPair(t, "decisive-bf16", decisiveSpec(11), 2),
		"qwen3_5": loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2),
	} {
		t.Run(name, func(t *testing.T) {
			e := &Engine{Target: p.target, Prefix: newPrefixCache(t, 1<<30, 4)}
			defer func() { _ = mlxc.Do(func() error { e.Prefix.Free(); return nil }) }()
			s := e.NewScheduler(SchedulerConfig{MaxBatch: 4, PrefillSlice: time.Nanosecond})
			first := batchRequests(p.vocab)
			got := runConcurrently(t, s, first)
			// Second turns: each prompt followed by its answer and two more tokens.
			second := make([]Request, len(first))
			for i, req := range first {
				second[i] = req
				second[i].Prompt = append(append(append([]int32(nil), req.Prompt...), got[i].Tokens...), 11, 12)
				second[i].PrefixMarks = []int{len(req.Prompt)}
			}
			again := runConcurrently(t, s, second)
			for i, req := range second {
				if at, ok := eqTokens(again[i].Tokens, soloReference(t, p.target, req)); !ok {
					t.Errorf("second turn %d differs from alone at %d", i, at)
				}
				// The first turn left its prompt and answer (less the last token, never fed).
				if want := len(first[i].Prompt) + len(got[i].Tokens) - 1; again[i].Stats.PromptCacheTokens < want {
					t.Errorf("second turn %d resumed %d positions, want at least %d", i, again[i].Stats.PromptCacheTokens, want)
				}
			}
		})
	}
}

// Requests leave no device memory behind: after a second round of solo and batched
// requests (rows joining and leaving, some cancelled), with and without the prefix cache
// and speculating,
// the active memory is no higher than after the first once the prefix cache is freed. (Arrays made outside a
// scope, or a saved state that is a view of a larger buffer, would stay.)
func TestRequestsLeaveNoMemory(t *testing.T) {
	for name, p := range map[string]*pair{
		"qwen3":   loadPair(t, "decisive-bf16", decisiveSpec(11), 2),
		"qwen3_5": loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2),
	} {
		for _, mode := range []struct{ prefix, draft bool }{{false, false}, {true, false}, {true, true}} {
			withPrefix := mode.prefix
			t.Run(fmt.Sprintf("%s/prefix%v/draft%v", name, mode.prefix, mode.draft), func(t *testing.T) {
				e := &Engine{Target: p.target}
				if mode.draft {
					e.Proposer = verify.NewDFlash(p.drft)
				}
				active := func() uint64 {
					var a uint64
					_ = mlxc.Do(func() error { mlxc.ClearCache(); a = mlxc.ActiveMemory(); return nil })
					return a
				}
				reqs := batchRequests(p.vocab)
				workload := func() {
					if withPrefix {
						e.Prefix = newPrefixCache(t, 1<<30, 4)
					}
					for _, req := range reqs[:3] {
						run(t, e, req)
					}
					s := e.NewScheduler(SchedulerConfig{MaxBatch: 4, PrefillSlice: time.Nanosecond})
					runConcurrently(t, s, reqs)
					ctx, cancel := context.WithCancel(context.Background())
					n := 0
					_, _ = s.Generate(ctx, Request{Prompt: []int32{4, 5, 6, 7}, MaxTokens: 100}, func(Event) error {
						if n++; n == 5 {
							cancel()
						}
						return nil
					})
					cancel()
					if e.Prefix != nil {
						if e.Prefix.Stats().Entries == 0 {
							t.Error("the prefix cache holds no entry: the test saved nothing")
						}
						_ = mlxc.Do(func() error { e.Prefix.Free(); return nil })
						e.Prefix = nil
					}
				}
				workload() // first-use allocations (a GPU's kernel constants, say) stay
				before := active()
				workload()
				// More memory after the second round than after the first is a leak (a GPU
				// may also release some of its first-use allocations in between).
				if after := active(); after > before {
					t.Errorf("active memory %d before the requests, %d after (%+d bytes)", before, after, int64(after)-int64(before))
				}
			})
		}
	}
}
