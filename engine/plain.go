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
	a := e.Target.Arch()
	o := newOutput(req, a.EOSTokenIDs)
	st := Stats{Mode: "plain", PromptTokens: len(req.Prompt)}
	if req.MaxTokens == 0 {
		o.end(FinishLength)
		return Result{FinishReason: o.finish, Stats: st}, nil
	}
	c := e.Target.NewCache()
	defer c.Free()
	c.Reserve(len(req.Prompt) + req.MaxTokens)
	if err := e.prefill(ctx, req.Prompt, c, nil); err != nil {
		return Result{FinishReason: FinishCancelled, Stats: st}, nil
	}
	keys := newKeys(req.Sampling)
	sp := req.Sampling
	penalty := sp.RepetitionPenalty > 0 && sp.RepetitionPenalty != 1
	history := []int32{req.Prompt[len(req.Prompt)-1]}
	// step builds the next token (uint32 → int32 [1]) from a token array [1]; the result
	// is detached (owned here) and the step's intermediates stay in the current scope.
	step := func(in *mlxc.Array) *mlxc.Array {
		out := e.Target.Forward(mlxc.Reshape(in, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
		logits := sp.PenaltyRows(mlxc.Reshape(out.Logits, 1, -1), lastN(history, 64), nil)
		tok := mlxc.Reshape(mlxc.AsType(sp.Draw(sample.LogProbs(logits), keys.Next()), mlxc.Int32), 1)
		return tok.Detach()
	}

	s := mlxc.NewScope()
	y := step(mlxc.FromSlice([]int32{req.Prompt[len(req.Prompt)-1]}, 1))
	mlxc.AsyncEval(y)
	s.Close()
	defer func() { y.Free() }()
	var firstTok time.Time
	for !o.done {
		if checkCancel(ctx, o) {
			break
		}
		s := mlxc.NewScope()
		tb := time.Now()
		var next *mlxc.Array
		if !penalty && len(o.tokens)+1 < req.MaxTokens {
			next = step(y)
			if req.Profile {
				countGraph(&st.StepNodes, &st.StepOps, next)
			}
			te := time.Now()
			mlxc.AsyncEval(next)
			if req.Profile {
				st.StepEncodeTime += time.Since(te)
			}
		}
		st.BuildTime += time.Since(tb)
		tw := time.Now()
		tok := mlxc.ToSlice[int32](y)[0]
		st.WaitTime += time.Since(tw)
		th := time.Now()
		if firstTok.IsZero() {
			firstTok = th
			st.FirstTokenTime = firstTok.Sub(start)
			st.PrefillTime = st.FirstTokenTime
		}
		history = append(history, tok)
		cont := o.push(tok)
		if err := emitPending(o, emit); err != nil {
			next.Free()
			s.Close()
			return Result{}, err
		}
		if cont && next == nil {
			next = step(mlxc.FromSlice([]int32{tok}, 1))
			mlxc.AsyncEval(next)
		}
		s.Close()
		y.Free()
		y = next
		if !cont {
			break
		}
		st.HostTime += time.Since(th)
		if len(o.tokens)%256 == 0 {
			mlxc.ClearCache()
		}
	}
	st.GeneratedTokens = len(o.tokens)
	finishStats(&st, firstTok, time.Now())
	return Result{Tokens: o.tokens, Text: o.text.String(), FinishReason: o.finish, Stats: st}, nil
}
