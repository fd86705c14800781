package model

import (
	"fmt"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// BatchModel is a model that steps B sequences in one forward: each row of a batch takes
// its own tokens (one in a decode step, a draft block in a verify step) at its own
// positions.
type BatchModel interface {
	Model
	// NewBatch makes an empty batch of this model's layers; rows join from single-sequence
	// caches made by NewCache (cache.Batch.Join) and leave into them (Extract, Leave).
	NewBatch() cache.Batch
	// ForwardBatch runs one step over every row of b (B = b.Rows()) and appends it to the
	// batch. Without opt.Widths ids is int32 [B, 1], row r's token at position
	// b.Lens()[r], and the logits are [B, 1, V]; with opt.Widths ids is int32 [1, ΣWidths],
	// row r's Widths[r] tokens packed after those of the rows before it, at positions
	// b.Lens()[r], b.Lens()[r]+1, …, and the logits are [1, ΣWidths, V] (every position).
	// Output.Hidden holds opt.Taps' residual rows, packed like the logits. Row r's logits
	// and hidden rows are what the single-sequence Forward of its tokens computes (bit for
	// bit on the CPU).
	ForwardBatch(ids *mlxc.Array, b cache.Batch, opt BatchOptions) Output
}

// BatchOptions controls one batched step.
type BatchOptions struct {
	// Live marks the rows that take this step's token (nil: all); only without Widths
	// (there a width of 0 holds a row). A held row's state is left as it was: its KV
	// length does not move (the key written past it is overwritten by its next step) and
	// its recurrent state and conv tail are selected back; its logits are computed and
	// meaningless.
	Live []bool
	// PaddedKeys attends every row in one attention over the longest row's keys, the rows'
	// tails masked (key j visible to query i of row r iff j ≤ Lens[r]+i); off: one
	// attention per row over exactly its keys, the computation of that row run alone (bit
	// for bit on the CPU). docs/perf/batching.md compares them.
	PaddedKeys bool
	// Widths, when set (one per row, each ≥ 0, at least one token in all), gives row r
	// Widths[r] tokens this step, packed in ids [1, ΣWidths]; a width of 0 holds the row
	// (its state stays bit for bit what it was). nil: one token per row, ids [B, 1].
	Widths []int
	// Taps lists decoder layers whose residual outputs are returned in Output.Hidden,
	// concatenated on the feature axis in this order (ForwardOptions.Taps).
	Taps []int
	// Tentative writes the step's positions without counting them: the batch then refuses
	// every change until cache.Batch.Commit(keep) keeps row r's first keep[r] of them
	// (the accepted prefix of a verified draft block); the others leave no trace.
	Tentative bool
	// KeyBucket > 0 pads the keys of MLX's attention in a step whose widest row takes 2..64
	// tokens to a multiple of it under a mask (ForwardOptions.KeyBucket): each such row's
	// own keys, or on the PaddedKeys path the longest row's. The CUDA backend builds a
	// cuDNN plan per shape of a multi-query attention, and exact lengths change every
	// step. 0: exact lengths. Rows the few-query kernel attends (BatchPass.UseKernel) need
	// none: the kernel takes the lengths at run time.
	KeyBucket int
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

// BatchPass is one batched step's view of its layers: the rows' positions (their lengths
// before the step), the packing of their tokens, the arrays all layers share, the taps,
// and the KV layers written, which Finish advances.
//
// The step's N token rows are packed (row r's after those of the rows before it), as the
// products and the MLP take them: row-independent, so each row's rows are computed as
// when it runs alone. Heads and recurrences take them unpacked, [B, W] with W the widest
// row (Unpack, Pack): a row's positions past its width are padding, computed and never
// kept (they lie past its length, or past the steps its recurrent state replays).
type BatchPass struct {
	Opt BatchOptions
	// B rows; N token rows, packed; W the widest row's tokens.
	B, N, W     int
	lens        []int
	widths      []int       // the tokens each row computes: Widths, or 1 each
	counts      []int       // the positions each row takes: widths, 0 for a held row
	pos, at     *mlxc.Array // int32 [B]: RoPE offsets; [B, 1, W, 1]: write positions
	unpack      *mlxc.Array // int32 [B·W]: the packed row at each unpacked one (nil: identity)
	pack        *mlxc.Array // int32 [N]: the unpacked row of each packed one (nil: identity)
	mask        *mlxc.Array // the padded path's key mask, made by its first layer
	written     []*BatchKVCache
	longestSeen int // the keys of the longest row after the step, padding included
	taps        []*mlxc.Array
	tapAt       map[int]int // tap layer → its index in taps
	// fqa, when set (UseKernel), attends each row of a step wider than one token whose
	// block it fits (FewQueryAttention.Fits) through the few-query kernel; scaleArr is the
	// model's 1/√D as its 0-d array. rowPos and rowMask are per row, made by the first
	// layer that needs them: the kernel's position of the row's first token, and a padded
	// row's mask (KeyBucket).
	fqa      *FewQueryAttention
	scaleArr *mlxc.Array
	rowPos   []*mlxc.Array
	rowMask  []*mlxc.Array
}

// NewBatchPass checks a step of ids over rows of the given lengths (the batch's Lens) for
// a model of layers decoder layers and makes its shared arrays; op names the family's
// forward in errors.
func NewBatchPass(op string, lens []int, layers int, ids *mlxc.Array, opt BatchOptions) *BatchPass {
	B := len(lens)
	fail := func(format string, args ...any) { panic(&mlxc.Error{Op: op, Msg: fmt.Sprintf(format, args...)}) }
	if B == 0 {
		fail("%v", errNoRows)
	}
	p := &BatchPass{Opt: opt, B: B, lens: slices.Clone(lens), tapAt: map[int]int{}}
	sh := ids.Shape()
	if opt.Widths == nil {
		if len(sh) != 2 || sh[0] != B || sh[1] != 1 {
			fail("ids must be [%d, 1] (one token per row), got %v", B, sh)
		}
		if opt.Live != nil && len(opt.Live) != B {
			fail("live marks %d rows of %d", len(opt.Live), B)
		}
		p.widths, p.counts = make([]int, B), make([]int, B)
		for r := range p.widths {
			p.widths[r] = 1
			if opt.Live == nil || opt.Live[r] {
				p.counts[r] = 1
			}
		}
	} else {
		if opt.Live != nil {
			fail("live and widths both set: a width of 0 holds a row")
		}
		if len(opt.Widths) != B {
			fail("widths give %d rows of %d", len(opt.Widths), B)
		}
		n := 0
		for r, w := range opt.Widths {
			if w < 0 {
				fail("row %d has width %d", r, w)
			}
			n += w
		}
		if n == 0 {
			fail("widths %v give no row a token", opt.Widths)
		}
		if len(sh) != 2 || sh[0] != 1 || sh[1] != n {
			fail("ids must be [1, %d] (the rows' tokens packed, widths %v), got %v", n, opt.Widths, sh)
		}
		p.widths, p.counts = slices.Clone(opt.Widths), slices.Clone(opt.Widths)
	}
	p.W = slices.Max(p.widths)
	for _, w := range p.widths {
		p.N += w
	}
	for i, t := range opt.Taps {
		if t < 0 || t >= layers {
			fail("tap layer %d out of range [0, %d)", t, layers)
		}
		p.tapAt[t] = i
	}
	if len(opt.Taps) > 0 {
		p.taps = make([]*mlxc.Array, len(opt.Taps))
	}
	pos := make([]int32, B)
	at := make([]int32, 0, B*p.W)
	for r, n := range lens {
		pos[r] = int32(n)
		p.longestSeen = max(p.longestSeen, n+p.W)
		for i := range p.W {
			at = append(at, int32(n+i))
		}
	}
	p.pos = mlxc.FromSlice(pos, B)
	p.at = mlxc.FromSlice(at, B, 1, p.W, 1)
	if p.N != B*p.W { // some row is narrower than the widest: gathers between the layouts
		unpack, pack := make([]int32, 0, B*p.W), make([]int32, 0, p.N)
		first := 0 // the packed index of row r's first token
		for r, w := range p.widths {
			for i := range p.W {
				unpack = append(unpack, int32(min(first+min(i, max(w-1, 0)), p.N-1))) // padding repeats a token
				if i < w {
					pack = append(pack, int32(r*p.W+i))
				}
			}
			first += w
		}
		p.unpack, p.pack = mlxc.FromSlice(unpack, B*p.W), mlxc.FromSlice(pack, p.N)
	}
	return p
}

// UseKernel lets the step attend through the few-query kernel a (nil: never) where a row's
// block fits it, in steps whose widest row takes more than one token; scale is the
// model's 1/√D as a 0-d float32 array. The kernel reads each row's keys up to its length
// given at run time, so it builds nothing per step, where MLX's multi-query attention on
// CUDA builds a cuDNN plan for every new pair of block width and key length (a new one
// almost every step of a batch). It is the kernel a row run alone (Forward) attends with.
func (p *BatchPass) UseKernel(a *FewQueryAttention, scale *mlxc.Array) {
	if a == nil || scale == nil {
		return
	}
	p.fqa, p.scaleArr = a, scale
	p.rowPos = make([]*mlxc.Array, p.B)
}

// Positions are the rows' positions, int32 [B], for RoPE (Rope.ApplyAt): row r's W
// unpacked tokens sit at Positions[r]+i.
func (p *BatchPass) Positions() *mlxc.Array { return p.pos }

// Counts are the positions each row takes in this step (its width, 0 when held), or nil
// when every row takes all W: the recurrent layers' per-row step counts.
func (p *BatchPass) Counts() []int {
	for _, n := range p.counts {
		if n != p.W {
			return p.counts
		}
	}
	return nil
}

// Unpack turns packed rows x [N, …] into unpacked ones [B·W, …]: row r's tokens at
// r·W, r·W+1, …, its padding a copy of one of the step's rows.
func (p *BatchPass) Unpack(x *mlxc.Array) *mlxc.Array {
	if p.unpack == nil {
		return x
	}
	return mlxc.Take(x, p.unpack, 0)
}

// Pack is Unpack's inverse on the rows' tokens: unpacked rows x [B·W, …] to packed ones
// [N, …], the padding dropped.
func (p *BatchPass) Pack(x *mlxc.Array) *mlxc.Array {
	if p.pack == nil {
		return x
	}
	return mlxc.Take(x, p.pack, 0)
}

// Attend writes the step's heads k, v [B, nKV, W, hd] into lc at each row's positions
// and attends the queries q [B, nH, W, hd] over each row's keys up to and including its
// own, causally, returning the attention rows packed [N, nH·hd].
func (p *BatchPass) Attend(lc *BatchKVCache, q, k, v *mlxc.Array, scale float32) *mlxc.Array {
	if !slices.Equal(lc.lens, p.lens) {
		panic(&mlxc.Error{Op: "batched attention", Msg: fmt.Sprintf("layer holds rows of lengths %v, the step %v", lc.lens, p.lens)})
	}
	lc.write(k, v, p.at)
	p.written = append(p.written, lc)
	if p.Opt.PaddedKeys && (p.W == 1 || p.fqa == nil) {
		// One attention for all rows, queries unpacked [B, nH, W, hd]: a masked key adds an
		// exact zero to the row's softmax sums, so on the CPU each row's rows are still its
		// own attention's bits (batchtest checks it for W = 1 and verify blocks alike).
		keysLen := p.longestSeen
		if b := p.Opt.KeyBucket; b > 0 && p.W > 1 && p.W <= MaxBucketedQueries {
			keysLen = bucketRows(keysLen, b, lc.capacity())
		}
		if p.mask == nil {
			j := mlxc.Reshape(mlxc.Arange(0, float64(keysLen), 1, mlxc.Int32), 1, 1, 1, keysLen)
			p.mask = mlxc.LessEqual(j, p.at) // key j of row r is visible to query i iff j ≤ Lens[r]+i
		}
		keys := mlxc.SliceAxis(lc.keys, 2, 0, keysLen)
		values := mlxc.SliceAxis(lc.values, 2, 0, keysLen)
		o := mlxc.ScaledDotProductAttention(q, keys, values, scale, mlxc.MaskArray, p.mask, nil)
		return p.Pack(mergeHeads(o, p.B*p.W))
	}
	// One attention per row over exactly its keys, with the mask mode the single-sequence
	// Forward gives a block of w tokens (KVPass: causal for w > 1): the row's own
	// computation. With the kernel (UseKernel) a row it fits goes through it, over the
	// row's whole buffer up to its length; with KeyBucket a wider row's keys are padded
	// under a mask, as a block run alone pads them.
	nH, nKV, hd, vd := q.Dim(1), lc.keys.Dim(1), lc.keys.Dim(3), lc.values.Dim(3)
	outs := make([]*mlxc.Array, 0, p.B)
	for r, n := range p.lens {
		w := p.widths[r]
		if w == 0 {
			continue
		}
		qr := q
		if p.B > 1 || w < p.W {
			qr = mlxc.Slice(q, []int{r, 0, 0, 0}, []int{r + 1, nH, w, q.Dim(3)})
		}
		if p.fqa != nil && p.W > 1 {
			// The row's buffer [1, nKV, capacity, hd] is one contiguous piece of the batch's.
			keys, values := mlxc.SliceAxis(lc.keys, 0, r, r+1), mlxc.SliceAxis(lc.values, 0, r, r+1)
			if p.fqa.Fits(qr, keys) {
				if p.rowPos[r] == nil {
					p.rowPos[r] = OnDevice(Visible(n))
				}
				outs = append(outs, p.fqa.Apply(qr, keys, values, p.scaleArr, p.rowPos[r], true, n+w))
				continue
			}
		}
		K, mode := n+w, mlxc.MaskNone
		var mask *mlxc.Array
		if w > 1 {
			mode = mlxc.MaskCausal
			if b := p.Opt.KeyBucket; b > 0 && w <= MaxBucketedQueries {
				K, mode = bucketRows(n+w, b, lc.capacity()), mlxc.MaskArray
				if p.rowMask == nil {
					p.rowMask = make([]*mlxc.Array, p.B)
				}
				if p.rowMask[r] == nil {
					p.rowMask[r] = PrefixMask(w, K, func(i int) int { return n + i + 1 }, q.Dtype())
				}
				mask = p.rowMask[r]
			}
		}
		keys := mlxc.Slice(lc.keys, []int{r, 0, 0, 0}, []int{r + 1, nKV, K, hd})
		values := mlxc.Slice(lc.values, []int{r, 0, 0, 0}, []int{r + 1, nKV, K, vd})
		outs = append(outs, mergeHeads(mlxc.ScaledDotProductAttention(qr, keys, values, scale, mode, mask, nil), w))
	}
	if len(outs) == 1 {
		return outs[0]
	}
	return mlxc.Concatenate(outs, 0)
}

// Tap keeps the residual rows h [N, H] after layer i when the step taps it.
func (p *BatchPass) Tap(i int, h *mlxc.Array) {
	if j, ok := p.tapAt[i]; ok {
		p.taps[j] = h
	}
}

// Output shapes the step's logits rows [N, V] and its taps as ForwardBatch returns them:
// [1, N, ·] with Widths, else [B, 1, ·].
func (p *BatchPass) Output(logits *mlxc.Array) Output {
	shape := func(x *mlxc.Array) *mlxc.Array {
		if p.Opt.Widths != nil {
			return mlxc.Reshape(x, 1, p.N, -1)
		}
		return mlxc.Reshape(x, p.B, 1, -1)
	}
	out := Output{Logits: shape(logits)}
	if p.taps != nil {
		hid := p.taps[0]
		if len(p.taps) > 1 {
			hid = mlxc.Concatenate(p.taps, -1)
		}
		out.Hidden = shape(hid)
	}
	return out
}

// Finish counts the step's positions in every KV layer it wrote (each row's count), or
// for a tentative step records them until Commit.
func (p *BatchPass) Finish() {
	for _, lc := range p.written {
		lc.advance(p.counts, p.Opt.Tentative)
	}
}
