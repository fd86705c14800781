package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// PipelineProbe is how fast DFlash cycles go when the host never waits for the device: the
// same full-block cycle (draft, then verify of staged + B−1 drafts at one position) built
// and enqueued again and again with no read between cycles, so the host builds cycle r+1
// while the device runs cycle r. Per cycle, the wall time is then the larger of the host's
// time (graph building and encoding) and the device's; the real loop must read each
// cycle's acceptance before it can build the next, so its cycle is longer by the time the
// device sits idle meanwhile. The difference is what keeping the cycle's state on the
// device (offsets and acceptance as device arrays) would buy.
type PipelineProbe struct {
	Cycles int `json:"cycles"`
	// CycleMS: wall time per pipelined cycle; HostMS: of which the host spent building and
	// encoding (the device time is at least CycleMS when HostMS is clearly below it).
	CycleMS float64 `json:"cycle_ms"`
	HostMS  float64 `json:"host_ms"`
	// VerifyMS and VerifyHostMS: the same for verify blocks alone (fixed drafts).
	VerifyMS     float64 `json:"verify_ms"`
	VerifyHostMS float64 `json:"verify_host_ms"`
}

// ProbePipeline prefills prompt, then runs cycles pipelined cycles and as many pipelined
// verify blocks (after two of each to warm up). Greedy; needs a proposer. The outputs are
// not tokens of any generation (every cycle re-verifies the same position).
func (e *Engine) ProbePipeline(ctx context.Context, prompt []int32, cycles int) (PipelineProbe, error) {
	res := PipelineProbe{Cycles: cycles}
	p := e.Proposer
	if p == nil {
		return res, fmt.Errorf("pipeline probe: no drafter loaded")
	}
	if len(prompt) == 0 || cycles < 1 {
		return res, fmt.Errorf("pipeline probe: need a prompt and at least one cycle")
	}
	B := p.BlockSize()
	if B < 2 {
		return res, fmt.Errorf("pipeline probe: block size %d leaves no drafts", B)
	}
	if len(prompt)+2*B > e.ContextLen() {
		return res, fmt.Errorf("pipeline probe: %w", ErrPromptTooLong)
	}
	var probeErr error
	err := mlxc.Catch(func() {
		c := e.Target.NewCache()
		defer c.Free()
		c.Reserve(len(prompt) + 2*B)
		p.Begin()
		defer p.End()
		if probeErr = e.prefill(ctx, prompt, c, p); probeErr != nil {
			return
		}
		sp := sample.Params{}
		keys := newKeys(sp)
		taps := p.TapLayers()
		argmax := model.NewRowArgmax(e.settings().Kernels)
		defer argmax.Free()
		staged := prompt[len(prompt)-1]
		// The last prompt token as the first step, its hidden rows as the drafter's context.
		s := mlxc.NewScope()
		out := e.Target.Forward(mlxc.FromSlice([]int32{staged}, 1, 1), c, model.ForwardOptions{Taps: taps, Logits: model.LogitsLast})
		staged = mlxc.ToSlice[int32](mlxc.AsType(mlxc.Argmax(mlxc.Reshape(out.Logits, -1), -1, false), mlxc.Int32))[0]
		first := p.Propose(staged, c.Offset(), out.Hidden, B-1, sp, keys)
		fixed := first.Tokens.Detach()
		mlxc.Eval(fixed)
		s.Close()
		defer fixed.Free()

		// cycle builds one cycle's graph and enqueues it; none of its rows is kept, so the
		// next cycle writes the same rows.
		cycle := func(withDraft bool) *mlxc.Array {
			drafts := fixed
			if withDraft {
				drafts = p.Propose(staged, c.Offset(), nil, B-1, sp, keys).Tokens
			}
			ids := mlxc.Concatenate([]*mlxc.Array{mlxc.FromSlice([]int32{staged}, 1, 1), mlxc.Reshape(drafts, 1, B-1)}, 1)
			c.Speculate()
			o := e.Target.Forward(ids, c, model.ForwardOptions{Taps: taps, Logits: model.LogitsAll, KeyBucket: e.KeyBucket, RowwiseAttention: e.RowwiseVerify})
			v := verify.GreedyLogits(argmax, mlxc.Reshape(o.Logits, B, -1), drafts)
			last := v.Next.Detach()
			mlxc.AsyncEval(append(v.Arrays(), drafts)...)
			if err := c.Commit(nil); err != nil {
				panic(&mlxc.Error{Op: "pipeline probe", Msg: err.Error()})
			}
			return last
		}
		run := func(withDraft bool) (wall, host time.Duration) {
			var pending []*mlxc.Array
			defer func() {
				for _, a := range pending {
					a.Free()
				}
			}()
			for w := 0; w < 2; w++ { // warm-up: kernels compiled, buffers allocated
				s := mlxc.NewScope()
				last := cycle(withDraft)
				mlxc.Eval(last)
				last.Free()
				s.Close()
			}
			start := time.Now()
			for r := 0; r < cycles && ctx.Err() == nil; r++ {
				s := mlxc.NewScope()
				tb := time.Now()
				pending = append(pending, cycle(withDraft))
				host += time.Since(tb)
				s.Close()
			}
			mlxc.Eval(pending...)
			return time.Since(start), host
		}
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(cycles) }
		wall, host := run(true)
		res.CycleMS, res.HostMS = per(wall), per(host)
		wall, host = run(false)
		res.VerifyMS, res.VerifyHostMS = per(wall), per(host)
		probeErr = ctx.Err()
	})
	if err != nil {
		return res, err
	}
	return res, probeErr
}
