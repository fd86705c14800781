package qwen35

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/model/deltanet"
)

var _ model.BatchModel = (*Model)(nil)

// Batch is the hybrid's batched state: batched KV layers at the attention layers and
// stacked recurrent states at the GatedDeltaNet layers, all with the same rows.
type Batch struct {
	*cache.BatchList
	kv  []*model.BatchKVCache  // nil at linear layers
	rec []*deltanet.BatchCache // nil at attention layers
}

// NewBatch makes an empty batch of the model's layers.
func (m *Model) NewBatch() cache.Batch {
	n := len(m.layers)
	b := &Batch{kv: make([]*model.BatchKVCache, n), rec: make([]*deltanet.BatchCache, n)}
	ls := make([]cache.BatchLayer, n)
	for i := range m.layers {
		if m.cfg.IsLinear(i) {
			b.rec[i] = deltanet.NewBatchCache()
			ls[i] = b.rec[i]
		} else {
			b.kv[i] = &model.BatchKVCache{}
			ls[i] = b.kv[i]
		}
	}
	b.BatchList = cache.NewBatchList(ls...)
	return b
}

// ForwardBatch is one step for every row of b (model.BatchModel): Forward's layers over
// the step's packed rows [N, H], the attention heads unpacked to [B, W] for RoPE at each
// row's positions and attention through model.BatchPass, and each GatedDeltaNet layer's
// recurrence over the stacked states with the rows unpacked (its kernel takes the row
// axis; a row's padding steps are never kept).
func (m *Model) ForwardBatch(ids *mlxc.Array, b cache.Batch, opt model.BatchOptions) model.Output {
	bc, ok := b.(*Batch)
	if !ok || len(bc.kv) != len(m.layers) {
		fail("batch does not belong to this model")
	}
	if bc.Tentative() {
		fail("a tentative step is not committed")
	}
	if err := bc.CheckLens(); err != nil {
		fail("%v", err)
	}
	p := model.NewBatchPass("qwen3_5.forward_batch", bc.Lens(), len(m.layers), ids, opt)
	if m.batchFQA {
		p.UseKernel(m.fqa, m.scaleArr)
	}
	B, W, N, eps := p.B, p.W, p.N, m.cfg.Eps
	counts := p.Counts()
	h := m.embed.Lookup(mlxc.Reshape(ids, N))
	for i := range m.layers {
		l := &m.layers[i]
		x := model.NormOf(h, l.inputNorm, eps)
		var post *model.Normed
		if l.attn != nil {
			q, k, v, gate := m.heads(l.attn, x, B, W, p.Unpack)
			q, k = m.rope.ApplyAt(q, p.Positions()), m.rope.ApplyAt(k, p.Positions())
			merged := p.Attend(bc.kv[i], q, k, v, m.scale)
			h, post = model.OutAdd(nil, l.attn.o, m.gating.Gate(merged, gate), h, l.postNorm, eps)
		} else {
			rc := bc.rec[i]
			// The projections come packed as one sequence [1, N, ·]; the recurrence takes
			// each row's positions on its own row, [B, W, ·], and y goes back packed.
			unpack := func(x *mlxc.Array) *mlxc.Array {
				return mlxc.Reshape(p.Unpack(mlxc.Squeeze(x, 0)), B, W, -1)
			}
			mixed := m.deltaNet(l.lin, x, 1, N, func(qkv, a, b *mlxc.Array) *mlxc.Array {
				y := l.lin.mixer.ApplyRows(unpack(qkv), unpack(a), unpack(b), rc, counts, opt.Tentative)
				Hv, Dv := y.Dim(2), y.Dim(3)
				return mlxc.Reshape(p.Pack(mlxc.Reshape(y, B*W, Hv, Dv)), 1, N, Hv, Dv)
			})
			h, post = model.OutAdd(nil, l.lin.out, mixed, h, l.postNorm, eps)
		}
		h = m.mlp(l, h, post)
		p.Tap(i, h)
	}
	p.Finish()
	return p.Output(m.Head(m.FinalNorm(h)))
}
