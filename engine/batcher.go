package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// DefaultPrefillInterleave is the most prompt positions a joining sequence prefills
// between two decode steps of the rows already decoding: a long prompt then delays each
// running row's next token by about one such chunk instead of its whole prefill.
const DefaultPrefillInterleave = 256

// A chunk is further held to about prefillShare decode steps' time, at the rate the
// sequence's previous chunk ran (a position costs more the more keys it attends to, so a
// fixed count of positions would stall the rows longer and longer on a slow device), and
// never below minPrefillChunk positions, so the prefill always moves.
const (
	prefillShare    = 2
	minPrefillChunk = 16
)

// batcher admits sequences into the decoder: each prefills in its own caches (one at a
// time, first come first served, in chunks between the decode steps while rows decode,
// whole when none does) and then joins the decode step. Plain decoding of one request is
// a batcher with one sequence. It runs on the MLX thread.
type batcher struct {
	e *Engine
	d *decoder
	// maxRows bounds the sequences admitted (prefilling and decoding).
	maxRows int
	// interleave is the most prompt positions prefilled per tick while rows decode (0:
	// whole prompts).
	interleave int
	// prefilling are the admitted sequences still prefilling, in arrival order; ready
	// those prefilled that join at the next tick.
	prefilling, ready []*sequence
	// active are all admitted sequences until they are finished (prefilling, ready or
	// decoding).
	active []*sequence
	// finished, when set, is told of each sequence once it is done with the batcher.
	finished func(q *sequence)
	// stepTime is a moving average of a decode tick's time; chunkRate the positions per
	// second of the last interleaved prefill chunk (0: none yet).
	stepTime  time.Duration
	chunkRate float64
}

func (e *Engine) newBatcher(maxRows, interleave int) *batcher {
	b := &batcher{e: e, d: e.newDecoder(), interleave: interleave}
	b.maxRows = min(max(maxRows, 1), b.d.maxRows())
	switch {
	case interleave == 0:
		b.interleave = DefaultPrefillInterleave
	case interleave < 0:
		b.interleave = 0 // whole prompts, the rows waiting
	}
	return b
}

// room reports how many more sequences may be admitted.
func (b *batcher) room() int { return b.maxRows - len(b.active) }

// empty reports whether no sequence is admitted.
func (b *batcher) empty() bool { return len(b.active) == 0 && b.d.idle() }

// admit starts q's prefill; q must have passed validation. A sequence with nothing to
// generate is done at once.
func (b *batcher) admit(q *sequence) {
	b.active = append(b.active, q)
	if q.over() {
		return
	}
	q.c = b.e.Target.NewCache()
	q.c.Reserve(len(q.req.Prompt) + q.req.MaxTokens)
	q.pf = b.e.newPrefill(q.req.Prompt, q.req.PrefixMarks, q.c, nil, &q.st)
	b.prefilling = append(b.prefilling, q)
}

// iterate runs one chunk of the first prefill and one decode tick, then hands finished
// sequences to b.finished. An error fails the sequences it concerns and is returned only
// when the decoder's state is lost (every decoding row has then failed).
func (b *batcher) iterate() error {
	b.prefillSome()
	var joiners []*sequence
	for _, q := range b.ready {
		if q.over() {
			q.c.Free() // ended between its prefill and its first step
			q.c = nil
			continue
		}
		joiners = append(joiners, q)
	}
	b.ready = nil
	if !b.d.idle() || len(joiners) > 0 {
		t0 := time.Now()
		defer func() {
			if dt := time.Since(t0); b.stepTime == 0 {
				b.stepTime = dt
			} else {
				b.stepTime = (b.stepTime*7 + dt) / 8
			}
		}()
		if err := mlxc.Catch(func() {
			if err := b.d.tick(joiners); err != nil {
				panic(&mlxc.Error{Op: "decode step", Msg: err.Error()})
			}
		}); err != nil {
			b.failDecoding(err, joiners)
			b.collect()
			return err
		}
	}
	b.collect()
	return nil
}

// prefillSome runs the prefills: every waiting one whole when no row decodes (nobody
// waits for a token; they then join together), else one chunk of interleave positions of
// the first. A sequence that ends while prefilling
// (cancelled, or its prefill failed) leaves without joining.
func (b *batcher) prefillSome() {
	for len(b.prefilling) > 0 {
		q := b.prefilling[0]
		limit := 0
		if !b.d.idle() {
			limit = b.chunkLimit()
		}
		var runErr error
		if !q.over() {
			from, t0 := q.pf.pos, time.Now()
			if err := mlxc.Catch(func() { runErr = q.pf.run(q.ctx, limit) }); err != nil {
				q.err = fmt.Errorf("prefill: %w", err)
			}
			if dt := time.Since(t0); limit > 0 && q.pf.pos > from && dt > 0 {
				b.chunkRate = float64(q.pf.pos-from) / dt.Seconds()
			}
		}
		if runErr != nil || q.over() {
			// Cancelled (runErr is the context's) or failed.
			q.over()
			b.dropPrefill(q)
			continue
		}
		if !q.pf.done() {
			return
		}
		q.pf.finish()
		q.pf.free()
		q.pf = nil
		b.prefilling = b.prefilling[1:]
		b.ready = append(b.ready, q)
		if limit > 0 {
			return // one chunk per tick while rows decode
		}
	}
}

// chunkLimit is the positions of the next interleaved prefill chunk: up to interleave,
// and about prefillShare decode ticks' time at the last chunk's rate.
func (b *batcher) chunkLimit() int {
	if b.interleave == 0 {
		return 0
	}
	if b.chunkRate <= 0 || b.stepTime <= 0 {
		return min(b.interleave, 4*minPrefillChunk)
	}
	n := int(b.chunkRate * (prefillShare * b.stepTime).Seconds())
	return min(max(n, minPrefillChunk), b.interleave)
}

// dropPrefill removes the first prefilling sequence, freeing its caches.
func (b *batcher) dropPrefill(q *sequence) {
	b.prefilling = b.prefilling[1:]
	q.pf.free()
	q.pf = nil
	q.c.Free()
	q.c = nil
}

// failDecoding ends every decoding row and joiner with err after the decoder's state
// was lost.
func (b *batcher) failDecoding(err error, joiners []*sequence) {
	for _, q := range append(slices.Clone(b.d.rows), joiners...) {
		if q.err == nil {
			q.err = err
		}
		if q.c != nil && b.d.single != q {
			q.c.Free()
			q.c = nil
		}
	}
	b.d.free()
}

// collect hands the sequences that are done (over, and out of the decoder and the
// prefill) to b.finished.
func (b *batcher) collect() {
	b.active = slices.DeleteFunc(b.active, func(q *sequence) bool {
		if !q.over() || b.d.holds(q) || slices.Contains(b.prefilling, q) || slices.Contains(b.ready, q) {
			return false
		}
		if b.finished != nil {
			b.finished(q)
		}
		return true
	})
}

// free releases everything the batcher holds; sequences still admitted end cancelled.
func (b *batcher) free() {
	for _, q := range b.prefilling {
		q.pf.free()
	}
	for _, q := range append(b.prefilling, b.ready...) {
		q.c.Free()
		q.c = nil
	}
	b.prefilling, b.ready = nil, nil
	b.d.free()
	for _, q := range b.active {
		q.o.end(FinishCancelled)
	}
	b.collect()
}
