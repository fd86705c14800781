package qwen3

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

var _ model.BatchModel = (*Qwen3)(nil)

// NewBatch makes an empty batch of the model's KV layers.
func (m *Qwen3) NewBatch() cache.Batch { return model.NewBatchKVCaches(len(m.layers)) }

// ForwardBatch is one decode step for every row of b: the layers of Forward over rows
// [B, H], with RoPE at each row's position and attention through model.BatchPass. The
// fused head-prep kernels (B = 1 only) are not used: heads are prepared with MLX ops, the
// products and the MLP take the rows as a verify block's rows.
func (m *Qwen3) ForwardBatch(ids *mlxc.Array, b cache.Batch, opt model.BatchOptions) model.Output {
	bc, ok := b.(*model.BatchKVCaches)
	if !ok || len(bc.Layers) != len(m.layers) {
		panic(&mlxc.Error{Op: "qwen3.forward_batch", Msg: "batch does not belong to this model"})
	}
	if err := bc.CheckLens(); err != nil {
		panic(&mlxc.Error{Op: "qwen3.forward_batch", Msg: err.Error()})
	}
	p := model.NewBatchPass("qwen3.forward_batch", bc.Lens(), ids, opt)
	a := &m.arch
	B := p.B
	h := m.embed.Lookup(mlxc.Reshape(ids, B))
	var next *model.Normed
	for i := range m.layers {
		l := &m.layers[i]
		x := next
		if x == nil {
			x = model.NormOf(h, l.inputNorm, a.RMSNormEps)
		}
		qkv := model.ApplyParts(l.qkv, x.X(), l.attn.q, l.attn.k, l.attn.v)
		q := model.SplitHeads(qkv[0], B, 1, a.NumHeads, l.attn.qNorm, a.RMSNormEps)
		k := model.SplitHeads(qkv[1], B, 1, a.NumKVHeads, l.attn.kNorm, a.RMSNormEps)
		v := model.SplitHeads(qkv[2], B, 1, a.NumKVHeads, nil, 0)
		q, k = m.rope.ApplyAt(q, p.Positions()), m.rope.ApplyAt(k, p.Positions())
		merged := p.Attend(bc.Layers[i], q, k, v, m.scale)
		h, x = model.OutAdd(m.fused, l.attn.o, merged, h, l.postNorm, a.RMSNormEps)
		h, next = m.mlp(i, h, x, true)
	}
	p.Finish()
	return model.Output{Logits: mlxc.Reshape(m.Head(next), B, 1, -1)}
}
