package qwen3

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

var _ model.BatchModel = (*Qwen3)(nil)

// NewBatch makes an empty batch of the model's KV layers.
func (m *Qwen3) NewBatch() cache.Batch { return model.NewBatchKVCaches(len(m.layers)) }

// ForwardBatch is one step for every row of b (model.BatchModel): the layers of Forward
// over the step's packed rows [N, H], with the heads unpacked to [B, W] for RoPE at each
// row's positions and attention through model.BatchPass. The fused head-prep kernels
// (B = 1 only) are not used: heads are prepared with MLX ops, the products and the MLP take
// the rows as a verify block's rows.
func (m *Qwen3) ForwardBatch(ids *mlxc.Array, b cache.Batch, opt model.BatchOptions) model.Output {
	const op = "qwen3.forward_batch"
	bc, ok := b.(*model.BatchKVCaches)
	if !ok || len(bc.Layers) != len(m.layers) {
		panic(&mlxc.Error{Op: op, Msg: "batch does not belong to this model"})
	}
	if bc.Tentative() {
		panic(&mlxc.Error{Op: op, Msg: "a tentative step is not committed"})
	}
	if err := bc.CheckLens(); err != nil {
		panic(&mlxc.Error{Op: op, Msg: err.Error()})
	}
	p := model.NewBatchPass(op, bc.Lens(), len(m.layers), ids, opt)
	if m.batchFQA {
		p.UseKernel(m.fqa, m.scaleArr)
	}
	a := &m.arch
	B, W := p.B, p.W
	h := m.embed.Lookup(mlxc.Reshape(ids, p.N))
	var next *model.Normed
	for i := range m.layers {
		l := &m.layers[i]
		x := next
		if x == nil {
			x = model.NormOf(h, l.inputNorm, a.RMSNormEps)
		}
		qkv := model.ApplyParts(l.qkv, x.X(), l.attn.q, l.attn.k, l.attn.v)
		q := model.SplitHeads(p.Unpack(qkv[0]), B, W, m.heads, l.attn.qNorm, a.RMSNormEps)
		k := model.SplitHeads(p.Unpack(qkv[1]), B, W, m.kvHeads, l.attn.kNorm, a.RMSNormEps)
		v := model.SplitHeads(p.Unpack(qkv[2]), B, W, m.kvHeads, nil, 0)
		q, k = m.rope.ApplyAt(q, p.Positions()), m.rope.ApplyAt(k, p.Positions())
		merged := p.Attend(bc.Layers[i], q, k, v, m.scale)
		h, x = model.OutAdd(m.fused, l.attn.o, merged, h, l.postNorm, a.RMSNormEps)
		h, next = m.mlp(i, h, x, true)
		p.Tap(i, h)
	}
	p.Finish()
	return p.Output(m.Head(next))
}
