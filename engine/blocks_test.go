package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// settle feeds p many cycles drafting the largest block with exact per-position rates
// hit (fractional counts, pooled and the largest size's own), then makes exploring not
// due, so that size reports the policy's own choice.
func settle(p *blockPolicy, hit float64) {
	last := len(p.sizes) - 1
	for k := 0; k < 400; k++ {
		p.observed++
		for i := range p.tries {
			p.tries[i] = p.tries[i]*policyDecay + math.Pow(hit, float64(i))
			p.hits[i] = p.hits[i]*policyDecay + math.Pow(hit, float64(i+1))
			p.sizeTries[last][i], p.sizeHits[last][i] = p.tries[i], p.hits[i]
		}
	}
	p.spent, p.explored = 1000, 1000*policyExploreShare*2
}

// The policy's estimate and choice, against hand-computed values.
func TestBlockPolicyChooses(t *testing.T) {
	flat := &BlockCosts{Sizes: []int{2, 4, 8, 16}, MS: []float64{10, 10, 10, 10}}
	// Cost 5 + B ms: a 16-block costs 2.1× a 2-block.
	steep := &BlockCosts{Sizes: []int{2, 4, 8, 16}, MS: []float64{7, 9, 13, 21}}
	// The CPU's trained pair: a one-token step 18 ms, a 2-row cycle 35, a 16-row one 173.
	cpu := &BlockCosts{Sizes: []int{1, 2, 4, 8, 16}, MS: []float64{18, 35, 64, 93, 173}}
	cases := []struct {
		name  string
		costs *BlockCosts
		hit   float64 // every draft's acceptance given the ones before
		want  int
	}{
		{"flat costs take the largest block even at low acceptance", flat, 0.2, 16},
		{"flat costs, high acceptance", flat, 0.95, 16},
		// Flat costs with the one-token step measured as cheap as a cycle: drafting costs
		// nothing extra, so the largest block still wins.
		{"flat costs with a one-token step", &BlockCosts{Sizes: []int{1, 2, 16}, MS: []float64{10, 10, 10}}, 0.9, 16},
		// At 0.2 the expected tokens are 1.2 at B=2, 1.25 at B=16: the cheapest wins.
		{"steep costs, low acceptance", steep, 0.2, 2},
		// At 0.95 a 16-block commits 1+Σ0.95^i ≈ 11.3 for 21 ms, a 8-block 6.6 for 13.
		{"steep costs, high acceptance", steep, 0.95, 16},
		// At 0.7: B=4 commits 2.53 for 9 ms (0.281/ms), B=8 3.12 for 13 (0.240/ms).
		{"steep costs, middle acceptance", steep, 0.7, 4},
		// Flat costs measured with noise (the H200's 35B-A3B cycle): the dip at 4 is
		// raised to the cost before it, and the largest block wins.
		{"noisy flat costs", &BlockCosts{Sizes: []int{2, 4, 8, 12, 16}, MS: []float64{28.9, 24.4, 31.6, 32.0, 31.97}}, 0.92, 16},
		// At 0.7 a 2-row cycle commits 1.7 tokens for 35 ms (0.049/ms), a 16-row one 3.3 for
		// 173 (0.019): a one-token step's 1 for 18 (0.056) wins, drafting loses.
		{"a CPU: drafting loses to one-token steps", cpu, 0.7, 1},
		// At 0.85 a 2-row cycle commits 1.85 tokens for 32 ms (0.0578/ms), 4% past the
		// step's 0.0556: within the margin that noisy costs can hide, so steps.
		{"drafting within the margin of a one-token step", &BlockCosts{Sizes: []int{1, 2, 16}, MS: []float64{18, 32, 1000}}, 0.85, 1},
		// At 0.99 a 16-row cycle commits 14.9 tokens for 173 ms (0.086/ms), past the step's
		// 0.056 and an 8-row cycle's 7.7 for 93 (0.083).
		{"a CPU: near-certain drafts pay for a wide verify", cpu, 0.99, 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newBlockPolicy(c.costs, 16)
			settle(p, c.hit)
			if got := p.size(16); got != c.want {
				t.Errorf("size %d, want %d (expected tokens: B=2 %.2f, 4 %.2f, 8 %.2f, 16 %.2f)", got, c.want,
					p.expected(2), p.expected(4), p.expected(8), p.expected(16))
			}
		})
	}
}

func TestBlockPolicyCounts(t *testing.T) {
	p := newBlockPolicy(&BlockCosts{Sizes: []int{2, 16}, MS: []float64{1, 2}}, 8)
	if p.sizes[len(p.sizes)-1] != 8 || math.Abs(p.ms[len(p.ms)-1]-(1+6.0/14)) > 1e-12 {
		t.Fatalf("sizes %v costs %v: want 8 last at the interpolated 1.43 ms", p.sizes, p.ms)
	}
	if p.exploring() {
		t.Fatal("exploring before any cycle paid for it")
	}
	for i := 0; i < 4; i++ {
		p.observe(7, 2) // accepted 2 of 7: positions 1, 2 hit, 3 tried and missed
	}
	// After 4 identical cycles: tries = hits for positions 1–2 = Σ decay^k, k<4; position
	// 3 tried as often, never hit; positions beyond never tried. The 8-block's own counts
	// are the same (every cycle drafted 8); the 2-block's are empty.
	sum := (1 - math.Pow(policyDecay, 4)) / (1 - policyDecay)
	want := []struct{ tries, hits float64 }{{sum, sum}, {sum, sum}, {sum, 0}, {0, 0}}
	for i, w := range want {
		if math.Abs(p.tries[i]-w.tries) > 1e-9 || math.Abs(p.hits[i]-w.hits) > 1e-9 ||
			p.sizeTries[1][i] != p.tries[i] || p.sizeHits[1][i] != p.hits[i] {
			t.Errorf("position %d: tries %.4f hits %.4f (8-block's own %.4f %.4f), want %.4f %.4f", i+1,
				p.tries[i], p.hits[i], p.sizeTries[1][i], p.sizeHits[1][i], w.tries, w.hits)
		}
	}
	if p.sizeTries[0][0] != 0 {
		t.Errorf("the 2-block counts cycles it did not draft: %v", p.sizeTries[0])
	}
	pooled := func(h, n float64) float64 { return (h + policyPrior) / (n + 2*policyPrior) }
	own := func(h, n, pool float64) float64 { return (h + policySizeWeight*pool) / (n + policySizeWeight) }
	h, m := pooled(sum, sum), pooled(0, sum)
	h8, m8 := own(sum, sum, h), own(0, sum, m)
	if got, want := p.expected(8), 1+h8+h8*h8+h8*h8*m8*(1+0.5+0.25+0.125+0.0625); math.Abs(got-want) > 1e-12 {
		t.Errorf("expected(8) = %.6f, want %.6f", got, want)
	}
	// The 2-block has no cycles of its own: the pooled estimate.
	if got, want := p.expected(2), 1+h; math.Abs(got-want) > 1e-12 {
		t.Errorf("expected(2) = %.6f, want %.6f", got, want)
	}
	// A one-token step and a cycle that drafted nothing count no position.
	p.observe(0, 0)
	if math.Abs(p.tries[0]-sum) > 1e-9 {
		t.Errorf("a one-token step decayed position 1: tries %.4f", p.tries[0])
	}
	if newBlockPolicy(nil, 16) != nil || newBlockPolicy(&BlockCosts{Sizes: []int{2}, MS: []float64{1}}, 1) != nil {
		t.Error("a policy without costs or with a 1-block limit")
	}
	if p := newBlockPolicy(&BlockCosts{Sizes: []int{1}, MS: []float64{1}}, 2); p == nil || fmt.Sprint(p.sizes) != "[1 2]" {
		t.Errorf("a 2-block limit with a measured step: %+v, want sizes [1 2]", p)
	}
}

// Where one-token steps win, the policy still explores now and then, at most
// policyExploreShare of the cycles' cost, from the narrow sizes up: with drafts that
// always miss, the 2-block (just above the best, the one-token step) and never the
// costly 16-block; with drafts that always hit, it climbs to the 4-block, which then
// pays. Each stretch of one-token steps runs until the next exploration is due.
func TestBlockPolicyExplores(t *testing.T) {
	costs := &BlockCosts{Sizes: []int{1, 2, 4, 16}, MS: []float64{10, 15, 20, 160}}
	for _, hit := range []bool{false, true} {
		p := newBlockPolicy(costs, 16)
		explored := map[int]int{}
		steps := 0
		for cycle := 0; cycle < 5000; {
			switch B := p.size(16); B {
			case 1:
				k := p.oneTokenSteps()
				if k < 1 {
					t.Fatalf("a stretch of %d steps", k)
				}
				for i := 0; i < k; i++ {
					if got := p.size(16); got != 1 {
						t.Fatalf("step %d of a stretch of %d: size %d", i, k, got)
					}
					p.observe(0, 0)
				}
				steps += k
				cycle += k
			default:
				if len(explored) == 0 && B != 2 {
					t.Fatalf("first exploring cycle: size %d, want 2", B)
				}
				explored[B]++
				if hit {
					p.observe(B-1, B-1)
				} else {
					p.observe(B-1, 0)
				}
				cycle++
			}
		}
		switch {
		case !hit && (explored[2] < 2 || len(explored) != 1):
			t.Errorf("drafts that miss: explored %v in %d steps, want the 2-block only", explored, steps)
		case hit && p.best() < 4:
			t.Errorf("drafts that hit: best %d after exploring %v", p.best(), explored)
		}
		// Exploring took its share and no more.
		if p.explored > policyExploreShare*p.spent {
			t.Errorf("exploring took %.0f of %.0f ms, share %.3f", p.explored, p.spent, policyExploreShare)
		}
	}
	if (*blockPolicy)(nil).oneTokenSteps() != 1 {
		t.Error("oneTokenSteps of no policy is not 1")
	}
}

// Where every drafting block costs more one-token steps than it has rows (a 4-bit verify
// on a CPU), no acceptance makes one pay: the policy takes one-token steps and never
// explores.
func TestBlockPolicyNeverExploresWhatCannotPay(t *testing.T) {
	p := newBlockPolicy(&BlockCosts{Sizes: []int{1, 2, 4, 16}, MS: []float64{1140, 2590, 5492, 22481}}, 16)
	for i := 0; i < 2000; i++ {
		if got := p.size(16); got != 1 {
			t.Fatalf("cycle %d: size %d, want one-token steps only", i, got)
		}
		p.observe(0, 0)
	}
	if k := p.oneTokenSteps(); k < 1<<20 {
		t.Errorf("stretches of %d steps where nothing is ever explored", k)
	}
}

// Where verify costs are flat, exploring drafts the largest block, which the policy
// chooses anyway.
func TestBlockPolicyExploresFlat(t *testing.T) {
	p := newBlockPolicy(&BlockCosts{Sizes: []int{1, 2, 8, 16}, MS: []float64{10, 10, 10, 10}}, 16)
	for i := 0; i < 50; i++ {
		if got := p.size(16); got != 16 {
			t.Fatalf("cycle %d: size %d, want 16", i, got)
		}
		p.observe(15, i%4)
	}
}

// oneTokenWins are costs under which a random pair's drafts never pay: a one-token step
// 10 ms, any drafting cycle 14 ms or more. Exploring is due every ~45 steps.
var oneTokenWins = &BlockCosts{Sizes: []int{1, 2, 4, 16}, MS: []float64{10, 14, 14, 14}}

// With an adaptive block DFlash still emits plain decoding's tokens in both loops, and
// costs that make small blocks pay make the loops use them; costs that make drafting lose
// make them take one-token steps between exploring cycles, the drafter's context kept in
// step (the caches after each cycle equal a fresh run's, the draft cache included).
func TestAdaptiveBlockEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	steep := &BlockCosts{Sizes: []int{2, 4, 8, 16}, MS: []float64{3, 5, 9, 17}}
	cases := []struct {
		pair  string
		costs *BlockCosts
		n     int
	}{
		{"qwen3_moe-bf16", steep, 40},
		{"qwen3_5_moe-bf16", steep, 40},
		{"qwen3-bf16", oneTokenWins, 120},
		{"qwen3_5-bf16", oneTokenWins, 120},
	}
	pairs := moePairs(t)
	pairs["qwen3-bf16"] = loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	pairs["qwen3_5-bf16"] = loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2)
	for _, c := range cases {
		p := pairs[c.pair]
		for pi, prompt := range prompts(p.vocab)[:2] {
			want := plainGreedy(t, p, prompt, c.n)
			for _, ahead := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/p%d/ahead%v", c.pair, pi, ahead), func(t *testing.T) {
					dfl := verify.NewDFlash(p.drft)
					e := &Engine{Target: p.target, Proposer: dfl, RunAhead: ahead, BlockCosts: c.costs}
					checked := 0
					if c.costs == oneTokenWins {
						e.afterCycle = func(cc model.Cache, committed []int32) {
							checked++
							if checked%7 == 0 { // a fresh run per cycle would be slow
								compareWithFresh(t, p, cc, committed, dfl)
							}
						}
					}
					res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: c.n, IgnoreEOS: true})
					checkLossless(t, res, evs, want, 16)
					if len(res.Stats.BlockSizes) < 2 {
						t.Errorf("one block size only: %v", res.Stats.BlockSizes)
					}
					n := 0
					for _, k := range res.Stats.BlockSizes {
						n += k
					}
					if n != res.Stats.Cycles {
						t.Errorf("block sizes %v count %d cycles, stats %d", res.Stats.BlockSizes, n, res.Stats.Cycles)
					}
					if c.costs == oneTokenWins {
						// Most tokens from one-token steps, and more than one exploring cycle.
						if res.Stats.BlockSizes[1] < c.n/2 || res.Stats.Cycles-res.Stats.BlockSizes[1] < 2 {
							t.Errorf("block sizes %v: want mostly one-token steps and ≥ 2 explorations", res.Stats.BlockSizes)
						}
					}
				})
			}
		}
	}
}

// Requests whose tokens come mostly from one-token steps save and resume the prefix cache
// as the fixed block's do: a second turn resumed from the first emits the uncached tokens,
// greedy and sampled (a stretch of steps ends on the budget with no step in flight).
func TestOneTokenStepsPrefixCache(t *testing.T) {
	if testenv.GPU() {
		t.Skip("needs rows that round alike whatever the prefill's chunking: the CPU backend")
	}
	p := loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2)
	turn1 := []int32{5, 9, 2, 77, 31, 64, 64, 2, 1, 40, 41, 42, 43, 44, 45, 46, 47}
	for _, sp := range []sample.Params{{}, {Temperature: 0.8, TopP: 0.95, Seed: 7}} {
		for _, ahead := range []bool{false, true} {
			t.Run(fmt.Sprintf("T%v/ahead%v", sp.Temperature, ahead), func(t *testing.T) {
				pcache := newPrefixCache(t, 0, 4)
				defer pcache.Free()
				newEngine := func(c *prefixcache.Cache) *Engine {
					return &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: ahead, BlockCosts: oneTokenWins, Prefix: c}
				}
				uncached, cached := newEngine(nil), newEngine(pcache)
				req := func(prompt []int32, n int) Request {
					return Request{Prompt: prompt, MaxTokens: n, Sampling: sp, IgnoreEOS: true}
				}
				a, _ := run(t, cached, req(turn1, 30))
				turn2 := append(append(append([]int32(nil), turn1...), a.Tokens...), 3, 4, 8)
				want, _ := run(t, uncached, req(turn2, 30))
				got, _ := run(t, cached, req(turn2, 30))
				if i, ok := eqTokens(got.Tokens, want.Tokens); !ok {
					t.Fatalf("turn 2 differs from the uncached run at %d:\n got %v\nwant %v", i, got.Tokens, want.Tokens)
				}
				if r := got.Stats.PromptCacheTokens; r != len(turn1)+len(a.Tokens)-1 {
					t.Errorf("turn 2 reused %d prompt tokens, want %d", r, len(turn1)+len(a.Tokens)-1)
				}
				if a.Stats.BlockSizes[1] == 0 {
					t.Errorf("turn 1 took no one-token step: %v", a.Stats.BlockSizes)
				}
			})
		}
	}
}

// MeasureBlockCosts times every size that fits the drafter, in order, and leaves no array
// behind.
func TestMeasureBlockCosts(t *testing.T) {
	p := moePairs(t)["qwen3_moe-bf16"]
	e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft)}
	var bc BlockCosts
	err := mlxc.Do(func() error {
		before := mlxc.LiveArrays()
		var err error
		bc, err = e.MeasureBlockCosts(context.Background(), []int32{3, 1, 4, 1, 5, 9, 2, 6}, []int{16, 4, 2, 40, 1, 4}, 2)
		if after := mlxc.LiveArrays(); after != before {
			t.Errorf("%d arrays left behind", after-before)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(bc.Sizes) != "[1 2 4 16]" || len(bc.MS) != 4 {
		t.Fatalf("sizes %v costs %v, want [1 2 4 16] (40 dropped, 4 once)", bc.Sizes, bc.MS)
	}
	for i, ms := range bc.MS {
		if ms <= 0 {
			t.Errorf("size %d: cost %g ms", bc.Sizes[i], ms)
		}
	}
	_, err = e.MeasureBlockCosts(context.Background(), []int32{3}, []int{4}, 1)
	if err == nil {
		t.Error("a one-token probe prompt was accepted")
	}
}

// The per-position counts and the τ estimated from them, by hand: cycles of (drafts,
// accepted) (7, 2), (7, 7), (3, 3) (cut by the budget), (7, 0).
func TestEstimatedTau(t *testing.T) {
	st := Stats{BlockSizes: map[int]int{}, DraftTries: make([]int, 7), DraftHits: make([]int, 7)}
	for _, c := range [][2]int{{7, 2}, {7, 7}, {3, 3}, {7, 0}} {
		countDrafts(&st, c[0], c[1])
	}
	wantTries := []int{4, 3, 3, 1, 1, 1, 1}
	wantHits := []int{3, 3, 2, 1, 1, 1, 1}
	if fmt.Sprint(st.DraftTries) != fmt.Sprint(wantTries) || fmt.Sprint(st.DraftHits) != fmt.Sprint(wantHits) {
		t.Fatalf("tries %v hits %v, want %v %v", st.DraftTries, st.DraftHits, wantTries, wantHits)
	}
	if st.BlockSizes[8] != 3 || st.BlockSizes[4] != 1 {
		t.Errorf("block sizes %v", st.BlockSizes)
	}
	for _, c := range []struct {
		b    int
		want float64
	}{
		{1, 1}, {2, 1 + 0.75}, {3, 1 + 0.75 + 0.75}, {4, 1 + 0.75 + 0.75 + 0.5}, {8, 1 + 0.75 + 0.75 + 0.5*5}, {16, 1 + 0.75 + 0.75 + 0.5*5},
	} {
		if got := EstimatedTau(st, c.b); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("EstimatedTau(%d) = %g, want %g", c.b, got, c.want)
		}
	}
	if EstimatedTau(Stats{}, 8) != 0 {
		t.Error("a τ from no counts")
	}
}
