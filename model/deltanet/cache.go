package deltanet

import (
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// Cache is one GatedDeltaNet layer's state: the conv tail (the last K−1 raw projection
// rows, in the input dtype) and the recurrent state (float32) after Offset positions. A
// recurrent state cannot drop positions, so the layer is no cache.Trimmer: it rolls back
// only through Speculate and Commit (snapshot, tape, replay), and in the run-ahead loop
// through placed blocks settled by SetOffset.
type Cache struct {
	offset int
	// state and tail are the state after offset positions; nil before the first forward
	// (zeros, as mlx-lm starts).
	state, tail *mlxc.Array

	// Serial speculation: tentative from Speculate to Commit; spec is the tentative
	// forwards' record once one ran, base the offset before them.
	tentative bool
	base      int
	spec      *record

	// Run-ahead: placed is the newest block placed at a device position, sincePlaced the
	// number of blocks placed since the last SetOffset that settled them.
	placed      *block
	sincePlaced int

	// kern runs the replays: the kernels of the mixer that last applied to this cache (nil:
	// the ops path, the same states).
	kern *Kernels
}

// record is what a tentative forward keeps: the state and tail it started from, its tape
// and its conv's input rows (the start tail, then its raw projection rows), from which the
// state and tail after any prefix of it are rebuilt exactly.
type record struct {
	state, tail *mlxc.Array
	tape        Tape
	rows        *mlxc.Array // [B, K−1+T, C]: concat(tail, qkv)
}

func (r *record) free() {
	if r == nil {
		return
	}
	r.state.Free()
	r.tail.Free()
	r.tape.Free()
	r.rows.Free()
}

func (r *record) bytes() int64 {
	var n int64
	for _, a := range []*mlxc.Array{r.state, r.tail, r.tape.Delta, r.tape.K, r.tape.G, r.rows} {
		if a != nil {
			n += int64(a.NBytes())
		}
	}
	return n
}

// at returns the state and tail after the first n rows of the record (host count),
// replayed through kn.
func (r *record) at(kn *Kernels, n int) (state, tail *mlxc.Array) {
	k := r.tail.Dim(1)
	return kn.Replay(r.state, r.tape, n), mlxc.Contiguous(mlxc.SliceAxis(r.rows, 1, n, n+k))
}

// atDevice returns the state and tail after the first count rows of the record, count an
// int32 [1] array on the device, replayed through kn.
func (r *record) atDevice(kn *Kernels, count *mlxc.Array) (state, tail *mlxc.Array) {
	return kn.ReplayAt(r.state, r.tape, count), mlxc.SliceDynamic(r.rows, count, []int{1}, r.tail.Shape())
}

// block is a forward placed at a device position: the record plus its start position on
// the device, and on the host once known (-1 until then).
type block struct {
	record
	pos  *mlxc.Array
	host int
}

func (b *block) free() {
	if b != nil {
		b.record.free()
		b.pos.Free()
	}
}

// The recurrent layer's contract: a Layer that can be placed, but not trimmed.
var (
	_ cache.Layer  = (*Cache)(nil)
	_ cache.Placed = (*Cache)(nil)
)

// NewCache makes an empty layer cache.
func NewCache() *Cache { return &Cache{} }

// Offset is the number of positions the state has taken in (tentative ones included
// until Commit, as a KV layer counts its rows).
func (c *Cache) Offset() int { return c.offset }

// State returns the conv tail and the recurrent state after Offset positions (nil, nil
// for an empty cache); in the run-ahead loop that is the state SetOffset last declared.
// The arrays belong to the cache.
func (c *Cache) State() (tail, state *mlxc.Array) { return c.tail, c.state }

// set replaces the current state and tail, taking ownership of the new arrays.
func (c *Cache) set(state, tail *mlxc.Array) {
	state.Detach()
	tail.Detach()
	c.state.Free()
	c.tail.Free()
	c.state, c.tail = state, tail
}

// dropPlaced forgets the placed blocks (a serial forward or a restore supersedes them).
func (c *Cache) dropPlaced() {
	c.placed.free()
	c.placed, c.sincePlaced = nil, 0
}

// Speculate marks the next forward as tentative: it records its starting state, tape and
// rows so that Commit can keep any prefix of it.
func (c *Cache) Speculate() {
	c.spec.free()
	c.spec, c.tentative, c.base = nil, true, c.offset
}

// Commit keeps the first len(keep) rows of the tentative forwards (keep must be 0..n−1):
// all of them keeps the end state; fewer restores the snapshot and replays that many
// steps of the tape, and rebuilds the tail from the snapshot's tail and the kept rows.
func (c *Cache) Commit(keep []int) error {
	if !c.tentative {
		return errors.New("deltanet cache: commit without speculate")
	}
	if !cache.IsPrefix(keep) {
		return fmt.Errorf("deltanet cache: can keep only a prefix of the tentative rows, not %v", keep)
	}
	n, written := len(keep), c.offset-c.base
	if n > written {
		return fmt.Errorf("deltanet cache: cannot keep %d of %d tentative rows", n, written)
	}
	if c.spec != nil && n < written {
		if err := c.rebuild(c.spec, n); err != nil {
			return err
		}
	}
	c.spec.free()
	c.spec, c.tentative, c.offset = nil, false, c.base+n
	return nil
}

// SetOffset declares the first n positions committed after forwards placed at device
// positions. The run-ahead loop places block c+1 at the position block c's accepted count
// gives, and only then declares that position: so with two or more blocks placed since the
// last SetOffset, the newest one starts at n and its start state is the committed one (no
// device work); with one, n lies within it, and its state after n − start rows is rebuilt
// from its tape.
func (c *Cache) SetOffset(n int) error {
	if c.placed == nil || c.sincePlaced == 0 {
		if n != c.offset {
			return fmt.Errorf("deltanet cache: cannot set offset %d: no forward was placed since offset %d", n, c.offset)
		}
		return nil
	}
	if n < c.offset {
		return fmt.Errorf("deltanet cache: cannot set offset %d below the committed %d", n, c.offset)
	}
	b := c.placed
	if c.sincePlaced == 1 {
		k := n - b.host
		if k < 0 || k > b.tape.Steps() {
			return fmt.Errorf("deltanet cache: offset %d is outside the block placed at %d with %d rows", n, b.host, b.tape.Steps())
		}
		if err := c.rebuild(&b.record, k); err != nil {
			return err
		}
		c.dropPlaced()
		c.offset = n
		return nil
	}
	c.set(b.state.Ref(), b.tail.Ref())
	b.host, c.sincePlaced, c.offset = n, 1, n
	return nil
}

// rebuild makes the state and tail after the first n rows of r the current ones; the
// intermediate arrays live in a scope of their own.
func (c *Cache) rebuild(r *record, n int) error {
	return mlxc.Catch(func() {
		sc := mlxc.NewScope()
		defer sc.Close()
		state, tail := r.at(c.kern, n)
		c.set(state, tail)
	})
}

// begin returns the state and tail a forward starts from (zeros of the given shapes for an
// empty cache), not owned by the caller. A placed forward after another starts where
// that one's rows up to pos end, computed on the device.
func (c *Cache) begin(pos *mlxc.Array, stateShape, tailShape []int, dt mlxc.Dtype) (state, tail *mlxc.Array) {
	if pos != nil && c.placed != nil {
		count := mlxc.Subtract(mlxc.AsType(mlxc.Reshape(pos, 1), mlxc.Int32), c.placed.pos)
		return c.placed.atDevice(c.kern, count)
	}
	if pos == nil {
		c.dropPlaced()
	}
	if c.state == nil {
		c.set(mlxc.Zeros(stateShape, mlxc.Float32), mlxc.Zeros(tailShape, dt))
	}
	if s, t := c.state.Shape(), c.tail.Shape(); !equal(s, stateShape) || !equal(t, tailShape) {
		fail("deltanet.apply", "cache holds state %v and tail %v, the layer needs %v and %v", s, t, stateShape, tailShape)
	}
	return c.state, c.tail
}

// recording reports whether the next forward must record a tape.
func (c *Cache) recording(pos *mlxc.Array) bool {
	if pos != nil && c.tentative {
		fail("deltanet.apply", "a forward placed at a device position cannot also be speculative")
	}
	return pos != nil || c.tentative
}

// end stores a forward's results: state and tail after its T rows (rows is the conv's
// input, startTail then the T raw projection rows), which started from start, startTail
// (as begin returned them) with the given tape when recording. A placed forward's tail is
// nil: the next forward rebuilds it from rows.
func (c *Cache) end(pos, rows, start, startTail, state, tail *mlxc.Array, tape Tape) {
	K1 := startTail.Dim(1)
	T := rows.Dim(1) - K1
	switch {
	case pos != nil:
		b := &block{record: record{state: start.Ref(), tail: startTail.Ref(), tape: detachTape(tape), rows: rows.Ref()}, pos: mlxc.AsType(mlxc.Reshape(pos, 1), mlxc.Int32).Detach(), host: -1}
		if c.placed == nil {
			b.host = c.offset // a first block starts at the committed end
		}
		c.placed.free()
		c.placed = b
		c.sincePlaced++
		state.Free()
		tail.Free()
	case c.tentative && c.spec == nil:
		c.spec = &record{state: start.Ref(), tail: startTail.Ref(), tape: detachTape(tape), rows: rows.Ref()}
		c.set(state, tail)
		c.offset += T
	case c.tentative:
		// A second tentative forward continues the tape: the snapshot stays the first one's.
		old := c.spec
		c.spec = &record{
			state: old.state, tail: old.tail,
			tape: detachTape(Tape{
				Delta: mlxc.Concatenate([]*mlxc.Array{old.tape.Delta, tape.Delta}, 1),
				K:     mlxc.Concatenate([]*mlxc.Array{old.tape.K, tape.K}, 1),
				G:     mlxc.Concatenate([]*mlxc.Array{old.tape.G, tape.G}, 1),
			}),
			rows: mlxc.Concatenate([]*mlxc.Array{old.rows, mlxc.SliceAxis(rows, 1, K1, K1+T)}, 1).Detach(),
		}
		old.tape.Free()
		old.rows.Free()
		c.set(state, tail)
		c.offset += T
	default:
		c.set(state, tail)
		c.offset += T
	}
}

func detachTape(t Tape) Tape {
	t.Delta.Detach()
	t.K.Detach()
	t.G.Detach()
	return t
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Arrays lists the buffers to evaluate with a step: the state and tail, and the newest
// placed block's starting ones.
func (c *Cache) Arrays() []*mlxc.Array {
	var out []*mlxc.Array
	if c.state != nil {
		out = append(out, c.state, c.tail)
	}
	if c.placed != nil {
		out = append(out, c.placed.state, c.placed.tail)
	}
	return out
}

// Bytes is the memory the cache's buffers hold (shared buffers counted once per holder).
func (c *Cache) Bytes() int64 {
	var n int64
	if c.state != nil {
		n += int64(c.state.NBytes() + c.tail.NBytes())
	}
	if c.spec != nil {
		n += c.spec.bytes()
	}
	if c.placed != nil {
		n += c.placed.bytes()
	}
	return n
}

// Free releases all buffers; the cache is empty afterwards.
func (c *Cache) Free() {
	c.spec.free()
	c.dropPlaced()
	c.state.Free()
	c.tail.Free()
	*c = Cache{}
}

// snapshot is a recurrent layer's saved state: its own handles of the state and tail.
type snapshot struct {
	state, tail *mlxc.Array
	offset      int
}

func (s *snapshot) Free() {
	s.state.Free()
	s.tail.Free()
	s.state, s.tail = nil, nil
}

// Snapshot captures the state after Offset positions (the committed one in the run-ahead
// loop). It shares the buffers, which no forward writes in place.
func (c *Cache) Snapshot() cache.Snapshot {
	s := &snapshot{offset: c.offset}
	if c.state != nil {
		s.state, s.tail = c.state.Ref(), c.tail.Ref()
	}
	return s
}

// Restore returns to a snapshot of this layer, ending any speculation or placed blocks.
func (c *Cache) Restore(s cache.Snapshot) error {
	ds, ok := s.(*snapshot)
	if !ok {
		return errors.New("deltanet cache: snapshot of another kind of layer")
	}
	c.spec.free()
	c.dropPlaced()
	c.spec, c.tentative = nil, false
	c.state.Free()
	c.tail.Free()
	c.state, c.tail = nil, nil
	if ds.state != nil {
		c.state, c.tail = ds.state.Ref(), ds.tail.Ref()
	}
	c.offset = ds.offset
	return nil
}

// recurrentKind names the recurrent layer's saved states.
const recurrentKind = "recurrent"

var _ cache.Saver = (*Cache)(nil)

// Save keeps the state and tail after all Offset positions (the committed ones in the
// run-ahead loop): a recurrent state cannot be had at an earlier position. It copies them
// (cache.OwnCopy): the tail is a slice of the last forward's conv input and the state may
// be one of a stacked output, views that would keep those whole buffers alive.
func (c *Cache) Save(n int) (cache.Saved, error) {
	if c.tentative {
		return cache.Saved{}, errors.New("deltanet cache: cannot save during a speculation")
	}
	if n != c.offset {
		return cache.Saved{}, fmt.Errorf("deltanet cache: a recurrent state is saved only at its offset %d, not %d", c.offset, n)
	}
	s := cache.Saved{Kind: recurrentKind, Offset: n}
	if c.state != nil {
		s.Arrays = []*mlxc.Array{cache.OwnCopy(c.state).Detach(), cache.OwnCopy(c.tail).Detach()}
	}
	return s, nil
}

// Load makes the empty layer hold s, whose offset n must be (the next forward checks the
// shapes against the layer's).
func (c *Cache) Load(s cache.Saved, n int) error {
	if s.Kind != recurrentKind {
		return fmt.Errorf("deltanet cache: cannot load a %q layer's state", s.Kind)
	}
	if c.state != nil || c.offset != 0 {
		return errors.New("deltanet cache: load into a layer that holds a state")
	}
	if n != s.Offset {
		return fmt.Errorf("deltanet cache: a recurrent state resumes only at its offset %d, not %d", s.Offset, n)
	}
	switch {
	case len(s.Arrays) == 2 && s.Arrays[0].Dtype() == mlxc.Float32 && s.Arrays[0].Ndim() == 4 && s.Arrays[1].Ndim() == 3:
		c.state, c.tail = s.Arrays[0].Ref(), s.Arrays[1].Ref()
	case len(s.Arrays) == 0 && n == 0:
	default:
		return errors.New("deltanet cache: saved state is not a float32 state [B, Hv, Dv, Dk] and a tail [B, K-1, C]")
	}
	c.offset = n
	return nil
}
