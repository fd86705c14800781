package draft

import (
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// A DFlash2 layer (DFLASH2.md §6.3) wraps attention and the MLP each in a grouped dynamic
// convolution: the sublayer reads conv(norm(x)) and its output passes through the
// convolution's second side, with coefficients computed from the same normed input,
// before the residual add. Attention is bidirectional inside the block, and every layer
// reads a bounded window of context (WindowCache).

// dynConv is one layer's grouped dynamic causal convolution (attention_conv or mlp_conv).
type dynConv struct {
	base *mlxc.Array    // [2 (side), K (tap), H]
	proj *model.Linear  // kernel_projection: H → 2·K·G
	side [2]*mlxc.Array // base[side] [K, H], views made once at load
}

// buildConvs takes a layer's two convolutions (under prefix p) from b.
func (d *Drafter) buildConvs(b *model.Builder, p string, l *layer) {
	cfg := d.Cfg
	H, K, G := cfg.HiddenSize, cfg.ConvKernel, cfg.HiddenSize/cfg.ConvGroup
	for _, c := range []struct {
		name string
		dst  **dynConv
	}{{"attention_conv", &l.attnConv}, {"mlp_conv", &l.mlpConv}} {
		*c.dst = &dynConv{
			base: b.Float(p+c.name+".base_kernel", 2, K, H),
			proj: b.Linear(p+c.name+".kernel_projection", 2*K*G, H, false),
		}
	}
}

// prepareConvs makes the per-side views of the base kernels once the weights are read.
func (d *Drafter) prepareConvs() {
	for i := range d.layers {
		for _, c := range []*dynConv{d.layers[i].attnConv, d.layers[i].mlpConv} {
			for s := range c.side {
				c.side[s] = mlxc.Reshape(mlxc.SliceAxis(c.base, 0, s, s+1), d.Cfg.ConvKernel, d.Cfg.HiddenSize).Detach()
			}
			c.proj.Prepare()
		}
	}
}

// convArrays are the convolutions' weights.
func (l *layer) convArrays() []*mlxc.Array {
	var out []*mlxc.Array
	for _, c := range []*dynConv{l.attnConv, l.mlpConv} {
		if c != nil {
			out = append(append(out, c.base), c.proj.Arrays()...)
		}
	}
	return out
}

// freeConvs releases the convolutions' weights.
func (l *layer) freeConvs() {
	for _, c := range []*dynConv{l.attnConv, l.mlpConv} {
		if c != nil {
			c.base.Free()
			c.proj.Free()
			c.side[0].Free()
			c.side[1].Free()
		}
	}
}

// prepareSide is the first side of layer convolution c over the normed rows n [N, H],
// blocks of L rows each (N = L: one block): the rows the sublayer reads, and the
// coefficients [N, K, G] its output's side uses. The kernel projection runs over all rows
// at once; the convolution never reads across a block's start.
func (d *Drafter) prepareSide(c *dynConv, n *mlxc.Array, L int) (u, finish *mlxc.Array) {
	N, K, G := n.Dim(0), d.Cfg.ConvKernel, d.Cfg.HiddenSize/d.Cfg.ConvGroup
	dyn := mlxc.Split(mlxc.Reshape(c.proj.Apply(n), N, 2, K, G), []int{1}, 1)
	first := mlxc.Reshape(dyn[0], N, K, G)
	return d.convBlocks(n, first, c.side[0], L), mlxc.Reshape(dyn[1], N, K, G)
}

// finishSide is the second side of c over the sublayer's output rows h [N, H] (blocks of
// L rows).
func (d *Drafter) finishSide(c *dynConv, h, coeff *mlxc.Array, L int) *mlxc.Array {
	return d.convBlocks(h, coeff, c.side[1], L)
}

// convBlocks convolves rows h [N, H] in blocks of L rows: one block as it is, several as
// [N/L, L, H] (Conv's batched form, the same values per block).
func (d *Drafter) convBlocks(h, coeff, base *mlxc.Array, L int) *mlxc.Array {
	N, H := h.Dim(0), h.Dim(1)
	if N == L {
		return d.conv.Apply(h, coeff, base)
	}
	R := N / L
	y := d.conv.Apply(mlxc.Reshape(h, R, L, H), mlxc.Reshape(coeff, R, L, coeff.Dim(1), coeff.Dim(2)), base)
	return mlxc.Reshape(y, N, H)
}

// Block is what a DFlash2 forward gives the selector: the block's normed final rows
// after the anchor [L−1, H] and their logits [L−1, V].
type Block struct {
	Hidden, Logits *mlxc.Array
}

// ForwardWindow drafts a DFlash2 block. block is int32 [1, L] = [anchor, mask…]; ctx holds
// the target's tapped rows [1, S, n·H] of the positions committed since the last call
// (nil when none), which go into c at its offset; the block follows them. It is
// ForwardWindowRows' one-row case.
func (d *Drafter) ForwardWindow(block, ctx *mlxc.Array, c *WindowCache) (Block, error) {
	bs, err := d.ForwardWindowRows([]*mlxc.Array{block}, []*mlxc.Array{ctx}, []*WindowCache{c})
	if err != nil {
		return Block{}, err
	}
	return bs[0], nil
}

// ForwardWindowRows drafts the blocks of several sequences in one forward: row r's block
// blocks[r] (int32 [1, L], the same L for every row: DFlash2 always drafts its trained
// block) after its own window caches[r], into which its new context rows ctxs[r] ([1, S_r, n·H],
// nil when none) go as ForwardWindow writes them. The convolutions, projections, MLPs,
// norms and the head run once over all rows' block tokens packed together ([R·L, ·]; the
// convolutions per block); each row's attention reads only its own window and block, at
// its own positions. Every packed op is row-wise, so on the CPU row r's Block is bit for
// bit ForwardWindow's for that row alone. The caches must be distinct; on an error (a
// misused cache) no cache has changed.
func (d *Drafter) ForwardWindowRows(blocks, ctxs []*mlxc.Array, caches []*WindowCache) ([]Block, error) {
	L := blocks[0].Dim(1)
	rows := make([]windowRow, len(blocks))
	ids := make([]*mlxc.Array, len(blocks))
	for r, block := range blocks {
		if block.Dim(1) != L {
			return nil, fmt.Errorf("draft: row %d's block has %d tokens, row 0's %d (DFlash2 rows share the trained block)", r, block.Dim(1), L)
		}
		ids[r] = block
	}
	for r, c := range caches {
		off := c.Offset()
		proj, skip, err := d.windowContext(ctxs[r], c, off)
		if err != nil {
			return nil, fmt.Errorf("draft: row %d: %w", r, err)
		}
		S := 0
		if proj != nil {
			S = proj.Dim(0)
		}
		q0 := off + skip + S
		rows[r] = windowRow{c: c, proj: proj, at: off + skip,
			rotate: func(a *mlxc.Array) *mlxc.Array { return d.rope.Apply(a, q0) },
			makeMask: func(n int) *mlxc.Array {
				start := c.start
				if proj != nil {
					start = q0 - n
				}
				return d.windowMask(start, q0, n, L)
			}}
	}
	x := d.windowLayers(d.embedBlock(packRows(ids)), L, rows)
	for _, w := range rows {
		if w.proj != nil {
			w.c.advance(w.at, w.proj.Dim(0))
		}
	}
	return d.finalRows(x, L), nil
}

// ForwardWindowAt is ForwardWindow when only the device knows how many of the previous
// verify block's rows are committed (the engine's run-ahead loop): ctx's T rows all go
// into c at its offset, the first valid (int32 [1], device) of them committed, and the
// block follows those. c's offset is left past all T rows; the caller sets it
// (WindowCache.SetOffset) once it has read the count.
func (d *Drafter) ForwardWindowAt(block, ctx, valid *mlxc.Array, c *WindowCache) (Block, error) {
	L, T := block.Dim(1), ctx.Dim(1)
	off := c.Offset()
	if T > c.keep {
		return Block{}, fmt.Errorf("draft: %d context rows at once exceed the window's %d", T, c.keep)
	}
	if err := c.begin(off, true); err != nil {
		return Block{}, err
	}
	proj := d.project(d.activation(mlxc.Reshape(ctx, T, -1)))
	q0 := mlxc.Add(mlxc.FromSlice([]int32{int32(off)}, 1), valid)
	x := d.windowLayers(d.embedBlock(block), L, []windowRow{{c: c, proj: proj, at: off,
		rotate: func(a *mlxc.Array) *mlxc.Array { return d.rope.ApplyAt(a, q0) },
		makeMask: func(rows int) *mlxc.Array {
			return d.windowMaskAt(off+T-rows, q0, rows, L)
		}}})
	c.advance(off, T)
	return d.finalRows(x, L)[0], nil
}

// windowRow is one sequence's share of a DFlash2 forward: its window c, into which each
// layer writes the projected context rows proj (nil: none) at position at; its block's
// queries and keys are rotated by rotate, and its mask is makeMask's for the window's row
// count (made once: every layer holds the same positions).
type windowRow struct {
	c        *WindowCache
	proj     *mlxc.Array
	at       int
	rotate   func(*mlxc.Array) *mlxc.Array
	makeMask func(rows int) *mlxc.Array
	mask     *mlxc.Array
}

// windowLayers runs the packed block rows x [R·L, H] (row r's block is rows r·L…r·L+L−1)
// through the DFlash2 layers: each row's block attends to its own window's rows and to
// itself.
func (d *Drafter) windowLayers(x *mlxc.Array, L int, rows []windowRow) *mlxc.Array {
	N := x.Dim(0)
	outs := make([]*mlxc.Array, len(rows))
	for i := range d.layers {
		l := &d.layers[i]
		x = d.layer2(l, x, L, func(u *mlxc.Array) *mlxc.Array {
			qp, kp, vp := l.q.Apply(u), l.k.Apply(u), l.v.Apply(u)
			for r := range rows {
				w := &rows[r]
				q, kb, vb := d.blockHeads(l, rowsOf(qp, r*L, L, N), rowsOf(kp, r*L, L, N), rowsOf(vp, r*L, L, N), w.rotate)
				if w.proj != nil {
					k, v := d.headsKV(l, l.k.Apply(w.proj), l.v.Apply(w.proj), w.at)
					w.c.write(i, k, v)
				}
				kc, vc := w.c.keys(i)
				if w.mask == nil {
					n := 0
					if kc != nil {
						n = kc.Dim(2)
					}
					w.mask = d.padKeysMask(w.makeMask(n))
				}
				outs[r] = d.attend2(q, kc, vc, kb, vb, w.mask, L)
			}
			return packRows(outs)
		})
	}
	return x
}

// rowsOf is rows start…start+L−1 of a [N, ·] (a itself when that is all of it).
func rowsOf(a *mlxc.Array, start, L, N int) *mlxc.Array {
	if L == N {
		return a
	}
	return mlxc.SliceAxis(a, 0, start, start+L)
}

// windowContext projects the new context rows ctx [1, S, n·H] and begins the window
// cache's write at position off. Rows older than the window can never be read, so of more
// than keep new rows only the last keep are projected (skip of them are passed over).
func (d *Drafter) windowContext(ctx *mlxc.Array, c *WindowCache, off int) (proj *mlxc.Array, skip int, err error) {
	if ctx == nil {
		return nil, 0, nil
	}
	S := ctx.Dim(1)
	rows := mlxc.Reshape(ctx, S, -1)
	if S > c.keep {
		skip = S - c.keep
		rows = mlxc.SliceAxis(rows, 0, skip, S)
	}
	if err := c.begin(off, skip == 0); err != nil {
		return nil, 0, err
	}
	return d.project(d.activation(rows)), skip, nil
}

// AddWindowContext appends committed context rows [1, T, n·H] to c without drafting
// (prefill chunks, and a cycle that drafts nothing).
func (d *Drafter) AddWindowContext(ctx *mlxc.Array, c *WindowCache) error {
	off := c.Offset()
	proj, skip, err := d.windowContext(ctx, c, off)
	if err != nil || proj == nil {
		return err
	}
	for i := range d.layers {
		l := &d.layers[i]
		k, v := d.headsKV(l, l.k.Apply(proj), l.v.Apply(proj), off+skip)
		c.write(i, k, v)
	}
	c.advance(off+skip, proj.Dim(0))
	return nil
}

// embedBlock is the input rows [R·L, H] of blocks [R, L]: the target's embedding of
// their tokens, times input_embedding_scale when the checkpoint sets one.
func (d *Drafter) embedBlock(blocks *mlxc.Array) *mlxc.Array {
	x := d.activation(d.target.Embed(mlxc.Reshape(blocks, -1)))
	if s := d.Cfg.InputEmbeddingScale; s != 1 {
		x = mlxc.Multiply(x, mlxc.Scalar(s, x.Dtype()))
	}
	return x
}

// activation computes float16 rows in float32: DFlash2 drafts collapse with float16
// activations (DFLASH2.md §11.1); bfloat16 and float32 pass unchanged.
func (d *Drafter) activation(x *mlxc.Array) *mlxc.Array {
	if x.Dtype() == mlxc.Float16 {
		return mlxc.AsType(x, mlxc.Float32)
	}
	return x
}

// layer2 is one DFlash2 decoder layer over the block rows x [N, H], blocks of L rows;
// attend maps the attention convolution's output rows to the attention's heads as rows
// [N, nH·hd] (before o_proj).
func (d *Drafter) layer2(l *layer, x *mlxc.Array, L int, attend func(u *mlxc.Array) *mlxc.Array) *mlxc.Array {
	eps := d.Cfg.RMSNormEps
	u, coeff := d.prepareSide(l.attnConv, mlxc.RMSNorm(x, l.inputNorm, eps), L)
	x = mlxc.Add(x, d.finishSide(l.attnConv, l.o.Apply(attend(u)), coeff, L))
	u, coeff = d.prepareSide(l.mlpConv, mlxc.RMSNorm(x, l.postNorm, eps), L)
	m := l.down.Apply(d.swiglu.Apply(l.gate.Apply(u), l.up.Apply(u)))
	return mlxc.Add(x, d.finishSide(l.mlpConv, m, coeff, L))
}

// blockHeads are the block's rotated query heads [1, nH, L, hd] and its own keys and
// values [1, nKV, L, hd] from its rows of the q, k and v products (qp, kp, vp [L, ·]).
func (d *Drafter) blockHeads(l *layer, qp, kp, vp *mlxc.Array, rotate func(*mlxc.Array) *mlxc.Array) (q, k, v *mlxc.Array) {
	c0 := d.Cfg
	L := qp.Dim(0)
	q = mlxc.Transpose(mlxc.RMSNorm(mlxc.Reshape(qp, 1, L, c0.NumHeads, -1), l.qNorm, c0.RMSNormEps), 0, 2, 1, 3)
	k, v = d.heads(l, kp, vp, rotate)
	return rotate(q), k, v
}

// attend2 is the block's attention over the window's context keys kc, vc (nil: none) and
// its own keys kb, vb, visible as mask [1, 1, L, ctx+L] says: its heads as rows [L, nH·hd].
func (d *Drafter) attend2(q, kc, vc, kb, vb, mask *mlxc.Array, L int) *mlxc.Array {
	parts, vparts, n := []*mlxc.Array{kb}, []*mlxc.Array{vb}, L
	if kc != nil {
		parts, vparts, n = []*mlxc.Array{kc, kb}, []*mlxc.Array{vc, vb}, n+kc.Dim(2)
	}
	if pad := mask.Dim(3) - n; pad > 0 {
		// Masked zero keys up to the padded mask's length (padKeysMask).
		z := mlxc.Zeros([]int{1, kb.Dim(1), pad, kb.Dim(3)}, kb.Dtype())
		parts, vparts = append(parts, z), append(vparts, z)
	}
	keys, values := parts[0], vparts[0]
	if len(parts) > 1 {
		keys, values = mlxc.Concatenate(parts, 2), mlxc.Concatenate(vparts, 2)
	}
	o := mlxc.ScaledDotProductAttention(q, keys, values, d.scale, mlxc.MaskArray, mask, nil)
	return mlxc.Reshape(mlxc.Transpose(o, 0, 2, 1, 3), L, -1)
}

// padKeysMask pads a block's mask [1, 1, L, n] with hidden columns to a multiple of
// KeyBucket (unchanged when KeyBucket is 0): attend2 then appends as many zero keys. The
// window's rows grow by the committed tokens every cycle, and MLX's CUDA backend builds a
// new attention plan for each new key length (milliseconds each, every cycle); padded,
// the length changes once per KeyBucket rows. The padded keys weigh exp(−inf) = 0.
func (d *Drafter) padKeysMask(mask *mlxc.Array) *mlxc.Array {
	n := mask.Dim(3)
	if d.KeyBucket <= 0 || n%d.KeyBucket == 0 {
		return mask
	}
	pad := d.KeyBucket - n%d.KeyBucket
	hidden := mlxc.Zeros([]int{1, 1, mask.Dim(2), pad}, mlxc.Bool)
	return mlxc.Concatenate([]*mlxc.Array{mask, hidden}, 3)
}

// windowMask is the block's mask over R context rows (positions start…start+R−1) and its
// own L rows, the block's row i at position q0+i: a context row at p is seen when
// q0+i−p < window; every block row sees every other.
func (d *Drafter) windowMask(start, q0, R, L int) *mlxc.Array {
	return d.windowMaskAt(start, mlxc.FromSlice([]int32{int32(q0)}, 1), R, L)
}

// windowMaskAt is windowMask with the block's first position on the device (q0, int32
// [1]); context rows at or past q0 (an uncommitted tail) are hidden too.
func (d *Drafter) windowMaskAt(start int, q0 *mlxc.Array, R, L int) *mlxc.Array {
	W := int32(d.Cfg.SlidingWindow)
	q := mlxc.Add(mlxc.Reshape(mlxc.Arange(0, float64(L), 1, mlxc.Int32), L, 1), q0) // [L, 1]
	p := mlxc.Reshape(mlxc.Arange(float64(start), float64(start+R), 1, mlxc.Int32), 1, R)
	ctx := mlxc.LogicalAnd(mlxc.Less(p, q0), mlxc.Less(mlxc.Subtract(q, p), mlxc.ScalarInt(int64(W), mlxc.Int32)))
	all := mlxc.Full([]int{L, L}, mlxc.ScalarInt(1, mlxc.Bool), mlxc.Bool)
	return mlxc.Reshape(mlxc.Concatenate([]*mlxc.Array{ctx, all}, 1), 1, 1, L, R+L)
}

// finalRows are, for each block of L rows in x [R·L, H], the final norm of its rows after
// the anchor and their logits through the target's head (times output_multiplier,
// soft-capped when the checkpoint says so): the norm and head run once over all blocks.
func (d *Drafter) finalRows(x *mlxc.Array, L int) []Block {
	N, H := x.Dim(0), x.Dim(1)
	if N == L {
		return []Block{d.finalBlock(mlxc.SliceAxis(x, 0, 1, L))}
	}
	R := N / L
	all := d.finalBlock(mlxc.Reshape(mlxc.SliceAxis(mlxc.Reshape(x, R, L, H), 1, 1, L), R*(L-1), H))
	out := make([]Block, R)
	for r := range out {
		a, b := r*(L-1), (r+1)*(L-1)
		out[r] = Block{Hidden: mlxc.SliceAxis(all.Hidden, 0, a, b), Logits: mlxc.SliceAxis(all.Logits, 0, a, b)}
	}
	return out
}

// finalBlock is finalRows over rows x that are all drafts (no anchor).
func (d *Drafter) finalBlock(x *mlxc.Array) Block {
	n := model.NormOf(x, d.norm, d.Cfg.RMSNormEps)
	logits := d.target.Head(n)
	if m := d.Cfg.OutputMultiplier; m != 1 {
		logits = mlxc.Multiply(logits, mlxc.Scalar(m, logits.Dtype()))
	}
	if c := d.Cfg.LogitCap; c > 0 {
		cap := mlxc.Scalar(c, logits.Dtype())
		logits = mlxc.Multiply(mlxc.Tanh(mlxc.Divide(logits, cap)), cap)
	}
	return Block{Hidden: n.X(), Logits: logits}
}

// remapCodebooks renames the selector's codebooks, stored as bare tensors
// (candidate_selector.predecessor_codebook), to the embedding names the builder reads
// (….weight); quantized codebooks already carry .weight/.scales/.biases. Both spellings
// at once is an error: which one is meant cannot be told.
func remapCodebooks(dir string, w *model.Weights) error {
	for _, name := range []string{"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"} {
		if !w.Has(name) {
			continue
		}
		if w.Has(name + ".weight") {
			return fmt.Errorf("%s: the checkpoint has both %s and %s.weight", dir, name, name)
		}
		w.Rename(name, name+".weight")
	}
	return nil
}

// prepare2 readies a DFlash2 drafter: its projections (MLX's products: the custom
// kernels serve DFlash1's block layout), the convolutions' side views, the compiled
// convolution and activation.
func (d *Drafter) prepare2(s settings.Settings) error {
	d.Settings = s
	d.swiglu = model.NewSwiGLU()
	return mlxc.Catch(func() {
		d.fc.Prepare()
		for i := range d.layers {
			l := &d.layers[i]
			for _, x := range []*model.Linear{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
				x.Prepare()
			}
		}
		d.prepareConvs()
		d.Selector.proj.Prepare()
		d.conv = NewConv(d.Cfg.ConvGroup)
	})
}
