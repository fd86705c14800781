package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// BlockCosts are the measured costs of one DFlash cycle per block size B (the staged
// token and B−1 drafts): the drafter's proposal, the target's tentative verify of B rows
// and the rollback that keeps one of them, built and evaluated on their own. Block 1 is a
// one-token step as the serial loop runs it when no block pays: pipelined like plain
// decoding, the drafter's context rows kept for its next draft.
type BlockCosts struct {
	Sizes []int     `json:"sizes"`        // ascending
	MS    []float64 `json:"cycle_ms"`     // fastest milliseconds per cycle at Sizes[i]
	Probe int       `json:"probe_tokens"` // context the cycles ran after
}

// AdaptiveBlockFor resolves settings.Loop.AdaptiveBlock: Auto adapts, for every target,
// drafter and backend. The block that pays depends on how a verify's cost grows with its
// rows (flat on a GPU for a dense model; steeper for a MoE target, which reads more
// experts per row; several one-token steps for 16 rows on a CPU or for Apple's 4-bit
// products), which only a measurement tells.
func AdaptiveBlockFor(sw settings.Switch) bool {
	return sw != settings.Off
}

// ProbeBlockSizes are the block sizes MeasureBlockCosts times by default (those up to the
// drafter's block); 1 is the one-token step.
var ProbeBlockSizes = []int{1, 2, 3, 4, 6, 8, 12, 16}

// oneTokenProbeSteps are the pipelined one-token steps one timing of block 1 runs: a
// step's cost is what it adds while the one before it is still running.
const oneTokenProbeSteps = 4

// MeasureBlockCosts times a DFlash cycle for each block size in sizes (capped at the
// proposer's block) after prefilling prompt: repeats timed rounds over all sizes after one
// untimed, each size reported as its fastest: interference (other work on a shared host, a
// collection) only ever adds time, and one slow timing of the one-token step would make
// every draft look cheap. The drafts and their verdicts are discarded; each
// cycle keeps one row, as a cycle that accepts nothing does, so the context grows by one
// per cycle as in decoding. Block 1 times oneTokenProbeSteps pipelined one-token steps
// (per step). It runs on the MLX thread.
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
		if B >= 1 && B <= p.BlockSize() && !slices.Contains(bc.Sizes, B) {
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
		c.Reserve(len(prompt) + (len(bc.Sizes)+oneTokenProbeSteps)*(repeats+1) + p.BlockSize())
		p.Begin()
		defer p.End()
		if err = e.prefill(ctx, prompt, c, p); err != nil {
			return
		}
		taps := p.TapLayers()
		staged := prompt[len(prompt)-1]
		if tc, ok := p.(verify.TokenContext); ok {
			// Past the prompt the probe's positions hold tokens it does not keep; the
			// staged one stands for them (only the cycles' costs are kept).
			tc.SetTokens(func(q int) (int32, bool) {
				if q >= 0 && q < len(prompt) {
					return prompt[q], true
				}
				return staged, true
			})
		}
		// pending are the context rows the drafter takes at its next proposal (detached).
		var pending []*mlxc.Array
		defer func() { freeAll(pending) }()
		takeRows := func() *mlxc.Array {
			if len(pending) == 0 {
				return nil
			}
			rows := mlxc.Concatenate(pending, 1)
			freeAll(pending)
			pending = nil
			return rows
		}
		step := func(B int) time.Duration {
			s := mlxc.NewScope()
			defer s.Close()
			t := time.Now()
			prop := p.Propose(staged, c.Offset(), takeRows(), B-1, sample.Params{}, nil)
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
			pending = append(pending, rows)
			return time.Since(t)
		}
		// oneToken starts a one-token step after the lazy token in [1]: its greedy token
		// [1] and its tapped row, detached.
		oneToken := func(in *mlxc.Array) (tok, row *mlxc.Array) {
			s := mlxc.NewScope()
			defer s.Close()
			out := e.Target.Forward(mlxc.Reshape(in, 1, 1), c, model.ForwardOptions{Taps: taps, Logits: model.LogitsLast})
			tok = mlxc.Reshape(mlxc.AsType(mlxc.Argmax(out.Logits, -1, false), mlxc.Int32), 1).Detach()
			row = out.Hidden.Detach()
			mlxc.AsyncEval(tok, row)
			return tok, row
		}
		// steps runs oneTokenProbeSteps pipelined one-token steps (each built from the lazy
		// token before the one before it is read) and returns the time per step.
		steps := func() time.Duration {
			t := time.Now()
			in := mlxc.FromSlice([]int32{staged}, 1)
			tok, row := oneToken(in)
			in.Free()
			for i := 1; i <= oneTokenProbeSteps; i++ {
				var nextTok, nextRow *mlxc.Array
				if i < oneTokenProbeSteps {
					nextTok, nextRow = oneToken(tok)
				}
				staged = mlxc.ToSlice[int32](tok)[0]
				tok.Free()
				pending = append(pending, row)
				tok, row = nextTok, nextRow
			}
			return time.Since(t) / oneTokenProbeSteps
		}
		// The last prompt token runs alone first, like the loops' first step, so that
		// every probed cycle has context rows to hand the drafter.
		s := mlxc.NewScope()
		out := e.Target.Forward(mlxc.FromSlice([]int32{staged}, 1, 1), c, model.ForwardOptions{Taps: taps, Logits: model.LogitsLast})
		first := out.Hidden.Detach()
		mlxc.Eval(append(c.Arrays(), first)...)
		pending = append(pending, first)
		s.Close()
		// Round by round, every size in each: a stretch of interference on a shared host, or
		// the first cycles after the prefill, then spread over all sizes instead of landing
		// on one. Round 0 is untimed (a size's first cycle builds its kernels and buffers).
		// After a timed round, a block whose cycle costs at least B one-token steps is timed
		// no more: it commits at most B tokens, so no acceptance makes it pay, and such
		// cycles are the long ones (a 4-bit 16-row verify on a CPU: 20 steps).
		bc.MS = make([]float64, len(bc.Sizes))
		settled := make([]bool, len(bc.Sizes))
		for r := 0; r <= repeats; r++ {
			for i, B := range bc.Sizes {
				if settled[i] {
					continue
				}
				if err = ctx.Err(); err != nil {
					return
				}
				var d time.Duration
				if B == 1 {
					d = steps()
				} else {
					d = step(B)
				}
				if err != nil {
					return
				}
				if ms := float64(d.Microseconds()) / 1000; r == 1 || (r > 1 && ms < bc.MS[i]) {
					bc.MS[i] = ms
				}
			}
			if r >= 1 && bc.Sizes[0] == 1 {
				for i, B := range bc.Sizes {
					settled[i] = settled[i] || (B > 1 && bc.MS[i] >= float64(B)*bc.MS[0])
				}
			}
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

// freeAll frees every array of as.
func freeAll(as []*mlxc.Array) {
	for _, a := range as {
		a.Free()
	}
}

// blockPolicy picks each cycle's block size from the acceptance seen so far and the
// measured cost of a cycle per size: the size whose expected tokens per cycle over its
// cost is largest. Where verify costs about the same for any block (a dense model on a
// GPU) that is the largest block; where it grows with the block (a MoE target, whose
// verify reads more experts per extra row, or a CPU) a smaller block can win when the
// far drafts are rarely accepted, and where even two rows cost more than the drafts
// they are expected to add (a CPU, whose 16-row verify costs several one-token steps),
// block 1 wins: a one-token step with no drafts, which commits exactly one token. Which
// block a cycle uses never changes what is committed, only how fast: the verdict of each
// draft is the same, and a one-token step is plain decoding's.
//
// A drafter attends across its block both ways, so the drafts of a short block are not
// the first drafts of a long one: the acceptance of each size is counted apart (the
// cycles that drafted that size), and the counts pooled over all sizes stand in for a
// size's own until it has a few cycles of them.
type blockPolicy struct {
	sizes []int     // candidate sizes, ascending; 1 (a one-token step) when measured; the last is the largest allowed
	ms    []float64 // cost of a cycle at sizes[i]
	// tries[i] and hits[i] count the cycles that drafted position i+1 with every draft
	// before it accepted, and those of them that accepted it too, pooled over all sizes;
	// sizeTries[j] and sizeHits[j] the same for the cycles that drafted sizes[j]. A count
	// decays each time its position is tried again (acceptance drifts with the text), not
	// while other positions or one-token steps run, so a rarely drafted position keeps
	// what was last seen of it.
	tries, hits         []float64
	sizeTries, sizeHits [][]float64
	// spent is the cost (measured, per size) of every cycle so far, explored what the
	// cycles that drafted another size than the best because exploring was due lost
	// against the best (exploreLoss).
	spent, explored float64
	observed        int
}

const (
	// policyDecay weighs older tries of a position down: acceptance drifts with the text.
	policyDecay = 0.97
	// policyExploreShare is the share of the cycles' cost that exploring may lose: when
	// what the cycles that explored (blockPolicy.explore), the next one included, lost
	// against the best size (exploreLoss) is no more than this share of all cycles' cost,
	// the next one explores, so that the acceptance past the chosen size stays measured
	// while smaller blocks (or one-token steps) are chosen. The share bounds what exploring
	// costs where it does not pay; where a wide verify costs little more than a one-token
	// step (a GPU), an exploring cycle loses little and exploring is frequent.
	policyExploreShare = 1.0 / 32
	policyPrior        = 0.1
	// policySizeWeight is how many cycles of the pooled counts a size's own counts are
	// blended with: a size seen in a few cycles leans on the pooled estimate, one seen in
	// many on its own.
	policySizeWeight = 8.0
	// policyTie is the relative difference in expected tokens per millisecond below which
	// two sizes count as tied (blockPolicy.best).
	policyTie = 0.02
	// policyStepMargin is how much more a drafting size's expected tokens per millisecond
	// must be than a one-token step's for the policy to draft (blockPolicy.best).
	policyStepMargin = 0.05
)

// newBlockPolicy makes the policy for blocks up to maxB from costs (nil: no policy, the
// fixed block). Sizes above maxB are dropped; maxB's cost is interpolated when it was
// not measured.
func newBlockPolicy(costs *BlockCosts, maxB int) *blockPolicy {
	if costs == nil || maxB < 2 || len(costs.Sizes) == 0 || len(costs.Sizes) != len(costs.MS) {
		return nil
	}
	p := &blockPolicy{tries: make([]float64, maxB-1), hits: make([]float64, maxB-1)}
	for i, B := range costs.Sizes {
		if B >= 1 && B < maxB {
			p.sizes, p.ms = append(p.sizes, B), append(p.ms, costs.MS[i])
		}
	}
	p.sizes, p.ms = append(p.sizes, maxB), append(p.ms, costAt(costs, maxB))
	// A smaller block never costs more than a larger one: measured costs that say so are
	// noise, and a host's noise adds time (flat costs, as a host-bound cycle has, measure
	// a few percent up and down; one size's cycles met a stall). Each cost is lowered to
	// the smallest after it. Raising the larger ones instead let one slow size price every
	// larger block out (a 27B hybrid on a GPU: block 2 timed at 60 ms, blocks 3–8 at 41–43,
	// all taken as 60, and a fresh request ran one-token steps for its first 20 cycles).
	for i := len(p.ms) - 2; i >= 0; i-- {
		p.ms[i] = min(p.ms[i], p.ms[i+1])
	}
	for _, B := range p.sizes {
		p.sizeTries = append(p.sizeTries, make([]float64, B-1))
		p.sizeHits = append(p.sizeHits, make([]float64, B-1))
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

// size is the block for the next cycle; nil policy: maxB (the caller's fixed block). It
// depends only on what was observed, so asking twice before the next observe gives the
// same size.
func (p *blockPolicy) size(maxB int) int {
	if p == nil {
		return maxB
	}
	best := p.best()
	if p.exploring() {
		return p.explore(best)
	}
	return best
}

// explore is the size an exploring cycle drafts: the one whose rate is the highest with
// each position's acceptance taken optimistically (estimate's optimistic form: the size
// a measurement can gain the most from; the largest where costs are flat), or, when that
// is the best size already, the next larger one, so that the positions just past the
// best get measured and stay measured as the text changes. Where a wide verify costs many
// one-token steps (a CPU) exploring thus climbs from the narrow sizes, each measured
// before a wider one looks worth its cost, instead of paying for the widest first.
//
// A block whose cycle costs at least B one-token steps is never explored: it commits at
// most B tokens, so no acceptance makes it pay.
func (p *blockPolicy) explore(best int) int {
	target, top := best, -1.0
	for j, B := range p.sizes {
		if rate := p.estimate(B, true) / p.ms[j]; rate > top && p.canPay(j) {
			target, top = B, rate
		}
	}
	if target != best {
		return target
	}
	for j, B := range p.sizes {
		if B > best && p.canPay(j) {
			return B
		}
	}
	return best
}

// canPay reports whether sizes[j] could ever beat a one-token step: its cycle costs less
// than sizes[j] steps (or no step was measured).
func (p *blockPolicy) canPay(j int) bool {
	return p.sizes[0] != 1 || p.ms[j] < float64(p.sizes[j])*p.ms[0]
}

// best is the size with the most expected tokens per millisecond, or the largest whose
// rate is within policyTie of that: sizes estimated from their own cycles and sizes
// estimated from the pooled counts differ by a percent or so where they should tie (flat
// costs), and on a near tie the larger block is worth more, as it measures more
// positions. A drafting size must beat the one-token step (when measured) by
// policyStepMargin: the measured costs are noisy by a few percent on a busy host, and a
// draft that gains less than that risks running slower than plain decoding.
func (p *blockPolicy) best() int {
	rates := make([]float64, len(p.sizes))
	first := 0 // the first drafting size
	if p.sizes[0] == 1 {
		first = 1
	}
	top := 0.0
	for j, B := range p.sizes {
		rates[j] = p.expected(B) / p.ms[j]
		if j >= first {
			top = max(top, rates[j])
		}
	}
	if first == 1 && rates[0]*(1+policyStepMargin) >= top {
		return 1
	}
	for j := len(p.sizes) - 1; j > first; j-- {
		if rates[j] >= top*(1-policyTie) {
			return p.sizes[j]
		}
	}
	return p.sizes[first]
}

// exploring reports whether the next cycle explores (blockPolicy.explore) to keep
// positions beyond the best size measured: whenever exploring, this cycle included, costs
// no more than policyExploreShare of all cycles so far. Paid for before it runs, so a
// short request where no draft pays loses at most that share to exploring, and the first
// cycles take the best size under the prior (one-token steps where a verify's cost grows
// steeply, the largest block where it is flat).
func (p *blockPolicy) exploring() bool {
	best := p.best()
	target := p.explore(best)
	return target != best && p.explored+p.exploreLoss(target, best) <= policyExploreShare*p.spent
}

// exploreLoss is what a cycle of block B is expected to lose against one of the best
// size: its cost less the time the best size takes, at its expected rate, to commit the
// tokens B is expected to commit. A one-token step is never skipped by exploring (every
// cycle commits at least one token), so on a CPU, where a wide verify costs many steps,
// an exploring cycle loses nearly all its cost; on a GPU, where it costs one or two
// steps, it loses a fraction of one, and a few early rejections cannot keep the policy
// at one-token steps for long. The loss is at least policyTie of B's cost: measured
// estimates are that noisy.
func (p *blockPolicy) exploreLoss(B, best int) float64 {
	cost := p.costOf(B)
	perToken := p.costOf(best) / p.expected(best)
	return max(cost-p.expected(B)*perToken, policyTie*cost)
}

// oneTokenSteps is how many one-token steps may run before a cycle has to look at the
// policy again (≥ 1): none of them observes a draft, so the policy's choice stays block 1
// until exploring is due.
func (p *blockPolicy) oneTokenSteps() int {
	if p == nil || p.sizes[0] != 1 || p.exploring() {
		return 1
	}
	target := p.explore(1)
	if target == 1 {
		return math.MaxInt32 // nothing could pay: steps until the request ends
	}
	due := (p.explored+p.exploreLoss(target, 1))/policyExploreShare - p.spent
	return max(1, int(math.Ceil(due/p.ms[0])))
}

// expected is the estimated tokens a cycle of block B commits: 1 + Σ P(the first i
// drafts are accepted), each position's acceptance given the ones before estimated as
// hits over tries with a weak even prior (policyPrior of a hit in twice as many tries):
// an unmeasured position counts as even, a measured one as what was seen. A strong prior
// would pull high rates down and, multiplied over a block, undervalue large blocks. B's
// own counts, where it has any, are blended with the pooled estimate (policySizeWeight).
// A one-token step (B = 1) commits exactly one token.
func (p *blockPolicy) expected(B int) float64 { return p.estimate(B, false) }

// estimate is expected(B), or with optimistic set the same with each position's
// acceptance raised to at least Laplace's (hits+1)/(tries+2): even for a position never
// tried, a third after one miss, so that one unlucky try does not keep a size from being
// measured again.
func (p *blockPolicy) estimate(B int, optimistic bool) float64 {
	j := slices.Index(p.sizes, B)
	e, surv := 1.0, 1.0
	for i := 0; i < B-1 && i < len(p.tries); i++ {
		rate := (p.hits[i] + policyPrior) / (p.tries[i] + 2*policyPrior)
		if j >= 0 {
			rate = (p.sizeHits[j][i] + policySizeWeight*rate) / (p.sizeTries[j][i] + policySizeWeight)
		}
		if optimistic {
			rate = max(rate, (p.hits[i]+1)/(p.tries[i]+2))
		}
		surv *= rate
		e += surv
	}
	return e
}

// expectedWith is expected(B) with the row's own counts blended with the acceptance
// pooled over all rows (policySizeWeight cycles of it) instead of the even prior: in a
// batch, a row that has not drafted yet (or not lately) is expected to do as the others
// do.
func (p *blockPolicy) expectedWith(B int, pool *acceptPool) float64 {
	e, surv := 1.0, 1.0
	for i := 0; i < B-1 && i < len(p.tries); i++ {
		rate := (p.hits[i] + policySizeWeight*pool.rate(i)) / (p.tries[i] + policySizeWeight)
		surv *= rate
		e += surv
	}
	return e
}

// observe records a cycle that drafted n tokens and accepted the first a (n = 0: a
// one-token step).
func (p *blockPolicy) observe(n, a int) {
	if p == nil {
		return
	}
	if best := p.best(); p.exploring() && n+1 != best {
		p.explored += p.exploreLoss(n+1, best)
	}
	p.spent += p.costOf(n + 1)
	p.observed++
	decayPositions(p.tries, p.hits, n, a)
	if j := slices.Index(p.sizes, n+1); j >= 0 {
		decayPositions(p.sizeTries[j], p.sizeHits[j], n, a)
	}
}

// costOf is the cost of a cycle of block B: a candidate's, else (a block cut by the
// token budget) the next candidate's above it.
func (p *blockPolicy) costOf(B int) float64 {
	for j, s := range p.sizes {
		if s >= B {
			return p.ms[j]
		}
	}
	return p.ms[len(p.ms)-1]
}

// decayPositions adds a cycle that drafted n tokens and accepted the first a to decayed
// per-position counts: each position tried (every draft before it accepted) first
// decays its counts, then counts the try and, when accepted, the hit.
func decayPositions(tries, hits []float64, n, a int) {
	for i := 0; i < min(n, a+1, len(tries)); i++ {
		tries[i] = tries[i]*policyDecay + 1
		hits[i] *= policyDecay
		if i < a {
			hits[i]++
		}
	}
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
