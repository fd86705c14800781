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
	p := e.Proposer
	B := blockSize(p, req)
	arch := e.Target.Arch()
	o := newOutput(req, arch.EOSTokenIDs)
	st := Stats{Mode: "dflash", PromptTokens: len(req.Prompt), AcceptHist: make([]int, B)}
	if req.MaxTokens == 0 {
		o.end(FinishLength)
		return Result{FinishReason: o.finish, Stats: st}, nil
	}
	c := e.Target.NewCache()
	defer c.Free()
	c.Reserve(len(req.Prompt) + req.MaxTokens + B)
	p.Begin()
	defer p.End()
	if err := e.prefill(ctx, req.Prompt, c, p); err != nil {
		return Result{FinishReason: FinishCancelled, Stats: st}, nil
	}
	sp := req.Sampling
	keys := newKeys(sp)
	taps := p.TapLayers()
	argmax := model.NewRowArgmax(e.settings().Kernels) // the greedy verdict's kernels on a CUDA GPU
	defer argmax.Free()
	history := []int32{req.Prompt[len(req.Prompt)-1]}

	// First token: the last prompt token alone, like plain decoding, so both paths agree.
	var ctxRows *mlxc.Array
	var staged int32
	{
		s := mlxc.NewScope()
		last := mlxc.FromSlice([]int32{req.Prompt[len(req.Prompt)-1]}, 1, 1)
		out := e.Target.Forward(last, c, model.ForwardOptions{Taps: taps, Logits: model.LogitsLast})
		logits := sp.PenaltyRows(mlxc.Reshape(out.Logits, 1, -1), history, nil)
		lp := sample.LogProbs(logits)
		var v verify.Verdict
		if sp.Greedy() {
			v = verify.Greedy(lp, nil)
		} else {
			v = verify.Speculative(lp, nil, nil, sp, keys)
		}
		mlxc.Eval(v.Next)
		staged = mlxc.ToSlice[int32](v.Next)[0]
		if out.Hidden != nil {
			ctxRows = out.Hidden.Detach()
		}
		s.Close()
	}
	defer func() { ctxRows.Free() }()
	firstTok := time.Now()
	st.FirstTokenTime = firstTok.Sub(start)
	st.PrefillTime = st.FirstTokenTime
	history = append(history, staged)
	cont := o.push(staged) && !checkCancel(ctx, o)
	if err := emitPending(o, emit); err != nil {
		return Result{}, err
	}

	// draft launches the drafter for the next cycle and starts it on the device at once
	// (async), so that building the verify graph on the host overlaps with drafting, and a
	// prefetched draft overlaps with the host's bookkeeping and streaming of the previous
	// cycle. Its arrays are detached: they outlive the cycle's scope.
	type pendingDraft struct {
		prop verify.Proposal
		n    int
	}
	var draftEval time.Duration // profile mode: time spent waiting for drafts inside draft()
	draft := func(staged int32, n int) pendingDraft {
		s := mlxc.NewScope()
		defer s.Close()
		prop := p.Propose(staged, c.Offset(), ctxRows, max(n, 0), sp, keys)
		if prop.Tokens == nil {
			return pendingDraft{}
		}
		prop.Tokens.Detach()
		prop.Probs.Detach()
		if req.Profile {
			countGraph(&st.DraftNodes, &st.DraftOps, prop.Tokens)
			td := time.Now()
			mlxc.AsyncEval(prop.Tokens)
			st.DraftEncodeTime += time.Since(td)
			mlxc.Eval(prop.Tokens)
			draftEval = time.Since(td)
			st.DraftTime += draftEval
		} else {
			mlxc.AsyncEval(prop.Tokens)
		}
		return pendingDraft{prop: prop, n: prop.Tokens.Dim(0)}
	}
	free := func(d pendingDraft) { d.prop.Tokens.Free(); d.prop.Probs.Free() }
	budget := func(committed int) int { return min(B-1, req.MaxTokens-committed-1) }

	var next pendingDraft
	if cont {
		tb := time.Now()
		draftEval = 0
		next = draft(staged, budget(len(o.tokens)))
		ctxRows.Free()
		ctxRows = nil
		st.BuildTime += time.Since(tb) - draftEval
	}
	defer func() { free(next) }()
	for cont {
		if checkCancel(ctx, o) {
			break
		}
		cur := next
		next = pendingDraft{}
		n := cur.n
		s := mlxc.NewScope()
		tb := time.Now()
		ids := mlxc.FromSlice([]int32{staged}, 1, 1)
		var drafts *mlxc.Array
		if n > 0 {
			drafts = cur.prop.Tokens
			ids = mlxc.Concatenate([]*mlxc.Array{ids, mlxc.Reshape(drafts, 1, n)}, 1)
		}
		c.Speculate() // the verify block is tentative: only staged and the accepted drafts stay
		out := e.Target.Forward(ids, c, model.ForwardOptions{Taps: taps, Logits: model.LogitsAll, KeyBucket: e.KeyBucket, RowwiseAttention: e.RowwiseVerify})
		logits := sp.PenaltyRows(mlxc.Reshape(out.Logits, n+1, -1), lastN(history, 64), drafts)
		var v verify.Verdict
		if sp.Greedy() {
			v = verify.GreedyLogits(argmax, logits, drafts)
		} else if e.speculative != nil {
			v = e.speculative(sample.LogProbs(logits), drafts, cur.prop.Probs, sp, keys)
		} else {
			v = verify.Speculative(sample.LogProbs(logits), drafts, cur.prop.Probs, sp, keys)
		}
		st.BuildTime += time.Since(tb)

		evalList := v.Arrays()
		if drafts != nil {
			evalList = append(evalList, drafts)
		}
		if req.Profile {
			// Counted before the clock starts: walking the graph is not the verify's cost.
			countGraph(&st.VerifyNodes, &st.VerifyOps, evalList...)
		}
		tw := time.Now()
		if req.Profile {
			mlxc.AsyncEval(evalList...)
			st.VerifyEncodeTime += time.Since(tw)
		}
		mlxc.Eval(evalList...)
		waited := time.Since(tw)
		st.WaitTime += waited
		if req.Profile {
			st.VerifyTime += waited
		}

		th := time.Now()
		nextToks := mlxc.ToSlice[int32](v.Next)
		var accept []bool
		var dtoks []int32
		if n > 0 {
			accept = mlxc.ToSlice[bool](v.Accept)
			dtoks = mlxc.ToSlice[int32](drafts)
		}
		a, tok := verify.Resolve(nextToks, accept)
		if e.ReplayAccept != nil {
			a = min(max(e.ReplayAccept(n), 0), n)
			tok = nextToks[a]
		}

		tr := time.Now()
		if err := c.Commit(cache.Prefix(a + 1)); err != nil {
			s.Close()
			free(cur)
			return Result{}, err
		}
		if out.Hidden != nil {
			ctxRows = mlxc.SliceAxis(out.Hidden, 1, 0, a+1).Detach()
		}
		st.RollbackTime += time.Since(tr)
		s.Close()
		free(cur)

		st.Cycles++
		st.Drafted += n
		st.Accepted += a
		st.AcceptHist[a]++
		committed := append(dtoks[:a:a], tok)

		// Start the next draft before streaming, unless this cycle certainly ends the
		// generation (a stop token or the token budget). A stop string found while
		// streaming ends it too; the prefetched draft is then simply dropped.
		ends := len(o.tokens)+len(committed) >= req.MaxTokens
		for _, t := range committed {
			ends = ends || o.stopTokens[t]
		}
		var prefetch time.Duration
		if !ends {
			tb := time.Now()
			draftEval = 0
			next = draft(tok, budget(len(o.tokens)+len(committed)))
			prefetch = time.Since(tb)
			st.BuildTime += prefetch - draftEval
		}
		ctxRows.Free()
		ctxRows = nil

		for _, t := range committed {
			if !cont {
				break
			}
			history = append(history, t)
			cont = o.push(t)
		}
		staged = tok
		if e.afterCycle != nil && cont {
			committedAll := append(append([]int32(nil), req.Prompt...), o.tokens[:len(o.tokens)-1]...)
			e.afterCycle(c, committedAll)
		}
		if err := emitPending(o, emit); err != nil {
			return Result{}, err
		}
		if st.Cycles%64 == 0 {
			mlxc.ClearCache()
		}
		st.HostTime += time.Since(th) - prefetch
	}
	st.GeneratedTokens = len(o.tokens)
	finishStats(&st, firstTok, time.Now())
	// HostTime above includes rollback; report them separately.
	st.HostTime -= st.RollbackTime
	return Result{Tokens: o.tokens, Text: o.text.String(), FinishReason: o.finish, Stats: st}, nil
}
