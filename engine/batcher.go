package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// DefaultPrefillSlice is how long a joining sequence's prefill may hold the rows already
// decoding between two of their steps. A prompt that the measured prefill rate puts within
// the slice runs whole (a GPU prefills thousands of positions in that time, and splitting
// them would cost the newcomer many times its prefill in per-chunk overhead and, on CUDA,
// new kernels for each shape); a longer one runs in chunks that fit it.
const DefaultPrefillSlice = 250 * time.Millisecond

// minPrefillChunk is the smallest interleaved chunk, so the prefill always moves; chunks
// are powers of two, so a device sees few chunk shapes.
const minPrefillChunk = 16

// batcher admits sequences into the decoder: each prefills in its own caches (one at a
// time, first come first served, in chunks between the decode steps while rows decode,
// whole when none does) and then joins the decode step. Plain decoding of one request is
// a batcher with one sequence. It runs on the MLX thread.
type batcher struct {
	e *Engine
	d *decoder
	// maxRows bounds the sequences admitted (prefilling and decoding).
	maxRows int
	// slice is the most time a prefill may hold the decoding rows per tick (0: whole
	// prompts, the rows waiting).
	slice time.Duration
	// fixedChunk, when set, is the prefill chunk while rows decode, in positions, in place
	// of the slice's measured one (ranks in lockstep must chunk alike).
	fixedChunk int
	// prefilling are the admitted sequences still prefilling, in arrival order; ready
	// those prefilled that join at the next tick.
	prefilling, ready []*sequence
	// active are all admitted sequences until they are finished (prefilling, ready or
	// decoding).
	active []*sequence
	// finished, when set, is told of each sequence once it is done with the batcher.
	finished func(q *sequence)
	// prefilled and prefillTime are the positions prefilled and the time they took,
	// decayed (the prefill rate; whole prefills weigh most).
	prefilled   float64
	prefillTime time.Duration
}

func (e *Engine) newBatcher(maxRows int, slice time.Duration) *batcher {
	b := &batcher{e: e, d: e.newDecoder(), slice: slice}
	b.maxRows = min(max(maxRows, 1), b.d.maxRows())
	switch {
	case slice == 0:
		b.slice = DefaultPrefillSlice
	case slice < 0:
		b.slice = 0 // whole prompts, the rows waiting
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
	var p verify.Proposer
	if q.dr != nil {
		n := len(q.req.Prompt) + q.req.MaxTokens + q.dr.maxW
		q.c.Reserve(n)
		q.dr.begin(n)
		p = q.dr.p
	} else {
		q.c.Reserve(len(q.req.Prompt) + q.req.MaxTokens)
	}
	q.pf = b.e.newPrefill(q.req.Prompt, q.req.PrefixMarks, q.c, p, &q.st)
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
// waits for a token; they then join together), else one slice's worth of the first. A sequence that ends while prefilling
// (cancelled, or its prefill failed) leaves without joining.
func (b *batcher) prefillSome() {
	for len(b.prefilling) > 0 {
		q := b.prefilling[0]
		limit := 0
		if !b.d.idle() {
			limit = b.chunkLimit(q.pf.end - q.pf.pos)
		}
		var runErr error
		if !q.over() {
			from, t0 := q.pf.pos, time.Now()
			if err := mlxc.Catch(func() { runErr = q.pf.run(q.ctx, limit) }); err != nil {
				q.err = fmt.Errorf("prefill: %w", err)
			}
			b.countPrefill(q.pf.pos-from, time.Since(t0))
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
			return // one slice per tick while rows decode
		}
	}
}

// chunkLimit is the positions of the next prefill chunk while rows decode, of a prompt
// with left positions still to run: 0 (all of them) when the measured rate runs them
// within the slice, else the largest power of two that it runs within the slice (at
// least minPrefillChunk). Before any prefill was timed, minPrefillChunk·4.
func (b *batcher) chunkLimit(left int) int {
	if b.fixedChunk > 0 {
		if left <= b.fixedChunk {
			return 0
		}
		return b.fixedChunk
	}
	if b.slice == 0 {
		return 0
	}
	if b.prefillTime <= 0 {
		return min(4*minPrefillChunk, left)
	}
	fit := int(b.prefilled / b.prefillTime.Seconds() * b.slice.Seconds())
	if fit >= left {
		return 0
	}
	n := minPrefillChunk
	for n*2 <= fit {
		n *= 2
	}
	return n
}

// countPrefill adds a prefill run of n positions that took dt to the measured rate,
// older runs weighing less.
func (b *batcher) countPrefill(n int, dt time.Duration) {
	if n <= 0 || dt <= 0 {
		return
	}
	b.prefilled = b.prefilled*0.75 + float64(n)
	b.prefillTime = b.prefillTime*3/4 + dt
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
		q.dr.release()
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
