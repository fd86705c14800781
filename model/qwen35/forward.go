package qwen35

import (
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/deltanet"
)

// Forward follows mlx-lm's qwen3_5.py: per layer h += mixer(norm(h)), then h += mlp(norm(h)).
// Activations stay rows [B·L, H], as in the Qwen3 family (fewer graph nodes per step).
func (m *Model) Forward(ids *mlxc.Array, c model.Cache, opt model.ForwardOptions) model.Output {
	p := m.newPass(ids, c, opt)
	h := m.embed.Lookup(mlxc.Reshape(ids, p.rows))
	for i := range m.layers {
		h = p.layer(i, h)
		if j, ok := p.tapAt[i]; ok {
			p.taps[j] = h
		}
	}
	return p.output(h)
}

// pass is one Forward call: the attention path chosen once for the block and the arrays
// that all attention layers share because they hold the same positions.
type pass struct {
	*model.KVPass // the attention path and the positions the attention layers share
	m             *Model
	c             *Cache
	opt           model.ForwardOptions
	B, L, rows    int
	taps          []*mlxc.Array
	tapAt         map[int]int
}

func fail(format string, args ...any) {
	panic(&mlxc.Error{Op: "qwen3_5.forward", Msg: fmt.Sprintf(format, args...)})
}

// newPass checks Forward's arguments and picks the attention path of the block, with the
// Qwen3 family's rules.
func (m *Model) newPass(ids *mlxc.Array, c model.Cache, opt model.ForwardOptions) *pass {
	qc, ok := c.(*Cache)
	if !ok || len(qc.kv) != len(m.layers) {
		fail("cache does not belong to this model")
	}
	sh := ids.Shape()
	if len(sh) != 2 {
		fail("ids must be [B, L], got %v", sh)
	}
	B, L := sh[0], sh[1]
	p := &pass{m: m, c: qc, opt: opt, B: B, L: L, rows: B * L, tapAt: map[int]int{}}
	for i, t := range opt.Taps {
		if t < 0 || t >= len(m.layers) {
			fail("tap layer %d out of range [0, %d)", t, len(m.layers))
		}
		p.tapAt[t] = i
	}
	if len(opt.Taps) > 0 {
		p.taps = make([]*mlxc.Array, len(opt.Taps))
	}
	off0 := qc.Offset()
	for _, kv := range qc.kv {
		if kv != nil {
			off0 = kv.Offset() // the attention layers' offset is what RoPE and the masks see
			break
		}
	}
	p.KVPass = model.NewKVPass("qwen3_5.forward", B, L, opt, m.fqa, off0, nil)
	return p
}

// layer runs decoder layer i on the residual rows h.
func (p *pass) layer(i int, h *mlxc.Array) *mlxc.Array {
	return p.decoder(&p.m.layers[i], p.c.kv[i], p.c.rec[i], h)
}

// decoder runs the decoder layer l on the residual rows h with its cache: kv for an
// attention layer, rc for a GatedDeltaNet one (the MTP head's layers go through here too).
func (p *pass) decoder(l *layer, kv *model.KVCache, rc *deltanet.Cache, h *mlxc.Array) *mlxc.Array {
	m, eps := p.m, p.m.cfg.Eps
	x := model.NormOf(h, l.inputNorm, eps)
	var post *model.Normed
	if l.attn != nil {
		merged, gate := p.attention(l.attn, kv, x)
		// The output gate: sigmoid and product in the activation dtype, before o_proj.
		h, post = model.OutAdd(nil, l.attn.o, m.gating.Gate(merged, gate), h, l.postNorm, eps)
	} else {
		h, post = model.OutAdd(nil, l.lin.out, p.deltaNet(l.lin, rc, x), h, l.postNorm, eps)
	}
	return m.mlp(l, h, post)
}

// mlp is a layer's MLP (dense or sparse) and residual add for its normed rows post and
// residual h.
func (m *Model) mlp(l *layer, h *mlxc.Array, post *model.Normed) *mlxc.Array {
	if l.moe != nil {
		return mlxc.Add(h, mlxc.Reshape(l.moe.Apply(mlxc.Reshape(post.X(), -1, m.cfg.Hidden)), h.Shape()...))
	}
	h, _ = model.MLPAdd(nil, m.swiglu, l.gateUp, l.gate, l.up, l.down, post, h, nil, m.cfg.Eps)
	return h
}

// deltaNet is a GatedDeltaNet layer's mixer of the normed rows x, as rows [B·L, Hv·Dv]
// ready for out_proj: projections, the recurrence (deltanet.Mixer), then the gated RMSNorm
// n·silu(z) with the silu and the product in float32.
func (p *pass) deltaNet(l *linear, rc *deltanet.Cache, x *model.Normed) *mlxc.Array {
	return p.m.deltaNet(l, x, p.B, p.L, func(qkv, a, b *mlxc.Array) *mlxc.Array {
		return l.mixer.Apply(qkv, a, b, rc, p.opt.Pos)
	})
}

// deltaNet is a GatedDeltaNet layer's projections of the normed rows x (B sequences of L
// rows), the mixer step mix over them (a single sequence's cache, or a batch's rows), and
// the gated norm, as rows [B·L, Hv·Dv].
func (m *Model) deltaNet(l *linear, x *model.Normed, B, L int, mix func(qkv, a, b *mlxc.Array) *mlxc.Array) *mlxc.Array {
	c := &m.cfg
	Hv, Dv := c.LinValueHeads, c.LinValueDim
	xn := x.X()
	var qkv, z, b, a *mlxc.Array
	if l.in != nil {
		// The merged product as [B, L, ·] and one split: qkv, b and a come out in their
		// shapes (a reshape and a split, where a split and four reshapes were).
		parts := mlxc.Split(mlxc.Reshape(l.in.Whole(xn), B, L, -1), l.in.SplitAt(), 2)
		qkv, z, b, a = parts[0], mlxc.Reshape(parts[1], B, L, Hv, Dv), parts[2], parts[3]
	} else {
		qkv = mlxc.Reshape(l.qkv.Apply(xn), B, L, c.ConvDim())
		z = mlxc.Reshape(l.z.Apply(xn), B, L, Hv, Dv)
		b = mlxc.Reshape(l.b.Apply(xn), B, L, Hv)
		a = mlxc.Reshape(l.a.Apply(xn), B, L, Hv)
	}
	y := mix(qkv, a, b)
	out := l.mixer.Fused.GatedOut(z, mlxc.RMSNorm(y, l.norm, c.Eps))
	return mlxc.Reshape(out, B*L, Hv*Dv)
}

// attention is a gated attention layer's attention of the normed rows x: the attention
// rows [B·L, nH·hd] and the output gate rows of the same shape.
func (p *pass) attention(l *attention, lc *model.KVCache, x *model.Normed) (merged, gate *mlxc.Array) {
	q, k, v, gate := p.m.heads(l, x, p.B, p.L, nil)
	if p.RotateAt() {
		q, k = p.m.rope.ApplyAt(q, p.Position()), p.m.rope.ApplyAt(k, p.Position())
	} else {
		off := lc.Offset()
		q, k = p.m.rope.Apply(q, off), p.m.rope.Apply(k, off)
	}
	return p.attend(lc, q, k, v), gate
}

// heads projects a gated attention layer's normed rows x into normed, unrotated heads
// q [B, nH, L, hd], k, v [B, nKV, L, hd] (B sequences of L rows) and the output gate rows,
// as x's rows [rows, nH·hd]. unpack (nil: none) maps the projected rows to the B·L rows
// of the heads: a batched step's packed rows to its unpacked [B, W] (model.BatchPass).
func (m *Model) heads(l *attention, x *model.Normed, B, L int, unpack func(*mlxc.Array) *mlxc.Array) (q, k, v, gate *mlxc.Array) {
	c := &m.cfg
	hd := c.HeadDim
	// Per head, q_proj writes the query's hd values and then the gate's hd values.
	qkv := model.ApplyParts(l.qkv, x.X(), l.q, l.k, l.v)
	gateOf := func(x *mlxc.Array) *mlxc.Array {
		return mlxc.Split(mlxc.Reshape(x, x.Dim(0), c.Heads, 2*hd), []int{hd}, -1)[1]
	}
	if unpack != nil {
		gate = mlxc.Reshape(gateOf(qkv[0]), -1, c.Heads*hd)
		for i := range qkv {
			qkv[i] = unpack(qkv[i])
		}
	}
	qg := mlxc.Split(mlxc.Reshape(qkv[0], B, L, c.Heads, 2*hd), []int{hd}, -1)
	if unpack == nil {
		gate = mlxc.Reshape(qg[1], B*L, c.Heads*hd)
	}
	q = mlxc.Transpose(mlxc.RMSNorm(qg[0], l.qNorm, c.Eps), 0, 2, 1, 3)
	k = model.SplitHeads(qkv[1], B, L, c.KVHeads, l.kNorm, c.Eps)
	v = model.SplitHeads(qkv[2], B, L, c.KVHeads, nil, 0)
	return q, k, v, gate
}

// attend writes k, v into the layer's cache the way the block's path reads them and attends
// through the shared routing (model.KVPass.Keys, model.Attention), returning rows
// [B·L, nH·hd].
func (p *pass) attend(lc *model.KVCache, q, k, v *mlxc.Array) *mlxc.Array {
	m := p.m
	attn := model.Attention{FQA: m.fqa, Scale: m.scale, ScaleArr: m.scaleArr, Causal: true}
	return attn.Attend(q, p.Keys(lc, q, k, v, nil, nil), p.rows)
}

// output gathers the taps and the logits that opt asks for from the last layer's rows h.
func (p *pass) output(h *mlxc.Array) model.Output {
	m, B, L := p.m, p.B, p.L
	var out model.Output
	if p.taps != nil {
		hid := p.taps[0]
		if len(p.taps) > 1 {
			hid = mlxc.Concatenate(p.taps, -1)
		}
		out.Hidden = mlxc.Reshape(hid, B, L, -1)
	}
	switch p.opt.Logits {
	case model.LogitsAll:
		out.Logits = mlxc.Reshape(m.Head(m.FinalNorm(h)), B, L, -1)
	case model.LogitsLast:
		last := h
		if L > 1 {
			last = mlxc.Reshape(mlxc.SliceAxis(mlxc.Reshape(h, B, L, -1), 1, L-1, L), B, -1)
		}
		out.Logits = mlxc.Reshape(m.Head(m.FinalNorm(last)), B, 1, -1)
	}
	return out
}
