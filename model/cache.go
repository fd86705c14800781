package model

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// Cache is a model's per-sequence state, one cache.Layer per layer: the decoding loops use
// only this interface, so that a family whose layers are not all KV (recurrent layers
// rolled back through Speculate and Commit) fits the same loops.
type Cache = cache.Caches

// kvStep is mlx-lm's allocation step; keeping it makes the cache layout (and so the CUDA
// cuDNN SDPA eligibility for decode) identical.
const kvStep = 256

// KVCache holds one attention layer's keys and values, [B, nKV, capacity, hd], filled up to
// offset. Trimming only moves offset; later writes overwrite the stale rows.
type KVCache struct {
	keys, values *mlxc.Array
	offset       int
	reserve      int
	// base is the offset before a tentative forward, while tentative (Speculate) is set;
	// the zero value is a layer outside speculation.
	base      int
	tentative bool
}

// The KV layer's contract, and run-ahead's capability (rows written at a device-computed
// position, the offset set once the host reads the count).
var (
	_ cache.Layer    = (*KVCache)(nil)
	_ cache.Reserver = (*KVCache)(nil)
	_ cache.Trimmer  = (*KVCache)(nil)
	_ cache.Placed   = (*KVCache)(nil)
)

// Offset is the number of valid positions.
func (c *KVCache) Offset() int { return c.offset }

// UpdateAndFetch appends k, v ([B, nKV, L, hd]) and returns views of all valid keys and
// values. Growth follows mlx-lm exactly (zeros in steps of 256, truncating a partially
// filled buffer first).
func (c *KVCache) UpdateAndFetch(k, v *mlxc.Array) (*mlxc.Array, *mlxc.Array) {
	c.Append(k, v)
	return mlxc.SliceAxis(c.keys, 2, 0, c.offset), mlxc.SliceAxis(c.values, 2, 0, c.offset)
}

// Append stores k, v after the valid rows (no views returned).
func (c *KVCache) Append(k, v *mlxc.Array) {
	c.write(k, v)
	c.offset += k.Dim(2)
}

// Wrote records n rows that a kernel wrote into the buffers at Offset in place
// (Fused.KVPrepInto): Append without the write.
func (c *KVCache) Wrote(n int) { c.offset += n }

// AppendBuffers appends like UpdateAndFetch but returns the whole buffers [B, nKV,
// capacity, hd] instead of views (one graph node fewer each): for kernels that are told
// how many rows are valid.
func (c *KVCache) AppendBuffers(k, v *mlxc.Array) (*mlxc.Array, *mlxc.Array) {
	c.Append(k, v)
	return c.keys, c.values
}

// UpdateAndFetchPadded appends like UpdateAndFetch but returns views rounded up to a
// multiple of bucket rows (within the buffer): the rows past Offset are stale or zero and
// the caller masks them. A key length that changes only every bucket rows lets the CUDA
// backend reuse its cuDNN attention plan, which is built per key length (milliseconds).
func (c *KVCache) UpdateAndFetchPadded(k, v *mlxc.Array, bucket int) (*mlxc.Array, *mlxc.Array, int) {
	c.Append(k, v)
	return c.padded(c.offset, bucket)
}

// Scratch writes k, v at Offset without committing them (Offset is unchanged, the next
// write overwrites them) and returns padded views holding the valid rows followed by
// these: the drafter's block attends to the committed context plus itself this way without
// concatenating the context every cycle.
func (c *KVCache) Scratch(k, v *mlxc.Array, bucket int) (*mlxc.Array, *mlxc.Array, int) {
	c.write(k, v)
	return c.padded(c.offset+k.Dim(2), bucket)
}

// padded returns views of the first n rows rounded up to a multiple of bucket (capped at
// the buffer size) and that row count.
func (c *KVCache) padded(n, bucket int) (*mlxc.Array, *mlxc.Array, int) {
	n = bucketRows(n, bucket, c.keys.Dim(2))
	return mlxc.SliceAxis(c.keys, 2, 0, n), mlxc.SliceAxis(c.values, 2, 0, n), n
}

// bucketRows is n rounded up to a multiple of bucket, at most limit (n itself when bucket
// is 0): a padded key count, which changes only every bucket rows.
func bucketRows(n, bucket, limit int) int {
	if bucket <= 0 {
		return n
	}
	return min((n+bucket-1)/bucket*bucket, limit)
}

// write stores k, v at rows [offset, offset+L), growing the buffers first when needed.
func (c *KVCache) write(k, v *mlxc.Array) {
	ks, vs := k.Shape(), v.Shape()
	L := ks[2]
	prev := c.offset
	if c.keys == nil || prev+L > c.keys.Dim(2) {
		steps := (kvStep + L - 1) / kvStep
		if c.keys == nil && c.reserve > L {
			steps = (c.reserve + kvStep - 1) / kvStep
		}
		newK := mlxc.Zeros([]int{ks[0], ks[1], steps * kvStep, ks[3]}, k.Dtype())
		newV := mlxc.Zeros([]int{vs[0], vs[1], steps * kvStep, vs[3]}, v.Dtype())
		if c.keys != nil {
			oldK, oldV := c.keys, c.values
			if prev%kvStep != 0 {
				oldK = mlxc.SliceAxis(oldK, 2, 0, prev)
				oldV = mlxc.SliceAxis(oldV, 2, 0, prev)
			}
			newK = mlxc.Concatenate([]*mlxc.Array{oldK, newK}, 2)
			newV = mlxc.Concatenate([]*mlxc.Array{oldV, newV}, 2)
		}
		c.replace(newK, newV)
	}
	start := []int{0, 0, prev, 0}
	stopK := []int{ks[0], ks[1], prev + L, ks[3]}
	stopV := []int{vs[0], vs[1], prev + L, vs[3]}
	c.replace(mlxc.SliceUpdate(c.keys, k, start, stopK), mlxc.SliceUpdate(c.values, v, start, stopV))
}

// WriteAt stores k, v ([B, nKV, L, hd]) at rows [pos, pos+L), pos an int32 [1] array
// computed on the device, and returns the whole buffers. window is the caller's bound on
// pos+L: the buffers grow to hold it first, keeping every row they hold (rows past Offset
// may belong to a block whose acceptance is not read yet). Offset is unchanged: the caller
// sets it (KVCaches.SetOffset) once it knows how many rows to keep.
func (c *KVCache) WriteAt(k, v, pos *mlxc.Array, window int) (*mlxc.Array, *mlxc.Array) {
	c.Window(window, k.Shape(), v.Shape(), k.Dtype())
	axes := []int{2}
	c.replace(mlxc.SliceUpdateDynamic(c.keys, k, pos, axes), mlxc.SliceUpdateDynamic(c.values, v, pos, axes))
	return c.keys, c.values
}

// Window makes the buffers hold at least window rows (growing them as WriteAt does, every
// row kept) for keys and values shaped like ks, vs ([B, nKV, ·, hd]) of type dt, and
// returns them: row-contiguous arrays that a kernel may write rows into in place
// (Fused.HeadPrepInto).
func (c *KVCache) Window(window int, ks, vs []int, dt mlxc.Dtype) (*mlxc.Array, *mlxc.Array) {
	if c.keys == nil || window > c.keys.Dim(2) {
		rows := max(window, c.reserve)
		steps := (rows + kvStep - 1) / kvStep
		have := 0
		if c.keys != nil {
			have = c.keys.Dim(2)
		}
		newK := mlxc.Zeros([]int{ks[0], ks[1], steps*kvStep - have, ks[3]}, dt)
		newV := mlxc.Zeros([]int{vs[0], vs[1], steps*kvStep - have, vs[3]}, dt)
		if c.keys != nil {
			newK = mlxc.Concatenate([]*mlxc.Array{c.keys, newK}, 2)
			newV = mlxc.Concatenate([]*mlxc.Array{c.values, newV}, 2)
		}
		c.replace(newK, newV)
	}
	return c.keys, c.values
}

// InPlace is Window for a block of rows of type dt that a kernel writes into the buffers
// itself (kvHeads heads of headDim): the buffers, or nil, nil when they hold another type.
func (c *KVCache) InPlace(window, kvHeads, headDim int, dt mlxc.Dtype) (*mlxc.Array, *mlxc.Array) {
	shape := []int{1, kvHeads, 1, headDim}
	if k, v := c.Window(window, shape, shape, dt); k.Dtype() == dt {
		return k, v
	}
	return nil, nil
}

// replace swaps the buffers, freeing the old handles so MLX can update in place (donation
// needs the old buffer to have no other reference).
func (c *KVCache) replace(k, v *mlxc.Array) {
	k.Detach()
	v.Detach()
	c.keys.Free()
	c.values.Free()
	c.keys, c.values = k, v
}

// Trim drops the last n positions (clamped to offset) and returns how many were dropped.
func (c *KVCache) Trim(n int) int {
	if n > c.offset {
		n = c.offset
	}
	if n < 0 {
		n = 0
	}
	c.offset -= n
	return n
}

// State returns views of the valid keys and values (nil when empty).
func (c *KVCache) State() (*mlxc.Array, *mlxc.Array) {
	if c.keys == nil || c.offset == 0 {
		return nil, nil
	}
	return mlxc.SliceAxis(c.keys, 2, 0, c.offset), mlxc.SliceAxis(c.values, 2, 0, c.offset)
}

// Arrays returns the live buffers, for evaluation after a step.
func (c *KVCache) Arrays() []*mlxc.Array {
	if c.keys == nil {
		return nil
	}
	return []*mlxc.Array{c.keys, c.values}
}

func (c *KVCache) Bytes() int64 {
	if c.keys == nil {
		return 0
	}
	return int64(c.keys.NBytes() + c.values.NBytes())
}

func (c *KVCache) Free() {
	c.keys.Free()
	c.values.Free()
	c.keys, c.values, c.offset, c.tentative = nil, nil, 0, false
}

// Reserve makes the first allocation large enough for n positions.
func (c *KVCache) Reserve(n int) { c.reserve = n }

// Speculate remembers the offset: the rows the next forward appends are tentative.
func (c *KVCache) Speculate() { c.base, c.tentative = c.offset, true }

// Commit keeps the tentative rows keep (a prefix: rows stay where they were written, so a
// tree's path, which would need moving rows, is refused) and drops the rest.
func (c *KVCache) Commit(keep []int) error {
	if !c.tentative {
		return errors.New("kv cache: commit without speculate")
	}
	if !cache.IsPrefix(keep) {
		return fmt.Errorf("kv cache: can keep only a prefix of the tentative rows, not %v", keep)
	}
	if written := c.offset - c.base; len(keep) > written {
		return fmt.Errorf("kv cache: cannot keep %d of %d tentative rows", len(keep), written)
	}
	c.offset, c.tentative = c.base+len(keep), false
	return nil
}

// SetOffset declares the first n rows valid (n within the buffers): after rows written
// with WriteAt at positions the host learns later.
func (c *KVCache) SetOffset(n int) error {
	if err := c.checkOffset(n); err != nil {
		return err
	}
	c.offset = n
	return nil
}

// checkOffset refuses an offset outside the buffers, which would declare rows never written.
func (c *KVCache) checkOffset(n int) error {
	if n < 0 || (n > 0 && (c.keys == nil || n > c.keys.Dim(2))) {
		return fmt.Errorf("kv cache: cannot set offset %d past the buffers", n)
	}
	return nil
}

// kvSnapshot is a KV layer's state: its offset, the rows being still in place.
type kvSnapshot struct{ offset int }

func (kvSnapshot) Free() {}

// Snapshot is O(1): the offset. Restoring it is exact as long as no row below it has been
// overwritten since (the layer not rewound below it and written again).
func (c *KVCache) Snapshot() cache.Snapshot { return kvSnapshot{c.offset} }

// Restore returns to a snapshot of this layer taken earlier.
func (c *KVCache) Restore(s cache.Snapshot) error {
	ks, ok := s.(kvSnapshot)
	if !ok {
		return errors.New("kv cache: snapshot of another kind of layer")
	}
	if ks.offset > c.offset {
		return fmt.Errorf("kv cache: snapshot at %d is past the current offset %d", ks.offset, c.offset)
	}
	c.offset, c.tentative = ks.offset, false
	return nil
}

// KVCaches is a stack of per-layer KV caches: the Cache of a pure-attention model. Layers
// and the embedded list hold the same layers (Layers typed for the model's own use).
type KVCaches struct {
	Layers []*KVCache
	*cache.List
}

// NewKVCaches makes n empty layer caches.
func NewKVCaches(n int) *KVCaches {
	c := &KVCaches{Layers: make([]*KVCache, n)}
	ls := make([]cache.Layer, n)
	for i := range c.Layers {
		c.Layers[i] = &KVCache{}
		ls[i] = c.Layers[i]
	}
	c.List = cache.NewList(ls...)
	return c
}

// SetOffset declares the first n rows of every layer valid (n within the buffers): after
// blocks written with WriteAt at positions the host learns later. Nothing changes when
// any layer refuses n.
func (c *KVCaches) SetOffset(n int) error {
	for _, l := range c.Layers {
		if err := l.checkOffset(n); err != nil {
			return err
		}
	}
	for _, l := range c.Layers {
		l.offset = n
	}
	return nil
}

// Checkpoint marks the current length. Restore(cp) returns to it as long as the cache
// has not been rewound below cp since: the rows are still in place (a KV snapshot is just
// an offset), so both are O(1).
func (c *KVCaches) Checkpoint() int { return c.Offset() }

// Restore rewinds to a checkpoint taken earlier. It takes the place of the list's Restore
// here; per-layer snapshots are c.List.Snapshot and c.List.Restore.
func (c *KVCaches) Restore(cp int) error {
	if cp > c.Offset() {
		return fmt.Errorf("kv cache: checkpoint %d is past the current offset %d", cp, c.Offset())
	}
	return c.Rewind(c.Offset() - cp)
}

// kvKind names the KV layer's saved states.
const kvKind = "kv"

var _ cache.Saver = (*KVCache)(nil)

// Save copies the first n rows of keys and values into buffers of their own: a kernel may
// later write rows of the live buffers in place (Fused.HeadPrepInto), so a view would not
// stay what it was.
func (c *KVCache) Save(n int) (cache.Saved, error) {
	if c.tentative {
		return cache.Saved{}, errors.New("kv cache: cannot save during a speculation")
	}
	if n < 0 || n > c.offset {
		return cache.Saved{}, fmt.Errorf("kv cache: cannot save %d of %d rows", n, c.offset)
	}
	s := cache.Saved{Kind: kvKind, Offset: n, Trimmable: true}
	if n == 0 {
		return s, nil
	}
	for _, b := range []*mlxc.Array{c.keys, c.values} {
		sh := b.Shape()
		sh[2] = n
		s.Arrays = append(s.Arrays, copyRows(b, sh, n).Detach())
	}
	return s, nil
}

// Load makes the empty layer hold the first n rows of s, in buffers laid out as the first
// write of a fresh cache would allocate them (Reserve's capacity in steps of kvStep).
func (c *KVCache) Load(s cache.Saved, n int) error {
	if s.Kind != kvKind {
		return fmt.Errorf("kv cache: cannot load a %q layer's state", s.Kind)
	}
	if c.keys != nil || c.offset != 0 {
		return errors.New("kv cache: load into a layer that holds rows")
	}
	if n < 0 || n > s.Offset {
		return fmt.Errorf("kv cache: cannot load %d of %d saved rows", n, s.Offset)
	}
	if n == 0 {
		return nil
	}
	if len(s.Arrays) != 2 || s.Arrays[0].Ndim() != 4 || s.Arrays[1].Ndim() != 4 ||
		s.Arrays[0].Dim(2) != s.Offset || s.Arrays[1].Dim(2) != s.Offset {
		return fmt.Errorf("kv cache: saved state is not keys and values of %d rows", s.Offset)
	}
	steps := (max(n, c.reserve) + kvStep - 1) / kvStep
	var bufs [2]*mlxc.Array
	for i, a := range s.Arrays {
		sh := a.Shape()
		sh[2] = steps * kvStep
		bufs[i] = copyRows(a, sh, n)
	}
	c.replace(bufs[0], bufs[1])
	c.offset = n
	return nil
}

// copyRows writes the first n rows (axis 2) of src into a new zero buffer of the given
// shape: always a buffer of its own (cache.OwnCopy).
func copyRows(src *mlxc.Array, shape []int, n int) *mlxc.Array {
	rows := mlxc.SliceAxis(src, 2, 0, n)
	if shape[2] == n {
		return cache.OwnCopy(rows) // a slice update covering all of it would return rows
	}
	stop := slices.Clone(shape)
	stop[2] = n
	return mlxc.SliceUpdate(mlxc.Zeros(shape, src.Dtype()), rows, make([]int, len(shape)), stop)
}
