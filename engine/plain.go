package engine

import (
	"context"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// plain is autoregressive decoding, pipelined like mlx-lm: the step for token n+1 is built
// from the lazy token n and started before the host reads token n, so the device never
// waits for Go. With a repetition penalty the history must be known, so steps sync.
func (e *Engine) plain(ctx context.Context, req Request, emit func(Event) error) (Result, error) {
	mlxc.ResetPeakMemory()
	start := time.Now()
	e.budget(&req)
	r := &plainRun{e: e, req: req, sp: req.Sampling, start: start}
	r.o = newOutput(req, e.Target.Arch().EOSTokenIDs)
	r.st = Stats{Mode: "plain", PromptTokens: len(req.Prompt)}
	if req.MaxTokens == 0 {
		r.o.end(FinishLength)
		return Result{FinishReason: r.o.finish, Stats: r.st}, nil
	}
	r.c = e.Target.NewCache()
	defer r.c.Free()
	r.c.Reserve(len(req.Prompt) + req.MaxTokens)
	if err := e.prefillPrompt(ctx, req.Prompt, req.PrefixMarks, r.c, nil, &r.st); err != nil {
		return Result{FinishReason: FinishCancelled, Stats: r.st}, nil
	}
	r.keys = newKeys(r.sp)
	r.penalty = r.sp.RepetitionPenalty > 0 && r.sp.RepetitionPenalty != 1
	r.history = []int32{req.Prompt[len(req.Prompt)-1]}

	r.firstStep()
	defer func() { r.y.Free() }()
	for !r.o.done {
		if checkCancel(ctx, r.o) {
			break
		}
		cont, err := r.advance(emit)
		if err != nil {
			return Result{}, err
		}
		if !cont {
			break
		}
	}
	r.st.GeneratedTokens = len(r.o.tokens)
	finishStats(&r.st, r.firstTok, time.Now())
	if e.Prefix != nil && r.c.Offset() > len(req.Prompt) {
		// The caches hold the prompt and the first read tokens (history after the last
		// prompt token), the step in flight included.
		fed := append(append([]int32(nil), req.Prompt...), r.history[1:]...)
		e.saveCommitted(fed[:min(len(fed), r.c.Offset())], r.c, nil, nil)
	}
	return Result{Tokens: r.o.tokens, Text: r.o.text.String(), FinishReason: r.o.finish, Stats: r.st}, nil
}

// plainRun is one request's state in the plain decoding loop.
type plainRun struct {
	e       *Engine
	req     Request
	o       *output
	st      Stats
	c       model.Cache
	sp      sample.Params
	keys    *sample.Keys
	penalty bool
	history []int32
	// y is the lazy token [1] the host reads next (detached).
	y *mlxc.Array
	// start is when the request began; firstTok when its first token was read.
	start, firstTok time.Time
}

// step builds the next token (uint32 → int32 [1]) from a token array [1]; the result
// is detached (owned here) and the step's intermediates stay in the current scope.
func (r *plainRun) step(in *mlxc.Array) *mlxc.Array {
	out := r.e.Target.Forward(mlxc.Reshape(in, 1, 1), r.c, model.ForwardOptions{Logits: model.LogitsLast})
	logits := r.sp.PenaltyRows(mlxc.Reshape(out.Logits, 1, -1), lastN(r.history, 64), nil)
	tok := mlxc.Reshape(mlxc.AsType(r.sp.Draw(sample.LogProbs(logits), r.keys.Next()), mlxc.Int32), 1)
	return tok.Detach()
}

// firstStep starts the step after the last prompt token, so the loop always has a token
// in flight to read.
func (r *plainRun) firstStep() {
	s := mlxc.NewScope()
	r.y = r.step(mlxc.FromSlice([]int32{r.req.Prompt[len(r.req.Prompt)-1]}, 1))
	mlxc.AsyncEval(r.y)
	s.Close()
}

// stepAhead builds and starts the step after y before y is read, so the device runs it
// while the host waits; it returns nil when the penalty needs y's value first or y is the
// last token the budget allows.
func (r *plainRun) stepAhead() *mlxc.Array {
	if r.penalty || len(r.o.tokens)+1 >= r.req.MaxTokens {
		return nil
	}
	next := r.step(r.y)
	if r.req.Profile {
		countGraph(&r.st.StepNodes, &r.st.StepOps, next)
	}
	te := time.Now()
	mlxc.AsyncEval(next)
	if r.req.Profile {
		r.st.StepEncodeTime += time.Since(te)
	}
	return next
}

// advance reads token y, emits it and moves y to the following step (built after the read
// when it could not be built ahead); it reports whether decoding continues.
func (r *plainRun) advance(emit func(Event) error) (bool, error) {
	s := mlxc.NewScope()
	tb := time.Now()
	next := r.stepAhead()
	r.st.BuildTime += time.Since(tb)
	tw := time.Now()
	tok := mlxc.ToSlice[int32](r.y)[0]
	r.st.WaitTime += time.Since(tw)
	th := time.Now()
	if r.firstTok.IsZero() {
		r.firstTok = th
		r.st.FirstTokenTime = r.firstTok.Sub(r.start)
		r.st.PrefillTime = r.st.FirstTokenTime
	}
	r.history = append(r.history, tok)
	cont := r.o.push(tok)
	if err := emitPending(r.o, emit); err != nil {
		next.Free()
		s.Close()
		return false, err
	}
	if cont && next == nil {
		next = r.step(mlxc.FromSlice([]int32{tok}, 1))
		mlxc.AsyncEval(next)
	}
	s.Close()
	r.y.Free()
	r.y = next
	if !cont {
		return false, nil
	}
	r.st.HostTime += time.Since(th)
	if len(r.o.tokens)%256 == 0 {
		mlxc.ClearCache()
	}
	return true, nil
}
