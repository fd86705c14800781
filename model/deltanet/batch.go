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
// stack is each row's own step. Rows have no padding: every row of a step takes one
// position, or, held (ApplyRows's live), keeps its state.
type BatchCache struct {
	// step holds the stacked state and tail and is what Mixer.Apply runs on; its offset
	// means nothing here (lens are the rows' lengths).
	step Cache
	lens []int
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
	c.lens = nil
}

// ApplyRows is Apply for a batched step: qkv [B, 1, C], a and b [B, 1, Hv], row r's
// position continuing its own state. live marks the rows that take the step (nil: all);
// a held row's state and tail are selected back, so they stay bit for bit what they were.
func (m *Mixer) ApplyRows(qkv, a, b *mlxc.Array, c *BatchCache, live []bool) *mlxc.Array {
	B := len(c.lens)
	if qkv.Ndim() != 3 || qkv.Dim(0) != B || qkv.Dim(1) != 1 {
		fail("deltanet.apply_rows", "qkv must be [%d, 1, C] (one position per row), got %v", B, qkv.Shape())
	}
	if live != nil && len(live) != B {
		fail("deltanet.apply_rows", "live marks %d rows of %d", len(live), B)
	}
	held := live != nil && !allTrue(live)
	var oldState, oldTail *mlxc.Array
	if held && c.step.state != nil {
		oldState, oldTail = c.step.state.Ref(), c.step.tail.Ref()
	}
	y := m.Apply(qkv, a, b, &c.step, nil)
	if held {
		if oldState == nil { // the rows had no state yet: held rows keep zeros
			oldState, oldTail = zerosLike(c.step.state, B), zerosLike(c.step.tail, B)
		}
		mask := make([]bool, B)
		copy(mask, live)
		keep := mlxc.FromSlice(mask, B)
		c.step.set(mlxc.Where(mlxc.Reshape(keep, B, 1, 1, 1), c.step.state, oldState),
			mlxc.Where(mlxc.Reshape(keep, B, 1, 1), c.step.tail, oldTail))
		oldState.Free()
		oldTail.Free()
	}
	for r := range c.lens {
		if live == nil || live[r] {
			c.lens[r]++
		}
	}
	return y
}

func allTrue(b []bool) bool {
	for _, x := range b {
		if !x {
			return false
		}
	}
	return true
}
