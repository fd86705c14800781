package model

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// BatchKVCache is one attention layer's keys and values for B sequences, [B, nKV,
// capacity, hd]. Row r holds its positions at [0, Lens()[r]): every row starts at
// position 0 and its free tail is the padding (right padding with per-row lengths, where
// mlx-lm left-pads behind one shared write index). A row therefore sits in the buffer
// exactly where a single-sequence KVCache keeps it, and attention over row r's first
// Lens()[r] keys is the single-sequence computation (BatchPass).
//
// A tentative step (BatchOptions.Tentative) writes its positions past the rows' lengths
// without counting them; pending holds how many each row got until Commit counts the kept
// ones. The rejected ones need no undo: they lie past the row's length, where no attention
// reads and the next step overwrites.
type BatchKVCache struct {
	keys, values *mlxc.Array // nil until a row holds a key
	lens         []int
	pending      []int // the uncommitted tentative step's positions per row; nil: none
}

var _ cache.BatchLayer = (*BatchKVCache)(nil)

// Lens are the rows' lengths.
func (c *BatchKVCache) Lens() []int { return c.lens }

// capacity is the rows' buffer length (0 without buffers).
func (c *BatchKVCache) capacity() int {
	if c.keys == nil {
		return 0
	}
	return c.keys.Dim(2)
}

// steps rounds n positions up to the allocation step (kvStep, as the single-sequence
// cache), so the buffer grows only every kvStep decode steps.
func steps(n int) int { return max((n+kvStep-1)/kvStep, 1) * kvStep }

// ensure gives every row a buffer of at least need positions for heads like like's
// ([·, nKV, ·, hd] of its dtype): zeros for rows that have none yet (a batch of empty
// rows), the old rows followed by zeros when the buffer is shorter.
func (c *BatchKVCache) ensure(need int, like *mlxc.Array) {
	B, nKV, hd := len(c.lens), like.Dim(1), like.Dim(3)
	if c.keys == nil {
		shape := []int{B, nKV, steps(need), hd}
		c.replace(mlxc.Zeros(shape, like.Dtype()), mlxc.Zeros(shape, like.Dtype()))
		return
	}
	have := c.capacity()
	if need <= have {
		return
	}
	pad := []int{B, nKV, steps(need) - have, hd}
	c.replace(mlxc.Concatenate([]*mlxc.Array{c.keys, mlxc.Zeros(pad, c.keys.Dtype())}, 2),
		mlxc.Concatenate([]*mlxc.Array{c.values, mlxc.Zeros(pad, c.values.Dtype())}, 2))
}

// replace swaps the buffers, freeing the old handles so MLX can update in place.
func (c *BatchKVCache) replace(k, v *mlxc.Array) {
	k.Detach()
	v.Detach()
	c.keys.Free()
	c.values.Free()
	c.keys, c.values = k, v
}

// Join appends a row holding a KV layer's saved state (KVCache.Save): one copy of the
// batch, as any change of the row count is in MLX.
func (c *BatchKVCache) Join(s cache.Saved) error {
	if c.pending != nil {
		return errTentativeKV
	}
	if s.Kind != kvKind {
		return fmt.Errorf("batch kv cache: cannot join a %q layer's state", s.Kind)
	}
	n := s.Offset
	if n == 0 {
		if c.keys != nil {
			row := []int{1, c.keys.Dim(1), c.capacity(), c.keys.Dim(3)}
			c.replace(mlxc.Concatenate([]*mlxc.Array{c.keys, mlxc.Zeros(row, c.keys.Dtype())}, 0),
				mlxc.Concatenate([]*mlxc.Array{c.values, mlxc.Zeros(row, c.values.Dtype())}, 0))
		}
		c.lens = append(c.lens, 0)
		return nil
	}
	if len(s.Arrays) != 2 || s.Arrays[0].Ndim() != 4 || s.Arrays[0].Dim(0) != 1 || s.Arrays[0].Dim(2) < n ||
		!slices.Equal(s.Arrays[0].Shape(), s.Arrays[1].Shape()) {
		return fmt.Errorf("batch kv cache: saved state is not one sequence's keys and values of %d rows", n)
	}
	k, v := s.Arrays[0], s.Arrays[1]
	if c.keys != nil && (k.Dim(1) != c.keys.Dim(1) || k.Dim(3) != c.keys.Dim(3) || k.Dtype() != c.keys.Dtype()) {
		return fmt.Errorf("batch kv cache: a row of %v %v does not fit rows of %v %v", k.Shape(), k.Dtype(), c.keys.Shape(), c.keys.Dtype())
	}
	if len(c.lens) > 0 || c.keys != nil {
		c.ensure(n, k)
	}
	capacity := max(c.capacity(), steps(n))
	shape := []int{1, k.Dim(1), capacity, k.Dim(3)}
	rowK, rowV := copyRows(k, shape, n), copyRows(v, shape, n)
	if c.keys != nil {
		rowK = mlxc.Concatenate([]*mlxc.Array{c.keys, rowK}, 0)
		rowV = mlxc.Concatenate([]*mlxc.Array{c.values, rowV}, 0)
	}
	c.replace(rowK, rowV)
	c.lens = append(c.lens, n)
	return nil
}

// Extract copies row r's keys and values into buffers of their own, as KVCache.Save
// would have saved the same sequence decoded alone.
func (c *BatchKVCache) Extract(r int) (cache.Saved, error) {
	if c.pending != nil {
		return cache.Saved{}, errTentativeKV
	}
	if r < 0 || r >= len(c.lens) {
		return cache.Saved{}, fmt.Errorf("batch kv cache: row %d of %d", r, len(c.lens))
	}
	n := c.lens[r]
	s := cache.Saved{Kind: kvKind, Offset: n, Trimmable: true}
	if n == 0 {
		return s, nil
	}
	for _, b := range []*mlxc.Array{c.keys, c.values} {
		sh := b.Shape()
		sh[0], sh[2] = 1, n
		s.Arrays = append(s.Arrays, copyRows(mlxc.SliceAxis(b, 0, r, r+1), sh, n).Detach())
	}
	return s, nil
}

// Keep keeps the rows listed (increasing), in one gather that also drops the capacity no
// remaining row needs.
func (c *BatchKVCache) Keep(rows []int) error {
	if c.pending != nil {
		return errTentativeKV
	}
	for _, r := range rows {
		if r < 0 || r >= len(c.lens) {
			return fmt.Errorf("batch kv cache: cannot keep row %d of %d", r, len(c.lens))
		}
	}
	lens := make([]int, len(rows))
	longest := 0
	for i, r := range rows {
		lens[i] = c.lens[r]
		longest = max(longest, lens[i])
	}
	switch {
	case c.keys == nil:
	case len(rows) == 0:
		c.replace(nil, nil)
	default:
		idx := make([]int32, len(rows))
		for i, r := range rows {
			idx[i] = int32(r)
		}
		ix := mlxc.FromSlice(idx, len(idx))
		capacity := min(steps(longest), c.capacity())
		c.replace(mlxc.Take(mlxc.SliceAxis(c.keys, 2, 0, capacity), ix, 0), mlxc.Take(mlxc.SliceAxis(c.values, 2, 0, capacity), ix, 0))
	}
	c.lens = lens
	return nil
}

// write stores k, v ([B, nKV, W, hd], W positions per row) at positions at [B, 1, W, 1]
// (row r's from its length on) in one scatter, growing the buffers first so that every
// row has room for all W; the lengths are unchanged (advance, or Commit after a tentative
// step). A row that takes fewer than W positions gets junk in the rest, past its length.
func (c *BatchKVCache) write(k, v, at *mlxc.Array) {
	if c.pending != nil {
		panic(&mlxc.Error{Op: "batch kv cache", Msg: errTentativeKV.Error()})
	}
	if k.Dim(0) != len(c.lens) || at.Dim(2) != k.Dim(2) {
		panic(&mlxc.Error{Op: "batch kv cache", Msg: fmt.Sprintf("a step writes %d positions per row of %d, got %v", at.Dim(2), len(c.lens), k.Shape())})
	}
	c.ensure(slices.Max(c.lens)+k.Dim(2), k)
	c.replace(mlxc.PutAlongAxis(c.keys, at, k, 2), mlxc.PutAlongAxis(c.values, at, v, 2))
}

// advance counts the positions the last step gave each row (counts[r]; a held row's 0
// leaves its written keys past its length, for its next step to overwrite), or, for a
// tentative step, records them until Commit.
func (c *BatchKVCache) advance(counts []int, tentative bool) {
	if tentative {
		c.pending = slices.Clone(counts)
		return
	}
	for r, n := range counts {
		c.lens[r] += n
	}
}

// Tentative reports whether a tentative step awaits Commit.
func (c *BatchKVCache) Tentative() bool { return c.pending != nil }

// Commit counts row r's first keep[r] positions of the tentative step (0 ≤ keep[r] ≤ the
// positions it wrote for the row); the others lie past the row's length from now on.
func (c *BatchKVCache) Commit(keep []int) error {
	if c.pending == nil {
		return errors.New("batch kv cache: commit without a tentative step")
	}
	if err := checkKeep(keep, c.pending); err != nil {
		return fmt.Errorf("batch kv cache: %w", err)
	}
	for r, n := range keep {
		c.lens[r] += n
	}
	c.pending = nil
	return nil
}

// checkKeep checks a commit's keep counts against the positions the tentative step gave
// each row.
func checkKeep(keep, widths []int) error {
	if len(keep) != len(widths) {
		return fmt.Errorf("%d keep counts for %d rows", len(keep), len(widths))
	}
	for r, n := range keep {
		if n < 0 || n > widths[r] {
			return fmt.Errorf("row %d cannot keep %d of the %d positions its tentative step took", r, n, widths[r])
		}
	}
	return nil
}

// Arrays returns the live buffers, for evaluation after a step.
func (c *BatchKVCache) Arrays() []*mlxc.Array {
	if c.keys == nil {
		return nil
	}
	return []*mlxc.Array{c.keys, c.values}
}

func (c *BatchKVCache) Bytes() int64 {
	if c.keys == nil {
		return 0
	}
	return int64(c.keys.NBytes() + c.values.NBytes())
}

// Free releases the buffers; the layer has no rows afterwards.
func (c *BatchKVCache) Free() {
	c.replace(nil, nil)
	c.lens, c.pending = nil, nil
}

// errTentativeKV refuses a change of rows or a step while a tentative step is pending.
var errTentativeKV = errors.New("batch kv cache: a tentative step is not committed")

// errNoRows is a batched step over a batch without rows.
var errNoRows = errors.New("batched forward: the batch has no rows")
