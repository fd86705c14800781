// Package qwen35 is the Qwen3.5 family (model_type "qwen3_5"): a hybrid decoder whose
// layers are GatedDeltaNet linear attention (model/deltanet) except every
// full_attention_interval-th, which is gated full attention over a KV cache; the MLP is a
// dense SwiGLU. Its MoE sibling (model_type "qwen3_5_moe", Qwen3.5/3.6-35B-A3B) is the same
// decoder with a sparse MoE MLP (model/moe) in every layer. The math follows mlx-lm's
// qwen3_5.py and qwen3_5_moe.py op for op.
//
// Checkpoints that keep the multi-token-prediction head (mtp.*) load it with
// model.LoadOptions.MTP: Model.MTP returns it, and MTP.Step runs one step of it (mtp.go).
package qwen35

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/model/deltanet"
	"github.com/dflash-mlx/dflash-mlx/model/moe"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

func init() {
	model.Register("qwen3_5", Load)
	model.Register("qwen3_5_moe", LoadMoE)
}

// The hooks model.Load calls after the constructor.
var (
	_ model.WeightLister = (*Model)(nil)
	_ model.Preparer     = (*Model)(nil)
)

// attention is a gated full-attention layer's weights: q_proj holds, per head, the query
// and then its output gate.
type attention struct {
	q, k, v, o   *model.Linear
	qkv          *model.MergedLinear // q, k and v as one product (nil: they cannot be stacked)
	qNorm, kNorm *mlxc.Array
}

// linear is a GatedDeltaNet layer's projections and gated norm around the recurrence.
type linear struct {
	qkv, z, b, a, out *model.Linear
	// in is qkv, z, b and a merged into one product (nil where they cannot be: mixed
	// precisions): a verify block's four products become one, and on a GPU each product is
	// a kernel launch whose host cost the hybrid's cycle is made of (docs/perf/hybrid.md).
	in    *model.MergedLinear
	norm  *mlxc.Array
	mixer *deltanet.Mixer
}

type layer struct {
	inputNorm, postNorm *mlxc.Array
	attn                *attention          // nil for a linear layer
	lin                 *linear             // nil for an attention layer
	gate, up, down      *model.Linear       // the dense MLP (nil when moe is set)
	gateUp              *model.MergedLinear // gate and up as one product (nil: not stacked)
	moe                 *moe.Block          // the sparse MoE MLP of a qwen3_5_moe model
}

// Model is a loaded Qwen3.5 text model.
type Model struct {
	// cfg is this rank's share of the model (the heads it holds; splitConfig), which the
	// forward pass reads; global is the checkpoint's, which the weights' shapes and Arch
	// report. They are equal unless the model is split over ranks.
	cfg, global Config
	arch        model.Arch
	embed       *model.Embedding
	layers      []layer
	norm        *mlxc.Array
	lmHead      *model.Linear // nil when tied
	rope        *model.Rope
	scale       float32
	swiglu      *model.SwiGLU
	gating      *model.SigmoidGating // the attention output gates and the MoE blocks' shared-expert join
	skinny      *model.SkinnyGEMM
	qmm         *model.SmallMQuantMatmul // quantized products of 2..16 rows (nil: MLX's)
	// fqa (on CUDA) runs multi-token attention; scaleArr is scale as a 0-d float32 array.
	fqa      *model.FewQueryAttention
	scaleArr *mlxc.Array
	// batchFQA: batched steps attend their multi-token rows through fqa too
	// (settings.Kernels.BatchFQA, model.BatchPass.UseKernel).
	batchFQA bool
	// delta (on a GPU) runs the GatedDeltaNet layers' recurrence and replays, deltaFused
	// their element-wise steps (everywhere).
	delta      *deltanet.Kernels
	deltaFused *deltanet.Fused
	// family is the model_type it was loaded as (qwen3_5 or qwen3_5_moe).
	family string
	// gpuExact: verify blocks round every row as a one-token step (the MoE blocks run
	// row by row).
	gpuExact bool
	// mtp is the multi-token-prediction head (nil: not asked for, or not in the
	// checkpoint); noMTP says which, for RequireMTP.
	mtp   *MTP
	noMTP string
}

// Load is the family's constructor (model.Family): config, sanitize, every weight checked;
// model.Load then evaluates the weights (WeightArrays) and calls Prepare.
func Load(raw *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings) (model.Model, error) {
	return load(raw, w, q, s, "qwen3_5")
}

// LoadMoE is the qwen3_5_moe constructor: the same model with a sparse MoE MLP in every
// layer (when num_experts > 0), whose raw HF fused expert tensors sanitize splits.
func LoadMoE(raw *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings) (model.Model, error) {
	return load(raw, w, q, s, "qwen3_5_moe")
}

func load(raw *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings, family string) (model.Model, error) {
	if mt, _ := raw.StringOr("model_type", ""); mt != family {
		return nil, fmt.Errorf("%s: model_type %q is not %s", raw.Path, mt, family)
	}
	isMoE := family == "qwen3_5_moe"
	c, err := parseConfig(raw, isMoE)
	if err != nil {
		return nil, err
	}
	rope, err := model.ParseRope(c.rope, c.RotaryDims, c.RopeTheta, c.MaxPositions)
	if err != nil {
		return nil, err
	}
	if !w.MTP {
		dropMTP(w)
	}
	if isMoE {
		if err := splitExperts(w); err != nil {
			return nil, err
		}
	}
	sanitize(w, c.Tied)
	local, err := splitConfig(c, w.Shard)
	if err != nil {
		rope.Free()
		return nil, err
	}
	m := &Model{cfg: local, global: c, rope: rope, scale: float32(math.Pow(float64(c.HeadDim), -0.5)), family: family}
	nMTP, err := m.mtpLayers(raw, w)
	if err != nil {
		rope.Free()
		return nil, err
	}
	// The activation and the gates exist before build: the MoE blocks keep them in their
	// config.
	m.swiglu, m.gating = model.NewSwiGLU(), model.NewSigmoidGating()
	if err := m.build(model.NewBuilder(w, q), w, q, nMTP); err != nil {
		m.swiglu.Free()
		m.gating.Free()
		return nil, mtpProblems(err, nMTP)
	}
	m.setArch(w)
	if err := m.bindKernels(s); err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}

const prefix = "language_model."

// build takes every weight from b, checking names, shapes and dtypes, and fails on any
// tensor missing or left over (mlx-lm loads strictly).
//
// Under tensor parallelism (model.Shard) the shapes checked are the checkpoint's (global)
// and each rank keeps its heads: the gated q's heads (a head's query and gate rows are
// adjacent, so a range of heads is a range of rows), the KV heads, the GatedDeltaNet's key
// and value heads in each of q, k and v of the fused projection and the conv channels
// (value head h·r … h·r+r−1 reads key head h, so ranges of both stay paired), z, a, b,
// A_log and dt_bias by value head, and the MLP's width; o, out_proj and down all-sum.
//
// nMTP > 0 builds the multi-token-prediction head of that many layers as well (buildMTP).
func (m *Model) build(b *model.Builder, w *model.Weights, q *model.QuantConfig, nMTP int) error {
	c, lc := &m.global, &m.cfg
	H := c.Hidden
	vd := c.LinValueHeads * c.LinValueDim
	kd := c.LinKeyHeads * c.LinKeyDim
	convParts := []int{kd, kd, vd}
	m.embed = b.Embedding(prefix+"model.embed_tokens", c.Vocab, H)
	m.layers = make([]layer, c.Layers)
	for i := range m.layers {
		p := fmt.Sprintf("%smodel.layers.%d.", prefix, i)
		l := &m.layers[i]
		l.inputNorm = b.Float(p+"input_layernorm.weight", H)
		l.postNorm = b.Float(p+"post_attention_layernorm.weight", H)
		if c.IsLinear(i) {
			a := p + "linear_attn."
			l.lin = &linear{
				qkv:  b.SplitOutSegments(a+"in_proj_qkv", convParts, H),
				z:    b.SplitOut(a+"in_proj_z", vd, H, false),
				b:    b.SplitOut(a+"in_proj_b", c.LinValueHeads, H, false),
				a:    b.SplitOut(a+"in_proj_a", c.LinValueHeads, H, false),
				out:  b.SplitIn(a+"out_proj", H, vd),
				norm: b.Float(a+"norm.weight", c.LinValueDim),
				mixer: &deltanet.Mixer{
					ConvW:    b.FloatSplit(a+"conv1d.weight", convParts, c.ConvDim(), c.ConvKernel, 1),
					ALog:     b.FloatSplit(a+"A_log", nil, c.LinValueHeads),
					DtBias:   b.FloatSplit(a+"dt_bias", nil, c.LinValueHeads),
					KeyHeads: lc.LinKeyHeads, ValueHeads: lc.LinValueHeads,
					KeyDim: c.LinKeyDim, ValueDim: c.LinValueDim, ConvKernel: c.ConvKernel,
				},
			}
		} else {
			l.attn = m.buildAttention(b, p+"self_attn.")
		}
		if err := m.buildMLP(b, w, q, p, l); err != nil {
			return b.Abandon(err)
		}
	}
	m.norm = b.Float(prefix+"model.norm.weight", H)
	if !c.Tied {
		m.lmHead = b.Linear(prefix+"lm_head", c.Vocab, H, false)
	}
	if nMTP > 0 {
		if err := m.buildMTP(b, w, q, nMTP); err != nil {
			return b.Abandon(err)
		}
	}
	return b.Finish(nil)
}

// buildAttention takes a gated full-attention layer's weights under a (…self_attn.).
func (m *Model) buildAttention(b *model.Builder, a string) *attention {
	c := &m.global
	H, hd, bias := c.Hidden, c.HeadDim, c.AttentionBias
	return &attention{
		q:     b.SplitOut(a+"q_proj", 2*c.Heads*hd, H, bias),
		k:     b.SplitOut(a+"k_proj", c.KVHeads*hd, H, bias),
		v:     b.SplitOut(a+"v_proj", c.KVHeads*hd, H, bias),
		o:     b.SplitIn(a+"o_proj", H, c.Heads*hd),
		qNorm: b.Float(a+"q_norm.weight", hd),
		kNorm: b.Float(a+"k_norm.weight", hd),
	}
}

// buildMLP takes layer l's MLP under p (…layers.i.): the sparse MoE block of a
// qwen3_5_moe checkpoint, else the dense SwiGLU.
func (m *Model) buildMLP(b *model.Builder, w *model.Weights, q *model.QuantConfig, p string, l *layer) error {
	c := &m.global
	H := c.Hidden
	if c.Experts > 0 {
		blk, err := moe.New(b, w, q, p+"mlp", moe.Config{Hidden: H, Experts: c.Experts, TopK: c.TopK,
			Inter: c.MoEInter, SharedInter: c.SharedInter, NormTopK: c.NormTopK, SwiGLU: m.swiglu, Gating: m.gating})
		if err != nil {
			return err
		}
		l.moe = blk
		return nil
	}
	l.gate = b.SplitOut(p+"mlp.gate_proj", c.Inter, H, false)
	l.up = b.SplitOut(p+"mlp.up_proj", c.Inter, H, false)
	l.down = b.SplitIn(p+"mlp.down_proj", H, c.Inter)
	return nil
}

// setArch records what callers need to know, completed from the loaded weights.
func (m *Model) setArch(w *model.Weights) {
	c := &m.global
	a := model.Arch{Family: m.family, HiddenSize: c.Hidden, NumLayers: c.Layers, VocabSize: c.Vocab,
		NumHeads: c.Heads, NumKVHeads: c.KVHeads, HeadDim: c.HeadDim, MaxPositions: c.MaxPositions,
		RMSNormEps: c.Eps, RopeTheta: c.RopeTheta, EOSTokenIDs: c.EOS, TiedEmbeddings: c.Tied,
		WeightBytes: w.Bytes, TrimmableCache: false, Experts: c.Experts, ExpertsPerToken: c.TopK}
	a.Quantized = m.embed.Q != nil || m.layers[0].attn != nil && m.layers[0].attn.q.Q != nil ||
		m.layers[0].lin != nil && m.layers[0].lin.qkv.Q != nil
	a.Dtype = m.embed.Dtype()
	m.arch = a
}

// bindKernels makes the kernels s enables (few-row products, nil off CUDA; few-query
// attention, the GatedDeltaNet and small-M quantized product kernels, nil off a GPU with
// custom kernels) and the activation.
func (m *Model) bindKernels(s settings.Settings) error {
	var err error
	m.gpuExact = s.Loop.GPUExact
	if m.skinny, err = model.NewSkinnyGEMM(s.Kernels, s.Loop.GPUExact); err != nil {
		return err
	}
	if m.swiglu == nil {
		m.swiglu = model.NewSwiGLU()
	}
	if m.gating == nil {
		m.gating = model.NewSigmoidGating()
	}
	if m.fqa = model.NewFewQueryAttention(s.Kernels, s.Loop.GPUExact); m.fqa != nil {
		m.scaleArr = model.OnDeviceConst(mlxc.Scalar(float64(m.scale), mlxc.Float32))
	}
	m.batchFQA = s.Kernels.BatchFQA
	m.delta = deltanet.NewKernels(s.Kernels)
	m.deltaFused = deltanet.NewFused(m.cfg.LinKeyDim)
	m.qmm = model.NewSmallMQuantMatmul(s.Kernels)
	for i := range m.layers {
		if l := m.layers[i].lin; l != nil {
			l.mixer.Kernels, l.mixer.Fused = m.delta, m.deltaFused
		}
	}
	return nil
}

// allLayers lists the decoder layers: the target's, then the MTP head's.
func (m *Model) allLayers() []*layer {
	ls := make([]*layer, 0, len(m.layers))
	for i := range m.layers {
		ls = append(ls, &m.layers[i])
	}
	if m.mtp != nil {
		for i := range m.mtp.layers {
			ls = append(ls, &m.mtp.layers[i])
		}
	}
	return ls
}

// linears lists every Linear of the model (the MTP head's included).
func (m *Model) linears() []*model.Linear {
	var ls []*model.Linear
	for _, l := range m.allLayers() {
		if l.attn != nil {
			ls = append(ls, l.attn.q, l.attn.k, l.attn.v, l.attn.o)
		} else if l.lin != nil {
			ls = append(ls, l.lin.qkv, l.lin.z, l.lin.b, l.lin.a, l.lin.out)
		}
		if l.moe == nil {
			ls = append(ls, l.gate, l.up, l.down)
		}
	}
	if m.lmHead != nil {
		ls = append(ls, m.lmHead)
	}
	if m.mtp != nil {
		ls = append(ls, m.mtp.fc)
	}
	return ls
}

// WeightArrays lists every weight array, for model.Load to evaluate: the sanitized ones
// are computed from the file's.
func (m *Model) WeightArrays() []*mlxc.Array {
	ws := m.embed.Arrays()
	for _, l := range m.allLayers() {
		ws = append(ws, l.inputNorm, l.postNorm)
		if l.attn != nil {
			ws = append(ws, l.attn.qNorm, l.attn.kNorm)
		} else {
			ws = append(ws, l.lin.norm, l.lin.mixer.ConvW, l.lin.mixer.ALog, l.lin.mixer.DtBias)
		}
		ws = append(ws, l.moe.Arrays()...)
	}
	for _, x := range m.linears() {
		ws = append(ws, x.Arrays()...)
	}
	if h := m.mtp; h != nil {
		ws = append(ws, h.preEmbed, h.preHidden, h.norm)
	}
	return append(ws, m.norm)
}

// Prepare makes the per-weight views the products use, once model.Load evaluated the
// weights.
func (m *Model) Prepare() {
	m.embed.Prepare(m.skinny)
	for _, x := range m.linears() {
		x.Prepare()
		x.UseSkinny(m.skinny)
		x.UseQMM(m.qmm)
	}
	for _, l := range m.allLayers() {
		if l := l.lin; l != nil {
			l.in = model.Merge(l.qkv, l.z, l.b, l.a)
		}
		// Products that read the same rows are stacked: a kernel launch each in a verify
		// block on a GPU, whose host cost the cycle is made of.
		if a := l.attn; a != nil {
			a.qkv = model.Merge(a.q, a.k, a.v)
		}
		if l.moe == nil {
			l.gateUp = model.Merge(l.gate, l.up)
		}
		if b := l.moe; b != nil {
			b.Prepare()
			b.UseSkinny(m.skinny)
			b.UseQMM(m.qmm)
			b.Rowwise = m.gpuExact
		}
	}
}

// Kernels are the kernels a drafter bound to this model may reuse.
func (m *Model) Kernels() model.Kernels {
	return model.Kernels{Skinny: m.skinny, FQA: m.fqa, QMM: m.qmm}
}

func (m *Model) Arch() model.Arch { return m.arch }

// Config is the parsed architecture.
func (m *Model) Config() Config { return m.cfg }

func (m *Model) Embed(ids *mlxc.Array) *mlxc.Array { return m.embed.Lookup(ids) }

func (m *Model) Head(x *model.Normed) *mlxc.Array {
	if m.lmHead != nil {
		return m.lmHead.Apply(x.X())
	}
	return m.embed.AsLinear(x.X())
}

// FinalNorm is the model's final RMSNorm of rows h.
func (m *Model) FinalNorm(h *mlxc.Array) *model.Normed { return model.NormOf(h, m.norm, m.cfg.Eps) }

// Free releases all weights and kernels.
func (m *Model) Free() {
	m.embed.Free()
	m.freeLayers()
	m.norm.Free()
	m.rope.Free()
	m.swiglu.Free()
	m.gating.Free()
	m.skinny.Free()
	m.qmm.Free()
	m.fqa.Free()
	m.scaleArr.Free()
	m.delta.Free()
	m.deltaFused.Free()
}

// freeLayers releases the layers' weights and the head (the Builder's partial results on a
// failed build included: Free is safe on nil).
func (m *Model) freeLayers() {
	if h := m.mtp; h != nil {
		h.preEmbed.Free()
		h.preHidden.Free()
		h.norm.Free()
	}
	for _, l := range m.allLayers() {
		l.inputNorm.Free()
		l.postNorm.Free()
		if l.attn != nil {
			l.attn.qNorm.Free()
			l.attn.kNorm.Free()
		}
		if l.lin != nil {
			l.lin.norm.Free()
			l.lin.in.Free()
			l.lin.mixer.ConvW.Free()
			l.lin.mixer.ALog.Free()
			l.lin.mixer.DtBias.Free()
		}
		if l.attn != nil {
			l.attn.qkv.Free()
		}
		l.gateUp.Free()
		l.moe.Free()
	}
	for _, x := range m.linears() {
		x.Free()
	}
}

// Cache is the model's per-sequence state: a recurrent layer cache for each GatedDeltaNet
// layer and a KV cache for each attention layer, in layer order.
type Cache struct {
	*cache.List
	kv  []*model.KVCache  // nil at linear layers
	rec []*deltanet.Cache // nil at attention layers
}

func (m *Model) NewCache() model.Cache {
	n := len(m.layers)
	c := &Cache{kv: make([]*model.KVCache, n), rec: make([]*deltanet.Cache, n)}
	ls := make([]cache.Layer, n)
	for i := range m.layers {
		if m.cfg.IsLinear(i) {
			c.rec[i] = deltanet.NewCache()
			ls[i] = c.rec[i]
		} else {
			c.kv[i] = &model.KVCache{}
			ls[i] = c.kv[i]
		}
	}
	c.List = cache.NewList(ls...)
	return c
}

// splitConfig is c with this rank's share of the heads and the MLP's width under sh (c
// itself when sh does not split), or why sh cannot split the model: every rank needs
// whole attention, KV, GatedDeltaNet key and value heads and an equal part of the MLP.
// The experts' widths are checked as their blocks are taken (moe.New).
func splitConfig(c Config, sh *model.Shard) (Config, error) {
	if !sh.Split() {
		return c, nil
	}
	if c.KVHeads < sh.Size {
		return c, fmt.Errorf("%d KV heads cannot be split over %d ranks (each rank needs at least one)", c.KVHeads, sh.Size)
	}
	for _, p := range []struct {
		n    int
		what string
	}{{c.Heads, "attention heads"}, {c.KVHeads, "KV heads"}, {c.LinKeyHeads, "GatedDeltaNet key heads"},
		{c.LinValueHeads, "GatedDeltaNet value heads"}, {denseInter(c), "MLP columns (intermediate_size)"}} {
		if err := sh.Divides(p.n, p.what); err != nil {
			return c, err
		}
	}
	c.Heads, c.KVHeads, c.Inter = sh.Local(c.Heads), sh.Local(c.KVHeads), sh.Local(c.Inter)
	c.LinKeyHeads, c.LinValueHeads = sh.Local(c.LinKeyHeads), sh.Local(c.LinValueHeads)
	return c, nil
}

// denseInter is the dense MLP's width (0 for the MoE, whose layers have none).
func denseInter(c Config) int {
	if c.Experts > 0 {
		return 0
	}
	return c.Inter
}
