package engine

import (
	"context"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// blockSize is the DFlash block of a request: the proposer's, capped by the request's,
// at least 1.
func blockSize(p verify.Proposer, req Request) int {
	B := p.BlockSize()
	if req.BlockSize > 0 && req.BlockSize < B {
		B = req.BlockSize
	}
	return max(B, 1)
}

// dflash is the speculative loop. Per cycle: the drafter proposes n tokens after the staged
// one, the target verifies [staged, drafts] in one forward, the acceptance (greedy or
// speculative sampling) is built on the device, and one evaluation brings back the drafts,
// the per-slot verdicts and the candidate next tokens. The host then emits staged plus the
// accepted drafts, keeps their rows of the target caches (the verify was tentative: the
// rejected rows are dropped), and hands the accepted rows' hidden states to the drafter as
// the next context.
func (e *Engine) dflash(ctx context.Context, req Request, emit func(Event) error) (Result, error) {
	mlxc.ResetPeakMemory()
	start := time.Now()
	e.budget(&req)
	r := &serial{e: e, req: req, p: e.Proposer, sp: req.Sampling}
	r.B = blockSize(r.p, req)
	r.o = newOutput(req, e.Target.Arch().EOSTokenIDs)
	r.st = newDFlashStats(false, len(req.Prompt), r.B)
	r.policy = newBlockPolicy(e.BlockCosts, r.B)
	if req.MaxTokens == 0 {
		r.o.end(FinishLength)
		return Result{FinishReason: r.o.finish, Stats: r.st}, nil
	}
	r.c = e.Target.NewCache()
	defer r.c.Free()
	r.c.Reserve(len(req.Prompt) + req.MaxTokens + r.B)
	r.p.Begin()
	defer r.p.End()
	reserveContext(r.p, len(req.Prompt)+req.MaxTokens+r.B)
	if err := e.prefillPrompt(ctx, req.Prompt, req.PrefixMarks, r.c, r.p, &r.st); err != nil {
		return Result{FinishReason: FinishCancelled, Stats: r.st}, nil
	}
	r.keys = newKeys(r.sp)
	r.taps = r.p.TapLayers()
	r.argmax = model.NewRowArgmax(e.settings().Kernels) // the greedy verdict's kernels on a CUDA or Metal GPU
	defer r.argmax.Free()
	r.history = []int32{req.Prompt[len(req.Prompt)-1]}
	if e.Prefix != nil {
		r.fed = append([]int32(nil), req.Prompt...)
	}

	r.firstToken()
	defer func() { r.ctxRows.Free() }()
	firstTok := time.Now()
	r.st.FirstTokenTime = firstTok.Sub(start)
	r.st.PrefillTime = r.st.FirstTokenTime
	r.history = append(r.history, r.staged)
	cont := r.o.push(r.staged) && !checkCancel(ctx, r.o)
	if err := emitPending(r.o, emit); err != nil {
		return Result{}, err
	}
	if cont {
		r.prefetch(r.staged, len(r.o.tokens))
	}
	defer func() { r.next.free() }()
	for cont && !checkCancel(ctx, r.o) {
		if r.stepping {
			var err error
			if cont, err = r.oneTokenSteps(ctx, emit); err != nil {
				return Result{}, err
			}
			continue
		}
		a, tok, dtoks, th, err := r.verifyCycle()
		if err != nil {
			return Result{}, err
		}
		if cont, err = r.commit(a, tok, dtoks, th, emit); err != nil {
			return Result{}, err
		}
	}
	r.st.GeneratedTokens = len(r.o.tokens)
	finishStats(&r.st, firstTok, time.Now())
	if e.Prefix != nil {
		e.saveCommitted(r.fed, r.c, r.p, r.ctxRows)
	}
	// HostTime above includes rollback; report them separately.
	r.st.HostTime -= r.st.RollbackTime
	return Result{Tokens: r.o.tokens, Text: r.o.text.String(), FinishReason: r.o.finish, Stats: r.st}, nil
}

// serial is one request's state in the serial DFlash loop.
type serial struct {
	e       *Engine
	req     Request
	p       verify.Proposer
	B       int          // the largest block
	policy  *blockPolicy // the adaptive block size (nil: always B)
	o       *output
	st      Stats
	c       model.Cache
	sp      sample.Params
	keys    *sample.Keys
	taps    []int
	argmax  *model.RowArgmax
	history []int32
	// ctxRows are the hidden rows the next draft takes as new context (detached).
	ctxRows *mlxc.Array
	// stepping: the policy chose block 1, so the next tokens come from one-token steps
	// (oneTokenSteps) and no draft is prefetched.
	stepping bool
	// fed are the tokens whose positions the target's caches hold, in order (kept for
	// the prefix cache: past a stop token too).
	fed    []int32
	staged int32
	// next is the draft prefetched for the next cycle.
	next pendingDraft
	// draftEval is the time spent waiting for a draft inside draft (profile mode).
	draftEval time.Duration
}

// pendingDraft is a draft started on the device; its arrays are detached (owned here).
type pendingDraft struct {
	prop verify.Proposal
	n    int
}

func (d pendingDraft) free() { d.prop.Tokens.Free(); d.prop.Probs.Free() }

// firstToken runs the last prompt token alone, like plain decoding, so both paths agree:
// it stages the first token and keeps its hidden row as the first draft's context.
func (r *serial) firstToken() {
	s := mlxc.NewScope()
	defer s.Close()
	last := mlxc.FromSlice([]int32{r.req.Prompt[len(r.req.Prompt)-1]}, 1, 1)
	out := r.e.Target.Forward(last, r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsLast})
	logits := r.sp.PenaltyRows(mlxc.Reshape(out.Logits, 1, -1), r.history, nil)
	lp := sample.LogProbs(logits)
	var v verify.Verdict
	if r.sp.Greedy() {
		v = verify.Greedy(lp, nil)
	} else {
		v = verify.Speculative(lp, nil, nil, r.sp, r.keys)
	}
	mlxc.Eval(v.Next)
	r.staged = mlxc.ToSlice[int32](v.Next)[0]
	if out.Hidden != nil {
		r.ctxRows = out.Hidden.Detach()
	}
}

// draft launches the drafter for the next cycle and starts it on the device at once
// (async), so that building the verify graph on the host overlaps with drafting, and a
// prefetched draft overlaps with the host's bookkeeping and streaming of the previous
// cycle. Its arrays are detached: they outlive the cycle's scope.
func (r *serial) draft(staged int32, n int) pendingDraft {
	s := mlxc.NewScope()
	defer s.Close()
	prop := r.p.Propose(staged, r.c.Offset(), r.ctxRows, max(n, 0), r.sp, r.keys)
	if prop.Tokens == nil {
		return pendingDraft{}
	}
	prop.Tokens.Detach()
	prop.Probs.Detach()
	st := &r.st
	if r.req.Profile {
		countGraph(&st.DraftNodes, &st.DraftOps, prop.Tokens)
		td := time.Now()
		mlxc.AsyncEval(prop.Tokens)
		st.DraftEncodeTime += time.Since(td)
		mlxc.Eval(prop.Tokens)
		r.draftEval = time.Since(td)
		st.DraftTime += r.draftEval
	} else {
		mlxc.AsyncEval(prop.Tokens)
	}
	return pendingDraft{prop: prop, n: prop.Tokens.Dim(0)}
}

// prefetch starts the draft after staged for a cycle that follows committed emitted tokens
// and returns the time it took; the part spent building (not waiting) counts as BuildTime.
// The draft takes ctxRows, which are then freed. When the policy chooses block 1 it
// drafts nothing: the next tokens come from one-token steps, and ctxRows wait for the
// draft after them.
func (r *serial) prefetch(staged int32, committed int) time.Duration {
	B := r.policy.size(r.B)
	if r.stepping = r.policy != nil && B == 1; r.stepping {
		return 0
	}
	tb := time.Now()
	r.draftEval = 0
	r.next = r.draft(staged, min(B-1, r.req.MaxTokens-committed-1))
	r.ctxRows.Free()
	r.ctxRows = nil
	took := time.Since(tb)
	r.st.BuildTime += took - r.draftEval
	return took
}

// verifyCycle verifies the prefetched draft: the target runs [staged, drafts] as a
// tentative forward, one evaluation brings back the verdict, the caches keep the rows of
// staged and the a accepted drafts, and their hidden rows become the next draft's context.
// th is when the host's part of the cycle began.
func (r *serial) verifyCycle() (a int, tok int32, dtoks []int32, th time.Time, err error) {
	cur := r.next
	r.next = pendingDraft{}
	defer cur.free()
	s := mlxc.NewScope()
	defer s.Close()
	tb := time.Now()
	v, drafts, hidden := r.buildVerify(cur)
	r.st.BuildTime += time.Since(tb)
	r.waitVerify(v, drafts)

	th = time.Now()
	n := cur.n
	nextToks := mlxc.ToSlice[int32](v.Next)
	var accept []bool
	if n > 0 {
		accept = mlxc.ToSlice[bool](v.Accept)
		dtoks = mlxc.ToSlice[int32](drafts)
	}
	a, tok = verify.Resolve(nextToks, accept)
	if r.e.ReplayAccept != nil {
		a = min(max(r.e.ReplayAccept(n), 0), n)
		tok = nextToks[a]
	}

	tr := time.Now()
	if err = r.c.Commit(cache.Prefix(a + 1)); err != nil {
		return a, tok, dtoks, th, err
	}
	if hidden != nil {
		r.ctxRows = mlxc.SliceAxis(hidden, 1, 0, a+1).Detach()
	}
	r.st.RollbackTime += time.Since(tr)
	return a, tok, dtoks, th, nil
}

// buildVerify builds the verify block [staged, drafts] through the target (tentative: the
// caches keep only what the cycle commits) and its verdict; lazy, in the caller's scope.
func (r *serial) buildVerify(cur pendingDraft) (v verify.Verdict, drafts, hidden *mlxc.Array) {
	n := cur.n
	ids := mlxc.FromSlice([]int32{r.staged}, 1, 1)
	if n > 0 {
		drafts = cur.prop.Tokens
		ids = mlxc.Concatenate([]*mlxc.Array{ids, mlxc.Reshape(drafts, 1, n)}, 1)
	}
	r.c.Speculate()
	out := r.e.Target.Forward(ids, r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsAll, KeyBucket: r.e.KeyBucket, RowwiseAttention: r.e.RowwiseVerify})
	logits := r.sp.PenaltyRows(mlxc.Reshape(out.Logits, n+1, -1), lastN(r.history, 64), drafts)
	return r.verdict(logits, drafts, cur.prop.Probs), drafts, out.Hidden
}

// verdict is the verification of drafts (nil: none) from the target's logits [n+1, V]:
// greedy, or speculative sampling with the drafter's probabilities.
func (r *serial) verdict(logits, drafts, probs *mlxc.Array) verify.Verdict {
	switch {
	case r.sp.Greedy():
		return verify.GreedyLogits(r.argmax, logits, drafts)
	case r.e.speculative != nil:
		return r.e.speculative(sample.LogProbs(logits), drafts, probs, r.sp, r.keys)
	default:
		return verify.Speculative(sample.LogProbs(logits), drafts, probs, r.sp, r.keys)
	}
}

// waitVerify evaluates the verdict (and the drafts) and counts the wait.
func (r *serial) waitVerify(v verify.Verdict, drafts *mlxc.Array) {
	st := &r.st
	evalList := v.Arrays()
	if drafts != nil {
		evalList = append(evalList, drafts)
	}
	if r.req.Profile {
		// Counted before the clock starts: walking the graph is not the verify's cost.
		countGraph(&st.VerifyNodes, &st.VerifyOps, evalList...)
	}
	tw := time.Now()
	if r.req.Profile {
		mlxc.AsyncEval(evalList...)
		st.VerifyEncodeTime += time.Since(tw)
	}
	mlxc.Eval(evalList...)
	waited := time.Since(tw)
	st.WaitTime += waited
	if r.req.Profile {
		st.VerifyTime += waited
	}
}

// commit emits the a accepted drafts dtoks and tok after them, prefetching the next draft
// first unless this cycle certainly ends the generation; it reports whether to go on. th
// is when the host's part of the cycle began.
func (r *serial) commit(a int, tok int32, dtoks []int32, th time.Time, emit func(Event) error) (bool, error) {
	st, o := &r.st, r.o
	st.Cycles++
	st.Drafted += len(dtoks)
	st.Accepted += a
	st.AcceptHist[a]++
	countDrafts(st, len(dtoks), a)
	r.policy.observe(len(dtoks), a)
	committed := append(dtoks[:a:a], tok)

	// Start the next draft before streaming, unless this cycle certainly ends the
	// generation (a stop token or the token budget). A stop string found while
	// streaming ends it too; the prefetched draft is then simply dropped.
	ends := len(o.tokens)+len(committed) >= r.req.MaxTokens
	for _, t := range committed {
		ends = ends || o.stopTokens[t]
	}
	if r.fed != nil {
		r.fed = append(append(r.fed, r.staged), dtoks[:a]...)
	}
	var prefetch time.Duration
	if !ends {
		prefetch = r.prefetch(tok, len(o.tokens)+len(committed))
	}
	// A last cycle's rows stay for the prefix cache (taken in when the loop ends).

	cont := true
	for _, t := range committed {
		if !cont {
			break
		}
		r.history = append(r.history, t)
		cont = o.push(t)
	}
	r.staged = tok
	if r.e.afterCycle != nil && cont {
		committedAll := append(append([]int32(nil), r.req.Prompt...), o.tokens[:len(o.tokens)-1]...)
		r.e.afterCycle(r.c, committedAll)
	}
	if err := emitPending(o, emit); err != nil {
		return false, err
	}
	if st.Cycles%64 == 0 {
		mlxc.ClearCache()
	}
	st.HostTime += time.Since(th) - prefetch
	return cont, nil
}

// oneTokenSteps runs the one-token steps the policy chose (block 1: no block's expected
// tokens pay for its verify) until it has to look again (blockPolicy.oneTokenSteps):
// plain decoding's steps, pipelined as it pipelines them (the next step is built from the
// lazy token and started before the host reads this one; a repetition penalty needs the
// token first), each a cycle of block 1 with the same verdict, and so the same token, as
// a cycle without drafts. The drafter's context stays in step: each step's tapped row is
// kept, and the next draft takes them all at once (ctxRows); past 64 of them they go to
// the drafter as context so that they do not pile up. When the generation ends with a
// step in flight, that step fed a committed token (the one just read), so fed and the
// rows still match the caches. It reports whether to go on; going on, the next draft or
// steps are prefetched.
func (r *serial) oneTokenSteps(ctx context.Context, emit func(Event) error) (bool, error) {
	st, o := &r.st, r.o
	k := r.policy.oneTokenSteps()
	penalty := r.sp.RepetitionPenalty > 0 && r.sp.RepetitionPenalty != 1
	var rows []*mlxc.Array
	if r.ctxRows != nil {
		rows = append(rows, r.ctxRows)
		r.ctxRows = nil
	}
	defer func() {
		if len(rows) > 0 {
			s := mlxc.NewScope()
			r.ctxRows = mlxc.Concatenate(rows, 1).Detach()
			s.Close()
			freeAll(rows)
		}
	}()
	// step starts the step that feeds the token in ([1], lazy; nil: the host's token t):
	// its token and tapped row (nil without taps), detached.
	step := func(in *mlxc.Array, t int32) (tok, row *mlxc.Array) {
		tb := time.Now()
		s := mlxc.NewScope()
		defer s.Close()
		if in == nil {
			in = mlxc.FromSlice([]int32{t}, 1)
		}
		out := r.e.Target.Forward(mlxc.Reshape(in, 1, 1), r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsLast})
		logits := r.sp.PenaltyRows(mlxc.Reshape(out.Logits, 1, -1), lastN(r.history, 64), nil)
		tok = mlxc.Reshape(r.verdict(logits, nil, nil).Next, 1).Detach()
		if out.Hidden != nil {
			row = out.Hidden.Detach()
			mlxc.AsyncEval(tok, row)
		} else {
			mlxc.AsyncEval(tok)
		}
		st.BuildTime += time.Since(tb)
		return tok, row
	}
	fed := func(t int32) {
		if r.fed != nil {
			r.fed = append(r.fed, t)
		}
	}
	tok, row := step(nil, r.staged)
	fed(r.staged)
	cont := true
	for i := 1; ; i++ {
		var nextTok, nextRow *mlxc.Array
		if !penalty && i < k && len(o.tokens)+1 < r.req.MaxTokens {
			nextTok, nextRow = step(tok, 0)
		}
		tw := time.Now()
		t := mlxc.ToSlice[int32](tok)[0]
		st.WaitTime += time.Since(tw)
		th := time.Now()
		tok.Free()
		if row != nil {
			rows = append(rows, row)
		}
		st.Cycles++
		st.AcceptHist[0]++
		countDrafts(st, 0, 0)
		r.policy.observe(0, 0)
		r.history = append(r.history, t)
		r.staged = t
		cont = o.push(t) && !checkCancel(ctx, o)
		if nextTok != nil {
			fed(t)
		}
		if err := emitPending(o, emit); err != nil {
			nextTok.Free()
			nextRow.Free()
			return false, err
		}
		if len(rows) > 64 {
			r.flushRows(&rows)
		}
		if cont && nextTok == nil && i < k {
			// Not built ahead (a repetition penalty, or the budget's last tokens): from the
			// token just read.
			nextTok, nextRow = step(nil, t)
			fed(t)
		}
		st.HostTime += time.Since(th)
		if !cont || nextTok == nil {
			if nextTok != nil {
				// Ended with a step in flight: it ran on the caches, so its row is the
				// drafter's too.
				mlxc.Eval(nextTok)
				nextTok.Free()
				if nextRow != nil {
					rows = append(rows, nextRow)
				}
			}
			break
		}
		tok, row = nextTok, nextRow
		if st.Cycles%256 == 0 {
			// As often as plain decoding clears it: a cleared buffer cache costs the next
			// steps fresh allocations.
			mlxc.ClearCache()
		}
	}
	r.stepping = false
	if !cont {
		return false, nil
	}
	if r.e.afterCycle != nil {
		committedAll := append(append([]int32(nil), r.req.Prompt...), o.tokens[:len(o.tokens)-1]...)
		r.e.afterCycle(r.c, committedAll)
	}
	// The rows go to the next draft (ctxRows) before it is prefetched.
	if len(rows) > 0 {
		s := mlxc.NewScope()
		r.ctxRows = mlxc.Concatenate(rows, 1).Detach()
		s.Close()
		freeAll(rows)
		rows = nil
	}
	r.prefetch(r.staged, len(o.tokens))
	return true, nil
}

// flushRows hands the kept rows to the drafter as context (one batch) and empties them.
func (r *serial) flushRows(rows *[]*mlxc.Array) {
	s := mlxc.NewScope()
	r.p.Context(mlxc.Concatenate(*rows, 1))
	s.Close()
	freeAll(*rows)
	*rows = nil
}
