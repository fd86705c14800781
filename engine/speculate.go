package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// Speculation in the decoder. A sequence with a drafter (drafting) takes steps of its own
// width w: its staged token and w−1 drafts, verified with every other row's block in one
// tentative forward; it keeps the staged token and its accepted drafts (per row: KV rows
// counted, recurrent layers replayed) and commits them and the target's next token. A
// width of 1 is a plain step: no draft, one token, the tapped row kept for the drafter's
// next context. All rows that draft in a step draft in one proposer call
// (verify.ProposeRows: one drafter forward), and all verdicts come back in one
// evaluation. The widths come from plan: each row's own acceptance and the measured cost
// of the batch's forward (stepCosts).

// drafting is a sequence's drafter state.
type drafting struct {
	// p is the sequence's own proposer (a fork of the engine's: its own context).
	p verify.Proposer
	// maxW is the largest block (staged token + drafts) the sequence verifies.
	maxW int
	// policy is the sequence's acceptance per position and its block policy (nil: the
	// block is fixed: every step the largest the budget allows).
	policy *blockPolicy
	// pending are the tapped rows of committed positions the proposer has not taken in
	// yet (detached), in order.
	pending []*mlxc.Array
	begun   bool
}

// forker is a proposer that makes a fresh proposer over the same drafter for each
// sequence (verify.DFlash and DFlash2 keep one sequence's context).
type forker interface{ Fork() verify.Proposer }

// newDrafting makes the drafter state of a request: over the engine's proposer itself
// (one request at a time), or with fork over a proposer of its own (nil when the
// engine's proposer cannot make one: the request then decodes plainly).
func newDrafting(e *Engine, req Request, fork bool) *drafting {
	p := e.Proposer
	if fork {
		f, ok := p.(forker)
		if !ok {
			return nil
		}
		p = f.Fork()
	}
	maxW := blockSize(p, req)
	return &drafting{p: p, maxW: maxW, policy: newBlockPolicy(e.BlockCosts, maxW)}
}

// begin starts the proposer's sequence with room for n context positions.
func (dr *drafting) begin(n int) {
	dr.p.Begin()
	dr.begun = true
	reserveContext(dr.p, n)
}

// takePending joins the pending rows into one context array in the caller's scope (nil:
// none) and frees them.
func (dr *drafting) takePending() *mlxc.Array {
	if len(dr.pending) == 0 {
		return nil
	}
	var ctx *mlxc.Array
	if len(dr.pending) > 1 {
		ctx = mlxc.Concatenate(dr.pending, 1)
	} else {
		ctx = mlxc.Reshape(dr.pending[0], dr.pending[0].Shape()...) // a handle of the caller's scope
	}
	freeAll(dr.pending)
	dr.pending = nil
	return ctx
}

// keep appends a committed position's tapped rows; past 64 waiting rows they go to the
// proposer as context, so that steps without drafts do not pile them up.
func (dr *drafting) keep(rows *mlxc.Array) {
	dr.pending = append(dr.pending, rows)
	if len(dr.pending) > 64 {
		s := mlxc.NewScope()
		dr.p.Context(dr.takePending())
		s.Close()
	}
}

// release frees the pending rows and ends the proposer's sequence.
func (dr *drafting) release() {
	if dr == nil {
		return
	}
	freeAll(dr.pending)
	dr.pending = nil
	if dr.begun {
		dr.p.End()
		dr.begun = false
	}
}

// stepCosts are the measured costs of the decoder's steps: plain steps by their rows
// (pipelined: a step's cost is the interval between two reads) and speculative steps by
// the tokens they verify (Σ of the rows' widths; drafting, verify and commit, not
// overlapped). Both start from the engine's single-row block costs (Engine.BlockCosts:
// block 1 is a pipelined one-token step, block B a cycle verifying B tokens).
type stepCosts struct {
	plain, spec costTable
	// specOver: the last speculative step took more than costOutlier times its estimate.
	specOver bool
}

// observeSpec adds a speculative step verifying T tokens that took dt. A step over
// costOutlier times its estimate counts as that much (the first step of a shape may build
// kernels for it), unless the step before it was over its estimate too: a stall happens
// once, a cost the estimate misses repeats. So a batch whose speculative steps cost several
// times one row's cycle (an H200's 16-row Qwen3-4B verify: about 60 ms against one row's
// 6 ms cycle, and a 14 ms plain 16-row step) learns it in two steps instead of a dozen, and
// a short request no longer spends most of its steps drafting at a loss (1 to 16 clients
// of 96 tokens each: 439 tok/s batched against 1 131 plain at 16).
func (c *stepCosts) observeSpec(T int, dt time.Duration) {
	c.specOver = c.spec.record(T, dt, c.specOver)
}

// newStepCosts seeds the costs from the single-row block costs (nil: none known).
func newStepCosts(bc *BlockCosts) *stepCosts {
	c := &stepCosts{plain: costTable{}, spec: costTable{}}
	if bc != nil {
		for i, B := range bc.Sizes {
			if B == 1 {
				c.plain[1] = bc.MS[i]
			} else {
				c.spec[B] = bc.MS[i]
			}
		}
	}
	return c
}

// plainAt is the estimated milliseconds of a plain step of R rows: measured, or, with
// only fewer rows measured, no more than R one-row steps nor a speculative step of R
// tokens (which drafts too).
func (c *stepCosts) plainAt(R int) float64 {
	if _, ok := c.plain[R]; ok || len(c.plain) > 1 {
		return c.plain.at(R)
	}
	ms := c.plain.at(R)
	if sp := c.spec.at(R); sp > 0 && (ms == 0 || sp < ms) {
		return sp
	}
	return ms
}

// costTable is a decayed mean of milliseconds per step by its size (rows or tokens).
// Between measured sizes it interpolates; below the smallest it scales it down, past the
// largest it extends the last measured slope.
type costTable map[int]float64

// costOutlier bounds one step's weight in a costTable: a step is counted as at most this
// many times the estimate it is measured against.
const costOutlier = 2.0

// observe adds a step of size n that took dt, counted as at most costOutlier times the
// estimate for n: the first step of a new shape may build kernels for it (a GPU backend
// compiles them on first use), and a pause of the host can stretch any step. Taken in
// full, one such step would price a width so high that the policy never tries it again,
// and so never measures it again; capped, a width whose steps really cost that much gets
// there in a few steps.
func (c costTable) observe(n int, dt time.Duration) { c.record(n, dt, false) }

// record adds a step of size n that took dt as observe does, or, with whole, a step over
// costOutlier times its estimate in full and with half the weight; it reports whether the
// step was over that bound.
func (c costTable) record(n int, dt time.Duration, whole bool) (over bool) {
	ms := float64(dt.Microseconds()) / 1000
	if est := c.at(n); est > 0 && ms > costOutlier*est {
		over = true
		if !whole {
			ms = costOutlier * est
		}
	}
	old, ok := c[n]
	switch {
	case !ok:
		c[n] = ms
	case over && whole:
		c[n] = 0.5*old + 0.5*ms
	default:
		c[n] = 0.8*old + 0.2*ms
	}
	return over
}

// at is the estimated milliseconds of a step of size n (0 when nothing is known).
func (c costTable) at(n int) float64 {
	if ms, ok := c[n]; ok {
		return ms
	}
	keys := make([]int, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return 0
	}
	slices.Sort(keys)
	i, _ := slices.BinarySearch(keys, n)
	switch {
	case i == 0 || len(keys) == 1:
		return c[keys[0]] * float64(n) / float64(keys[0])
	case i < len(keys):
		lo, hi := keys[i-1], keys[i]
		f := float64(n-lo) / float64(hi-lo)
		return c[lo] + f*(c[hi]-c[lo])
	default:
		lo, hi := keys[len(keys)-2], keys[len(keys)-1]
		slope := max((c[hi]-c[lo])/float64(hi-lo), 0)
		return c[hi] + slope*float64(n-hi)
	}
}

// plan chooses each row's width for the next step (rows in row order; 1 for plain
// rows). Alone, a drafting row takes its block policy's size (the single-request
// policy). In a batch, the widths maximise the tokens the step is expected to commit
// (each row's own per-position acceptance) per millisecond of the step's measured cost
// over the tokens it verifies: greedily, each round raising the one row whose larger
// block gains the most rate, until none gains. Where a wider verify costs more than its
// drafts are expected to add (many rows on a compute-bound backend) every row stays at
// width 1, plain batched decoding; as rows leave, wider blocks pay again. A row whose
// policy is exploring takes its exploring size; loss is then what the step is expected to
// lose against the plan without it, in milliseconds (0: no row explores). Widths never
// pass the token budget.
func (d *decoder) plan(rows []*sequence) (w []int, loss float64) {
	w = make([]int, len(rows))
	for r, q := range rows {
		w[r] = 1
		if q.dr != nil && q.built > 0 {
			// A row's first step runs its last prompt token alone, as plain decoding's
			// does (and the run-ahead loop's first cycle): its tapped row is the first
			// draft's context. (built counts that step while it is in flight: planned
			// before it is read, the next step drafts.)
			w[r] = max(min(q.dr.maxW, q.req.MaxTokens-q.built), 1)
		}
	}
	drafting := 0
	for _, q := range rows {
		if q.dr != nil {
			drafting++
		}
	}
	if drafting == 0 {
		return w, 0
	}
	if len(rows) == 1 {
		if q := rows[0]; w[0] > 1 {
			w[0] = min(q.dr.policy.size(q.dr.maxW), w[0])
		}
		return w, 0 // the block policy explores on its own
	}
	if slices.ContainsFunc(rows, func(q *sequence) bool { return q.dr != nil && q.dr.policy == nil }) {
		return w, 0 // fixed blocks (no costs measured): every drafting row its largest block
	}
	cap := w
	w = make([]int, len(rows))
	T := 0
	for r := range w {
		w[r] = 1
		T++
	}
	expected := func(q *sequence, B int) float64 {
		if q.dr == nil || B == 1 {
			return 1
		}
		return q.dr.policy.expectedWith(B, &d.pool)
	}
	total := 0.0
	for r, q := range rows {
		total += expected(q, w[r])
	}
	rate := func(tokens float64, T int) float64 {
		ms := d.costs.spec.at(T)
		if T == len(rows) {
			ms = d.costs.plainAt(T) // every row at width 1: a plain step
		}
		if ms <= 0 {
			return tokens // nothing measured: a flat cost, the widest blocks
		}
		return tokens / ms
	}
	for range 4 * len(rows) {
		best, bestRow, bestW := rate(total, T)*(1+policyTie), -1, 0
		for r, q := range rows {
			if q.dr == nil {
				continue
			}
			for _, B := range q.dr.policy.sizes {
				if B = min(B, cap[r]); B <= w[r] { // near its budget, the budget's block
					continue
				}
				gain := total - expected(q, w[r]) + expected(q, B)
				if rt := rate(gain, T-w[r]+B); rt > best {
					best, bestRow, bestW = rt, r, B
				}
			}
		}
		if bestRow < 0 {
			break
		}
		q := rows[bestRow]
		total += expected(q, bestW) - expected(q, w[bestRow])
		T += bestW - w[bestRow]
		w[bestRow] = bestW
	}
	// Raising one row at a time cannot cross a valley: where a step that drafts at all
	// costs much more than a plain one (a GPU's batched verify: synchronous, its fixed cost
	// paid for a few tokens), one wide row loses while every row wide wins. So the step
	// with every drafting row at its own best block is weighed too.
	all, allTotal, allT := make([]int, len(rows)), 0.0, 0
	for r, q := range rows {
		all[r] = 1
		if q.dr != nil {
			all[r] = min(q.dr.policy.best(), cap[r])
		}
		allTotal += expected(q, all[r])
		allT += all[r]
	}
	if allT > T && rate(allTotal, allT) > rate(total, T)*(1+policyTie) {
		w, total, T = all, allTotal, allT
	}
	// Exploring keeps each row's acceptance past its planned width measured: every
	// exploring row in one step, else one of them, and only while what the steps that explored lost against their plans
	// (this one included) is no more than policyExploreShare of all steps' cost. A step's
	// loss is its cost less the time the planned step takes, at its expected rate, to
	// commit what the exploring one is expected to: a wide row makes the whole batch wait
	// for it on a CPU, and costs the batch little on a GPU.
	planned := rate(total, T)
	// Where a speculative step's cost is mostly fixed (a GPU's batched verify), exploring
	// one row pays most of that cost for one row's measurement: every row whose policy
	// explores then explores in the same step, when that step is within the share; the
	// widths xw serve the one-row step too.
	xw, xT, xTotal := exploreAll(rows, w, cap, total, T, expected)
	if xT > T && planned > 0 {
		if ms := d.costs.spec.at(xT); ms > 0 {
			if l := max(ms-xTotal/planned, policyTie*ms); d.explored+l <= policyExploreShare*d.spent {
				return xw, l
			}
		}
	}
	for r, q := range rows {
		x := xw[r]
		if x == w[r] {
			continue
		}
		Tx := T - w[r] + x
		ms := d.costs.spec.at(Tx)
		if ms <= 0 || planned <= 0 {
			break // nothing measured: the plan's widths are the widest already
		}
		gain := total - expected(q, w[r]) + expected(q, x)
		loss = max(ms-gain/planned, policyTie*ms)
		if d.explored+loss > policyExploreShare*d.spent {
			return w, 0
		}
		w[r] = x
		return w, loss
	}
	return w, 0
}

// exploreAll is the plan w with every row whose policy explores at its exploring size
// (capped): the widths, the tokens they verify and what they are expected to commit.
func exploreAll(rows []*sequence, w, cap []int, total float64, T int, expected func(*sequence, int) float64) ([]int, int, float64) {
	xw := slices.Clone(w)
	for r, q := range rows {
		if q.dr == nil || !q.dr.policy.exploring() {
			continue
		}
		if x := min(max(w[r], q.dr.policy.explore(q.dr.policy.best())), cap[r]); x > w[r] {
			total += expected(q, x) - expected(q, w[r])
			T += x - w[r]
			xw[r] = x
		}
	}
	return xw, T, total
}

// blockSize is the DFlash block of a request: the proposer's, capped by the request's,
// at least 1.
func blockSize(p verify.Proposer, req Request) int {
	B := p.BlockSize()
	if req.BlockSize > 0 && req.BlockSize < B {
		B = req.BlockSize
	}
	return max(B, 1)
}

// count adds a step's time to the steps' total, and to the exploring steps' when it
// explored.
func (d *decoder) count(dt time.Duration, loss float64) {
	d.spent += float64(dt.Microseconds()) / 1000
	d.explored += loss
}

// acceptPool is the acceptance per draft position pooled over every row a decoder has
// verified, decayed as a row's own: one drafter serves all rows, so what it does for
// some rows is the best guess for another row until that row has counts of its own
// (blockPolicy.expectedWith). Without it a row would start from the even prior, which in
// a batch of many rows does not pay for a draft, and would learn its acceptance only
// when it explores.
type acceptPool struct{ tries, hits []float64 }

// observe adds a step that drafted n tokens and accepted the first a.
func (p *acceptPool) observe(n, a int) {
	for len(p.tries) < n {
		p.tries, p.hits = append(p.tries, 0), append(p.hits, 0)
	}
	decayPositions(p.tries, p.hits, n, a)
}

// rate is position i's pooled acceptance given the ones before it, with the policy's
// weak even prior.
func (p *acceptPool) rate(i int) float64 {
	if i >= len(p.tries) {
		return 0.5
	}
	return (p.hits[i] + policyPrior) / (p.tries[i] + 2*policyPrior)
}

// draftCandidates is how many of the drafter's most likely tokens a constrained greedy
// row chooses each draft among (settings.Loop.MaskDrafts).
const draftCandidates = 8

// drafted is one row's part of a speculative step.
type drafted struct {
	w      int         // the row's width: staged + drafts
	drafts *mlxc.Array // int32 [w−1] (nil: none)
	// allow are a constrained row's verify masks [w, V] when its drafts were chosen under
	// its grammar (nil: computed along the drafts after the verify is built).
	allow *mlxc.Array
	probs *mlxc.Array // the drafts' distributions (nil: point masses)
	off   int         // the row's first position in the packed step
}

// speculate runs one synchronous step of the rows (the decoder's rows, arranged) with
// the given widths: the drafts of every row wider than 1 in one proposer call, one
// tentative forward of all rows' blocks, the verdicts in one evaluation, then each row's
// commit (its caches keep staged + its accepted drafts), its tokens taken, its drafter's
// next context kept.
func (d *decoder) speculate(rows []*sequence, widths []int, loss float64) error {
	s := mlxc.NewScope()
	defer s.Close()
	t0 := time.Now()
	lens := d.lens()
	parts := make([]drafted, len(rows))
	var calls []verify.RowDraft
	var callRows []int
	maskDrafts := d.e.settings().Loop.MaskDrafts != settings.Off
	for r, q := range rows {
		if widths[r] > 1 {
			call := verify.RowDraft{P: q.dr.p, Staged: q.last(), Pos: lens[r], Ctx: q.dr.takePending(),
				N: widths[r] - 1, Sp: q.req.Sampling, Keys: q.keys}
			if q.cons != nil && maskDrafts {
				call.Cands = draftCandidates
			}
			calls = append(calls, call)
			callRows = append(callRows, r)
		}
	}
	var draftList []*mlxc.Array
	for i, prop := range verify.ProposeRows(calls) {
		r := callRows[i]
		parts[r].drafts, parts[r].probs = prop.Tokens, prop.Probs
		if prop.Cands != nil {
			// A constrained greedy row: its drafts are chosen under its grammar among the
			// drafter's candidates (read here: the verify waits for them).
			q := rows[r]
			cands, logits := mlxc.ToSlice[int32](prop.Cands), mlxc.ToSlice[float32](prop.CandLogits)
			chosen, allow, err := q.cons.chooseDrafts(&q.st, d.e.Target.Arch().VocabSize, cands, logits, prop.Cands.Dim(1))
			if err != nil {
				q.err = err
			}
			parts[r].drafts, parts[r].allow = nil, allow
			if len(chosen) > 0 && err == nil {
				parts[r].drafts = mlxc.FromSlice(chosen, len(chosen))
			}
		}
		if parts[r].drafts != nil {
			draftList = append(draftList, parts[r].drafts)
		}
	}
	profile := slices.ContainsFunc(rows, func(q *sequence) bool { return q.req.Profile })
	var draftWait time.Duration
	if profile && len(draftList) > 0 {
		// Profiling splits the drafts' time from the verify's: the drafts are evaluated
		// on their own first (one more sync per step).
		var nodes int
		var ops map[string]int
		countGraph(&nodes, &ops, draftList...)
		td := time.Now()
		mlxc.Eval(draftList...)
		draftWait = time.Since(td)
		for _, r := range callRows {
			rows[r].st.DraftNodes += nodes
			rows[r].st.DraftTime += draftWait
		}
	}
	var ids []*mlxc.Array
	T := 0
	for r, q := range rows {
		parts[r].off = T
		ids = append(ids, mlxc.FromSlice([]int32{q.last()}, 1))
		if dr := parts[r].drafts; dr != nil {
			ids = append(ids, mlxc.AsType(dr, mlxc.Int32))
			parts[r].w = 1 + dr.Dim(0)
		} else {
			parts[r].w = 1
		}
		T += parts[r].w
	}
	in := mlxc.Reshape(mlxc.Concatenate(ids, 0), 1, T)
	taps := d.taps(rows)
	var out model.Output
	if d.single != nil {
		d.single.c.Speculate()
		out = d.e.Target.Forward(in, d.single.c, model.ForwardOptions{Taps: taps, Logits: model.LogitsAll,
			KeyBucket: d.e.KeyBucket, RowwiseAttention: d.e.RowwiseVerify})
	} else {
		w := make([]int, len(rows))
		for r := range parts {
			w[r] = parts[r].w
		}
		out = d.bm.ForwardBatch(in, d.batch, model.BatchOptions{Widths: w, Taps: taps, Tentative: true,
			PaddedKeys: paddedPays(lens), KeyBucket: d.e.KeyBucket})
	}
	logits := mlxc.Reshape(out.Logits, T, -1)
	if slices.ContainsFunc(rows, func(q *sequence) bool { return q.cons != nil }) {
		// The verify runs while the host walks the constrained rows' grammars along their
		// drafts (which it waits for): the masks depend on the drafts only.
		mlxc.AsyncEval(logits)
	}
	verdicts := make([]verify.Verdict, len(rows))
	var evalList []*mlxc.Array
	for r, q := range rows {
		p := parts[r]
		lg := mlxc.SliceAxis(logits, 0, p.off, p.off+p.w)
		if q.penalty {
			lg = q.req.Sampling.PenaltyRows(lg, lastN(q.history, 64), p.drafts)
		}
		if q.cons != nil && p.allow != nil {
			lg = masked(lg, p.allow)
		} else if q.cons != nil && q.err == nil {
			// Row j's mask is the grammar's after the staged token's predecessors and
			// drafts 0..j−1: a draft its mask does not allow has no probability under the
			// masked target, so it is rejected (greedy and sampled alike), and the token
			// after the accepted drafts is an allowed one.
			var dtoks []int32
			if p.drafts != nil {
				dtoks = mlxc.ToSlice[int32](mlxc.AsType(p.drafts, mlxc.Int32))
			}
			allow, err := q.cons.maskRows(&q.st, lg.Dim(1), dtoks)
			if err != nil {
				q.err = err
			} else {
				lg = masked(lg, allow)
			}
		}
		verdicts[r] = d.verdict(q, lg, p.drafts, p.probs)
		evalList = append(evalList, verdicts[r].Arrays()...)
		if p.drafts != nil {
			evalList = append(evalList, p.drafts)
		}
	}
	var verifyNodes int
	if profile {
		var ops map[string]int
		countGraph(&verifyNodes, &ops, evalList...)
	}
	tb := time.Since(t0) - draftWait
	tw := time.Now()
	mlxc.Eval(evalList...)
	wait := time.Since(tw)

	th := time.Now()
	keep := make([]int, len(rows))
	taken := make([][]int32, len(rows))
	accepted := make([]int, len(rows))
	for r, q := range rows {
		p := parts[r]
		next := mlxc.ToSlice[int32](verdicts[r].Next)
		var acc []bool
		var dtoks []int32
		if p.drafts != nil {
			acc = mlxc.ToSlice[bool](verdicts[r].Accept)
			dtoks = mlxc.ToSlice[int32](p.drafts)
		}
		a, tok := verify.Resolve(next, acc)
		if d.e.ReplayAccept != nil && q.dr != nil {
			a = min(max(d.e.ReplayAccept(p.w-1), 0), p.w-1)
			tok = next[a]
		}
		accepted[r] = a
		keep[r] = a + 1
		taken[r] = append(dtoks[:a:a], tok)
	}
	tr := time.Now()
	if d.single != nil {
		if err := d.single.c.Commit(cache.Prefix(keep[0])); err != nil {
			return fmt.Errorf("speculative step: committing: %w", err)
		}
	} else if err := d.batch.Commit(keep); err != nil {
		return fmt.Errorf("speculative step: committing: %w", err)
	}
	rollback := time.Since(tr)
	if out.Hidden != nil {
		for r, q := range rows {
			if q.dr != nil {
				q.dr.keep(mlxc.SliceAxis(out.Hidden, 1, parts[r].off, parts[r].off+keep[r]).Detach())
			}
		}
	}
	now := time.Now()
	d.costs.observeSpec(T, now.Sub(t0))
	d.count(now.Sub(t0), loss)
	for r, q := range rows {
		p := parts[r]
		q.steps++
		q.stepRows += len(rows)
		st := &q.st
		st.BuildTime += tb
		st.WaitTime += wait + draftWait
		if profile {
			st.VerifyTime += wait
			st.VerifyNodes += verifyNodes
		}
		st.RollbackTime += rollback
		if q.dr != nil && len(q.history) > 1 { // a first token is no cycle
			d.countCycle(q, p.w-1, accepted[r])
		}
		q.takeAll(taken[r], now)
		q.st.HostTime += time.Since(th) - rollback
		if d.e.afterCycle != nil && d.single == q && !q.over() {
			d.e.afterCycle(q.c, q.fed(len(q.req.Prompt)+len(q.history)-2))
		}
	}
	d.steps++
	if d.observe != nil {
		d.observe(len(rows))
	}
	if d.steps%64 == 0 {
		mlxc.ClearCache()
	}
	return nil
}

// verdict is a row's verdict from its logits [w, V] over its drafts (nil: none): a
// drafting row's as the DFlash loops build it (greedy, or speculative sampling with the
// drafts' distributions), a plain row's its plain draw.
func (d *decoder) verdict(q *sequence, logits, drafts, probs *mlxc.Array) verify.Verdict {
	sp := q.req.Sampling
	switch {
	case q.dr == nil:
		return verify.Verdict{Next: mlxc.AsType(sp.Draw(sample.LogProbs(logits), q.keys.Next()), mlxc.Int32)}
	case sp.Greedy():
		if !d.argmaxMade {
			d.argmax = model.NewRowArgmax(d.e.settings().Kernels) // the greedy verdict's kernels on a CUDA or Metal GPU
			d.argmaxMade = true
		}
		return verify.GreedyLogits(d.argmax, logits, drafts)
	case d.e.speculative != nil && drafts != nil: // a test's acceptance rule
		return d.e.speculative(sample.LogProbs(logits), drafts, probs, sp, q.keys)
	default:
		return verify.Speculative(sample.LogProbs(logits), drafts, probs, sp, q.keys)
	}
}

// taps are the target layers the rows' drafters read (nil when no row drafts).
func (d *decoder) taps(rows []*sequence) []int {
	for _, q := range rows {
		if q.dr != nil {
			return q.dr.p.TapLayers()
		}
	}
	return nil
}

// lens are the rows' committed lengths, in row order.
func (d *decoder) lens() []int {
	if d.single != nil {
		return []int{d.single.c.Offset()}
	}
	if d.batch == nil {
		return nil
	}
	return d.batch.Lens()
}
