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
	B, err := e.probeBlock(prompt, cycles)
	if err != nil {
		return res, err
	}
	r := &probeRun{e: e, ctx: ctx, p: e.Proposer, B: B, cycles: cycles}
	var probeErr error
	err = mlxc.Catch(func() { probeErr = r.measure(prompt, &res) })
	if err != nil {
		return res, err
	}
	return res, probeErr
}

// probeBlock checks that the probe can run on prompt and returns the proposer's block.
func (e *Engine) probeBlock(prompt []int32, cycles int) (int, error) {
	p := e.Proposer
	if p == nil {
		return 0, fmt.Errorf("pipeline probe: no drafter loaded")
	}
	if len(prompt) == 0 || cycles < 1 {
		return 0, fmt.Errorf("pipeline probe: need a prompt and at least one cycle")
	}
	B := p.BlockSize()
	if B < 2 {
		return 0, fmt.Errorf("pipeline probe: block size %d leaves no drafts", B)
	}
	if len(prompt)+2*B > e.ContextLen() {
		return 0, fmt.Errorf("pipeline probe: %w", ErrPromptTooLong)
	}
	return B, nil
}

// probeRun is one probe's state: the cache, the staged token and the fixed drafts that
// every cycle re-verifies at the same position.
type probeRun struct {
	e      *Engine
	ctx    context.Context
	p      verify.Proposer
	B      int
	cycles int
	c      model.Cache
	sp     sample.Params
	keys   *sample.Keys
	taps   []int
	argmax *model.RowArgmax
	staged int32
	// fixed are the first draft's tokens (detached), the drafts of the verify-only blocks.
	fixed *mlxc.Array
}

// measure prefills, stages the first draft, then times the full cycles and the verify
// blocks; it runs inside mlxc.Catch, so a failed op panics out of it.
func (r *probeRun) measure(prompt []int32, res *PipelineProbe) error {
	r.c = r.e.Target.NewCache()
	defer r.c.Free()
	r.c.Reserve(len(prompt) + 2*r.B)
	r.p.Begin()
	defer r.p.End()
	if tc, ok := r.p.(verify.TokenContext); ok {
		// The probe's positions hold the prompt, then the last prompt token again (the
		// first step); only their costs are kept.
		tc.SetTokens(func(q int) (int32, bool) {
			if q >= 0 && q < len(prompt) {
				return prompt[q], true
			}
			return 0, false
		})
	}
	if err := r.e.prefill(r.ctx, prompt, r.c, r.p); err != nil {
		return err
	}
	r.keys = newKeys(r.sp)
	r.taps = r.p.TapLayers()
	r.argmax = model.NewRowArgmax(r.e.settings().Kernels)
	defer r.argmax.Free()
	r.firstDraft(prompt[len(prompt)-1])
	defer r.fixed.Free()
	wall, host := r.run(true)
	res.CycleMS, res.HostMS = r.per(wall), r.per(host)
	wall, host = r.run(false)
	res.VerifyMS, res.VerifyHostMS = r.per(wall), r.per(host)
	return r.ctx.Err()
}

// firstDraft runs the last prompt token as the first step and drafts from its hidden rows
// as the drafter's context; it stages the step's token and keeps the drafts as fixed.
func (r *probeRun) firstDraft(last int32) {
	s := mlxc.NewScope()
	out := r.e.Target.Forward(mlxc.FromSlice([]int32{last}, 1, 1), r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsLast})
	r.staged = mlxc.ToSlice[int32](mlxc.AsType(mlxc.Argmax(mlxc.Reshape(out.Logits, -1), -1, false), mlxc.Int32))[0]
	first := r.p.Propose(r.staged, r.c.Offset(), out.Hidden, r.B-1, r.sp, r.keys)
	r.fixed = first.Tokens.Detach()
	mlxc.Eval(r.fixed)
	s.Close()
}

// cycle builds one cycle's graph and enqueues it; none of its rows is kept, so the
// next cycle writes the same rows.
func (r *probeRun) cycle(withDraft bool) *mlxc.Array {
	drafts := r.fixed
	if withDraft {
		drafts = r.p.Propose(r.staged, r.c.Offset(), nil, r.B-1, r.sp, r.keys).Tokens
	}
	ids := mlxc.Concatenate([]*mlxc.Array{mlxc.FromSlice([]int32{r.staged}, 1, 1), mlxc.Reshape(drafts, 1, r.B-1)}, 1)
	r.c.Speculate()
	o := r.e.Target.Forward(ids, r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsAll, KeyBucket: r.e.KeyBucket, RowwiseAttention: r.e.RowwiseVerify})
	v := verify.GreedyLogits(r.argmax, mlxc.Reshape(o.Logits, r.B, -1), drafts)
	last := v.Next.Detach()
	mlxc.AsyncEval(append(v.Arrays(), drafts)...)
	if err := r.c.Commit(nil); err != nil {
		panic(&mlxc.Error{Op: "pipeline probe", Msg: err.Error()})
	}
	return last
}

// run times cycles pipelined cycles after two synced ones, reading nothing until the
// last is enqueued; host is the part of the wall time spent building and encoding.
func (r *probeRun) run(withDraft bool) (wall, host time.Duration) {
	var pending []*mlxc.Array
	defer func() {
		for _, a := range pending {
			a.Free()
		}
	}()
	for w := 0; w < 2; w++ { // warm-up: kernels compiled, buffers allocated
		s := mlxc.NewScope()
		last := r.cycle(withDraft)
		mlxc.Eval(last)
		last.Free()
		s.Close()
	}
	start := time.Now()
	for i := 0; i < r.cycles && r.ctx.Err() == nil; i++ {
		s := mlxc.NewScope()
		tb := time.Now()
		pending = append(pending, r.cycle(withDraft))
		host += time.Since(tb)
		s.Close()
	}
	mlxc.Eval(pending...)
	return time.Since(start), host
}

// per is a duration spread over the probe's cycles, in milliseconds.
func (r *probeRun) per(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000 / float64(r.cycles)
}
