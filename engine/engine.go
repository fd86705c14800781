package engine

import (
	"context"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// PrefillChunk is mlx-lm's prefill_step_size: the same chunking reproduces its rounding.
const PrefillChunk = 2048

// Engine generates with a target model and, optionally, a proposer (the DFlash drafter).
type Engine struct {
	Target   model.Model
	Proposer verify.Proposer // nil: plain decoding only
	// ContextLength bounds prompt + generation; 0 = the model's max_position_embeddings.
	ContextLength int
	// KeyBucket pads the verify block's attention keys (model.ForwardOptions.KeyBucket);
	// model.KeyBucket(settings.Kernels) picks it for the backend.
	KeyBucket int
	// RowwiseVerify computes the verify block's attention row by row like decoding
	// (model.ForwardOptions.RowwiseAttention; GPU-exact mode turns it on).
	RowwiseVerify bool
	// Settings are the engine's kernel and diagnostic settings (the argmax kernels, the
	// graph dump); nil: settings.Default().
	Settings *settings.Settings

	// ReplayAccept, when set, overrides how many drafts a cycle accepts (benchmarks only).
	// Drafting, verification, rollback and commit all run for real, so the cycle cost is
	// the engine's true cost at the acceptance rate the function sets; the emitted tokens
	// are then NOT the model's output. Used by `bench --replay-drafts` to measure a
	// random-weight model at a known τ; results must be labelled as replayed.
	ReplayAccept func(n int) int

	// RunAhead builds each DFlash cycle from the previous one's results while they are still
	// on the device, reading a cycle only after the next is enqueued (ahead.go); requests
	// without repetition penalty. Same tokens, more overlap of host and device.
	RunAhead bool

	// Prefix, when set, resumes each request from the longest prefix of its prompt that the
	// cache holds, and adds what the request computed to it: the prompt, and the tokens
	// committed when a loop ends (prefix.go).
	Prefix *prefixcache.Cache

	// BlockCosts, when set, makes the DFlash block size adaptive: each cycle drafts the
	// block (up to the request's) whose expected tokens per cycle over its measured cost
	// is largest (blockPolicy). MeasureBlockCosts measures them. nil: every cycle drafts
	// the full block.
	BlockCosts *BlockCosts

	// afterCycle, when set (tests), sees the target cache after each DFlash cycle's
	// rollback together with the tokens committed so far (prompt + output − staged).
	afterCycle func(c model.Cache, committed []int32)
	// aheadMode, when set (tests, to tell a backend's fault from the loop's), changes how
	// the run-ahead loop overlaps: "late" builds each cycle only after reading the one
	// before (from the host's count), "eval" waits for each cycle right after building it.
	aheadMode string
	// speculative replaces verify.Speculative (tests inject a wrong rule to show that the
	// distribution test has power).
	speculative func(lp, drafts, probs *mlxc.Array, sp sample.Params, keys *sample.Keys) verify.Verdict
}

// settings returns e.Settings or, when unset, the defaults.
func (e *Engine) settings() *settings.Settings {
	if e.Settings == nil {
		d := settings.Default()
		return &d
	}
	return e.Settings
}

// ContextLen is the usable context.
func (e *Engine) ContextLen() int {
	if e.ContextLength > 0 {
		return e.ContextLength
	}
	return e.Target.Arch().MaxPositions
}

// Generate runs one request on the MLX thread, calling emit after every step or cycle that
// committed something. An error from emit stops the generation and is returned. Context
// cancellation ends the generation with FinishCancelled (checked once per step/cycle).
func (e *Engine) Generate(ctx context.Context, req Request, emit func(Event) error) (res Result, err error) {
	ctxLen := e.ContextLen()
	if err := req.validate(ctxLen); err != nil {
		return Result{}, err
	}
	before := mlxc.KernelCalls()
	defer func() { res.Stats.KernelCalls = callsSince(before) }()
	var genErr error
	if err := mlxc.Catch(func() {
		switch {
		case e.Proposer != nil && !req.NoDraft && e.canRunAhead(req):
			res, genErr = e.dflashAhead(ctx, req, emit)
		default:
			res, genErr = e.decodeOne(ctx, req, emit)
			if e.Proposer != nil && !req.NoDraft && e.RunAhead {
				res.Stats.RunAheadFallback = e.runAheadRefusal(req)
			}
		}
	}); err != nil {
		return Result{}, err
	}
	return res, genErr
}

// budget clamps max tokens to the context left after the prompt.
func (e *Engine) budget(req *Request) {
	req.MaxTokens = min(req.MaxTokens, e.ContextLen()-len(req.Prompt))
}

// reserveContext preallocates the proposer's context for n positions when it keeps one
// (verify.DFlash): a cache that regrows copies all its rows each time.
func reserveContext(p verify.Proposer, n int) {
	if r, ok := p.(interface{ Reserve(n int) }); ok {
		r.Reserve(n)
	}
}

// evalCache evaluates the cache buffers (and extra arrays) so a chunk's graph is freed.
func evalCache(c model.Cache, extra ...*mlxc.Array) {
	arrs := c.Arrays()
	for _, a := range extra {
		if a != nil {
			arrs = append(arrs, a)
		}
	}
	mlxc.Eval(arrs...)
}

func finishStats(st *Stats, firstTok, end time.Time) {
	st.DecodeTime = end.Sub(firstTok)
	if st.PrefillTime > 0 {
		// The positions computed, not those resumed from the prefix cache.
		n := st.PromptTokens
		if st.PrefillTokens > 0 {
			n = st.PrefillTokens
		}
		st.PromptTPS = float64(n) / st.FirstTokenTime.Seconds()
	}
	if st.DecodeTime > 0 && st.GeneratedTokens > 1 {
		// Tokens after the first over the time after the first: no overstatement.
		st.GenerationTPS = float64(st.GeneratedTokens-1) / st.DecodeTime.Seconds()
	}
	if st.Cycles > 0 {
		st.Tau = float64(st.Accepted+st.Cycles) / float64(st.Cycles)
	}
	st.PeakMemory = mlxc.PeakMemory()
}

func emitPending(o *output, emit func(Event) error) error {
	if ev, ok := o.take(); ok && emit != nil {
		return emit(ev)
	}
	return nil
}

func newKeys(sp sample.Params) *sample.Keys { return sample.NewKeys(sp.Seed) }

func lastN(toks []int32, n int) []int32 {
	if len(toks) > n {
		return toks[len(toks)-n:]
	}
	return toks
}

func checkCancel(ctx context.Context, o *output) bool {
	if ctx.Err() != nil {
		o.end(FinishCancelled)
		return true
	}
	return false
}

// callsSince is each custom kernel's calls since the counts before (nil for none): the
// kernels a generation ran.
func callsSince(before map[string]int64) map[string]int64 {
	var out map[string]int64
	for name, n := range mlxc.KernelCalls() {
		if d := n - before[name]; d > 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[name] = d
		}
	}
	return out
}
