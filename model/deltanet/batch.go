package deltanet

import (
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// BatchCache is one GatedDeltaNet layer's state for B sequences: the recurrent states
// [B, Hv, Dv, Dk] (float32) and conv tails [B, K−1, C] stacked on the row axis. The
// recurrence, the conv and the kernels treat rows independently, so a step over the
// stack is each row's own step. A step gives every row T positions, of which row r takes
// its count (ApplyRows): the positions past it are padding, whose steps the row's state
// never keeps; a row taking none keeps its state bit for bit.
type BatchCache struct {
	// step holds the stacked state and tail and is what Mixer.Apply runs on; its offset
	// means nothing here (lens are the rows' lengths). A step whose rows take different
	// counts runs tentatively on it (Cache.Speculate): its record (start state, tape, conv
	// rows) rebuilds each row's state after its own count.
	step Cache
	lens []int
	// counts are the positions each row may keep of an uncommitted tentative step (nil:
	// none pending).
	counts []int
}

var _ cache.BatchLayer = (*BatchCache)(nil)

// NewBatchCache makes a batched layer without rows.
func NewBatchCache() *BatchCache { return &BatchCache{} }

// Lens are the rows' lengths.
func (c *BatchCache) Lens() []int { return c.lens }

// State returns the stacked conv tails and recurrent states (nil, nil before any row
// holds one), owned by the cache.
func (c *BatchCache) State() (tail, state *mlxc.Array) { return c.step.tail, c.step.state }

// ensure gives every row a state when some row first brings one (rows that joined empty
// start from zeros, as an empty single-sequence cache does).
func (c *BatchCache) ensure(stateRow, tailRow *mlxc.Array) {
	if c.step.state != nil {
		return
	}
	B := len(c.lens)
	st, tl := stateRow.Shape(), tailRow.Shape()
	st[0], tl[0] = B, B
	c.step.set(mlxc.Zeros(st, mlxc.Float32), mlxc.Zeros(tl, tailRow.Dtype()))
}

// Join appends a row holding a recurrent layer's saved state (Cache.Save): one copy of
// the stack.
func (c *BatchCache) Join(s cache.Saved) error {
	if c.counts != nil {
		return errTentativeBatch
	}
	if s.Kind != recurrentKind {
		return fmt.Errorf("batch deltanet cache: cannot join a %q layer's state", s.Kind)
	}
	if len(s.Arrays) == 0 {
		if s.Offset != 0 {
			return fmt.Errorf("batch deltanet cache: a state of %d positions without arrays", s.Offset)
		}
		if c.step.state != nil {
			c.appendRow(zerosLike(c.step.state, 1), zerosLike(c.step.tail, 1))
		}
		c.lens = append(c.lens, 0)
		return nil
	}
	if len(s.Arrays) != 2 || s.Arrays[0].Ndim() != 4 || s.Arrays[0].Dim(0) != 1 || s.Arrays[0].Dtype() != mlxc.Float32 ||
		s.Arrays[1].Ndim() != 3 || s.Arrays[1].Dim(0) != 1 {
		return errors.New("batch deltanet cache: saved state is not one sequence's float32 state [1, Hv, Dv, Dk] and tail [1, K-1, C]")
	}
	state, tail := s.Arrays[0], s.Arrays[1]
	if c.step.state != nil && (!equal(state.Shape()[1:], c.step.state.Shape()[1:]) || !equal(tail.Shape()[1:], c.step.tail.Shape()[1:]) ||
		tail.Dtype() != c.step.tail.Dtype()) {
		return fmt.Errorf("batch deltanet cache: a row of state %v and tail %v does not fit rows of %v and %v",
			state.Shape(), tail.Shape(), c.step.state.Shape(), c.step.tail.Shape())
	}
	if len(c.lens) > 0 {
		c.ensure(state, tail)
		c.appendRow(state, tail)
	} else {
		c.step.set(cache.OwnCopy(state), cache.OwnCopy(tail))
	}
	c.lens = append(c.lens, s.Offset)
	return nil
}

// appendRow concatenates a row's state and tail to the stacks.
func (c *BatchCache) appendRow(state, tail *mlxc.Array) {
	c.step.set(mlxc.Concatenate([]*mlxc.Array{c.step.state, state}, 0), mlxc.Concatenate([]*mlxc.Array{c.step.tail, tail}, 0))
}

// zerosLike is n zero rows shaped like x's rows.
func zerosLike(x *mlxc.Array, n int) *mlxc.Array {
	sh := x.Shape()
	sh[0] = n
	return mlxc.Zeros(sh, x.Dtype())
}

// Extract copies row r's state and tail into arrays of their own, as Cache.Save would
// have saved the same sequence decoded alone.
func (c *BatchCache) Extract(r int) (cache.Saved, error) {
	if c.counts != nil {
		return cache.Saved{}, errTentativeBatch
	}
	if r < 0 || r >= len(c.lens) {
		return cache.Saved{}, fmt.Errorf("batch deltanet cache: row %d of %d", r, len(c.lens))
	}
	s := cache.Saved{Kind: recurrentKind, Offset: c.lens[r]}
	if c.step.state == nil || c.lens[r] == 0 {
		return s, nil
	}
	s.Arrays = []*mlxc.Array{
		cache.OwnCopy(mlxc.SliceAxis(c.step.state, 0, r, r+1)).Detach(),
		cache.OwnCopy(mlxc.SliceAxis(c.step.tail, 0, r, r+1)).Detach(),
	}
	return s, nil
}

// Keep keeps the rows listed (increasing) in one gather.
func (c *BatchCache) Keep(rows []int) error {
	if c.counts != nil {
		return errTentativeBatch
	}
	lens := make([]int, len(rows))
	idx := make([]int32, len(rows))
	for i, r := range rows {
		if r < 0 || r >= len(c.lens) {
			return fmt.Errorf("batch deltanet cache: cannot keep row %d of %d", r, len(c.lens))
		}
		lens[i], idx[i] = c.lens[r], int32(r)
	}
	switch {
	case c.step.state == nil:
	case len(rows) == 0:
		c.step.Free()
	default:
		ix := mlxc.FromSlice(idx, len(idx))
		c.step.set(mlxc.Take(c.step.state, ix, 0), mlxc.Take(c.step.tail, ix, 0))
	}
	c.lens = lens
	return nil
}

// Arrays lists the stacks, for evaluation after a step.
func (c *BatchCache) Arrays() []*mlxc.Array { return c.step.Arrays() }

// Bytes is the memory the stacks hold.
func (c *BatchCache) Bytes() int64 { return c.step.Bytes() }

// Free releases the stacks; the layer has no rows afterwards.
func (c *BatchCache) Free() {
	c.step.Free()
	c.lens, c.counts = nil, nil
}

// ApplyRows is Apply for a batched step: qkv [B, T, C], a and b [B, T, Hv], row r's
// positions continuing its own state. Row r takes the first counts[r] (0..T) of its T
// positions (counts nil: all T); the rest are padding. A tentative step leaves the lengths
// as they are and records its tape until Commit; otherwise each row's state and tail
// become those after its count: the end state for a row taking all T, its old one (selected
// back, bit for bit) for a row taking none, else a replay of its count of the tape.
func (m *Mixer) ApplyRows(qkv, a, b *mlxc.Array, c *BatchCache, counts []int, tentative bool) *mlxc.Array {
	const op = "deltanet.apply_rows"
	B := len(c.lens)
	if qkv.Ndim() != 3 || qkv.Dim(0) != B || qkv.Dim(1) < 1 {
		fail(op, "qkv must be [%d, T, C] (T ≥ 1 positions per row), got %v", B, qkv.Shape())
	}
	if c.counts != nil {
		fail(op, "%v", errTentativeBatch)
	}
	T := qkv.Dim(1)
	if counts == nil {
		counts = make([]int, B)
		for r := range counts {
			counts[r] = T
		}
	}
	if len(counts) != B {
		fail(op, "counts give %d rows of %d", len(counts), B)
	}
	for r, n := range counts {
		if n < 0 || n > T {
			fail(op, "row %d takes %d of %d positions", r, n, T)
		}
	}
	// A step every row takes whole, or not at all, needs no tape: its end state and the
	// old one are selected per row.
	whole := !tentative && allOf(counts, 0, T)
	if !whole {
		c.step.Speculate()
	}
	var oldState, oldTail *mlxc.Array
	if whole && !allOf(counts, T, T) && c.step.state != nil {
		oldState, oldTail = c.step.state.Ref(), c.step.tail.Ref()
	}
	y := m.Apply(qkv, a, b, &c.step, nil)
	switch {
	case !whole:
		c.counts = append([]int(nil), counts...)
		if !tentative {
			if err := c.Commit(counts); err != nil {
				fail(op, "%v", err)
			}
		}
		return y
	case !allOf(counts, T, T):
		if oldState == nil { // the rows had no state yet: held rows keep zeros
			oldState, oldTail = zerosLike(c.step.state, B), zerosLike(c.step.tail, B)
		}
		c.step.set(selectRows(counts, T, c.step.state, oldState), selectRows(counts, T, c.step.tail, oldTail))
		oldState.Free()
		oldTail.Free()
	}
	for r, n := range counts {
		c.lens[r] += n
	}
	return y
}

// Tentative reports whether a tentative step awaits Commit.
func (c *BatchCache) Tentative() bool { return c.counts != nil }

// Commit ends the tentative step keeping row r's first keep[r] positions of it (0 ≤
// keep[r] ≤ its count): each row's state is replayed from the step's start state through
// keep[r] steps of its tape, in one device call with a count per row (rows keeping all or
// none select the end or start state, and a commit keeping every row's whole step needs no
// replay), and its conv tail is the K−1 conv input rows ending at keep[r].
func (c *BatchCache) Commit(keep []int) error {
	if c.counts == nil {
		return errors.New("batch deltanet cache: commit without a tentative step")
	}
	if len(keep) != len(c.counts) {
		return fmt.Errorf("batch deltanet cache: %d keep counts for %d rows", len(keep), len(c.counts))
	}
	for r, n := range keep {
		if n < 0 || n > c.counts[r] {
			return fmt.Errorf("batch deltanet cache: row %d cannot keep %d of the %d positions its tentative step took", r, n, c.counts[r])
		}
	}
	spec := c.step.spec
	if spec != nil { // nil: the rows had no state and no step ran (cannot happen after Apply)
		T := spec.tape.Steps()
		if !allOf(keep, T, T) {
			err := mlxc.Catch(func() {
				sc := mlxc.NewScope()
				defer sc.Close()
				state, tail := spec.atRows(c.step.kern, keep, c.step.state, c.step.tail)
				c.step.set(state, tail)
			})
			if err != nil {
				return fmt.Errorf("batch deltanet cache: rebuilding the kept state: %w", err)
			}
		}
	}
	c.step.spec.free()
	c.step.spec, c.step.tentative = nil, false
	for r, n := range keep {
		c.lens[r] += n
	}
	c.counts = nil
	return nil
}

// atRows returns the stacked state and tail after row r's first keep[r] steps of the
// record (end, endTail: those after all T steps): rows keeping 0 or T select the start
// or end state, and any other count replays the tape on the device with one count per row.
func (r *record) atRows(kn *Kernels, keep []int, end, endTail *mlxc.Array) (state, tail *mlxc.Array) {
	B, T, K1 := len(keep), r.tape.Steps(), r.tail.Dim(1)
	if allOf(keep, 0, T) {
		state = selectRows(keep, T, end, r.state)
	} else {
		cnt := make([]int32, B)
		for i, n := range keep {
			cnt[i] = int32(n)
		}
		state = kn.ReplayAt(r.state, r.tape, mlxc.FromSlice(cnt, B))
	}
	// Row b's tail: conv input rows keep[b] … keep[b]+K−2 (the start tail, then the step's
	// raw rows), one gather.
	idx := make([]int32, 0, B*K1)
	for _, n := range keep {
		for j := range K1 {
			idx = append(idx, int32(n+j))
		}
	}
	if K1 == 0 {
		return state, endTail
	}
	tail = mlxc.TakeAlongAxis(r.rows, mlxc.FromSlice(idx, B, K1, 1), 1)
	return state, tail
}

// selectRows picks row r of whole where counts[r] = T, else of old (a step's end or
// start state, [B, …]).
func selectRows(counts []int, T int, whole, old *mlxc.Array) *mlxc.Array {
	mask := make([]bool, len(counts))
	for r, n := range counts {
		mask[r] = n == T
	}
	shape := make([]int, whole.Ndim())
	for i := range shape {
		shape[i] = 1
	}
	shape[0] = len(counts)
	return mlxc.Where(mlxc.FromSlice(mask, shape...), whole, old)
}

// allOf reports whether every count is lo or hi.
func allOf(counts []int, lo, hi int) bool {
	for _, n := range counts {
		if n != lo && n != hi {
			return false
		}
	}
	return true
}

// errTentativeBatch refuses a change of rows or a step while a tentative step is pending.
var errTentativeBatch = errors.New("batch deltanet cache: a tentative step is not committed")
