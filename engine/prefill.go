package engine

import (
	"context"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// prefillJob is one prompt's prefill, run a chunk at a time so that a scheduler can put
// decode steps of other sequences between its chunks: all prompt tokens but the last go
// through the target (no logits), their tapped hidden rows to the proposer. The caller
// runs the last prompt token as the first decode-shaped step (as mlx-lm does).
//
// With the prefix cache the job first resumes from the longest cached prefix, marks the
// recurrent layers' states on the way (every MarkEvery positions and at the request's
// marks) and, when finished, puts the prompt's state into the cache.
type prefillJob struct {
	e      *Engine
	prompt []int32
	c      model.Cache
	p      verify.Proposer
	taps   []int
	pos    int // next position to run
	from   int // the position resumed from the prefix cache
	end    int // len(prompt) − 1
	// Prefix cache (usePrefix): the proposer's saver, where chunks must end, and the
	// marks saved so far.
	usePrefix bool
	saver     contextSaver
	every     int
	marksAt   []int
	marks     []prefixcache.Mark
}

// newPrefill starts the prefill of prompt into the empty caches c (and the proposer p's
// context, when p is set), resuming from the prefix cache when the engine has one; st
// counts the reused and the computed positions.
func (e *Engine) newPrefill(prompt []int32, marksAt []int, c model.Cache, p verify.Proposer, st *Stats) *prefillJob {
	j := &prefillJob{e: e, prompt: prompt, c: c, p: p, end: len(prompt) - 1}
	if p != nil {
		j.taps = p.TapLayers()
	}
	st.PrefillTokens = len(prompt)
	j.saver, j.usePrefix = e.prefixSaver(p)
	if !j.usePrefix {
		return j
	}
	s := mlxc.NewScope() // the load's intermediates (the caches keep what they hold)
	j.pos = e.resume(prompt, c, p, j.saver)
	s.Close()
	j.from = j.pos
	st.PromptCacheTokens, st.PrefillTokens = j.pos, len(prompt)-j.pos
	if !c.Trimmable() {
		// Attention layers resume anywhere; a recurrent layer's state only where saved.
		if j.every = e.Prefix.MarkEvery(); j.every > 0 {
			j.marksAt = sortedMarks(marksAt)
		}
	}
	return j
}

// prefillPrompt runs a whole prefill (newPrefill, run, finish).
func (e *Engine) prefillPrompt(ctx context.Context, prompt []int32, marksAt []int, c model.Cache, p verify.Proposer, st *Stats) error {
	j := e.newPrefill(prompt, marksAt, c, p, st)
	defer j.free()
	if err := j.run(ctx, 0); err != nil {
		return err
	}
	j.finish()
	return nil
}

// prefill runs all prompt tokens but the last through the target without the prefix cache.
func (e *Engine) prefill(ctx context.Context, prompt []int32, c model.Cache, p verify.Proposer) error {
	j := &prefillJob{e: e, prompt: prompt, c: c, p: p, end: len(prompt) - 1}
	if p != nil {
		j.taps = p.TapLayers()
	}
	return j.run(ctx, 0)
}

// done reports whether every position but the last has run.
func (j *prefillJob) done() bool { return j.pos >= j.end }

// run prefills up to limit more positions (0: all that are left), in chunks of at most
// PrefillChunk that also end where the prefix cache marks states.
func (j *prefillJob) run(ctx context.Context, limit int) error {
	stop := j.end
	if limit > 0 {
		stop = min(j.end, j.pos+limit)
	}
	for j.pos < stop {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(PrefillChunk, stop-j.pos)
		if j.every > 0 {
			k = min(k, (j.pos/j.every+1)*j.every-j.pos)
		}
		for len(j.marksAt) > 0 && j.marksAt[0] <= j.pos {
			j.marksAt = j.marksAt[1:]
		}
		if len(j.marksAt) > 0 {
			k = min(k, j.marksAt[0]-j.pos)
		}
		s := mlxc.NewScope()
		out := j.e.Target.Forward(mlxc.FromSlice(j.prompt[j.pos:j.pos+k], 1, k), j.c, model.ForwardOptions{Taps: j.taps, Logits: model.LogitsNone})
		if j.p != nil {
			j.p.Context(out.Hidden)
		}
		evalCache(j.c, out.Hidden)
		j.pos += k
		if j.pos < j.end && j.markHere() {
			if st, err := j.c.SaveFixed(j.pos); err == nil {
				mlxc.Eval(cache.SavedArrays(st)...)
				j.marks = append(j.marks, prefixcache.Mark{Pos: j.pos, Target: st})
			}
		}
		s.Close()
	}
	return nil
}

// markHere reports whether the prefix cache keeps the recurrent state at the current
// position (a multiple of MarkEvery, or a mark the request asked for).
func (j *prefillJob) markHere() bool {
	if j.every == 0 {
		return false
	}
	return j.pos%j.every == 0 || (len(j.marksAt) > 0 && j.marksAt[0] == j.pos)
}

// finish puts the prompt's state into the prefix cache (when the engine has one and the
// job computed anything past the resumed prefix).
func (j *prefillJob) finish() {
	if !j.usePrefix || !j.done() || j.end <= j.from {
		return
	}
	s := mlxc.NewScope() // the copies' intermediates (the entry's arrays are its own)
	defer s.Close()
	ent := j.e.entry(j.prompt[:j.end], j.c, j.saver, j.p != nil)
	if ent == nil {
		return
	}
	ent.Marks, j.marks = j.marks, nil
	j.e.Prefix.Insert(ent)
}

// free releases the marks the prefix cache did not take.
func (j *prefillJob) free() {
	for _, m := range j.marks {
		cache.FreeSaved(m.Target)
	}
	j.marks = nil
}
