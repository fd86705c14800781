package engine

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// specPairs are target and drafter pairs for batched speculation: dense, 4-bit, hybrid
// and MoE targets with DFlash drafters, and dense and hybrid ones with DFlash2 drafters.
func specPairs(t *testing.T) map[string]*pair {
	t.Helper()
	q4 := decisiveSpec(12)
	q4.QuantBits, q4.QuantGroup = 4, 64
	pairs := map[string]*pair{
		"dflash/qwen3-bf16":   loadPair(t, "decisive-bf16", decisiveSpec(11), 2),
		"dflash/qwen3-4bit":   loadPair(t, "decisive-4bit", q4, 2),
		"dflash/qwen3_5-bf16": loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2),
	}
	for name, p := range moePairs(t) {
		pairs["dflash/"+name] = p
	}
	d2 := dflash2Pairs(t)
	pairs["dflash2/qwen3-bf16"] = d2["qwen3-bf16"]
	pairs["dflash2/qwen35-4bit"] = d2["qwen35-4bit"]
	return pairs
}

// Every request speculating in a batch (each row its own drafts and width, rows joining
// after interleaved prefills and leaving mid-run, a plain row among them) gives the
// tokens of the same request run alone: greedy bit for bit (and so plain decoding's),
// seeded T>0 the alone run's draw with that seed; on every family, DFlash and DFlash2.
func TestBatchedSpeculationMatchesAlone(t *testing.T) {
	testenv.RequireShapeExact(t)
	for name, p := range specPairs(t) {
		t.Run(name, func(t *testing.T) {
			reqs := batchRequests(p.vocab)
			reqs[1].NoDraft = true // a plain row rides in the speculative steps
			reqs[6].BlockSize = 3  // a row of its own narrower block
			alone := &Engine{Target: p.target, Proposer: proposerOf(p.drft)}
			e := &Engine{Target: p.target, Proposer: proposerOf(p.drft)}
			var mu sync.Mutex
			widest := 0
			s := e.NewScheduler(SchedulerConfig{MaxBatch: 8, PrefillSlice: time.Nanosecond, OnStep: func(rows, _ int) {
				mu.Lock()
				widest = max(widest, rows)
				mu.Unlock()
			}})
			got := runConcurrently(t, s, reqs)
			drafting, together := 0, 0
			for i, req := range reqs {
				want, _ := run(t, alone, req)
				if at, ok := eqTokens(got[i].Tokens, want.Tokens); !ok || len(got[i].Tokens) != len(want.Tokens) {
					t.Errorf("request %d: batched output differs from alone at token %d:\n got %v\nwant %v", i, at, got[i].Tokens, want.Tokens)
				}
				if req.Sampling.Greedy() && req.Sampling.RepetitionPenalty == 0 {
					if at, ok := eqTokens(got[i].Tokens, soloReference(t, p.target, req)); !ok {
						t.Errorf("request %d: greedy batched output differs from plain decoding at %d", i, at)
					}
				}
				st := got[i].Stats
				switch {
				case req.NoDraft && (st.Mode != "plain" || st.Cycles != 0):
					t.Errorf("request %d (no draft): mode %q, %d cycles", i, st.Mode, st.Cycles)
				case !req.NoDraft && (st.Mode != "dflash" || st.Cycles == 0):
					t.Errorf("request %d: mode %q, %d cycles; want dflash", i, st.Mode, st.Cycles)
				case !req.NoDraft && st.Drafted > 0:
					drafting++
					if st.BatchSize > 1 {
						together++
					}
				}
			}
			if widest < 2 {
				t.Errorf("widest step had %d rows: no batch formed", widest)
			}
			if drafting < 4 || together < 2 {
				t.Errorf("%d requests drafted, %d of them in batches", drafting, together)
			}
		})
	}
}

// Rows sampling at T > 0 in a batch of 4 speculating rows draw from the target's
// distribution: the χ² test of the first three tokens' joint distribution against the
// enumerated one, each request's seed its own, its batch mates other requests.
func TestBatchedSpeculativeSamplingMatchesTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("statistical test; skipped with -short")
	}
	for _, kind := range []string{"dflash", "dflash2"} {
		t.Run(kind, func(t *testing.T) {
			p := samplingPair(t, kind)
			sp := sample.Params{Temperature: 0.9, TopP: 0.97}
			prompt := []int32{1, 3, 5}
			exp := exactJoint(t, p.target, prompt, p.vocab, sp)
			e := &Engine{Target: p.target, Proposer: proposerOf(p.drft)}
			s := e.NewScheduler(SchedulerConfig{MaxBatch: 4})
			const N = 1200
			obs, _ := batchedFirstThree(t, s, prompt, sp, N, 4, nil)
			stat, df := chiSquare(obs, exp, N)
			crit := chiCritical(df, 3.09) // α = 0.001
			t.Logf("χ² = %.1f, df = %d, critical (α=0.001) = %.1f", stat, df, crit)
			if stat > crit {
				t.Errorf("distribution differs from the target's: χ² %.1f > %.1f", stat, crit)
			}
		})
	}
}

// batchedFirstThree runs n requests of prompt through s, in rounds of rows concurrent
// ones, each with its own seed and request r of a round at 4+r tokens (batch mates of
// other lengths keep the steps ragged), and counts the first three tokens of those that
// shape (nil: none) says to count; shape may change the request first. It returns the
// counts and how many requests they cover.
func batchedFirstThree(t *testing.T, s *Scheduler, prompt []int32, sp sample.Params, n, rows int, shape func(r int, req *Request) (counted bool)) (map[[3]int32]int, int) {
	obs := map[[3]int32]int{}
	counted := 0
	var mu sync.Mutex
	for round := 0; round < n/rows; round++ {
		var wg sync.WaitGroup
		for r := range rows {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				q := sp
				q.Seed = seed
				req := Request{Prompt: prompt, MaxTokens: 4 + r, Sampling: q, IgnoreEOS: true, BlockSize: 4}
				if shape != nil && !shape(r, &req) {
					if _, err := s.Generate(context.Background(), req, nil); err != nil {
						t.Error(err)
					}
					return
				}
				res, err := s.Generate(context.Background(), req, nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				obs[[3]int32{res.Tokens[0], res.Tokens[1], res.Tokens[2]}]++
				counted++
				mu.Unlock()
			}(uint64(round*rows+r)*7919 + 17)
		}
		wg.Wait()
	}
	return obs, counted
}

// samplingPair is a tiny 6-token target with a drafter of the given generation.
func samplingPair(t *testing.T, kind string) *pair {
	t.Helper()
	spec := modelgen.TinyQwen3()
	spec.Vocab, spec.Seed, spec.WeightStd, spec.EOS = 6, 21, 0.1, []int{-1}
	if kind == "dflash2" {
		ds := modelgen.DrafterFor(spec, 1).DFlash2For()
		return loadPairWith(t, "batch-sampling-dflash2", spec.Vocab, func(dir string) error { return modelgen.WriteQwen3(dir, spec) }, &ds)
	}
	return loadPair(t, "sampling-v6", spec, 1) // TestSpeculativeSamplingMatchesTarget's pair
}

// With the width policy (block costs measured), a request alone takes its block policy's
// sizes, and a batch whose wide verifies cost more than their drafts add steps plainly:
// greedy output stays plain decoding's, and the policy's choices show in the block sizes.
func TestBatchPolicyTurnsSpeculationOff(t *testing.T) {
	testenv.RequireShapeExact(t)
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	// A verify whose cost grows with every token: with several rows, no draft pays.
	steep := &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{1, 2, 4, 8, 16}}
	e := &Engine{Target: p.target, Proposer: proposerOf(p.drft), BlockCosts: steep}
	s := e.NewScheduler(SchedulerConfig{MaxBatch: 8})
	reqs := batchRequests(p.vocab)
	got := runConcurrently(t, s, reqs)
	for i, req := range reqs {
		if req.Sampling.Greedy() && req.Sampling.RepetitionPenalty == 0 {
			if at, ok := eqTokens(got[i].Tokens, soloReference(t, p.target, req)); !ok {
				t.Errorf("request %d differs from plain decoding at %d", i, at)
			}
		}
		st := got[i].Stats
		n := 0
		for _, k := range st.BlockSizes {
			n += k
		}
		if n != st.Cycles {
			t.Errorf("request %d: block sizes %v count %d cycles, stats %d", i, st.BlockSizes, n, st.Cycles)
		}
	}
	// Costs that start flat in the tokens: the rows draft (until the measured costs and
	// the random drafter's acceptance, pooled over the rows, say otherwise).
	e.BlockCosts = &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{10, 10, 10, 10, 10}}
	s = e.NewScheduler(SchedulerConfig{MaxBatch: 8})
	drafted := 0
	for _, res := range runConcurrently(t, s, reqs[:3]) {
		drafted += res.Stats.Drafted
	}
	if drafted == 0 {
		t.Error("flat costs: no request drafted")
	}
}

// The cost tables interpolate between measured sizes and extend the last slope; a plain
// step of rows not measured yet costs no more than a speculative step of as many tokens.
func TestStepCosts(t *testing.T) {
	c := newStepCosts(&BlockCosts{Sizes: []int{1, 4, 8}, MS: []float64{2, 5, 9}})
	for _, tc := range []struct {
		T    int
		want float64
	}{{2, 2.5}, {4, 5}, {6, 7}, {8, 9}, {16, 17}} {
		if got := c.spec.at(tc.T); got != tc.want {
			t.Errorf("speculative step of %d tokens: %v ms, want %v", tc.T, got, tc.want)
		}
	}
	if got := c.plainAt(1); got != 2 {
		t.Errorf("plain step of 1 row: %v ms, want the one-token step's 2", got)
	}
	if got := c.plainAt(4); got != 5 {
		t.Errorf("plain step of 4 rows, unmeasured: %v ms, want the 4-token verify's 5", got)
	}
	c.plain.observe(4, 3*time.Millisecond)
	if got := c.plainAt(4); got != 3 {
		t.Errorf("plain step of 4 rows, measured: %v ms, want 3", got)
	}
	c.spec.observe(8, 15*time.Millisecond)
	if got := c.spec.at(8); got != 0.8*9+0.2*15 {
		t.Errorf("after a measurement: %v", got)
	}
	// One outlier (a step that built kernels for its shape) counts as twice the
	// estimate; steps that really cost that much get there within a few steps.
	c.spec.observe(8, 500*time.Millisecond)
	if got, want := c.spec.at(8), 0.8*10.2+0.2*20.4; math.Abs(got-want) > 1e-9 {
		t.Errorf("after an outlier: %v ms, want %v", got, want)
	}
	for range 30 {
		c.spec.observe(8, 100*time.Millisecond)
	}
	if got := c.spec.at(8); got < 99 || got > 100 {
		t.Errorf("after 30 steps of 100 ms: %v ms, want about 100", got)
	}
	c.spec.observe(64, 900*time.Millisecond) // a new size: capped against the extrapolation
	if got := c.spec.at(64); got > 2*(100+(100-5)/4.0*56)+1e-9 {
		t.Errorf("a new size's first step: %v ms, want at most twice the extrapolated cost", got)
	}
	if got := newStepCosts(nil).spec.at(5); got != 0 {
		t.Errorf("nothing measured: %v, want 0", got)
	}
}

// plan: alone, a row takes its block policy's size; in a batch, the widths follow the
// step's cost over the tokens it verifies: flat costs give every row its largest block,
// costs that grow with every token give every row a plain step, and costs flat up to a
// knee give wide blocks to some rows only. Widths never pass a row's token budget, and
// plain rows stay at 1.
func TestPlanWidths(t *testing.T) {
	single := &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{10, 10, 10, 10, 10}}
	rows := func(n int) []*sequence {
		out := make([]*sequence, n)
		for i := range out {
			q := &sequence{req: Request{MaxTokens: 1000}, history: []int32{1, 2}, built: 1}
			q.dr = &drafting{maxW: 16, policy: newBlockPolicy(single, 16)}
			for range 200 {
				q.dr.policy.observe(15, 14) // high acceptance at every position
			}
			out[i] = q
		}
		return out
	}
	costs := func(ms map[int]float64) *stepCosts { return &stepCosts{plain: costTable{}, spec: ms} }
	flat := costs(map[int]float64{1: 10, 16: 10, 128: 10})
	linear := costs(map[int]float64{1: 1, 2: 2, 128: 128})
	knee := costs(map[int]float64{1: 10, 16: 10, 32: 40, 128: 160})
	sum := func(w []int) int {
		n := 0
		for _, x := range w {
			n += x
		}
		return n
	}
	d := &decoder{costs: flat}
	if w, _ := d.plan(rows(1)); w[0] != 16 {
		t.Errorf("alone, flat: width %v, want 16", w)
	}
	if w, _ := d.plan(rows(8)); sum(w) != 8*16 {
		t.Errorf("8 rows, flat costs: widths %v, want 16 each", w)
	}
	d.costs = linear
	if w, _ := d.plan(rows(8)); sum(w) != 8 {
		t.Errorf("8 rows, costs growing with every token: widths %v, want 1 each", w)
	}
	d.costs = knee
	w, _ := d.plan(rows(8))
	if T := sum(w); T <= 8 || T >= 8*16 {
		t.Errorf("8 rows, flat to 16 tokens then steep: widths %v (%d tokens), want some rows wide and not all", w, T)
	}
	// Budgets and plain rows.
	rs := rows(3)
	rs[1].dr = nil
	rs[2].req.MaxTokens, rs[2].built = 10, 7
	d.costs = flat
	if w, _ := d.plan(rs); w[0] != 16 || w[1] != 1 || w[2] != 3 {
		t.Errorf("widths %v, want [16 1 3]: a plain row stays at 1, a row's budget caps it", w)
	}
	// Fresh rows (no counts of their own) in a batch where a wide step costs twice a
	// plain one: at the even prior no draft pays; with the rows' pooled acceptance high,
	// every row drafts.
	fresh := rows(8)
	for _, q := range fresh {
		q.dr.policy = newBlockPolicy(single, 16)
	}
	d = &decoder{costs: &stepCosts{plain: costTable{8: 10}, spec: costTable{9: 14, 16: 16, 128: 20}}, explored: 1} // no exploring due
	if w, _ := d.plan(fresh); sum(w) != 8 {
		t.Errorf("fresh rows, nothing pooled: widths %v, want plain steps", w)
	}
	for range 50 {
		d.pool.observe(15, 14)
	}
	if w, _ := d.plan(fresh); sum(w) < 8*8 {
		t.Errorf("fresh rows, high pooled acceptance: widths %v, want wide blocks", w)
	}
	d.costs = flat
	rs[0].built = 0 // a row whose first step is next: its last prompt token alone
	if w, _ := d.plan(rs); w[0] != 1 {
		t.Errorf("a joining row's first step has width %d, want 1", w[0])
	}
}
