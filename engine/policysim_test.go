package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// acceptStream draws a cycle's accepted drafts: none in the first `rejected` cycles, then
// each draft accepted with probability acc given the ones before it.
type acceptStream struct {
	r        *rand.Rand
	acc      float64
	rejected int
	cycles   int
}

func (s *acceptStream) draw(n int) int {
	s.cycles++
	a := 0
	if s.cycles > s.rejected {
		for a < n && s.r.Float64() < s.acc {
			a++
		}
	}
	return a
}

// fixedBest is the most tokens per millisecond any fixed block of costs makes at
// acceptance acc per position.
func fixedBest(costs *BlockCosts, acc float64) float64 {
	best := 0.0
	for i, B := range costs.Sizes {
		e, surv := 1.0, 1.0
		for range B - 1 {
			surv *= acc
			e += surv
		}
		best = max(best, e/costs.MS[i])
	}
	return best
}

var (
	// gpuCosts are cycle costs of the shape an H200 measures for a 4B target: a 16-token
	// verify costs 1.4 one-token steps.
	gpuCosts = &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{5.3, 5.6, 5.9, 6.4, 7.4}}
	// cpuCosts grow with every verified token, as a CPU's do: a 16-token verify costs 14
	// one-token steps, so no acceptance makes a draft pay.
	cpuCosts = &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{12.3, 25, 48, 90, 174}}
	// moeCosts grow with the experts a wider verify reads.
	moeCosts = &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{10, 13, 16, 22, 34}}
)

// Simulated requests of 400 cycles whose first three cycles reject every draft: however
// the acceptance starts, the policy reaches most of the rate of the best fixed block for
// the acceptance that follows. Where a wide verify costs little more than a one-token step
// (a GPU), an exploring cycle loses little, so a bad start cannot keep the policy at
// one-token steps (which it did when exploring was charged a cycle's whole cost: 0.78 of
// the best); where it costs many steps (a CPU), exploring stays within its share.
func TestBlockPolicyRecoversFromABadStart(t *testing.T) {
	cases := []struct {
		name  string
		costs *BlockCosts
		acc   float64
		least float64
	}{
		{"gpu/low", gpuCosts, 0.3, 0.9},
		{"gpu/mid", gpuCosts, 0.7, 0.85},
		{"gpu/high", gpuCosts, 0.9, 0.9},
		{"moe/mid", moeCosts, 0.7, 0.85},
		{"moe/high", moeCosts, 0.9, 0.85},
		{"cpu/high", cpuCosts, 0.9, 0.94},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := range 3 {
				p := newBlockPolicy(c.costs, 16)
				s := &acceptStream{r: rand.New(rand.NewPCG(uint64(seed), 1)), acc: c.acc, rejected: 3}
				ms, tokens := 0.0, 0
				sizes := map[int]int{}
				for range 400 {
					B := p.size(16)
					sizes[B]++
					a := s.draw(B - 1)
					ms += p.costOf(B)
					tokens += a + 1
					p.observe(B-1, a)
				}
				if got := float64(tokens) / ms / fixedBest(c.costs, c.acc); got < c.least {
					t.Errorf("seed %d: %.2f of the best fixed block's rate, want ≥ %.2f (blocks %v)", seed, got, c.least, sizes)
				}
			}
		})
	}
}

// A simulated batch of 8 fresh rows in one decoder, each rejecting its first three
// cycles' drafts and then accepting each draft with probability 0.9: where a step's cost
// grows slowly with the tokens it verifies (a GPU), the rows end up drafting wide and the
// batch commits several times plain batching's tokens per millisecond; where drafting
// costs a step a large fixed amount, every row drafts wide or none does; where it grows
// with every token (a CPU), the rows step plainly and exploring costs the batch little.
func TestBatchPolicyLearnsWhereDraftsPay(t *testing.T) {
	cases := []struct {
		name        string
		single      *BlockCosts
		plain       func(R int) float64    // a plain step's ms by rows
		spec        func(T, R int) float64 // a speculative step's ms by tokens verified and rows
		least, most float64                // the batch's rate over plain batching's
		early       float64                // the least rate over plain batching's in the first 60 steps (0: any)
	}{
		{"gpu", gpuCosts, func(R int) float64 { return 5.3 + 0.05*float64(R) }, func(T, _ int) float64 { return 7 + 0.03*float64(T) }, 3, 100, 1.5},
		{"cpu", cpuCosts, func(R int) float64 { return 12.3 * (0.6 + 0.4*float64(R)) }, func(T, _ int) float64 { return 11 * float64(T) }, 0.93, 1.01, 0.95},
		// A step that drafts at all costs twice a plain one and more (a synchronous read,
		// the verify's fixed cost, as an H200's batched steps measure): one wide row loses,
		// every row wide wins (8 rows at block 16: 1.39x). Raising one row at a time stayed
		// at plain steps (1.00x).
		{"gpu-valley", gpuCosts, func(R int) float64 { return 5 + float64(R) }, func(T, _ int) float64 { return 25 + 0.4*float64(T) }, 1.25, 1.6, 0},
		// A speculative step costs a fixed 20 + 2.5 ms a row whatever it drafts: 8 rows, 40 ms
		// against a 12 ms plain step, where one row's cycles (the seed) say 6 ms. Every row
		// wide still wins, and the first steps must not lose much while the cost is learned:
		// with each step over its estimate counted at twice the estimate, the first 60 steps
		// ran at 0.70x plain batching (an H200's short 4–16-client requests: 0.39–0.62x).
		{"gpu-rows", gpuCosts, func(R int) float64 { return 10 + 0.25*float64(R) }, func(T, R int) float64 { return 20 + 2.5*float64(R) + 0.1*float64(T) }, 1.5, 2.2, 0.85},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := &decoder{costs: newStepCosts(c.single)}
			rows := make([]*sequence, 8)
			streams := make([]*acceptStream, len(rows))
			for i := range rows {
				q := &sequence{req: Request{MaxTokens: 1 << 20}, history: []int32{1, 2}, built: 1, st: newDFlashStats(false, 2, 16)}
				q.dr = &drafting{maxW: 16, policy: newBlockPolicy(c.single, 16)}
				rows[i] = q
				streams[i] = &acceptStream{r: rand.New(rand.NewPCG(uint64(i), 2)), acc: 0.9, rejected: 3}
			}
			ms, tokens, drafted := 0.0, 0, 0
			early, earlyTokens := 0.0, 0
			for step := range 600 {
				w, loss := d.plan(rows)
				T, stepTokens := 0, 0
				for r, q := range rows {
					a := 0
					if w[r] > 1 {
						a = streams[r].draw(w[r] - 1)
						drafted++
					}
					d.countCycle(q, w[r]-1, a)
					tokens += a + 1
					stepTokens += a + 1
					T += w[r]
				}
				var cost float64
				if T == len(rows) {
					cost = c.plain(len(rows))
					d.costs.plain.observe(len(rows), time.Duration(cost*1e6))
				} else {
					cost = c.spec(T, len(rows))
					d.costs.observeSpec(T, time.Duration(cost*1e6))
				}
				d.count(time.Duration(cost*1e6), loss)
				if step < 60 {
					early += cost
					earlyTokens += stepTokens
				}
				if step >= 100 { // measured after the start
					ms += cost
				}
				if step == 99 {
					ms, tokens, drafted = 0, 0, 0
				}
			}
			plain := float64(len(rows)) / c.plain(len(rows))
			got := float64(tokens) / ms / plain
			t.Logf("%s: %.2fx plain batching's rate, %d of %d row steps drafted; first 60 steps %.2fx", c.name, got, drafted, 500*len(rows),
				float64(earlyTokens)/early/plain)
			if got < c.least || got > c.most {
				t.Errorf("%.2fx plain batching's rate, want within [%v, %v]", got, c.least, c.most)
			}
			if e := float64(earlyTokens) / early / plain; e < c.early {
				t.Errorf("first 60 steps at %.2fx plain batching's rate, want at least %v", e, c.early)
			}
			if d.explored > policyExploreShare*d.spent {
				t.Errorf("exploring lost %.1f of %.1f ms, more than its share", d.explored, d.spent)
			}
		})
	}
}

// hybridCosts are the cycle costs the start-up probe measured for a 27B hybrid target with
// a DFlash2 drafter on an H200 (bench/results/h200-2026-12-04-dflash2-27b, f5): a block of 8
// costs 1.9 one-token steps, and block 2 was timed slow (60 ms against 41–43 for 3–8).
var hybridCosts = &BlockCosts{Sizes: []int{1, 2, 3, 4, 6, 8}, MS: []float64{22.5, 60.4, 41.4, 41.4, 42.9, 43.2}}

// Short requests (20 and 60 cycles: 128 tokens at τ 6) from a fresh policy, over 200
// acceptance streams each: one size timed slow must not price the larger blocks out, so
// the policy drafts from the first cycles where the acceptance pays. (When each cost was
// raised to the largest before it, every block of 3–8 counted 60 ms and the 20-cycle
// requests never drafted: 0.32 of the best fixed block's rate at acceptance 0.92.)
func TestBlockPolicyShortRequests(t *testing.T) {
	cases := []struct {
		acc    float64
		cycles int
		least  float64
	}{
		{0.5, 20, 0.9}, {0.8, 20, 0.8}, {0.92, 20, 0.85}, {0.8, 60, 0.9}, {0.92, 60, 0.92},
	}
	for _, c := range cases {
		got, best := 0.0, 0.0
		blocks := map[int]int{}
		for seed := range 200 {
			p := newBlockPolicy(hybridCosts, 8)
			s := &acceptStream{r: rand.New(rand.NewPCG(uint64(seed), 9)), acc: c.acc}
			ms, tokens := 0.0, 0
			for range c.cycles {
				B := p.size(8)
				blocks[B]++
				a := s.draw(B - 1)
				ms += p.costOf(B)
				tokens += a + 1
				p.observe(B-1, a)
			}
			got += float64(tokens) / ms
			best += fixedBest(hybridCosts, c.acc)
		}
		if r := got / best; r < c.least {
			t.Errorf("acceptance %.2f, %d cycles: %.2f of the best fixed block's rate, want ≥ %.2f (blocks %v)", c.acc, c.cycles, r, c.least, blocks)
		}
	}
}

// A measured cost above a larger block's is lowered to it; costs that grow are kept.
func TestBlockPolicyCostsNeverFall(t *testing.T) {
	p := newBlockPolicy(hybridCosts, 8)
	want := []float64{22.5, 41.4, 41.4, 41.4, 42.9, 43.2}
	if !slices.Equal(p.ms, want) {
		t.Errorf("costs %v, want %v", p.ms, want)
	}
	if p := newBlockPolicy(cpuCosts, 16); !slices.Equal(p.ms, cpuCosts.MS) {
		t.Errorf("growing costs changed: %v, want %v", p.ms, cpuCosts.MS)
	}
}
