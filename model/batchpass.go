package model

import (
	"fmt"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// BatchModel is a model that decodes B sequences in one forward: each row of a batch
// takes one new token at its own position.
type BatchModel interface {
	Model
	// NewBatch makes an empty batch of this model's layers; rows join from single-sequence
	// caches made by NewCache (cache.Batch.Join) and leave into them (Extract, Leave).
	NewBatch() cache.Batch
	// ForwardBatch runs ids [B, 1] (int32; B = b.Rows()), row r's token at position
	// b.Lens()[r], appends them to the batch and returns logits [B, 1, V] (no taps).
	ForwardBatch(ids *mlxc.Array, b cache.Batch, opt BatchOptions) Output
}

// BatchOptions controls one batched decode step.
type BatchOptions struct {
	// Live marks the rows that take this step's token (nil: all). A held row's state is
	// left as it was: its KV length does not move (the key written past it is overwritten
	// by its next step) and its recurrent state and conv tail are selected back; its
	// logits are computed and meaningless.
	Live []bool
	// PaddedKeys attends every row in one attention over the longest row's keys, the rows'
	// tails masked; off: one attention per row over exactly its keys, the computation of
	// that row decoded alone (bit for bit on the CPU). docs/perf/batching.md compares them.
	PaddedKeys bool
}

// BatchKVCaches is a stack of batched KV layers: the batch of a pure-attention model.
// Layers and the embedded list hold the same layers.
type BatchKVCaches struct {
	Layers []*BatchKVCache
	*cache.BatchList
}

// NewBatchKVCaches makes n batched KV layers without rows.
func NewBatchKVCaches(n int) *BatchKVCaches {
	c := &BatchKVCaches{Layers: make([]*BatchKVCache, n)}
	ls := make([]cache.BatchLayer, n)
	for i := range c.Layers {
		c.Layers[i] = &BatchKVCache{}
		ls[i] = c.Layers[i]
	}
	c.BatchList = cache.NewBatchList(ls...)
	return c
}

// BatchPass is one batched decode step's view of its KV layers: the rows' positions
// (their lengths before the step), the arrays all layers share, and the layers written,
// which Finish advances.
type BatchPass struct {
	Opt         BatchOptions
	B           int
	lens        []int
	pos, at     *mlxc.Array // int32 [B]: RoPE offsets; [B, 1, 1, 1]: write indices
	mask        *mlxc.Array // the padded path's key mask, made by its first layer
	written     []*BatchKVCache
	longestSeen int
}

// NewBatchPass checks a step over rows of the given lengths (the batch's Lens) and
// makes its shared arrays; op names the family's forward in errors.
func NewBatchPass(op string, lens []int, ids *mlxc.Array, opt BatchOptions) *BatchPass {
	B := len(lens)
	if B == 0 {
		panic(&mlxc.Error{Op: op, Msg: errNoRows.Error()})
	}
	if sh := ids.Shape(); len(sh) != 2 || sh[0] != B || sh[1] != 1 {
		panic(&mlxc.Error{Op: op, Msg: fmt.Sprintf("ids must be [%d, 1] (one token per row), got %v", B, sh)})
	}
	if opt.Live != nil && len(opt.Live) != B {
		panic(&mlxc.Error{Op: op, Msg: fmt.Sprintf("live marks %d rows of %d", len(opt.Live), B)})
	}
	p := &BatchPass{Opt: opt, B: B, lens: append([]int(nil), lens...)}
	pos := make([]int32, B)
	for r, n := range lens {
		pos[r] = int32(n)
		p.longestSeen = max(p.longestSeen, n+1)
	}
	p.pos = mlxc.FromSlice(pos, B)
	p.at = mlxc.Reshape(p.pos, B, 1, 1, 1)
	return p
}

// Positions are the rows' positions, int32 [B], for RoPE (Rope.ApplyAt).
func (p *BatchPass) Positions() *mlxc.Array { return p.pos }

// Attend writes the step's heads k, v [B, nKV, 1, hd] into lc at each row's position
// and attends the queries q [B, nH, 1, hd] over each row's keys up to and including the
// new one, returning the attention rows [B, nH·hd].
func (p *BatchPass) Attend(lc *BatchKVCache, q, k, v *mlxc.Array, scale float32) *mlxc.Array {
	if !slices.Equal(lc.lens, p.lens) {
		panic(&mlxc.Error{Op: "batched attention", Msg: fmt.Sprintf("layer holds rows of lengths %v, the step %v", lc.lens, p.lens)})
	}
	lc.write(k, v, p.at)
	p.written = append(p.written, lc)
	if p.Opt.PaddedKeys {
		if p.mask == nil {
			j := mlxc.Reshape(mlxc.Arange(0, float64(p.longestSeen), 1, mlxc.Int32), 1, 1, 1, p.longestSeen)
			p.mask = mlxc.LessEqual(j, p.at) // key j of row r is visible iff j ≤ its position
		}
		keys := mlxc.SliceAxis(lc.keys, 2, 0, p.longestSeen)
		values := mlxc.SliceAxis(lc.values, 2, 0, p.longestSeen)
		return mergeHeads(mlxc.ScaledDotProductAttention(q, keys, values, scale, mlxc.MaskArray, p.mask, nil), p.B)
	}
	nKV, hd := lc.keys.Dim(1), lc.keys.Dim(3)
	outs := make([]*mlxc.Array, p.B)
	for r, n := range p.lens {
		keys := mlxc.Slice(lc.keys, []int{r, 0, 0, 0}, []int{r + 1, nKV, n + 1, hd})
		values := mlxc.Slice(lc.values, []int{r, 0, 0, 0}, []int{r + 1, nKV, n + 1, lc.values.Dim(3)})
		outs[r] = mlxc.ScaledDotProductAttention(mlxc.SliceAxis(q, 0, r, r+1), keys, values, scale, mlxc.MaskNone, nil, nil)
	}
	o := outs[0]
	if p.B > 1 {
		o = mlxc.Concatenate(outs, 0)
	}
	return mergeHeads(o, p.B)
}

// Finish counts the step's position in every KV layer it wrote, for the live rows.
func (p *BatchPass) Finish() {
	for _, lc := range p.written {
		lc.advance(p.Opt.Live)
	}
}
