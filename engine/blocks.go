package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// BlockCosts are the measured costs of one DFlash cycle per block size B (the staged
// token and B−1 drafts): the drafter's proposal, the target's tentative verify of B rows
// and the rollback that keeps one of them, built and evaluated on their own.
type BlockCosts struct {
	Sizes []int     `json:"sizes"`        // ascending
	MS    []float64 `json:"cycle_ms"`     // median milliseconds per cycle at Sizes[i]
	Probe int       `json:"probe_tokens"` // context the cycles ran after
}

// AdaptiveBlockFor resolves settings.Loop.AdaptiveBlock for a target: Auto adapts on
// MoE targets, whose verify cost grows with the block.
func AdaptiveBlockFor(sw settings.Switch, a model.Arch) bool {
	switch sw {
	case settings.On:
		return true
	case settings.Off:
		return false
	}
	return a.Experts > 0
}

// ProbeBlockSizes are the block sizes MeasureBlockCosts times by default (those up to the
// drafter's block).
var ProbeBlockSizes = []int{2, 3, 4, 6, 8, 10, 12, 16}

// MeasureBlockCosts times a DFlash cycle for each block size in sizes (capped at the
// proposer's block) after prefilling prompt: repeats timed cycles per size after one
// untimed, reported as the median. The drafts and their verdicts are discarded; each
// cycle keeps one row, as a cycle that accepts nothing does, so the context grows by one
// per cycle as in decoding. It runs on the MLX thread.
func (e *Engine) MeasureBlockCosts(ctx context.Context, prompt []int32, sizes []int, repeats int) (BlockCosts, error) {
	p := e.Proposer
	if p == nil {
		return BlockCosts{}, fmt.Errorf("block costs: no drafter")
	}
	if len(prompt) < 2 {
		return BlockCosts{}, fmt.Errorf("block costs: the probe prompt needs at least 2 tokens, got %d", len(prompt))
	}
	var bc BlockCosts
	for _, B := range sizes {
		if B >= 2 && B <= p.BlockSize() && !slices.Contains(bc.Sizes, B) {
			bc.Sizes = append(bc.Sizes, B)
		}
	}
	slices.Sort(bc.Sizes)
	if len(bc.Sizes) == 0 {
		return BlockCosts{}, fmt.Errorf("block costs: no size in %v fits the drafter's block %d", sizes, p.BlockSize())
	}
	bc.Probe = len(prompt)
	repeats = max(repeats, 1)
	var err error
	cerr := mlxc.Catch(func() {
		c := e.Target.NewCache()
		defer c.Free()
		c.Reserve(len(prompt) + len(bc.Sizes)*(repeats+1) + p.BlockSize())
		p.Begin()
		defer p.End()
		if err = e.prefill(ctx, prompt, c, p); err != nil {
			return
		}
		taps := p.TapLayers()
		staged := prompt[len(prompt)-1]
		var ctxRows *mlxc.Array
		defer func() { ctxRows.Free() }()
		step := func(B int) time.Duration {
			s := mlxc.NewScope()
			defer s.Close()
			t := time.Now()
			prop := p.Propose(staged, c.Offset(), ctxRows, B-1, sample.Params{}, nil)
			c.Speculate()
			ids := mlxc.Concatenate([]*mlxc.Array{mlxc.FromSlice([]int32{staged}, 1, 1), mlxc.Reshape(prop.Tokens, 1, B-1)}, 1)
			out := e.Target.Forward(ids, c, model.ForwardOptions{Taps: taps, Logits: model.LogitsAll, KeyBucket: e.KeyBucket, RowwiseAttention: e.RowwiseVerify})
			next := mlxc.Argmax(out.Logits, -1, false)
			mlxc.Eval(append(c.Arrays(), next, out.Hidden)...)
			if err = c.Commit(cache.Prefix(1)); err != nil {
				return 0
			}
			rows := mlxc.SliceAxis(out.Hidden, 1, 0, 1).Detach()
			mlxc.Eval(append(c.Arrays(), rows)...)
			ctxRows.Free()
			ctxRows = rows
			return time.Since(t)
		}
		// The last prompt token runs alone first, like the loops' first step, so that
		// every probed cycle has context rows to hand the drafter.
		s := mlxc.NewScope()
		out := e.Target.Forward(mlxc.FromSlice([]int32{staged}, 1, 1), c, model.ForwardOptions{Taps: taps, Logits: model.LogitsLast})
		ctxRows = out.Hidden.Detach()
		mlxc.Eval(append(c.Arrays(), ctxRows)...)
		s.Close()
		for _, B := range bc.Sizes {
			var times []float64
			for r := 0; r <= repeats && err == nil; r++ {
				if err = ctx.Err(); err != nil {
					return
				}
				d := step(B)
				if r > 0 {
					times = append(times, float64(d.Microseconds())/1000)
				}
			}
			if err != nil {
				return
			}
			slices.Sort(times)
			bc.MS = append(bc.MS, times[len(times)/2])
		}
	})
	if cerr != nil {
		return BlockCosts{}, cerr
	}
	if err != nil {
		return BlockCosts{}, fmt.Errorf("block costs: %w", err)
	}
	return bc, nil
}

// blockPolicy picks each cycle's block size from the acceptance seen so far and the
// measured cost of a cycle per size: the size whose expected tokens per cycle over its
// cost is largest. Where verify costs about the same for any block (a dense model on a
// GPU) that is the largest block; where it grows with the block (a MoE target, whose
// verify reads more experts per extra row, or a CPU) a smaller block can win when the
// far drafts are rarely accepted. Which block a cycle uses never changes what is
// committed, only how fast: the verdict of each draft is the same.
type blockPolicy struct {
	sizes []int     // candidate sizes, ascending; the last is the largest allowed
	ms    []float64 // cost of a cycle at sizes[i]
	// tries[i] and hits[i] (decayed) count the cycles that drafted position i+1 with
	// every draft before it accepted, and those of them that accepted it too.
	tries, hits []float64
	observed    int
}

const (
	// policyDecay weighs older cycles down (per cycle): acceptance drifts with the text.
	policyDecay = 0.97
	// policyWarmup cycles draft the largest block before the policy chooses, and every
	// policyExplore-th cycle after that does, so that the far positions' acceptance stays
	// measured while smaller blocks are chosen.
	policyWarmup  = 4
	policyExplore = 8
	policyPrior   = 0.1
)

// newBlockPolicy makes the policy for blocks up to maxB from costs (nil: no policy, the
// fixed block). Sizes above maxB are dropped; maxB's cost is interpolated when it was
// not measured.
func newBlockPolicy(costs *BlockCosts, maxB int) *blockPolicy {
	if costs == nil || maxB < 3 || len(costs.Sizes) == 0 || len(costs.Sizes) != len(costs.MS) {
		return nil
	}
	p := &blockPolicy{tries: make([]float64, maxB-1), hits: make([]float64, maxB-1)}
	for i, B := range costs.Sizes {
		if B < maxB {
			p.sizes, p.ms = append(p.sizes, B), append(p.ms, costs.MS[i])
		}
	}
	p.sizes, p.ms = append(p.sizes, maxB), append(p.ms, costAt(costs, maxB))
	// A larger block never costs less than a smaller one: measured costs that say so are
	// noise (flat costs, as a host-bound cycle has, measure a few percent up and down), and
	// taken literally they would make a middle size look cheap. Each cost is raised to the
	// largest before it.
	for i := 1; i < len(p.ms); i++ {
		p.ms[i] = max(p.ms[i], p.ms[i-1])
	}
	return p
}

// costAt is the measured cost at B, linearly interpolated (or extended flat) between
// measured sizes.
func costAt(c *BlockCosts, B int) float64 {
	for i, s := range c.Sizes {
		switch {
		case s == B:
			return c.MS[i]
		case s > B && i == 0:
			return c.MS[0]
		case s > B:
			lo, hi := c.Sizes[i-1], s
			f := float64(B-lo) / float64(hi-lo)
			return c.MS[i-1] + f*(c.MS[i]-c.MS[i-1])
		}
	}
	return c.MS[len(c.MS)-1]
}

// size is the block for the next cycle; nil policy: maxB (the caller's fixed block).
func (p *blockPolicy) size(maxB int) int {
	if p == nil {
		return maxB
	}
	if p.observed < policyWarmup || p.observed%policyExplore == 0 {
		return p.sizes[len(p.sizes)-1]
	}
	best, bestRate := p.sizes[len(p.sizes)-1], -1.0
	for j, B := range p.sizes {
		if rate := p.expected(B) / p.ms[j]; rate > bestRate {
			best, bestRate = B, rate
		}
	}
	return best
}

// expected is the estimated tokens a cycle of block B commits: 1 + Σ P(the first i
// drafts are accepted), each position's acceptance given the ones before estimated as
// hits over tries with a weak even prior (policyPrior of a hit in twice as many tries):
// an unmeasured position counts as even, a measured one as what was seen. A strong prior
// would pull high rates down and, multiplied over a block, undervalue large blocks.
func (p *blockPolicy) expected(B int) float64 {
	e, surv := 1.0, 1.0
	for i := 0; i < B-1; i++ {
		surv *= (p.hits[i] + policyPrior) / (p.tries[i] + 2*policyPrior)
		e += surv
	}
	return e
}

// observe records a cycle that drafted n tokens and accepted the first a.
func (p *blockPolicy) observe(n, a int) {
	if p == nil {
		return
	}
	p.observed++
	for i := range p.tries {
		p.tries[i] *= policyDecay
		p.hits[i] *= policyDecay
	}
	countPositions(p.tries, p.hits, n, a)
}

// countPositions adds a cycle that drafted n tokens and accepted the first a to
// per-position counts: position i+1 was tried when every draft before it was accepted
// (i ≤ a, i < n) and hit when it was accepted too (i < a).
func countPositions[T int | float64](tries, hits []T, n, a int) {
	for i := 0; i < min(n, a+1, len(tries)); i++ {
		tries[i]++
		if i < a {
			hits[i]++
		}
	}
}

// countDrafts records a cycle that drafted n tokens and accepted the first a in st's
// per-position counts.
func countDrafts(st *Stats, n, a int) {
	st.BlockSizes[n+1]++
	countPositions(st.DraftTries, st.DraftHits, n, a)
}

// newDFlashStats are the statistics a DFlash loop starts from, for blocks up to B.
func newDFlashStats(runAhead bool, promptTokens, B int) Stats {
	return Stats{Mode: "dflash", RunAhead: runAhead, PromptTokens: promptTokens, AcceptHist: make([]int, B),
		BlockSizes: map[int]int{}, DraftTries: make([]int, B-1), DraftHits: make([]int, B-1)}
}

// EstimatedTau is the tokens per cycle a fixed block of b would commit, from st's
// per-position acceptance: 1 + Σ over the first b−1 positions of the chance that they
// and all before them are accepted. Positions never tried count as never accepted. It
// is 0 when st has no counts.
func EstimatedTau(st Stats, b int) float64 {
	if len(st.DraftTries) == 0 || st.DraftTries[0] == 0 {
		return 0
	}
	tau, surv := 1.0, 1.0
	for i := 0; i < min(b-1, len(st.DraftTries)); i++ {
		if st.DraftTries[i] == 0 {
			break
		}
		surv *= float64(st.DraftHits[i]) / float64(st.DraftTries[i])
		tau += surv
	}
	return tau
}
