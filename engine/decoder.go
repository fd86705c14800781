package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// decoder is plain decoding for B ≥ 1 sequences: each tick builds one step that gives
// every decoding row its next token in one forward, then reads the step before it.
// Pipelined like mlx-lm: the step for token n+1 is built from the lazy tokens n and
// started before the host reads them, so the device never waits for Go. Rows join (after
// their prefill) and leave (ended, cancelled) between steps; the step in flight may
// compute a token for a row that has just ended, which is dropped.
//
// One row decodes in its own caches through the target's Forward, exactly the
// single-sequence computation; from two rows on, a batch (model.BatchModel) holds them,
// each row at its own length, and the rows' logits are each row's alone (bit for bit on
// the CPU). The caches move between the two forms when the row count crosses 1.
//
// The decoder runs on the MLX thread.
type decoder struct {
	e  *Engine
	bm model.BatchModel // nil: the target decodes one row at a time
	// rows are the sequences of the step in flight (y), in row order; ended ones among
	// them leave at the next tick.
	rows []*sequence
	// single is the only row when its own caches hold it; batch holds the rows otherwise
	// (nil without rows).
	single *sequence
	batch  cache.Batch
	// y is the step in flight: one token per row, int32 [len(rows)], detached; nil when
	// no step is in flight. yHidden are its tapped rows [rows, 1, ·] (detached) when a
	// drafting row is among them, for the drafters' next context.
	y, yHidden *mlxc.Array
	// nextHidden is the tapped rows of a step built ahead, until read hands it over.
	nextHidden *mlxc.Array
	// costs are the measured costs of the steps, and pool the acceptance pooled over all
	// rows, for the width policy (plan).
	costs *stepCosts
	pool  acceptPool
	// spent is the milliseconds of the steps so far, explored what the steps in which a
	// row explored a width past the plan's were expected to lose against it (plan).
	spent, explored float64
	// lastTick is when the last pipelined step was read (the interval between two reads
	// is a pipelined step's cost).
	lastTick time.Time
	// steps counts the steps built, for the allocator's cache release.
	steps int
	// argmax is the greedy verdicts' kernels (made at the first one).
	argmax     *model.RowArgmax
	argmaxMade bool
	// observe, when set, sees each step's row count.
	observe func(rows int)
}

func (e *Engine) newDecoder() *decoder {
	d := &decoder{e: e, costs: newStepCosts(e.BlockCosts)}
	if bm, ok := e.Target.(model.BatchModel); ok {
		d.bm = bm
	}
	return d
}

// maxRows is the most rows the target decodes in one step.
func (d *decoder) maxRows() int {
	if d.bm == nil {
		return 1
	}
	return int(^uint(0) >> 1)
}

// idle reports whether no step is in flight and no row decodes.
func (d *decoder) idle() bool { return d.y == nil && len(d.rows) == 0 }

// tick reads the step in flight and builds the next one for the rows that go on and the
// joining sequences (prefilled: their caches hold every prompt position but the last).
// A row's end, cancellation or failure takes effect here: it leaves at the tick after,
// its caches going to the prefix cache. After a tick, a sequence that is over and not
// among d.rows is done with the decoder.
func (d *decoder) tick(joiners []*sequence) error {
	s := mlxc.NewScope()
	defer s.Close()
	read := d.rows
	readFirst := slices.ContainsFunc(d.rows, (*sequence).readFirst) || slices.ContainsFunc(joiners, (*sequence).readFirst)
	if !readFirst && !d.drafts(joiners) {
		// Build ahead from the lazy tokens, then read them while the device runs.
		tb := time.Now()
		next, err := d.buildNext(joiners, true)
		if err != nil {
			return err
		}
		d.read(read, next, time.Since(tb))
		return nil
	}
	// A penalised row needs its last token's value in its logits, a constrained row its
	// mask after it, and a drafting row's width and draft depend on what the step in
	// flight commits: read first.
	d.read(read, nil, 0)
	kept, next := d.continuing(joiners)
	widths, loss := d.plan(next)
	if slices.ContainsFunc(widths, func(w int) bool { return w > 1 }) {
		if err := d.arrange(kept, joiners); err != nil {
			return err
		}
		d.rows = next
		return d.speculate(next, widths, loss)
	}
	tb := time.Now()
	if _, err := d.buildNext(joiners, false); err != nil {
		return err
	}
	for _, q := range d.rows {
		q.st.BuildTime += time.Since(tb)
	}
	return nil
}

// continuing lists the rows that take another step (indices into d.rows, and the
// sequences, followed by the joiners).
func (d *decoder) continuing(joiners []*sequence) (kept []int, next []*sequence) {
	for r, q := range d.rows {
		if q.wantsStep() {
			kept = append(kept, r)
			next = append(next, q)
		}
	}
	return kept, append(next, joiners...)
}

// drafts reports whether the next step would draft for some row, as planned before the
// step in flight is read: a step in flight that drafted must be read first anyway (its
// rows' acceptance moves the plan), a plain one leaves the plan as it is but for the
// token budget.
func (d *decoder) drafts(joiners []*sequence) bool {
	_, next := d.continuing(joiners)
	if !slices.ContainsFunc(next, func(q *sequence) bool { return q.dr != nil }) {
		return false
	}
	w, _ := d.plan(next)
	return slices.ContainsFunc(w, func(w int) bool { return w > 1 })
}

// holds reports whether q is a row of the step in flight.
func (d *decoder) holds(q *sequence) bool { return slices.Contains(d.rows, q) }

// read reads the step in flight (y, the tokens of rows) and commits each row's token;
// next is the step already built after it (nil: none yet), which becomes the one in
// flight. build is the time spent building next, counted for every row read.
func (d *decoder) read(rows []*sequence, next *mlxc.Array, build time.Duration) {
	y, hidden := d.y, d.yHidden
	d.y, d.yHidden = next, d.nextHidden
	d.nextHidden = nil
	if y == nil {
		return
	}
	defer hidden.Free()
	if !slices.ContainsFunc(rows, func(q *sequence) bool { return !q.over() }) {
		y.Free() // every row has ended: nothing to wait for
		return
	}
	tw := time.Now()
	toks := mlxc.ToSlice[int32](y)
	y.Free()
	wait := time.Since(tw)
	now := time.Now()
	if next != nil && !d.lastTick.IsZero() {
		d.costs.plain.observe(len(rows), now.Sub(d.lastTick))
		d.count(now.Sub(d.lastTick), 0)
	}
	d.lastTick = now
	if next == nil {
		d.lastTick = time.Time{} // the next step starts after this read: no interval
	}
	for r, q := range rows {
		q.st.BuildTime += build
		q.st.WaitTime += wait
		if q.dr != nil && hidden != nil {
			// The step's input is committed even when the row has just ended: its row
			// keeps the drafter's context level with the caches (the prefix cache).
			q.dr.keep(mlxc.SliceAxis(hidden, 0, r, r+1).Detach())
		}
		if q.over() {
			continue
		}
		if q.dr != nil && len(q.history) > 1 { // a first token is no cycle
			d.countCycle(q, 0, 0)
		}
		q.take(toks[r], now)
		q.st.HostTime += time.Since(now)
	}
}

// countCycle counts a drafting row's step that drafted n tokens and accepted the first a
// (n = 0: a step without drafts, a cycle of block 1) in its statistics, its block policy
// and the acceptance pooled over the rows.
func (d *decoder) countCycle(q *sequence, n, a int) {
	st := &q.st
	st.Cycles++
	st.Drafted += n
	st.Accepted += a
	st.AcceptHist[a]++
	countDrafts(st, n, a)
	q.dr.policy.observe(n, a)
	d.pool.observe(n, a)
}

// buildNext arranges the caches for the rows that go on and the joiners, and builds and
// starts their step; lazy: the rows' inputs are the tokens in flight (y), else their last
// read tokens. It returns the step's tokens (also in d.y once read is done with the old).
func (d *decoder) buildNext(joiners []*sequence, lazy bool) (*mlxc.Array, error) {
	kept, next := d.continuing(joiners)
	var ids *mlxc.Array
	if len(next) > 0 {
		var parts []*mlxc.Array
		if len(kept) > 0 {
			if lazy && d.y != nil {
				parts = append(parts, d.takeRows(d.y, kept))
			} else {
				in := make([]int32, len(kept))
				for i, r := range kept {
					in[i] = d.rows[r].history[len(d.rows[r].history)-1]
				}
				parts = append(parts, mlxc.FromSlice(in, len(in)))
			}
		}
		if len(joiners) > 0 {
			in := make([]int32, len(joiners))
			for i, q := range joiners {
				in[i] = q.req.Prompt[len(q.req.Prompt)-1]
			}
			parts = append(parts, mlxc.FromSlice(in, len(in)))
		}
		ids = parts[0]
		if len(parts) > 1 {
			ids = mlxc.Concatenate(parts, 0)
		}
	}
	if err := d.arrange(kept, joiners); err != nil {
		return nil, err
	}
	d.rows = next
	if len(next) == 0 {
		return nil, nil
	}
	tok, hidden := d.step(ids, next)
	tok.Detach()
	if hidden != nil {
		hidden.Detach()
	}
	profile := slices.ContainsFunc(next, func(q *sequence) bool { return q.req.Profile })
	if profile {
		var nodes int
		var ops map[string]int
		countGraph(&nodes, &ops, tok)
		for _, q := range next {
			q.st.StepNodes += nodes
			if q.st.StepOps == nil {
				q.st.StepOps = map[string]int{}
			}
			for k, v := range ops {
				q.st.StepOps[k] += v
			}
		}
	}
	te := time.Now()
	if hidden != nil {
		mlxc.AsyncEval(tok, hidden)
	} else {
		mlxc.AsyncEval(tok)
	}
	if profile {
		for _, q := range next {
			q.st.StepEncodeTime += time.Since(te)
		}
	}
	for _, q := range next {
		q.built++
		q.steps++
		q.stepRows += len(next)
	}
	d.steps++
	if d.observe != nil {
		d.observe(len(next))
	}
	if d.steps%256 == 0 {
		mlxc.ClearCache()
	}
	if !lazy {
		d.y, d.yHidden = tok, hidden
	} else {
		d.nextHidden = hidden // read commits the old step's tokens, then this one is in flight
	}
	return tok, nil
}

// takeRows is rows kept of the tokens y (all of them: y itself).
func (d *decoder) takeRows(y *mlxc.Array, kept []int) *mlxc.Array {
	if len(kept) == y.Dim(0) {
		return y
	}
	idx := make([]int32, len(kept))
	for i, r := range kept {
		idx[i] = int32(r)
	}
	return mlxc.Take(y, mlxc.FromSlice(idx, len(idx)), 0)
}

// step is the forward of one token per row, ids int32 [n], and each row's draw from its
// own logits with its own parameters and keys: int32 [n]; with drafting rows also the
// tapped rows [n, 1, ·] their drafters take as context (else nil).
func (d *decoder) step(ids *mlxc.Array, rows []*sequence) (toks, hidden *mlxc.Array) {
	n := len(rows)
	taps := d.taps(rows)
	var logits *mlxc.Array
	if d.single != nil {
		out := d.e.Target.Forward(mlxc.Reshape(ids, 1, 1), d.single.c, model.ForwardOptions{Taps: taps, Logits: model.LogitsLast})
		logits, hidden = mlxc.Reshape(out.Logits, 1, -1), out.Hidden
	} else {
		out := d.bm.ForwardBatch(mlxc.Reshape(ids, n, 1), d.batch, model.BatchOptions{Taps: taps, PaddedKeys: paddedPays(d.batch.Lens())})
		logits, hidden = mlxc.Reshape(out.Logits, n, -1), out.Hidden
	}
	if !slices.ContainsFunc(rows, func(q *sequence) bool { return q.readFirst() || !q.req.Sampling.Greedy() }) {
		// Greedy rows: one argmax over all rows (row r's is its own row's).
		return mlxc.AsType(mlxc.Argmax(sample.LogProbs(logits), -1, false), mlxc.Int32), hidden
	}
	drawn := make([]*mlxc.Array, n)
	for r, q := range rows {
		row := logits
		if n > 1 {
			row = mlxc.SliceAxis(logits, 0, r, r+1)
		}
		row = q.req.Sampling.PenaltyRows(row, lastN(q.history, 64), nil)
		if q.cons != nil {
			// The mask after the row's committed tokens (read first: all are known). A
			// row whose grammar allows nothing fails alone; its draw is never read.
			allow, err := q.cons.maskRows(&q.st, row.Dim(1), nil)
			if err != nil {
				q.err = err
			} else {
				row = masked(row, allow)
			}
		}
		drawn[r] = mlxc.Reshape(d.verdict(q, row, nil, nil).Next, 1)
	}
	out := drawn[0]
	if n > 1 {
		out = mlxc.Concatenate(drawn, 0)
	}
	return mlxc.AsType(out, mlxc.Int32), hidden
}

// arrange makes the caches hold the rows kept (indices into d.rows, increasing) followed
// by the joiners, in that order: the rows that leave go to the prefix cache and are
// freed, and the caches change form when the row count crosses 1.
func (d *decoder) arrange(kept []int, joiners []*sequence) error {
	n := len(kept) + len(joiners)
	keptSet := make(map[int]bool, len(kept))
	for _, r := range kept {
		keptSet[r] = true
	}
	// Leaving rows first, while the caches still hold them.
	for r, q := range d.rows {
		if !keptSet[r] {
			d.retire(r, q)
		}
	}
	switch {
	case d.single != nil:
		if len(kept) == 0 {
			d.single.c.Free()
			d.single.c = nil
			d.single = nil
		}
	case d.batch != nil && len(kept) == 0:
		d.batch.Free()
		d.batch = nil
	case d.batch != nil && n <= 1:
		if len(kept) == 1 {
			q := d.rows[kept[0]]
			q.c = d.e.Target.NewCache()
			if err := d.batch.Extract(kept[0], q.c); err != nil {
				return fmt.Errorf("decoder: a row leaving the batch: %w", err)
			}
			d.single = q
		}
		d.batch.Free()
		d.batch = nil
	case d.batch != nil:
		if len(kept) < d.batch.Rows() {
			if err := d.batch.Keep(kept); err != nil {
				return fmt.Errorf("decoder: %w", err)
			}
		}
	}
	if n == 1 && len(joiners) == 1 {
		d.single = joiners[0]
		return nil
	}
	if n >= 2 && d.batch == nil {
		d.batch = d.bm.NewBatch()
		if d.single != nil {
			q := d.single
			d.single = nil
			if _, err := d.batch.Join(q.c); err != nil {
				return fmt.Errorf("decoder: a row joining the batch: %w", err)
			}
			q.c.Free()
			q.c = nil
		}
	}
	for _, q := range joiners {
		if n == 1 {
			break
		}
		if _, err := d.batch.Join(q.c); err != nil {
			return fmt.Errorf("decoder: a row joining the batch: %w", err)
		}
		q.c.Free()
		q.c = nil
	}
	return nil
}

// retire puts the state of row r (sequence q, which leaves) into the prefix cache.
func (d *decoder) retire(r int, q *sequence) {
	if d.e.Prefix == nil || len(q.history) < 2 {
		return // nothing decoded: the prefill saved the prompt
	}
	s := mlxc.NewScope()
	defer s.Close()
	var p verify.Proposer
	var pending *mlxc.Array
	if q.dr != nil {
		p, pending = q.dr.p, q.dr.takePending()
		if d.yHidden != nil && r < d.yHidden.Dim(0) {
			// The step in flight fed the row's last token (its caches hold it): its
			// tapped row, which read has not kept yet, is the drafter's too.
			row := mlxc.SliceAxis(d.yHidden, 0, r, r+1)
			if pending == nil {
				pending = row
			} else {
				pending = mlxc.Concatenate([]*mlxc.Array{pending, row}, 1)
			}
		}
	}
	switch {
	case d.single == q:
		d.e.saveCommitted(q.fed(q.c.Offset()), q.c, p, pending)
	case d.batch != nil:
		c := d.e.Target.NewCache()
		defer c.Free()
		if err := d.batch.Extract(r, c); err == nil {
			d.e.saveCommitted(q.fed(c.Offset()), c, p, pending)
		}
	}
}

// free releases the caches and the step in flight (the decoder then has no rows).
func (d *decoder) free() {
	d.y.Free()
	d.yHidden.Free()
	d.nextHidden.Free()
	d.y, d.yHidden, d.nextHidden = nil, nil, nil
	d.argmax.Free()
	d.argmax, d.argmaxMade = nil, false
	if d.single != nil {
		d.single.c.Free()
		d.single.c = nil
		d.single = nil
	}
	if d.batch != nil {
		d.batch.Free()
		d.batch = nil
	}
	d.rows = nil
}

// paddedPays reports whether a step over rows of these lengths attends in one call over
// the longest row's keys (model.BatchOptions.PaddedKeys) rather than one call per row:
// when padding adds at most half the keys the rows hold, the calls saved outweigh the
// masked keys computed (docs/perf/batching.md). Both give each row's own logits.
func paddedPays(lens []int) bool {
	longest, sum := 0, 0
	for _, n := range lens {
		longest = max(longest, n+1)
		sum += n + 1
	}
	return 2*len(lens)*longest <= 3*sum
}
