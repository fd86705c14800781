package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// The run-ahead loop (Engine.RunAhead): the plain DFlash loop reads each cycle's
// acceptance before it builds the next cycle, so the device idles while the host reads,
// streams and builds. Here cycle k+1 is built and enqueued from cycle k's outputs while
// they are still on the device — the accepted count and the next token as device arrays
// (verify.Verdict.Leading), the target block placed at a device-computed position
// (model.ForwardOptions.Pos), the drafter given all of the previous block's hidden rows and
// the device count of committed ones (draft.Drafter.ForwardAt) — and only then is cycle k
// read. The emitted tokens are the same; what changes is that the host's work overlaps
// the device's. Requests without repetition penalty, pure-attention targets; with
// temperature > 0 the random keys are drawn in the plain loop's order (each cycle's draft,
// then its verification), so a seeded request samples the same tokens in both loops.

// RunAheadFor reports whether the run-ahead loop serves requests without a repetition
// penalty under the setting sw (settings.Loop.RunAhead): Auto on a CUDA GPU only.
// On a CUDA GPU it is faster than the serial loop with the same tokens (see
// docs/perf/run-ahead.md). Not measured on Metal; on the CPU backend host and device share
// the cores, so there is little to overlap.
func RunAheadFor(sw settings.Switch) bool {
	switch sw {
	case settings.On:
		return true
	case settings.Off:
		return false
	}
	return mlxc.CurrentDevice().GPU && mlxc.Backend() == "cuda"
}

// aheadProposer is a proposer that can draft from device-side acceptance.
type aheadProposer interface {
	verify.Proposer
	ProposeAt(staged, ctx, valid *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) verify.Proposal
	SetContext(n int) error
	CacheOffset() int
}

// canRunAhead reports whether req uses the run-ahead loop: asked for and possible.
func (e *Engine) canRunAhead(req Request) bool {
	return e.RunAhead && e.runAheadRefusal(req) == ""
}

// runAheadRefusal says why req cannot use the run-ahead loop, "" when it can: the serial
// loop then runs and Stats.RunAheadFallback carries the reason.
func (e *Engine) runAheadRefusal(req Request) string {
	if _, ok := e.Proposer.(aheadProposer); !ok {
		return "the proposer cannot draft from a device-side count"
	}
	c := e.Target.NewCache()
	defer c.Free()
	if c.RunAhead() == nil {
		return "the target's caches cannot be placed at a device-side position"
	}
	// A repetition penalty reads the tokens committed so far, which the host does not know
	// yet when it builds the next cycle.
	if sp := req.Sampling; sp.RepetitionPenalty > 0 && sp.RepetitionPenalty != 1 {
		return "repetition penalty"
	}
	// A constraint's masks follow the committed tokens too.
	if req.Constraint != nil {
		return "constraint"
	}
	return ""
}

// aheadCycle is one enqueued cycle; its arrays are detached (owned here).
type aheadCycle struct {
	n       int         // drafts verified
	pos     int         // target position of the block's first row (host; set once the previous cycle is read)
	drafts  *mlxc.Array // int32 [n] (nil when n = 0)
	v       verify.Verdict
	acc     *mlxc.Array // int32 [1]: accepted drafts (device)
	tok     *mlxc.Array // int32 [1]: the token after them (device)
	hidden  *mlxc.Array // the block's tapped rows [1, n+1, ·]
	replayA int         // ReplayAccept's count, or -1
}

func (c *aheadCycle) free() {
	if c == nil {
		return
	}
	for _, a := range []*mlxc.Array{c.drafts, c.v.Next, c.v.Accept, c.acc, c.tok, c.hidden} {
		a.Free()
	}
}

// dflashAhead is the run-ahead loop: each cycle is built and enqueued from the previous
// one's device-side results before the host reads them.
func (e *Engine) dflashAhead(ctx context.Context, req Request, emit func(Event) error) (Result, error) {
	mlxc.ResetPeakMemory()
	start := time.Now()
	e.budget(&req)
	r := &ahead{e: e, req: req, p: e.Proposer.(aheadProposer), sp: req.Sampling}
	r.B = blockSize(r.p, req)
	r.o = newOutput(req, e.Target.Arch().EOSTokenIDs)
	r.st = newDFlashStats(true, len(req.Prompt), r.B)
	r.policy = newBlockPolicy(e.BlockCosts, r.B)
	if req.MaxTokens == 0 {
		r.o.end(FinishLength)
		return Result{FinishReason: r.o.finish, Stats: r.st}, nil
	}
	r.c = e.Target.NewCache()
	defer r.c.Free()
	r.placed = r.c.RunAhead() // not nil: runAheadRefusal checked it
	r.c.Reserve(len(req.Prompt) + req.MaxTokens + 2*r.B)
	r.p.Begin()
	defer r.p.End()
	reserveContext(r.p, len(req.Prompt)+req.MaxTokens+2*r.B)
	if err := e.prefillPrompt(ctx, req.Prompt, req.PrefixMarks, r.c, r.p, &r.st); err != nil {
		return Result{FinishReason: FinishCancelled, Stats: r.st}, nil
	}
	r.taps = r.p.TapLayers()
	r.dctx = r.p.CacheOffset()
	r.keys = newKeys(r.sp)
	r.argmax = model.NewRowArgmax(e.settings().Kernels)
	defer r.argmax.Free()

	first := r.firstCycle()
	firstTok := time.Now()
	r.st.FirstTokenTime = firstTok.Sub(start)
	r.st.PrefillTime = r.st.FirstTokenTime
	r.staged = mlxc.ToSlice[int32](first.tok)[0]
	if e.Prefix != nil {
		r.fed = append([]int32(nil), req.Prompt...)
	}
	cont := r.o.push(r.staged) && !checkCancel(ctx, r.o)
	if err := emitPending(r.o, emit); err != nil {
		first.free()
		return Result{}, err
	}
	defer func() { r.pending.free(); r.next.free() }()
	if cont {
		tb := time.Now()
		r.pending = r.build(first, 0, r.draftsAfter(len(r.o.tokens)))
		r.pending.pos = first.pos + 1
		r.dctx++
		r.st.BuildTime += time.Since(tb)
	}
	first.free()

	for cont && r.pending != nil && !checkCancel(ctx, r.o) {
		r.buildAhead()
		a, tok, dtoks := r.read()
		var err error
		if cont, err = r.commit(a, tok, dtoks, emit); err != nil {
			return Result{}, err
		}
	}
	r.st.GeneratedTokens = len(r.o.tokens)
	finishStats(&r.st, firstTok, time.Now())
	return Result{Tokens: r.o.tokens, Text: r.o.text.String(), FinishReason: r.o.finish, Stats: r.st}, nil
}

// ahead is one request's state in the run-ahead loop.
type ahead struct {
	e      *Engine
	req    Request
	p      aheadProposer
	B      int          // the largest block
	policy *blockPolicy // the adaptive block size (nil: always B)
	o      *output
	st     Stats
	c      model.Cache
	placed cache.Placed // the caches' run-ahead capability
	taps   []int
	// dctx is where the next context rows go in the draft cache: all before are committed.
	dctx   int
	sp     sample.Params
	keys   *sample.Keys
	argmax *model.RowArgmax
	// pending is the cycle to read next; next the one built after it, if any.
	pending, next *aheadCycle
	// staged is the pending block's first token; fed the tokens whose positions the
	// target's caches hold, in order (kept for the prefix cache).
	staged int32
	fed    []int32
}

// verdict is the cycle's verification from the target's logits, as in the serial loop.
func (r *ahead) verdict(logits, drafts, probs *mlxc.Array) verify.Verdict {
	if r.sp.Greedy() {
		return verify.GreedyLogits(r.argmax, logits, drafts)
	}
	lp := sample.LogProbs(logits)
	if r.e.speculative != nil {
		return r.e.speculative(lp, drafts, probs, r.sp, r.keys)
	}
	return verify.Speculative(lp, drafts, probs, r.sp, r.keys)
}

// draftsAfter is the draft count of a cycle that follows `emitted` emitted tokens.
func (r *ahead) draftsAfter(emitted int) int {
	return min(r.policy.size(r.B)-1, r.req.MaxTokens-emitted-1)
}

// firstCycle runs the last prompt token alone, like plain decoding: a cycle of its own
// with no drafts, whose hidden row is the first cycle's new context.
func (r *ahead) firstCycle() *aheadCycle {
	first := &aheadCycle{replayA: -1}
	s := mlxc.NewScope()
	defer s.Close()
	last := mlxc.FromSlice([]int32{r.req.Prompt[len(r.req.Prompt)-1]}, 1, 1)
	out := r.e.Target.Forward(last, r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsLast})
	v := r.verdict(mlxc.Reshape(out.Logits, 1, -1), nil, nil)
	first.v.Next = v.Next.Detach()
	first.acc, first.tok = mlxc.FromSlice([]int32{0}, 1).Detach(), mlxc.Reshape(v.Next, 1).Detach()
	first.hidden = out.Hidden.Detach()
	first.pos = r.c.Offset() - 1
	mlxc.Eval(first.tok, first.hidden)
	return first
}

// build enqueues the cycle after prev: its drafter appends prev's hidden rows at dctx, of
// which acc+1 are committed, and drafts after them; its verify block starts at
// prev.pos+acc+1. acc is prev's device count, or known ≥ 0 when the host has read it.
func (r *ahead) build(prev *aheadCycle, known, n int) *aheadCycle {
	t0 := time.Now()
	s := mlxc.NewScope()
	defer s.Close()
	acc, tok := prev.acc, prev.tok
	if known >= 0 {
		acc = mlxc.FromSlice([]int32{int32(known)}, 1)
		tok = mlxc.Take(prev.v.Next, acc, 0)
	}
	valid := mlxc.Add(acc, mlxc.FromSlice([]int32{1}, 1))
	if err := r.p.SetContext(r.dctx); err != nil {
		panic(&mlxc.Error{Op: "dflash run-ahead", Msg: err.Error()})
	}
	prop := r.p.ProposeAt(tok, prev.hidden, valid, n, r.sp, r.keys)
	ids := mlxc.Reshape(tok, 1, 1)
	if n > 0 {
		ids = mlxc.Concatenate([]*mlxc.Array{ids, mlxc.Reshape(prop.Tokens, 1, n)}, 1)
	}
	pos := mlxc.Add(mlxc.FromSlice([]int32{int32(prev.pos)}, 1), valid)
	window := prev.pos + prev.n + 1 + n + 1 // pos ≤ prev.pos+prev.n+1
	out := r.e.Target.Forward(ids, r.c, model.ForwardOptions{Taps: r.taps, Logits: model.LogitsAll, Pos: pos, Window: window})
	v := r.verdict(mlxc.Reshape(out.Logits, n+1, -1), prop.Tokens, prop.Probs)
	cy := &aheadCycle{n: n, pos: -1, replayA: -1}
	cy.acc, cy.tok = v.Leading()
	if r.e.ReplayAccept != nil && n > 0 {
		cy.replayA = min(max(r.e.ReplayAccept(n), 0), n)
		cy.acc = mlxc.FromSlice([]int32{int32(cy.replayA)}, 1)
		cy.tok = mlxc.Take(v.Next, cy.acc, 0)
	}
	cy.v = verify.Verdict{Next: v.Next.Detach(), Accept: v.Accept}
	cy.v.Accept.Detach()
	cy.drafts = prop.Tokens.Detach()
	cy.acc.Detach()
	cy.tok.Detach()
	cy.hidden = out.Hidden.Detach()
	r.enqueue(cy, time.Since(t0))
	return cy
}

// enqueue starts a built cycle on the device (or, profiling, runs it alone); built is the
// time its graph took.
func (r *ahead) enqueue(cy *aheadCycle, built time.Duration) {
	evalList := append(cy.v.Arrays(), cy.acc, cy.tok, cy.hidden)
	if cy.drafts != nil {
		evalList = append(evalList, cy.drafts)
	}
	switch {
	case r.req.Profile:
		profileCycle(&r.st, r.e.settings().Diagnostics.GraphDump, evalList, cy.drafts, built)
	case r.e.aheadMode == "eval":
		mlxc.Eval(evalList...)
	default:
		mlxc.AsyncEval(evalList...)
	}
}

// buildAhead builds the next cycle before the pending one is read when a full block fits
// the token budget even if the pending one accepts everything; near the end it is built
// after reading, with the exact budget (the serial loop's blocks, so replayed runs match
// it too).
func (r *ahead) buildAhead() {
	tb := time.Now()
	if n := r.draftsAfter(len(r.o.tokens) + r.pending.n + 1); n >= r.policy.size(r.B)-1 && n >= 1 && r.e.aheadMode != "late" {
		r.next = r.build(r.pending, -1, n)
	}
	r.st.BuildTime += time.Since(tb)
}

// read waits for the pending cycle: its accepted count, the token after them, its drafts.
func (r *ahead) read() (a int, tok int32, dtoks []int32) {
	tw := time.Now()
	a = r.pending.replayA
	if a < 0 {
		a = int(mlxc.ToSlice[int32](r.pending.acc)[0])
	}
	tok = mlxc.ToSlice[int32](r.pending.tok)[0]
	if r.pending.n > 0 {
		dtoks = mlxc.ToSlice[int32](r.pending.drafts)
	}
	r.st.WaitTime += time.Since(tw)
	return a, tok, dtoks
}

// commit keeps the pending cycle's a+1 rows in the target caches, emits its tokens, builds
// the next cycle from the count just read when it was not built ahead, and moves on to
// it; it reports whether to go on.
func (r *ahead) commit(a int, tok int32, dtoks []int32, emit func(Event) error) (bool, error) {
	th := time.Now()
	st, o, pending := &r.st, r.o, r.pending
	st.Cycles++
	st.Drafted += pending.n
	st.Accepted += a
	st.AcceptHist[a]++
	countDrafts(st, pending.n, a)
	r.policy.observe(pending.n, a)
	if err := r.placed.SetOffset(pending.pos + a + 1); err != nil {
		return false, err
	}
	if r.fed != nil {
		r.fed = append(append(r.fed, r.staged), dtoks[:a]...)
	}
	r.staged = tok
	cont := true
	for _, t := range append(dtoks[:a:a], tok) {
		if !cont {
			break
		}
		cont = o.push(t)
	}
	var built time.Duration
	if cont && r.next == nil {
		// Too close to the token budget to run ahead: build from the count just read.
		tb := time.Now()
		if n := r.draftsAfter(len(o.tokens)); n >= 0 {
			r.next = r.build(pending, a, n)
		}
		built = time.Since(tb)
		st.BuildTime += built
	}
	if r.next != nil {
		r.next.pos = pending.pos + a + 1
		r.dctx += a + 1 // building next appended pending's rows; a+1 of them are committed
	}
	if r.e.afterCycle != nil && cont {
		if err := r.p.SetContext(r.dctx); err != nil {
			return false, err
		}
		all := append(append([]int32(nil), r.req.Prompt...), o.tokens[:len(o.tokens)-1]...)
		r.e.afterCycle(r.c, all)
	}
	if !cont {
		r.saveEnd(pending)
	}
	if err := emitPending(o, emit); err != nil {
		return false, err
	}
	pending.free()
	r.pending, r.next = r.next, nil
	if st.Cycles%64 == 0 {
		mlxc.ClearCache()
	}
	st.HostTime += time.Since(th) - built
	return cont, nil
}

// saveEnd puts the state after the committed tokens into the prefix cache when the loop
// ends after pending: the draft cache is declared up to what is committed, and the rows
// of pending that no cycle built after it took in are given to it.
func (r *ahead) saveEnd(pending *aheadCycle) {
	if r.e.Prefix == nil || r.fed == nil || r.p.SetContext(r.dctx) != nil {
		return
	}
	s := mlxc.NewScope()
	defer s.Close()
	var rows *mlxc.Array
	if missing := len(r.fed) - r.dctx; missing > 0 {
		if pending.hidden == nil || missing > pending.hidden.Dim(1) {
			return
		}
		rows = mlxc.SliceAxis(pending.hidden, 1, 0, missing)
	}
	r.e.saveCommitted(r.fed, r.c, r.p, rows)
}

// profileCycle is the run-ahead loop's profile mode (Request.Profile), one cycle at a time
// with nothing overlapped: it counts the cycle's graph nodes (the drafter's, the rest as
// the verify's), then times the hand-over to MLX (async_eval: kernel encoding,
// CycleEncodeTime) and the wait for the device after it (VerifyTime: the part of the
// device's work that encoding did not cover). built is the graph construction's time,
// counted in BuildTime by the caller; the node walk is not timed.
func profileCycle(st *Stats, graphDump string, evalList []*mlxc.Array, drafts *mlxc.Array, built time.Duration) {
	draft := map[string]int{}
	if drafts != nil {
		draft = mlxc.GraphOps(drafts)
	}
	if st.DraftOps == nil {
		st.DraftOps, st.VerifyOps = map[string]int{}, map[string]int{}
	}
	for k, v := range mlxc.GraphOps(evalList...) {
		st.DraftOps[k] += draft[k]
		st.DraftNodes += draft[k]
		st.VerifyOps[k] += v - draft[k]
		st.VerifyNodes += v - draft[k]
	}
	if path := graphDump; path != "" && st.Cycles <= graphDumpCycle {
		dumpCycleGraph(path, evalList, drafts)
	}
	st.CycleConstructTime += built
	te := time.Now()
	mlxc.AsyncEval(evalList...)
	st.CycleEncodeTime += time.Since(te)
	tw := time.Now()
	mlxc.Eval(evalList...)
	st.VerifyTime += time.Since(tw)
}

// graphDumpCycle is the last cycle whose graph settings.Diagnostics.GraphDump writes (each overwrites
// the one before): past the first ones, whose shapes (no drafts yet, a short context) are
// not the steady state.
const graphDumpCycle = 8

// dumpCycleGraph writes one cycle's nodes (mlxc.GraphList) to path: the drafter's first,
// then the rest. A profiling aid; a failure to write is reported and otherwise ignored.
func dumpCycleGraph(path string, evalList []*mlxc.Array, drafts *mlxc.Array) {
	var b strings.Builder
	d := ""
	if drafts != nil {
		d = mlxc.GraphList(drafts)
	}
	fmt.Fprintf(&b, "# drafter: %d nodes\n%s", strings.Count(d, "\n"), d)
	all := mlxc.GraphList(evalList...)
	rest := make([]string, 0, 512)
	seen := map[string]int{}
	for _, l := range strings.Split(d, "\n") {
		seen[l]++
	}
	for _, l := range strings.Split(strings.TrimSuffix(all, "\n"), "\n") {
		if seen[l] > 0 {
			seen[l]--
			continue
		}
		rest = append(rest, l)
	}
	fmt.Fprintf(&b, "# the rest: %d nodes\n%s\n", len(rest), strings.Join(rest, "\n"))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "DFLASH_GRAPH_DUMP: %v\n", err)
	}
}
