package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// The policy's estimate and choice, against hand-computed values.
func TestBlockPolicyChooses(t *testing.T) {
	flat := &BlockCosts{Sizes: []int{2, 4, 8, 16}, MS: []float64{10, 10, 10, 10}}
	// Cost 5 + B ms: a 16-block costs 2.1× a 2-block.
	steep := &BlockCosts{Sizes: []int{2, 4, 8, 16}, MS: []float64{7, 9, 13, 21}}
	cases := []struct {
		name  string
		costs *BlockCosts
		hit   float64 // every draft's acceptance given the ones before
		want  int
	}{
		{"flat costs take the largest block even at low acceptance", flat, 0.2, 16},
		{"flat costs, high acceptance", flat, 0.95, 16},
		// At 0.2 the expected tokens are 1.2 at B=2, 1.25 at B=16: the cheapest wins.
		{"steep costs, low acceptance", steep, 0.2, 2},
		// At 0.95 a 16-block commits 1+Σ0.95^i ≈ 11.3 for 21 ms, a 8-block 6.6 for 13.
		{"steep costs, high acceptance", steep, 0.95, 16},
		// At 0.7: B=4 commits 2.53 for 9 ms (0.281/ms), B=8 3.12 for 13 (0.240/ms).
		{"steep costs, middle acceptance", steep, 0.7, 4},
		// Flat costs measured with noise (the H200's 35B-A3B cycle): the dip at 4 is
		// raised to the cost before it, and the largest block wins.
		{"noisy flat costs", &BlockCosts{Sizes: []int{2, 4, 8, 12, 16}, MS: []float64{28.9, 24.4, 31.6, 32.0, 31.97}}, 0.92, 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newBlockPolicy(c.costs, 16)
			// Many cycles drafting 15 with exact per-position rates (fractional counts).
			for k := 0; k < 400; k++ {
				p.observed++
				for i := range p.tries {
					p.tries[i] = p.tries[i]*policyDecay + math.Pow(c.hit, float64(i))
					p.hits[i] = p.hits[i]*policyDecay + math.Pow(c.hit, float64(i+1))
				}
			}
			p.observed = policyExplore*10 + 1 // not an exploring cycle
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
	// Warm-up cycles and every explore-th one draft the largest block.
	for i := 0; i < policyWarmup; i++ {
		if got := p.size(8); got != 8 {
			t.Fatalf("warm-up cycle %d: size %d", i, got)
		}
		p.observe(7, 2) // accepted 2 of 7: positions 1, 2 hit, 3 tried and missed
	}
	// After 4 identical cycles: tries = hits for positions 1–2 = Σ decay^k, k<4; position
	// 3 tried as often, never hit; positions beyond never tried.
	sum := (1 - math.Pow(policyDecay, 4)) / (1 - policyDecay)
	want := []struct{ tries, hits float64 }{{sum, sum}, {sum, sum}, {sum, 0}, {0, 0}}
	for i, w := range want {
		if math.Abs(p.tries[i]-w.tries) > 1e-9 || math.Abs(p.hits[i]-w.hits) > 1e-9 {
			t.Errorf("position %d: tries %.4f hits %.4f, want %.4f %.4f", i+1, p.tries[i], p.hits[i], w.tries, w.hits)
		}
	}
	h := (sum + policyPrior) / (sum + 2*policyPrior)
	m := policyPrior / (sum + 2*policyPrior)
	if got, want := p.expected(4), 1+h+h*h+h*h*m; math.Abs(got-want) > 1e-12 {
		t.Errorf("expected(4) = %.6f, want %.6f", got, want)
	}
	if newBlockPolicy(nil, 16) != nil || newBlockPolicy(&BlockCosts{Sizes: []int{2}, MS: []float64{1}}, 2) != nil {
		t.Error("a policy without costs or with a 2-block limit")
	}
}

// With an adaptive block DFlash still emits plain decoding's tokens in both loops, and
// costs that make small blocks pay make the loops use them.
func TestAdaptiveBlockEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	steep := &BlockCosts{Sizes: []int{2, 4, 8, 16}, MS: []float64{3, 5, 9, 17}}
	for _, name := range []string{"qwen3_moe-bf16", "qwen3_5_moe-bf16"} {
		p := moePairs(t)[name]
		for pi, prompt := range prompts(p.vocab)[:2] {
			want := plainGreedy(t, p, prompt, 40)
			for _, ahead := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/p%d/ahead%v", name, pi, ahead), func(t *testing.T) {
					e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: ahead, BlockCosts: steep}
					res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: 40, IgnoreEOS: true})
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
				})
			}
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
	if fmt.Sprint(bc.Sizes) != "[2 4 16]" || len(bc.MS) != 3 {
		t.Fatalf("sizes %v costs %v, want [2 4 16] (40 and 1 dropped, 4 once)", bc.Sizes, bc.MS)
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
