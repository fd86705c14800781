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
	m          *Model
	c          *Cache
	opt        model.ForwardOptions
	B, L, rows int
	mask       string
	taps       []*mlxc.Array
	tapAt      map[int]int
	at         bool // the block sits at a device position (opt.Pos)
	rowwise    bool
	fqa        bool
	padKeys    bool
	off0       int
	padMask    *mlxc.Array
	pos, kpos  *mlxc.Array
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
	p := &pass{m: m, c: qc, opt: opt, B: B, L: L, rows: B * L, mask: mlxc.MaskNone, tapAt: map[int]int{}}
	if L > 1 {
		p.mask = mlxc.MaskCausal // bottom-right aligned: right for prefill chunks and verify blocks
	}
	for i, t := range opt.Taps {
		if t < 0 || t >= len(m.layers) {
			fail("tap layer %d out of range [0, %d)", t, len(m.layers))
		}
		p.tapAt[t] = i
	}
	if len(opt.Taps) > 0 {
		p.taps = make([]*mlxc.Array, len(opt.Taps))
	}
	p.at = opt.Pos != nil
	if p.at && (B != 1 || opt.Window < L) {
		fail("a block at a device position needs B = 1 and a window ≥ %d rows, got B = %d, window %d", L, B, opt.Window)
	}
	p.rowwise = L > 1 && L <= model.MaxBucketedQueries && opt.RowwiseAttention && !m.fqa.RowConsistent() && !p.at
	p.fqa = B == 1 && m.fqa != nil && !p.rowwise
	p.padKeys = L > 1 && L <= model.MaxBucketedQueries && opt.KeyBucket > 0 && !p.rowwise && !p.fqa && !p.at
	p.off0 = qc.Offset()
	for _, kv := range qc.kv {
		if kv != nil {
			p.off0 = kv.Offset() // the attention layers' offset is what RoPE and the masks see
			break
		}
	}
	p.pos = opt.Pos
	return p
}

// position is row 0's position as a device array: the caller's, or made once.
func (p *pass) position() *mlxc.Array {
	if p.pos == nil {
		p.pos = model.Visible(p.off0)
	}
	return p.pos
}

// kernelPos is position() in device memory for the CUDA kernels (model.OnDevice).
func (p *pass) kernelPos() *mlxc.Array {
	if p.kpos == nil {
		p.kpos = model.OnDevice(p.position())
	}
	return p.kpos
}

// layer runs decoder layer i on the residual rows h.
func (p *pass) layer(i int, h *mlxc.Array) *mlxc.Array {
	m, eps := p.m, p.m.cfg.Eps
	l := &m.layers[i]
	x := model.NormOf(h, l.inputNorm, eps)
	var post *model.Normed
	if l.attn != nil {
		merged, gate := p.attention(l.attn, p.c.kv[i], x)
		// The output gate: sigmoid and product in the activation dtype, before o_proj.
		h, post = model.OutAdd(nil, l.attn.o, mlxc.Multiply(merged, mlxc.Sigmoid(gate)), h, l.postNorm, eps)
	} else {
		h, post = model.OutAdd(nil, l.lin.out, p.deltaNet(l.lin, p.c.rec[i], x), h, l.postNorm, eps)
	}
	h, _ = model.MLPAdd(nil, m.swiglu, nil, l.gate, l.up, l.down, post, h, nil, eps)
	return h
}

// deltaNet is a GatedDeltaNet layer's mixer of the normed rows x, as rows [B·L, Hv·Dv]
// ready for out_proj: projections, the recurrence (deltanet.Mixer), then the gated RMSNorm
// n·silu(z) with the silu and the product in float32.
func (p *pass) deltaNet(l *linear, rc *deltanet.Cache, x *model.Normed) *mlxc.Array {
	c := &p.m.cfg
	B, L, Hv, Dv := p.B, p.L, c.LinValueHeads, c.LinValueDim
	xn := x.X()
	qkv := mlxc.Reshape(l.qkv.Apply(xn), B, L, c.ConvDim())
	z := mlxc.Reshape(l.z.Apply(xn), B, L, Hv, Dv)
	b := mlxc.Reshape(l.b.Apply(xn), B, L, Hv)
	a := mlxc.Reshape(l.a.Apply(xn), B, L, Hv)
	y := l.mixer.Apply(qkv, a, b, rc, p.opt.Pos)
	n := mlxc.RMSNorm(y, l.norm, c.Eps)
	out := mlxc.AsType(mlxc.Multiply(mlxc.SiLU(mlxc.AsType(z, mlxc.Float32)), mlxc.AsType(n, mlxc.Float32)), y.Dtype())
	return mlxc.Reshape(out, p.rows, Hv*Dv)
}

// attention is a gated attention layer's attention of the normed rows x: the attention
// rows [B·L, nH·hd] and the output gate rows of the same shape.
func (p *pass) attention(l *attention, lc *model.KVCache, x *model.Normed) (merged, gate *mlxc.Array) {
	c := &p.m.cfg
	B, L, hd := p.B, p.L, c.HeadDim
	xn := x.X()
	// Per head, q_proj writes the query's hd values and then the gate's hd values.
	qg := mlxc.Split(mlxc.Reshape(l.q.Apply(xn), B, L, c.Heads, 2*hd), []int{hd}, -1)
	gate = mlxc.Reshape(qg[1], p.rows, c.Heads*hd)
	q := mlxc.Transpose(mlxc.RMSNorm(qg[0], l.qNorm, c.Eps), 0, 2, 1, 3)
	k := heads(l.k.Apply(xn), B, L, c.KVHeads, l.kNorm, c.Eps)
	v := heads(l.v.Apply(xn), B, L, c.KVHeads, nil, 0)
	if p.at || p.m.fqa.RowConsistent() {
		// GPU-exact mode rotates decode steps and verify blocks with the same kernel.
		q, k = p.m.rope.ApplyAt(q, p.position()), p.m.rope.ApplyAt(k, p.position())
	} else {
		off := lc.Offset()
		q, k = p.m.rope.Apply(q, off), p.m.rope.Apply(k, off)
	}
	return p.attend(lc, q, k, v), gate
}

// heads turns projected rows [B·L, n·D] into heads [B, n, L, D], with the per-head RMSNorm
// when norm is set (before the transpose, as mlx-lm); one token needs only a reshape.
func heads(x *mlxc.Array, B, L, n int, norm *mlxc.Array, eps float32) *mlxc.Array {
	if L == 1 {
		x = mlxc.Reshape(x, B, n, 1, -1)
	} else {
		x = mlxc.Reshape(x, B, L, n, -1)
	}
	if norm != nil {
		x = mlxc.RMSNorm(x, norm, eps)
	}
	if L == 1 {
		return x
	}
	return mlxc.Transpose(x, 0, 2, 1, 3)
}

// attend writes k, v into the layer's cache the way the block's path reads them and attends
// through the shared routing (model.Attention), returning rows [B·L, nH·hd].
func (p *pass) attend(lc *model.KVCache, q, k, v *mlxc.Array) *mlxc.Array {
	m := p.m
	attn := model.Attention{FQA: m.fqa, Scale: m.scale, ScaleArr: m.scaleArr, Causal: true}
	var ak model.AttendKeys
	switch {
	case p.at:
		keys, values := lc.WriteAt(k, v, p.pos, p.opt.Window)
		ak.Fits = keys
		ak.Kernel = func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) { return keys, values, p.kernelPos() }
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			if p.padMask == nil {
				p.padMask = model.WindowMask(p.pos, p.L, p.opt.Window, true)
			}
			w := p.opt.Window
			return mlxc.SliceAxis(keys, 2, 0, w), mlxc.SliceAxis(values, 2, 0, w), mlxc.MaskArray, p.padMask
		}
	case p.rowwise:
		ak.Rowwise, ak.Off0 = true, p.off0
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values := lc.UpdateAndFetch(k, v)
			return keys, values, p.mask, nil
		}
	case p.padKeys:
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values, K := lc.UpdateAndFetchPadded(k, v, p.opt.KeyBucket)
			if p.padMask == nil {
				off0 := p.off0
				p.padMask = model.PrefixMask(p.L, K, func(i int) int { return off0 + i + 1 }, q.Dtype())
			}
			return keys, values, mlxc.MaskArray, p.padMask
		}
	default:
		ak.Fits = k
		ak.Kernel = func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
			keys, values := lc.AppendBuffers(k, v) // the kernel reads only the visible rows
			return keys, values, p.kernelPos()
		}
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values := lc.UpdateAndFetch(k, v)
			return keys, values, p.mask, nil
		}
	}
	if !p.fqa {
		ak.Kernel = nil
	}
	return attn.Attend(q, ak, p.rows)
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
