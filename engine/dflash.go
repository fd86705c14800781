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
		r.ctxRows.Free()
		r.ctxRows = nil
	}
	defer func() { r.next.free() }()
	for cont && !checkCancel(ctx, r.o) {
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
func (r *serial) prefetch(staged int32, committed int) time.Duration {
	tb := time.Now()
	r.draftEval = 0
	r.next = r.draft(staged, min(r.policy.size(r.B)-1, r.req.MaxTokens-committed-1))
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
	switch {
	case r.sp.Greedy():
		v = verify.GreedyLogits(r.argmax, logits, drafts)
	case r.e.speculative != nil:
		v = r.e.speculative(sample.LogProbs(logits), drafts, cur.prop.Probs, r.sp, r.keys)
	default:
		v = verify.Speculative(sample.LogProbs(logits), drafts, cur.prop.Probs, r.sp, r.keys)
	}
	return v, drafts, out.Hidden
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
		r.ctxRows.Free()
		r.ctxRows = nil
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
