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

// ForwardBatch is one decode step for every row of b: Forward's layers over rows [B, H],
// RoPE at each row's position, attention through model.BatchPass, and each GatedDeltaNet
// layer's recurrence over the stacked states (its kernel takes the row axis).
func (m *Model) ForwardBatch(ids *mlxc.Array, b cache.Batch, opt model.BatchOptions) model.Output {
	bc, ok := b.(*Batch)
	if !ok || len(bc.kv) != len(m.layers) {
		fail("batch does not belong to this model")
	}
	if err := bc.CheckLens(); err != nil {
		fail("%v", err)
	}
	p := model.NewBatchPass("qwen3_5.forward_batch", bc.Lens(), ids, opt)
	B, eps := p.B, m.cfg.Eps
	h := m.embed.Lookup(mlxc.Reshape(ids, B))
	for i := range m.layers {
		l := &m.layers[i]
		x := model.NormOf(h, l.inputNorm, eps)
		var post *model.Normed
		if l.attn != nil {
			q, k, v, gate := m.heads(l.attn, x, B, 1)
			q, k = m.rope.ApplyAt(q, p.Positions()), m.rope.ApplyAt(k, p.Positions())
			merged := p.Attend(bc.kv[i], q, k, v, m.scale)
			h, post = model.OutAdd(nil, l.attn.o, mlxc.Multiply(merged, mlxc.Sigmoid(gate)), h, l.postNorm, eps)
		} else {
			rc := bc.rec[i]
			mixed := m.deltaNet(l.lin, x, B, 1, func(qkv, a, b *mlxc.Array) *mlxc.Array {
				return l.lin.mixer.ApplyRows(qkv, a, b, rc, opt.Live)
			})
			h, post = model.OutAdd(nil, l.lin.out, mixed, h, l.postNorm, eps)
		}
		h = m.mlp(l, h, post)
	}
	p.Finish()
	return model.Output{Logits: mlxc.Reshape(m.Head(m.FinalNorm(h)), B, 1, -1)}
}
