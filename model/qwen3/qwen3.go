// Package qwen3 is the Qwen3 family (config.json model_type "qwen3"): its config, its
// weights (HF and mlx-community layouts, bf16 or affine-quantized) and its forward pass,
// which follows mlx-lm's models/qwen3.py op for op over model's shared layers and kernels.
// Its MoE sibling (model_type "qwen3_moe": Qwen3-30B-A3B, Qwen3-Coder-30B-A3B) is the
// same decoder with a sparse MoE MLP (model/moe) in the layers its config names, as in
// mlx-lm's qwen3_moe.py. Both register themselves with model.Register from init.
package qwen3

import (
	"fmt"
	"math"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/moe"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

func init() { model.Register("qwen3", loadQwen3) }

type qwen3Attention struct {
	q, k, v, o   *model.Linear
	qNorm, kNorm *mlxc.Array
}

type qwen3Layer struct {
	inputNorm, postNorm *mlxc.Array
	attn                qwen3Attention
	gate, up, down      *model.Linear // the dense MLP (nil when moe is set)
	moe                 *moe.Block    // the sparse MLP of a qwen3_moe layer
	// qkv and gateUp are set when the projections are merged (MergeProjectionsDefault).
	qkv, gateUp *model.MergedLinear
}

// Qwen3 is the dense Qwen3 decoder (model_type "qwen3").
type Qwen3 struct {
	arch   model.Arch
	embed  *model.Embedding
	layers []qwen3Layer
	norm   *mlxc.Array
	lmHead *model.Linear // nil when tied
	rope   *model.Rope
	scale  float32
	swiglu *model.SwiGLU
	skinny *model.SkinnyGEMM
	qmm    *model.SmallMQuantMatmul // quantized products of 2..16 rows (nil: MLX's)
	// fqa (on CUDA, or its Metal twin) runs multi-token attention; scaleArr is m.scale as a 0-d
	// float32 array for it.
	fqa      *model.FewQueryAttention
	scaleArr *mlxc.Array
	// batchFQA: batched steps attend their multi-token rows through fqa too
	// (settings.Kernels.BatchFQA, model.BatchPass.UseKernel).
	batchFQA bool
	fused    *model.Fused // on CUDA: per-layer kernels for head prep and the MLP gate
	// gpuExact: verify blocks round every row as a one-token step (the MoE blocks run
	// row by row).
	gpuExact bool
	// heads and kvHeads are this rank's attention heads: all of them, or 1/N of each on a
	// tensor-parallel rank (model.Shard).
	heads, kvHeads int
}

func loadQwen3(cfg *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings) (model.Model, error) {
	a, inter, err := parseQwen3Arch(cfg)
	if err != nil {
		return nil, err
	}
	return newQwen3(cfg, w, q, s, a, inter, nil)
}

// newQwen3 builds the decoder of architecture a (inter: the dense MLP width) whose
// layers mc marks sparse have the MoE MLP (mc nil: none, the dense Qwen3).
func newQwen3(cfg *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings, a model.Arch, inter int, mc *moeConfig) (model.Model, error) {
	rope, err := model.ParseRope(cfg, a.HeadDim, a.RopeTheta, a.MaxPositions)
	if err != nil {
		return nil, err
	}
	m := &Qwen3{rope: rope, scale: float32(math.Pow(float64(a.HeadDim), -0.5))}
	// The activation exists before build: the MoE blocks keep it in their config.
	m.swiglu = model.NewSwiGLU()
	if err := m.build(model.NewBuilder(w, q), w, q, a, inter, mc); err != nil {
		m.swiglu.Free()
		m.rope.Free()
		return nil, err
	}
	m.setArch(a, w)
	if err := m.bindKernels(s); err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}

// parseQwen3Arch reads the architecture fields of config.json and the MLP width, which
// model.Arch does not carry; every field is checked before any weight is taken.
func parseQwen3Arch(cfg *model.RawConfig) (model.Arch, int, error) {
	a := model.Arch{Family: "qwen3", TrimmableCache: true}
	var inter int
	err := cfg.PositiveInts(model.Field("hidden_size", &a.HiddenSize), model.Field("num_hidden_layers", &a.NumLayers),
		model.Field("num_attention_heads", &a.NumHeads), model.Field("num_key_value_heads", &a.NumKVHeads),
		model.Field("head_dim", &a.HeadDim), model.Field("vocab_size", &a.VocabSize), model.Field("intermediate_size", &inter))
	if err != nil {
		return a, 0, err
	}
	if a.MaxPositions, err = cfg.IntOr("max_position_embeddings", 40960); err != nil {
		return a, 0, err
	}
	eps, err := cfg.Float("rms_norm_eps")
	if err != nil {
		return a, 0, err
	}
	a.RMSNormEps = float32(eps)
	if err := cfg.LiftRopeParameters(); err != nil {
		return a, 0, err
	}
	if a.RopeTheta, err = cfg.Float("rope_theta"); err != nil {
		return a, 0, err
	}
	if a.TiedEmbeddings, err = cfg.BoolOr("tie_word_embeddings", false); err != nil {
		return a, 0, err
	}
	if a.EOSTokenIDs, err = cfg.IntList("eos_token_id"); err != nil {
		return a, 0, err
	}
	if a.NumHeads%a.NumKVHeads != 0 {
		return a, 0, fmt.Errorf("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", cfg.Path, a.NumHeads, a.NumKVHeads)
	}
	return a, inter, nil
}

// build takes the model's weights from b for architecture a (inter: the dense MLP width;
// mc: the sparse layers, or nil) and fails on any tensor left over or missing, so a
// mismatched checkpoint is caught at load.
func (m *Qwen3) build(b *model.Builder, w *model.Weights, q *model.QuantConfig, a model.Arch, inter int, mc *moeConfig) error {
	H, hd := a.HiddenSize, a.HeadDim
	sh := w.Shard
	if err := m.checkSplit(sh, a, inter, mc); err != nil {
		return b.Abandon(err)
	}
	m.heads, m.kvHeads = sh.Local(a.NumHeads), sh.Local(a.NumKVHeads)
	m.embed = b.Embedding("model.embed_tokens", a.VocabSize, H)
	m.layers = make([]qwen3Layer, a.NumLayers)
	for i := range m.layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		l := &m.layers[i]
		l.inputNorm = b.Float(p+"input_layernorm.weight", H)
		l.postNorm = b.Float(p+"post_attention_layernorm.weight", H)
		// Tensor parallelism splits the heads (q, k, v by output rows, o by input
		// columns) and the MLP's width (gate and up by rows, down by columns); unsplit,
		// SplitOut and SplitIn are Linear.
		l.attn.q = b.SplitOut(p+"self_attn.q_proj", a.NumHeads*hd, H, false)
		l.attn.k = b.SplitOut(p+"self_attn.k_proj", a.NumKVHeads*hd, H, false)
		l.attn.v = b.SplitOut(p+"self_attn.v_proj", a.NumKVHeads*hd, H, false)
		l.attn.o = b.SplitIn(p+"self_attn.o_proj", H, a.NumHeads*hd)
		l.attn.qNorm = b.Float(p+"self_attn.q_norm.weight", hd)
		l.attn.kNorm = b.Float(p+"self_attn.k_norm.weight", hd)
		if mc.sparse(i) {
			blk, err := newMoEBlock(b, w, q, p, H, mc, m.swiglu)
			if err != nil {
				return b.Abandon(err)
			}
			l.moe = blk
			continue
		}
		l.gate = b.SplitOut(p+"mlp.gate_proj", inter, H, false)
		l.up = b.SplitOut(p+"mlp.up_proj", inter, H, false)
		l.down = b.SplitIn(p+"mlp.down_proj", H, inter)
	}
	m.norm = b.Float("model.norm.weight", H)
	if !a.TiedEmbeddings {
		m.lmHead = b.Linear("lm_head", a.VocabSize, H, false)
	}
	return b.Finish(qwen3Ignored(a.TiedEmbeddings))
}

// checkSplit refuses a tensor-parallel split the model's shape does not allow, before
// any weight is taken: every rank needs whole attention and KV heads and an equal part of
// the MLP's width (the experts' widths are checked as their blocks are taken, moe.New).
func (m *Qwen3) checkSplit(sh *model.Shard, a model.Arch, inter int, mc *moeConfig) error {
	if !sh.Split() {
		return nil
	}
	if a.NumKVHeads < sh.Size {
		return fmt.Errorf("%d KV heads cannot be split over %d ranks (each rank needs at least one)", a.NumKVHeads, sh.Size)
	}
	for _, c := range []struct {
		n    int
		what string
	}{{a.NumHeads, "attention heads"}, {a.NumKVHeads, "KV heads"}, {denseInter(inter, a, mc), "MLP columns (intermediate_size)"}} {
		if err := sh.Divides(c.n, c.what); err != nil {
			return err
		}
	}
	return nil
}

// denseInter is the dense MLP's width if any layer has one (0 when every layer is sparse).
func denseInter(inter int, a model.Arch, mc *moeConfig) int {
	for i := range a.NumLayers {
		if !mc.sparse(i) {
			return inter
		}
	}
	return 0
}

// qwen3Ignored names the checkpoint tensors Finish may leave unused: mlx-lm's sanitize
// drops lm_head.* when the embeddings are tied; rotary caches that some HF exports carry
// are not parameters.
func qwen3Ignored(tied bool) func(name string) bool {
	return func(name string) bool {
		if tied && (name == "lm_head.weight" || name == "lm_head.scales" || name == "lm_head.biases") {
			return true
		}
		return strings.HasSuffix(name, ".rotary_emb.inv_freq") // a cache some exporters save
	}
}

// setArch completes a with what only the loaded weights tell (quantized or not, their
// dtype and size) and stores it as the model's architecture.
func (m *Qwen3) setArch(a model.Arch, w *model.Weights) {
	a.Quantized = m.embed.Q != nil || (len(m.layers) > 0 && m.layers[0].attn.q.Q != nil)
	a.Dtype = m.embed.Dtype()
	a.WeightBytes = w.Bytes
	m.arch = a
}

// bindKernels makes the model's kernels that s enables (the few-row product, the fused
// head prep and gate, the small-M quantized product, few-query attention); the activation
// is always made.
func (m *Qwen3) bindKernels(s settings.Settings) error {
	var err error
	m.gpuExact = s.Loop.GPUExact
	if m.skinny, err = model.NewSkinnyGEMM(s.Kernels, s.Loop.GPUExact); err != nil {
		return err
	}
	m.fused = model.NewFused(m.rope, m.arch.HeadDim, m.arch.RMSNormEps, s.Kernels)
	m.qmm = model.NewSmallMQuantMatmul(s.Kernels)
	if m.fqa = model.NewFewQueryAttention(s.Kernels, s.Loop.GPUExact); m.fqa != nil {
		m.scaleArr = model.OnDeviceConst(mlxc.Scalar(float64(m.scale), mlxc.Float32))
	}
	m.batchFQA = s.Kernels.BatchFQA
	return nil
}

// Prepare makes per-weight views once the weights are evaluated (see model.Linear.prepare).
func (m *Qwen3) Prepare() {
	m.embed.Prepare(m.skinny)
	m.lmHead.Prepare()
	m.lmHead.UseSkinny(m.skinny)
	m.lmHead.UseQMM(m.qmm)
	// The fused kernels read the merged products directly (no slices).
	merge := m.fused != nil || model.MergesProjections()
	for i := range m.layers {
		l := &m.layers[i]
		for _, x := range []*model.Linear{l.attn.q, l.attn.k, l.attn.v, l.attn.o, l.gate, l.up, l.down} {
			x.Prepare()
			x.UseSkinny(m.skinny)
			x.UseQMM(m.qmm)
		}
		if l.moe != nil {
			l.moe.Prepare()
			l.moe.UseSkinny(m.skinny)
			l.moe.UseQMM(m.qmm)
			l.moe.Rowwise = m.gpuExact
		}
		if merge {
			l.qkv = model.Merge(l.attn.q, l.attn.k, l.attn.v)
			if l.moe == nil {
				l.gateUp = model.Merge(l.gate, l.up)
			}
		}
	}
}

// model.Kernels are the few-row product kernel (nil off CUDA), the few-query attention kernel
// (nil unless enabled on CUDA) and the small-M quantized product (nil unless enabled on a
// GPU), which drafters bound to this model reuse.
func (m *Qwen3) Kernels() model.Kernels {
	return model.Kernels{Skinny: m.skinny, FQA: m.fqa, QMM: m.qmm}
}

func (m *Qwen3) Arch() model.Arch { return m.arch }

func (m *Qwen3) NewCache() model.Cache { return model.NewKVCaches(len(m.layers)) }

func (m *Qwen3) Embed(ids *mlxc.Array) *mlxc.Array { return m.embed.Lookup(ids) }

func (m *Qwen3) Head(x *model.Normed) *mlxc.Array {
	if m.lmHead != nil {
		return m.lmHead.Apply(x.X())
	}
	return m.embed.AsLinear(x.X())
}

// FinalNorm is the model's final RMSNorm of rows h.
func (m *Qwen3) FinalNorm(h *mlxc.Array) *model.Normed {
	return model.NormOf(h, m.norm, m.arch.RMSNormEps)
}

// Forward follows mlx-lm's qwen3.py op for op.
func (m *Qwen3) Forward(ids *mlxc.Array, c model.Cache, opt model.ForwardOptions) model.Output {
	p := m.newPass(ids, c, opt)
	// Activations stay 2-D, [B·L, H]: MLX wraps a matmul of a 3-D input in Flatten and
	// Unflatten nodes, and every graph node costs host time on each step (14 per layer).
	h := m.embed.Lookup(mlxc.Reshape(ids, p.rows))
	var next *model.Normed // this layer's input norm, when the previous layer's MLP made it
	for i := range m.layers {
		h, next = p.layer(i, h, next)
		if j, ok := p.tapAt[i]; ok {
			p.taps[j] = h
		}
	}
	return p.output(h, next)
}

// qwen3Pass is one Forward call: the attention path chosen once for the whole block, and
// the arrays that all layers share because they hold the same positions.
type qwen3Pass struct {
	*model.KVPass // the attention path and the positions all layers share
	m             *Qwen3
	kv            *model.KVCaches
	opt           model.ForwardOptions
	B, L, rows    int
	taps          []*mlxc.Array
	tapAt         map[int]int // tap layer → its index in taps
}

// newPass checks Forward's arguments and picks the attention path of the block.
func (m *Qwen3) newPass(ids *mlxc.Array, c model.Cache, opt model.ForwardOptions) *qwen3Pass {
	kv, ok := c.(*model.KVCaches)
	if !ok || len(kv.Layers) != len(m.layers) {
		panic(&mlxc.Error{Op: "qwen3.forward", Msg: "cache does not belong to this model"})
	}
	sh := ids.Shape()
	if len(sh) != 2 {
		panic(&mlxc.Error{Op: "qwen3.forward", Msg: fmt.Sprintf("ids must be [B, L], got %v", sh)})
	}
	B, L := sh[0], sh[1]
	p := &qwen3Pass{m: m, kv: kv, opt: opt, B: B, L: L, rows: B * L, tapAt: map[int]int{}}
	for i, t := range opt.Taps {
		if t < 0 || t >= len(m.layers) {
			panic(&mlxc.Error{Op: "qwen3.forward", Msg: fmt.Sprintf("tap layer %d out of range [0, %d)", t, len(m.layers))})
		}
		p.tapAt[t] = i
	}
	if len(opt.Taps) > 0 {
		p.taps = make([]*mlxc.Array, len(opt.Taps))
	}
	p.KVPass = model.NewKVPass("qwen3.forward", B, L, opt, m.fqa, kv.Offset(), m.fused.OnDevice)
	return p
}

// layer runs layer i on the residual stream h (next: its input norm, when the previous
// layer's MLP made it) and returns the stream and the norm of what follows.
func (p *qwen3Pass) layer(i int, h *mlxc.Array, next *model.Normed) (*mlxc.Array, *model.Normed) {
	m, a := p.m, &p.m.arch
	l := &m.layers[i]
	x := next
	if x == nil {
		x = model.NormOf(h, l.inputNorm, a.RMSNormEps)
	}
	merged := p.attention(l, p.kv.Layers[i], x)
	h, x = model.OutAdd(m.fused, l.attn.o, merged, h, l.postNorm, a.RMSNormEps)
	return m.mlp(i, h, x, p.opt.Logits != model.LogitsNone)
}

// mlp is layer i's MLP and residual add for its normed rows x and residual h; it returns
// the stream and the norm of what follows (the next layer's input norm, or the final norm
// when logits follow the last layer).
func (m *Qwen3) mlp(i int, h *mlxc.Array, x *model.Normed, logits bool) (*mlxc.Array, *model.Normed) {
	a := &m.arch
	l := &m.layers[i]
	var nextNorm *mlxc.Array
	switch {
	case i+1 < len(m.layers):
		nextNorm = m.layers[i+1].inputNorm
	case logits:
		nextNorm = m.norm // the last layer's rows go through the final norm
	}
	if l.moe != nil {
		h = mlxc.Add(h, l.moe.Apply(x.X()))
		if nextNorm == nil {
			return h, nil
		}
		return h, model.NormOf(h, nextNorm, a.RMSNormEps)
	}
	return model.MLPAdd(m.fused, m.swiglu, l.gateUp, l.gate, l.up, l.down, x, h, nextNorm, a.RMSNormEps)
}

// attention is one layer's attention of the normed rows x, as rows [B·L, H·D].
func (p *qwen3Pass) attention(l *qwen3Layer, lc *model.KVCache, x *model.Normed) *mlxc.Array {
	h := p.heads(l, lc, x)
	if h.merged != nil {
		return h.merged // PrepAttention wrote the keys and values and attended.
	}
	return p.attend(lc, h)
}

// qwen3Heads is what head prep made of one layer's rows: the heads q, k, v; or the cache's
// buffers keys and values, when it wrote the block into them; or merged, the attention
// rows [L, H·D], when it attended too.
type qwen3Heads struct {
	q, k, v, keys, values, merged *mlxc.Array
}

// heads projects one layer's normed rows x into rotated, normed heads: through the fused
// kernels (B = 1, into the cache when the block sits at a device position) or MLX ops.
func (p *qwen3Pass) heads(l *qwen3Layer, lc *model.KVCache, x *model.Normed) (h qwen3Heads) {
	m, a := p.m, &p.m.arch
	if p.B == 1 && m.fused.PrepFits(x.H, a.HeadDim, l.attn.qNorm, l.attn.kNorm) {
		if p.At && l.qkv != nil {
			h.keys, h.values = lc.InPlace(p.opt.Window, m.kvHeads, a.HeadDim, x.H.Dtype())
		}
		if h.keys != nil {
			h.merged, h.q = m.fused.PrepInto(l.qkv.Whole(x.X()), m.heads, m.kvHeads, a.HeadDim, l.attn.qNorm, l.attn.kNorm, p.KernelPos(), h.keys, h.values,
				m.scaleArr, true, p.FQA && m.fqa.ServesRows(p.L) && !p.SplitKeys())
		} else {
			h.q, h.k, h.v = m.headPrep(l, x, p.KernelPos())
		}
		return h
	}
	offset := lc.Offset()
	qkv := model.ApplyParts(l.qkv, x.X(), l.attn.q, l.attn.k, l.attn.v)
	h.q = model.SplitHeads(qkv[0], p.B, p.L, m.heads, l.attn.qNorm, a.RMSNormEps)
	h.k = model.SplitHeads(qkv[1], p.B, p.L, m.kvHeads, l.attn.kNorm, a.RMSNormEps)
	h.v = model.SplitHeads(qkv[2], p.B, p.L, m.kvHeads, nil, 0)
	if p.RotateAt() {
		h.q, h.k = m.rope.ApplyAt(h.q, p.Position()), m.rope.ApplyAt(h.k, p.Position())
	} else {
		h.q, h.k = m.rope.Apply(h.q, offset), m.rope.Apply(h.k, offset)
	}
	return h
}

// attend writes the heads h into the layer's cache the way the block's path reads them and
// attends (model.KVPass.Keys, Attention.Attend), returning the attention rows [B·L, H·D].
func (p *qwen3Pass) attend(lc *model.KVCache, h qwen3Heads) *mlxc.Array {
	m := p.m
	attn := model.Attention{FQA: m.fqa, Scale: m.scale, ScaleArr: m.scaleArr, Causal: true}
	return attn.Attend(h.q, p.Keys(lc, h.q, h.k, h.v, h.keys, h.values), p.rows)
}

// output gathers the taps and the logits that opt asks for from the last layer's stream h
// and its final norm next.
func (p *qwen3Pass) output(h *mlxc.Array, next *model.Normed) model.Output {
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
		out.Logits = mlxc.Reshape(m.Head(next), B, L, -1)
	case model.LogitsLast:
		final := next
		switch {
		case L > 1 && B == 1:
			final = next.Rows(L-1, L)
		case L > 1:
			final = m.FinalNorm(mlxc.Reshape(mlxc.SliceAxis(mlxc.Reshape(h, B, L, -1), 1, L-1, L), B, -1))
		}
		out.Logits = mlxc.Reshape(m.Head(final), B, 1, -1)
	}
	return out
}

// WeightArrays lists every weight, for Load to evaluate.
func (m *Qwen3) WeightArrays() []*mlxc.Array {
	ws := m.embed.Arrays()
	for i := range m.layers {
		l := &m.layers[i]
		ws = append(ws, l.inputNorm, l.postNorm, l.attn.qNorm, l.attn.kNorm)
		for _, x := range []*model.Linear{l.attn.q, l.attn.k, l.attn.v, l.attn.o, l.gate, l.up, l.down} {
			ws = append(ws, x.Arrays()...)
		}
		ws = append(ws, l.moe.Arrays()...)
	}
	ws = append(ws, m.norm)
	return append(ws, m.lmHead.Arrays()...)
}

// Free releases all weights and kernels.
func (m *Qwen3) Free() {
	m.freeWeights()
	m.rope.Free()
	m.swiglu.Free()
	m.skinny.Free()
	m.qmm.Free()
	m.fqa.Free()
	m.scaleArr.Free()
	m.fused.Free()
}

// freeWeights releases the weights taken so far (safe on a partly built model).
func (m *Qwen3) freeWeights() {
	m.embed.Free()
	for i := range m.layers {
		l := &m.layers[i]
		l.inputNorm.Free()
		l.postNorm.Free()
		l.attn.qNorm.Free()
		l.attn.kNorm.Free()
		for _, x := range []*model.Linear{l.attn.q, l.attn.k, l.attn.v, l.attn.o, l.gate, l.up, l.down} {
			x.Free()
		}
		l.moe.Free()
		l.qkv.Free()
		l.gateUp.Free()
	}
	m.norm.Free()
	m.lmHead.Free()
}

// headPrep runs the fused head preparation on one layer's projections of rows x (B = 1):
// one merged q/k/v product when the layer has it, three otherwise.
func (m *Qwen3) headPrep(l *qwen3Layer, x *model.Normed, pos *mlxc.Array) (q, k, v *mlxc.Array) {
	a := &m.arch
	D := a.HeadDim
	if l.qkv != nil {
		return m.fused.HeadPrepMerged(l.qkv.Whole(x.X()), m.heads, m.kvHeads, D, l.attn.qNorm, l.attn.kNorm, pos)
	}
	xn := x.X()
	return m.fused.HeadPrep(l.attn.q.Apply(xn), l.attn.k.Apply(xn), l.attn.v.Apply(xn), 0, 0, 0, m.heads, m.kvHeads, D,
		l.attn.qNorm, l.attn.kNorm, pos)
}
