package draft

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

type layer struct {
	inputNorm, postNorm *mlxc.Array
	q, k, v, o          *model.Linear
	qNorm, kNorm        *mlxc.Array
	gate, up, down      *model.Linear
	// Merged projections for the block rows (with the fused kernels); context rows
	// use the k and v views, or kv, k and v as one view of qkv's stack, when the fused
	// kernels prepare them (Fused.KVPrep).
	qkv, gateUp *model.MergedLinear
	kv          *model.Linear
	// window > 0 (a sliding_attention layer) and causal are the layer's mask, as z-lab's
	// DFlash drafter defines it: block row i at position q sees the keys at positions p
	// with p < q+1 when causal, q−window < p when windowed (and p < q+window when windowed
	// but not causal), so a sliding layer attends to the last window positions of context
	// and block up to and including itself. A full layer (both unset) sees all context and
	// the whole block.
	window int
	causal bool
	// attnConv and mlpConv are a DFlash2 layer's convolutions (nil for DFlash1).
	attnConv, mlpConv *dynConv
}

// masked reports whether the layer needs a mask: the attention kernels serve only the
// unmasked block (every row seeing all context and the whole block).
func (l *layer) masked() bool { return l.window > 0 || l.causal }

// Drafter is a loaded DFlash draft model bound to its target.
type Drafter struct {
	Cfg        Config
	target     model.Model
	fc         *model.Linear
	hiddenNorm *mlxc.Array
	layers     []layer
	norm       *mlxc.Array
	rope       *model.Rope
	scale      float32
	swiglu     *model.SwiGLU
	// fqa (the target's few-query attention kernel, when enabled) and scaleArr, the
	// drafter's scale as a 0-d array for it.
	fqa      *model.FewQueryAttention
	scaleArr *mlxc.Array
	attn     model.Attention // routes each layer's attention (fqa or SDPA)
	// fused (CUDA; DFLASH_FUSED_DRAFT=0 or DFLASH_FUSED=0 turns it off): the target's fused
	// head-prep and gated activation kernels, built for the drafter's own rotary embedding
	// and epsilon, on the block rows: fewer draft nodes and less host time per cycle (see
	// docs/perf/drafter.md).
	fused *model.Fused
	// ctxPos holds the context rows' positions for the fused kernels (contextPos), by
	// position: one per row of a ForwardRows call, whose rows sit at different positions.
	ctxPos map[int]*mlxc.Array
	// KeyBucket > 0: the block's keys are written after the cached context and attended
	// through a view padded to a multiple of KeyBucket with a mask (see
	// model.ForwardOptions.KeyBucket); 0: the context is concatenated with the block.
	KeyBucket int
	// ContextWindow, when > 0, bounds what the full-attention layers' blocks attend to in
	// a long context: the first ContextSink rows and the rows from ContextWindow before the
	// cycle's new context on (StreamingLLM's sink and recent window). It changes drafts, not
	// the output (the target verifies them); the cache still holds every row. Sliding
	// layers keep their own window.
	ContextWindow, ContextSink int
	// Settings are what Load was given (LoadOptions.Settings); its proposer reads the
	// kernel choices there (verify.DFlash).
	Settings settings.Settings
	// Selector and conv are a DFlash2 drafter's candidate selector and its compiled
	// convolution (nil for DFlash1).
	Selector *Selector
	conv     *Conv
}

// LoadOptions tunes Load.
type LoadOptions struct {
	// Settings picks the fused kernels of the block and context rows (nil: settings.Default()).
	Settings *settings.Settings
}

// Load reads a drafter folder and checks it against the target (hidden size, vocabulary,
// layer ids in range). It must run on the MLX thread.
func Load(dir string, target model.Model, opt LoadOptions) (*Drafter, error) {
	s, err := loadSettings(dir, opt)
	if err != nil {
		return nil, err
	}
	raw, err := model.ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	cfg, rope, err := parseConfig(raw)
	if err != nil {
		return nil, err
	}
	if err := checkTarget(raw.Path, cfg, target.Arch()); err != nil {
		return nil, err
	}
	q, err := raw.ParseQuantization()
	if err != nil {
		return nil, err
	}
	w, err := readWeights(dir, cfg.Kind)
	if err != nil {
		return nil, err
	}
	d := &Drafter{Cfg: cfg, target: target, rope: rope, scale: float32(math.Pow(float64(cfg.HeadDim), -0.5))}
	if err := d.build(dir, model.NewBuilder(w, q)); err != nil {
		return nil, err
	}
	if cfg.Kind == DFlash2 {
		if err := d.prepare2(s); err != nil {
			d.Free()
			return nil, fmt.Errorf("load drafter %s: %w", dir, err)
		}
		return d, nil
	}
	k := d.bindKernels(s)
	if err := d.prepare(k); err != nil {
		d.Free()
		return nil, fmt.Errorf("load drafter %s: %w", dir, err)
	}
	return d, nil
}

// loadSettings are opt's settings, or the defaults, once they validate: a bad choice
// fails before any file is read.
func loadSettings(dir string, opt LoadOptions) (settings.Settings, error) {
	s := settings.Default()
	if opt.Settings != nil {
		s = *opt.Settings
	}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("load drafter %s: %w", dir, err)
	}
	return s, nil
}

// checkTarget rejects a drafter trained for another target (path names its config in
// the errors), before any weight is read.
func checkTarget(path string, cfg Config, ta model.Arch) error {
	if cfg.HiddenSize != ta.HiddenSize {
		return fmt.Errorf("%s: drafter hidden_size %d does not match the target's %d (wrong draft for this model?)", path, cfg.HiddenSize, ta.HiddenSize)
	}
	if cfg.VocabSize != ta.VocabSize {
		return fmt.Errorf("%s: drafter vocab_size %d does not match the target's %d (a drafter for another target?)", path, cfg.VocabSize, ta.VocabSize)
	}
	for _, id := range cfg.TargetLayerIDs {
		if id < 0 || id >= ta.NumLayers {
			return fmt.Errorf("%s: dflash_config.target_layer_ids has %d, outside the target's %d layers (a drafter for another target?)", path, id, ta.NumLayers)
		}
	}
	if cfg.NumTargetLayers > 0 && cfg.NumTargetLayers != ta.NumLayers {
		return fmt.Errorf("%s: num_target_layers %d does not match the target's %d layers (a drafter for another target?)", path, cfg.NumTargetLayers, ta.NumLayers)
	}
	if cfg.MaskTokenID >= ta.VocabSize {
		return fmt.Errorf("%s: mask_token_id %d is outside the vocabulary (%d)", path, cfg.MaskTokenID, ta.VocabSize)
	}
	return nil
}

// readWeights reads the drafter's weight files, refusing an embedding or head of its
// own because the drafter uses the target's.
func readWeights(dir string, kind Kind) (*model.Weights, error) {
	w, err := model.ReadWeightHeaders(dir)
	if err != nil {
		return nil, err
	}

	for name := range w.Info {
		if len(name) >= 8 && name[:8] == "lm_head." || len(name) >= 13 && name[:13] == "embed_tokens." {
			return nil, fmt.Errorf("%s: drafter has its own %s; DFlash drafters share the target's embedding and head", dir, name)
		}
	}
	if err := w.Load(nil); err != nil {
		return nil, err
	}
	if kind == DFlash2 {
		if err := remapCodebooks(dir, w); err != nil {
			w.Free()
			return nil, err
		}
	}
	return w, nil
}

// build takes the drafter's weights from b and evaluates them, so that a missing or
// unreadable tensor fails the load rather than the first draft.
func (d *Drafter) build(dir string, b *model.Builder) error {
	cfg := d.Cfg
	H, hd := cfg.HiddenSize, cfg.HeadDim
	d.fc = b.Linear("fc", H, len(cfg.TargetLayerIDs)*H, false)
	d.hiddenNorm = b.Float("hidden_norm.weight", H)
	d.norm = b.Float("norm.weight", H)
	d.layers = make([]layer, cfg.NumLayers)
	for i := range d.layers {
		p := fmt.Sprintf("layers.%d.", i)
		l := &d.layers[i]
		l.inputNorm = b.Float(p+"input_layernorm.weight", H)
		l.postNorm = b.Float(p+"post_attention_layernorm.weight", H)
		l.q = b.Linear(p+"self_attn.q_proj", cfg.NumHeads*hd, H, cfg.AttentionBias)
		l.k = b.Linear(p+"self_attn.k_proj", cfg.NumKVHeads*hd, H, cfg.AttentionBias)
		l.v = b.Linear(p+"self_attn.v_proj", cfg.NumKVHeads*hd, H, cfg.AttentionBias)
		l.o = b.Linear(p+"self_attn.o_proj", H, cfg.NumHeads*hd, cfg.AttentionBias)
		l.qNorm = b.Float(p+"self_attn.q_norm.weight", hd)
		l.kNorm = b.Float(p+"self_attn.k_norm.weight", hd)
		l.gate = b.Linear(p+"mlp.gate_proj", cfg.Intermediate, H, false)
		l.up = b.Linear(p+"mlp.up_proj", cfg.Intermediate, H, false)
		l.down = b.Linear(p+"mlp.down_proj", H, cfg.Intermediate, false)
		l.window, l.causal = cfg.LayerMask(i)
		if cfg.Kind == DFlash2 {
			d.buildConvs(b, p, l)
		}
	}
	if cfg.Kind == DFlash2 {
		d.Selector = &Selector{TopK: cfg.SelectorTopK, Rank: cfg.SelectorRank,
			proj: b.Linear("candidate_selector.hidden_projection", cfg.SelectorRank, H, false),
			pred: b.Embedding("candidate_selector.predecessor_codebook", cfg.VocabSize, cfg.SelectorRank),
			succ: b.Embedding("candidate_selector.successor_codebook", cfg.VocabSize, cfg.SelectorRank)}
	}
	if err := b.Finish(func(name string) bool { return false }); err != nil {
		return fmt.Errorf("load drafter %s: %w", dir, err)
	}
	if err := mlxc.Catch(func() { mlxc.Eval(d.weights()...) }); err != nil {
		d.Free()
		return fmt.Errorf("load drafter %s: reading weights: %w", dir, err)
	}
	return nil
}

// bindKernels sets the drafter's activation, settings, fused kernels and attention
// routing, and returns the target's kernels for prepare (nil fields: none).
func (d *Drafter) bindKernels(s settings.Settings) model.Kernels {
	d.swiglu = model.NewSwiGLU()
	d.Settings = s
	if s.Kernels.FusedDraft {
		d.fused = model.NewFused(d.rope, d.Cfg.HeadDim, d.Cfg.RMSNormEps, s.Kernels)
	}
	// The target's kernels (CUDA), shared, not owned: its few-row product suits drafts of
	// 16 rows, and its few-query attention the draft block.
	var k model.Kernels
	if t, ok := d.target.(model.KernelProvider); ok {
		k = t.Kernels()
	}
	if k.FQA != nil {
		d.fqa = k.FQA
		d.scaleArr = model.OnDeviceConst(mlxc.Scalar(float64(d.scale), mlxc.Float32))
	}
	d.attn = model.Attention{FQA: d.fqa, Scale: d.scale, ScaleArr: d.scaleArr}
	return k
}

// prepare readies each projection for the target's few-row and small-M quantized product
// kernels k (and merges them where the fused kernels read merged products); an MLX failure
// comes back as the error.
func (d *Drafter) prepare(k model.Kernels) error {
	merge := d.fused != nil // fused kernels read merged products
	return mlxc.Catch(func() {
		d.fc.Prepare()
		d.fc.UseSkinny(k.Skinny)
		d.fc.UseQMM(k.QMM)
		for i := range d.layers {
			l := &d.layers[i]
			for _, x := range []*model.Linear{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
				x.Prepare()
				x.UseSkinny(k.Skinny)
				x.UseQMM(k.QMM)
			}
			if merge {
				l.qkv = model.MergeLinears(l.q, l.k, l.v)
				l.gateUp = model.MergeLinears(l.gate, l.up)
			}
			if d.fused != nil && d.Settings.Kernels.FusedContext {
				l.kv = l.qkv.Span(1, 3)
			}
		}
	})
}

// NewCache makes the draft KV cache (committed context only).
func (d *Drafter) NewCache() *model.KVCaches { return model.NewKVCaches(len(d.layers)) }

// BlockSize is the trained block length (staged token + drafts).
func (d *Drafter) BlockSize() int { return d.Cfg.BlockSize }

// TapLayers are the target layers whose outputs the drafter reads.
func (d *Drafter) TapLayers() []int { return d.Cfg.TargetLayerIDs }

// Forward drafts a block. block is int32 [1, L] = [staged, mask…]; ctx is the target's
// tapped hidden rows [1, T, n·H] for the positions committed since the last call (nil when
// none); they are appended to the cache. Returns logits [1, L−1, V] for slots 1..L−1.
// It is ForwardRows' one-row case.
func (d *Drafter) Forward(block, ctx *mlxc.Array, c *model.KVCaches) *mlxc.Array {
	return d.ForwardRows([]*mlxc.Array{block}, []*mlxc.Array{ctx}, []*model.KVCaches{c})[0]
}

// ForwardRows drafts the blocks of several sequences in one forward: row r's block
// blocks[r] (int32 [1, L_r] = [staged, mask…], L_r ≥ 2; the lengths may differ) after its
// own context, cache caches[r] with its new rows ctxs[r] ([1, T_r, n·H], nil when none)
// appended as Forward appends them. The embedding, projections, MLPs, norms and the head
// run once over all rows' block tokens packed together ([ΣL_r, ·]); each row's attention
// reads only its own cache and block, its positions from its own cache offset. Every
// packed op is row-wise (a row's result never reads another row), so on the CPU row r's
// logits are bit for bit Forward's for that row alone; on a GPU a product's kernel may
// pick another tiling for more rows. Returns each row's logits [1, L_r−1, V]. The caches
// must be distinct.
func (d *Drafter) ForwardRows(blocks, ctxs []*mlxc.Array, caches []*model.KVCaches) []*mlxc.Array {
	passes := make([]*draftPass, len(blocks))
	ids := make([]*mlxc.Array, len(blocks))
	N := 0
	for r, block := range blocks {
		L := block.Dim(1)
		p := &draftPass{d: d, L: L, start: N, bands: bandMasks{}, padded: d.KeyBucket > 0 && L <= 64}
		if ctx := ctxs[r]; ctx != nil {
			p.T = ctx.Dim(1)
			p.proj = d.project(mlxc.Reshape(ctx, p.T, -1))
		}
		passes[r], ids[r] = p, mlxc.Reshape(block, L)
		N += L
	}
	// Rows stay 2-D ([ΣL, H]) like the target's, so matmuls need no Flatten/Unflatten nodes.
	x := d.target.Embed(packRows(ids))
	merged := make([]*mlxc.Array, len(passes))
	var next *model.Normed // this layer's input norm, when the previous layer's MLP made it
	for i := range d.layers {
		l := &d.layers[i]
		h := next
		if h == nil {
			h = model.NormOf(x, l.inputNorm, d.Cfg.RMSNormEps)
		}
		bp := d.projectBlock(l, h)
		for r, p := range passes {
			lc := caches[r].Layers[i]
			q, kn, vn := p.heads(l, lc, bp.rows(p.start, p.L, N))
			merged[r] = d.attn.Attend(q, p.keys(l, lc, q, kn, vn), p.L)
		}
		x, next = d.layerTail(i, x, packRows(merged))
	}
	return d.rowLogits(next, passes, N)
}

// packRows stacks rows [L_r, ·] into [ΣL_r, ·]; one array passes as it is, so that the
// one-row forward builds no extra node.
func packRows(rows []*mlxc.Array) *mlxc.Array {
	if len(rows) == 1 {
		return rows[0]
	}
	return mlxc.Concatenate(rows, 0)
}

// blockProj is one layer's q, k, v products of all rows' block rows [N, ·], made once for
// every row: the merged product for the fused head prep (whole), else one per part.
type blockProj struct {
	whole *mlxc.Array
	parts []*mlxc.Array
}

// projectBlock projects the normed block rows h of one layer.
func (d *Drafter) projectBlock(l *layer, h *model.Normed) blockProj {
	if l.qkv != nil && d.fused.PrepFits(h.H, d.Cfg.HeadDim, l.qNorm, l.kNorm) {
		return blockProj{whole: l.qkv.Whole(h.X())}
	}
	return blockProj{parts: model.ApplyParts(l.qkv, h.X(), l.q, l.k, l.v)}
}

// rows is one row's share, rows start..start+L−1 of N (all of them: the arrays as they are).
func (b blockProj) rows(start, L, N int) blockProj {
	if L == N {
		return b
	}
	if b.whole != nil {
		return blockProj{whole: mlxc.SliceAxis(b.whole, 0, start, start+L)}
	}
	parts := make([]*mlxc.Array, len(b.parts))
	for i, a := range b.parts {
		parts[i] = mlxc.SliceAxis(a, 0, start, start+L)
	}
	return blockProj{parts: parts}
}

// rowLogits are each row's draft logits [1, L_r−1, V] from the final norm of the packed
// rows [N, H]: the head reads every row's slots 1..L_r−1 in one product.
func (d *Drafter) rowLogits(final *model.Normed, passes []*draftPass, N int) []*mlxc.Array {
	if len(passes) == 1 {
		return []*mlxc.Array{d.logits(final)}
	}
	idx := make([]int32, 0, N-len(passes))
	for _, p := range passes {
		for j := 1; j < p.L; j++ {
			idx = append(idx, int32(p.start+j))
		}
	}
	sel := mlxc.FromSlice(idx, len(idx))
	all := d.target.Head(model.NormedAs(mlxc.Take(final.H, sel, 0), mlxc.Take(final.X(), sel, 0)))
	out := make([]*mlxc.Array, len(passes))
	m := 0
	for r, p := range passes {
		out[r] = mlxc.Reshape(mlxc.SliceAxis(all, 0, m, m+p.L-1), 1, p.L-1, -1)
		m += p.L - 1
	}
	return out
}

// draftPass is one row of a ForwardRows call: the block's length and its first row among
// the packed rows, the context rows it appends (T of them, projected), and what all layers
// share because they hold the same positions.
type draftPass struct {
	d                  *Drafter
	L, T, start        int
	proj               *mlxc.Array // the projected context rows, nil when none
	padded             bool        // keys padded to KeyBucket under a mask
	mask, visible, pos *mlxc.Array // padded keys, fqa, fused: made by the first layer that needs them
	wvisible           *mlxc.Array // the kernel's visible rows of a context window
	bands              bandMasks   // the masked layers' masks, one per kind
}

// heads makes the block's rotated query heads and its keys and values from the row's
// projections b: through the fused head prep where it fits, else MLX ops.
func (p *draftPass) heads(l *layer, lc *model.KVCache, b blockProj) (q, kn, vn *mlxc.Array) {
	d, c0, off := p.d, p.d.Cfg, lc.Offset()
	if b.whole != nil {
		if p.pos == nil {
			p.pos = d.fused.OnDevice(model.Visible(off + p.T))
		}
		return d.fused.HeadPrepMerged(b.whole, c0.NumHeads, c0.NumKVHeads, c0.HeadDim, l.qNorm, l.kNorm, p.pos)
	}
	q = mlxc.Transpose(mlxc.RMSNorm(mlxc.Reshape(b.parts[0], 1, p.L, c0.NumHeads, -1), l.qNorm, c0.RMSNormEps), 0, 2, 1, 3)
	q = d.rope.Apply(q, off+p.T)
	kn, vn = d.headsKV(l, b.parts[1], b.parts[2], off+p.T)
	return q, kn, vn
}

// keys appends the context rows to the layer's cache and says where the attention's keys
// and values come from on each path: the block attends bidirectionally to itself and to
// all context (no causal mask), except in a masked (sliding) layer.
func (p *draftPass) keys(l *layer, lc *model.KVCache, q, kn, vn *mlxc.Array) (ak model.AttendKeys) {
	d, L := p.d, p.L
	off := lc.Offset()
	var kc, vc *mlxc.Array
	switch {
	case p.proj != nil && p.padded:
		lc.Append(d.keysValues(l, p.proj, off))
	case p.proj != nil:
		kc, vc = lc.UpdateAndFetch(d.keysValues(l, p.proj, off))
	case !p.padded:
		kc, vc = lc.State()
	}
	if from := d.windowFrom(off); from > 0 && !l.masked() {
		defer func() { ak = p.windowed(ak, lc.Offset()+L, from) }()
	}
	// The block sees the context (its new rows appended above) and itself.
	ak = model.AttendKeys{Fits: kn, MaxKeys: lc.Offset() + L, Kernel: func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
		keys, values, n := lc.Scratch(kn, vn, 0)
		if p.visible == nil {
			p.visible = d.fused.OnDevice(model.Visible(n))
		}
		return keys, values, p.visible
	}}
	if l.masked() {
		ak.Kernel = nil
	}
	if p.padded {
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values, K := lc.Scratch(kn, vn, d.KeyBucket)
			if l.masked() {
				q0 := model.Visible(lc.Offset())
				return keys, values, mlxc.MaskArray, p.bands.get(l, q0, mlxc.Add(q0, model.Visible(L)), L, K)
			}
			if p.mask == nil {
				visible := lc.Offset() + L
				p.mask = model.PrefixMask(L, K, func(int) int { return visible }, q.Dtype())
			}
			return keys, values, mlxc.MaskArray, p.mask
		}
		return ak
	}
	ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
		keys, values := kn, vn
		if kc != nil {
			keys, values = mlxc.Concatenate([]*mlxc.Array{kc, kn}, 2), mlxc.Concatenate([]*mlxc.Array{vc, vn}, 2)
		}
		if !l.masked() {
			return keys, values, mlxc.MaskNone, nil
		}
		K := keys.Dim(2) // the cache's context from position 0, then the block
		q0 := model.Visible(K - L)
		return keys, values, mlxc.MaskArray, p.bands.get(l, q0, model.Visible(K), L, K)
	}
	return ak
}

// DefaultContextSink is the sink rows a context window keeps (ContextSink), as the public
// DFlash ports do.
const DefaultContextSink = 64

// windowFrom is the first recent context row a block keeps when the cache held off rows
// before the cycle's new ones, or 0 when it keeps all of them (no window, or too short a
// context for one).
func (d *Drafter) windowFrom(off int) int {
	if d.ContextWindow <= 0 || off-d.ContextWindow <= d.ContextSink {
		return 0
	}
	return off - d.ContextWindow
}

// windowRows keeps, of keys or values [1, Hkv, R, D] whose rows are the context from
// position 0 and then the block, the sink rows and rows [from, to).
func (d *Drafter) windowRows(a *mlxc.Array, from, to int) *mlxc.Array {
	return mlxc.Concatenate([]*mlxc.Array{mlxc.SliceAxis(a, 2, 0, d.ContextSink), mlxc.SliceAxis(a, 2, from, to)}, 2)
}

// windowed makes a full-attention layer's keys those of the context window: its n rows
// (context and block) less those between the sink and from.
func (p *draftPass) windowed(ak model.AttendKeys, n, from int) model.AttendKeys {
	d := p.d
	rows := d.ContextSink + n - from
	kernel, dense := ak.Kernel, ak.Dense
	ak.MaxKeys = rows
	if kernel != nil {
		ak.Kernel = func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
			keys, values, _ := kernel()
			if p.wvisible == nil {
				p.wvisible = d.fused.OnDevice(model.Visible(rows))
			}
			return d.windowRows(keys, from, n), d.windowRows(values, from, n), p.wvisible
		}
	}
	ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
		keys, values, _, _ := dense() // the first n rows are valid, the rest masked
		return d.windowRows(keys, from, n), d.windowRows(values, from, n), mlxc.MaskNone, nil
	}
	return ak
}

// ForwardAt drafts a block when only the device knows how much of the new context is
// committed (the engine's run-ahead loop): ctx holds the target's tapped rows [1, T, n·H]
// of the previous verify block, of which the first valid (int32 [1]) are committed. All T
// rows go into the cache at its offset (the host knows that much) and the block block
// (int32 [1, L], device) follows the valid ones: it attends to the committed context and
// to itself, exactly as Forward with the valid rows alone would. The cache's offset is left
// at offset+T; the caller sets it (KVCaches.SetOffset) to offset+valid once read. Returns
// logits [1, L−1, V] for slots 1..L−1.
func (d *Drafter) ForwardAt(block, ctx, valid *mlxc.Array, c *model.KVCaches) *mlxc.Array {
	L, T := block.Dim(1), ctx.Dim(1)
	x := d.target.Embed(mlxc.Reshape(block, L))
	p := d.newAtPass(L, T, ctx, c.Offset(), valid)
	var next *model.Normed
	for i := range d.layers {
		l := &d.layers[i]
		h := next
		if h == nil {
			h = model.NormOf(x, l.inputNorm, d.Cfg.RMSNormEps)
		}
		merged := p.attend(l, c.Layers[i], h)
		x, next = d.layerTail(i, x, merged)
	}
	return d.logits(next)
}

// atPass is what one ForwardAt call's layers share: the same positions and window in
// every layer, so their device values are made once per call.
type atPass struct {
	d            *Drafter
	L, T, window int
	proj         *mlxc.Array // the context rows projected [T, H]
	pos, seen    *mlxc.Array // the block's first position and the keys it sees
	kp, ks, mask *mlxc.Array // pos and seen for our kernels, and the dense mask, made on first use
	bands        bandMasks   // the masked layers' masks, one per kind
	// The context window's rows seen (device), for the kernels, and its mask.
	wseen, wks, wmask *mlxc.Array
}

// newAtPass projects ctx (rows [1, T, n·H]) and places the block of L rows after the
// valid committed ones from cache offset off.
func (d *Drafter) newAtPass(L, T int, ctx *mlxc.Array, off int, valid *mlxc.Array) *atPass {
	p := &atPass{d: d, L: L, T: T, window: off + T + L, bands: bandMasks{}}
	p.proj = d.project(mlxc.Reshape(ctx, T, -1))
	p.pos = mlxc.Add(mlxc.FromSlice([]int32{int32(off)}, 1), valid)
	p.seen = mlxc.Add(p.pos, mlxc.FromSlice([]int32{int32(L)}, 1))
	return p
}

// kpos is pos as our kernels read it, made once for all layers.
func (p *atPass) kpos() *mlxc.Array {
	if p.kp == nil {
		p.kp = p.d.fused.OnDevice(p.pos)
	}
	return p.kp
}

// kseen is seen as our kernels read it, made once for all layers.
func (p *atPass) kseen() *mlxc.Array {
	if p.ks == nil {
		p.ks = p.d.fused.OnDevice(p.seen)
	}
	return p.ks
}

// attend writes layer l's context rows and block keys and values into its cache lc and
// returns the block's attention rows [L, H·D] from its input norm h.
func (p *atPass) attend(l *layer, lc *model.KVCache, h *model.Normed) *mlxc.Array {
	d, L := p.d, p.L
	fusedPrep := l.qkv != nil && d.fused.PrepFits(h.H, d.Cfg.HeadDim, l.qNorm, l.kNorm)
	// A masked layer's block keys go through WriteAt, never into the buffers by the
	// kernel that also attends (it knows no mask).
	// Nor when the layer attends to a context window: the window's copy of the buffers
	// would not be ordered after a write into them in place.
	inPlace := fusedPrep && !l.masked() && d.windowFrom(p.window-p.T-L) == 0
	keys, values, qn := p.writeContext(l, lc, h, inPlace)
	q, kn, vn, merged := p.headPrep(l, h, fusedPrep, qn, keys, values)
	if keys == nil {
		keys, values = lc.WriteAt(kn, vn, p.pos, p.window)
	}
	if merged != nil { // PrepAttention wrote the block's keys and values and attended
		return merged
	}
	ak := model.AttendKeys{
		MaxKeys: p.window,
		Fits:    keys, // kn is nil when head prep wrote the cache
		Kernel:  func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) { return keys, values, p.kseen() },
		Dense: func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			if l.masked() {
				// Key row j of the window is position j; the block's rows are at pos….
				return mlxc.SliceAxis(keys, 2, 0, p.window), mlxc.SliceAxis(values, 2, 0, p.window), mlxc.MaskArray, p.bands.get(l, p.pos, p.seen, L, p.window)
			}
			if p.mask == nil {
				p.mask = model.WindowMask(p.seen, L, p.window, false)
			}
			return mlxc.SliceAxis(keys, 2, 0, p.window), mlxc.SliceAxis(values, 2, 0, p.window), mlxc.MaskArray, p.mask
		},
	}
	if l.masked() {
		ak.Kernel = nil
	} else if from := d.windowFrom(p.window - p.T - L); from > 0 {
		ak = p.windowed(ak, keys, values, from)
	}
	return d.attn.Attend(q, ak, L)
}

// windowed makes a full-attention layer's keys those of the context window: the buffers'
// rows up to the window, less those between the sink and from; the rows seen shrink by as
// many, on the device.
func (p *atPass) windowed(ak model.AttendKeys, keys, values *mlxc.Array, from int) model.AttendKeys {
	d := p.d
	rows := d.ContextSink + p.window - from
	if p.wseen == nil {
		p.wseen = mlxc.Subtract(p.seen, mlxc.FromSlice([]int32{int32(from - d.ContextSink)}, 1))
	}
	kw, vw := d.windowRows(keys, from, p.window), d.windowRows(values, from, p.window)
	ak.Fits, ak.MaxKeys = kw, rows
	ak.Kernel = func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
		if p.wks == nil {
			p.wks = d.fused.OnDevice(p.wseen)
		}
		return kw, vw, p.wks
	}
	ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
		if p.wmask == nil {
			p.wmask = model.WindowMask(p.wseen, p.L, rows, false)
		}
		return kw, vw, mlxc.MaskArray, p.wmask
	}
	return ak
}

// bandMasks holds one call's masks of the masked layers, made once per kind (window,
// causal): every layer of a call sees the same positions.
type bandMasks map[[2]int]*mlxc.Array

// get is layer l's mask for a block of L rows whose row 0 is at position q0 (int32 [1],
// on the host or the device) over K key rows, key row j being position j, of which the
// first seen (int32 [1]) hold context and block (the rest are padding): the boolean mask
// [1, 1, L, K] of layer.window's rule.
func (b bandMasks) get(l *layer, q0, seen *mlxc.Array, L, K int) *mlxc.Array {
	kind := [2]int{l.window, 0}
	if l.causal {
		kind[1] = 1
	}
	if m, ok := b[kind]; ok {
		return m
	}
	j := mlxc.Reshape(mlxc.Arange(0, float64(K), 1, mlxc.Int32), 1, K)
	q := mlxc.Add(mlxc.Reshape(mlxc.Arange(0, float64(L), 1, mlxc.Int32), L, 1), q0)
	vis := mlxc.Less(j, seen) // [1, K]; a masked layer's terms below make it [L, K]
	if l.causal {
		vis = mlxc.LogicalAnd(vis, mlxc.LessEqual(j, q))
	}
	if l.window > 0 {
		w := mlxc.ScalarInt(int64(l.window), mlxc.Int32)
		vis = mlxc.LogicalAnd(vis, mlxc.Less(mlxc.Subtract(q, j), w))
		if !l.causal {
			vis = mlxc.LogicalAnd(vis, mlxc.Less(mlxc.Subtract(j, q), w))
		}
	}
	m := mlxc.Reshape(vis, 1, 1, L, K)
	b[kind] = m
	return m
}

// writeContext appends the context rows to lc. It returns the cache's buffers when the
// block's head prep is to write into them too (keys nil: it is not), and the q norm
// weight that head prep reads.
func (p *atPass) writeContext(l *layer, lc *model.KVCache, h *model.Normed, fusedPrep bool) (keys, values, qn *mlxc.Array) {
	d, c0 := p.d, p.d.Cfg
	// The context rows go into the cache in place when the block's head prep writes
	// there too; qn is then KVPrepInto's copy of the q norm weight, which orders the
	// block's kernels after that write.
	qn = l.qNorm
	if fusedPrep && l.kv != nil && d.fused.PrepFits(p.proj, c0.HeadDim, l.qNorm, l.kNorm) {
		if keys, values = lc.InPlace(p.window, c0.NumKVHeads, c0.HeadDim, h.H.Dtype()); keys != nil {
			qn = d.fused.KVPrepInto(l.kv.Apply(p.proj), c0.NumKVHeads, c0.HeadDim, l.qNorm, l.kNorm, d.contextPos(lc.Offset()), keys, values)
			lc.Wrote(p.T)
		}
	}
	if qn == l.qNorm {
		lc.Append(d.keysValues(l, p.proj, lc.Offset()))
		if fusedPrep {
			keys, values = lc.InPlace(p.window, c0.NumKVHeads, c0.HeadDim, h.H.Dtype())
		}
	}
	return keys, values, qn
}

// headPrep makes the block's queries, and its keys and values unless it writes them into
// the cache's keys and values; merged is set when one kernel also attended.
func (p *atPass) headPrep(l *layer, h *model.Normed, fusedPrep bool, qn, keys, values *mlxc.Array) (q, kn, vn, merged *mlxc.Array) {
	d, c0 := p.d, p.d.Cfg
	if fusedPrep {
		if keys != nil {
			merged, q = d.fused.PrepInto(l.qkv.Whole(h.X()), c0.NumHeads, c0.NumKVHeads, c0.HeadDim, qn, l.kNorm, p.kpos(), keys, values,
				d.scaleArr, false, d.fqa.ServesRows(p.L) && !d.fqa.Splits(p.window))
		} else {
			q, kn, vn = d.fused.HeadPrepMerged(l.qkv.Whole(h.X()), c0.NumHeads, c0.NumKVHeads, c0.HeadDim, l.qNorm, l.kNorm, p.kpos())
		}
		return q, kn, vn, merged
	}
	qkv := model.ApplyParts(l.qkv, h.X(), l.q, l.k, l.v)
	q = mlxc.Transpose(mlxc.RMSNorm(mlxc.Reshape(qkv[0], 1, p.L, c0.NumHeads, -1), l.qNorm, c0.RMSNormEps), 0, 2, 1, 3)
	q = d.rope.ApplyAt(q, p.pos)
	kn, vn = d.heads(l, qkv[1], qkv[2], func(k *mlxc.Array) *mlxc.Array { return d.rope.ApplyAt(k, p.pos) })
	return q, kn, vn, merged
}

// layerTail finishes layer i after attention (merged: its heads as rows [L, ·]): the o
// projection and residual, the post-attention norm, the MLP and its residual. It returns
// the residual stream and its norm for what follows: layer i+1's input norm, or after the
// last layer the final norm (written by the down projection's kernel where it can).
func (d *Drafter) layerTail(i int, x, merged *mlxc.Array) (*mlxc.Array, *model.Normed) {
	l := &d.layers[i]
	x, h := model.OutAdd(d.fused, l.o, merged, x, l.postNorm, d.Cfg.RMSNormEps)
	nextNorm := d.norm
	if i+1 < len(d.layers) {
		nextNorm = d.layers[i+1].inputNorm
	}
	return model.MLPAdd(d.fused, d.swiglu, l.gateUp, l.gate, l.up, l.down, h, x, nextNorm, d.Cfg.RMSNormEps)
}

// logits are the block's draft logits [1, L−1, V] from the final norm of the last layer's
// rows [L, H] (slots 1..L−1), through the target's head.
func (d *Drafter) logits(final *model.Normed) *mlxc.Array {
	L := final.H.Dim(0)
	return mlxc.Reshape(d.target.Head(final.Rows(1, L)), 1, L-1, -1)
}

// project maps tapped target hidden rows [T, n·H] to the drafter's context [T, H].
func (d *Drafter) project(ctx *mlxc.Array) *mlxc.Array {
	return mlxc.RMSNorm(d.fc.Apply(ctx), d.hiddenNorm, d.Cfg.RMSNormEps)
}

// keysValues is one layer's keys (k_norm, RoPE from position off) and values for rows
// x [T, H], as [1, nKV, T, hd]. Block rows and context rows go through the same path.
func (d *Drafter) keysValues(l *layer, x *mlxc.Array, off int) (*mlxc.Array, *mlxc.Array) {
	if l.kv != nil && d.fused.PrepFits(x, d.Cfg.HeadDim, l.qNorm, l.kNorm) {
		return d.fused.KVPrep(l.kv.Apply(x), d.Cfg.NumKVHeads, d.Cfg.HeadDim, l.kNorm, d.contextPos(off))
	}
	return d.headsKV(l, l.k.Apply(x), l.v.Apply(x), off)
}

// contextPos is position off as our kernels read it (model.OnDevice): made once per
// position, so the layers of one call share one node, and kept for the next calls (a
// forward of several rows reads as many positions). Past maxContextPos positions the
// kept ones are dropped: sequences move on, and a graph still to run holds its own
// reference.
func (d *Drafter) contextPos(off int) *mlxc.Array {
	if a, ok := d.ctxPos[off]; ok {
		return a
	}
	if len(d.ctxPos) >= maxContextPos {
		d.freeContextPos()
	}
	if d.ctxPos == nil {
		d.ctxPos = make(map[int]*mlxc.Array)
	}
	a := d.fused.OnDevice(model.Visible(off)).Detach()
	d.ctxPos[off] = a
	return a
}

// maxContextPos bounds the positions contextPos keeps: more than the rows of a batch.
const maxContextPos = 256

// freeContextPos releases the positions contextPos kept.
func (d *Drafter) freeContextPos() {
	for _, a := range d.ctxPos {
		a.Free()
	}
	clear(d.ctxPos)
}

// headsKV turns projected key and value rows [T, nKV·hd] into heads (k_norm, RoPE from
// position off).
func (d *Drafter) headsKV(l *layer, kp, vp *mlxc.Array, off int) (*mlxc.Array, *mlxc.Array) {
	return d.heads(l, kp, vp, func(k *mlxc.Array) *mlxc.Array { return d.rope.Apply(k, off) })
}

// heads is headsKV with the rotation given.
func (d *Drafter) heads(l *layer, kp, vp *mlxc.Array, rotate func(*mlxc.Array) *mlxc.Array) (*mlxc.Array, *mlxc.Array) {
	c0 := d.Cfg
	T := kp.Dim(0)
	k := mlxc.Transpose(mlxc.RMSNorm(mlxc.Reshape(kp, 1, T, c0.NumKVHeads, -1), l.kNorm, c0.RMSNormEps), 0, 2, 1, 3)
	v := mlxc.Transpose(mlxc.Reshape(vp, 1, T, c0.NumKVHeads, -1), 0, 2, 1, 3)
	return rotate(k), v
}

func (d *Drafter) weights() []*mlxc.Array {
	ws := append(d.fc.Arrays(), d.hiddenNorm, d.norm)
	if d.Selector != nil {
		ws = append(ws, d.Selector.arrays()...)
	}
	for i := range d.layers {
		l := &d.layers[i]
		ws = append(ws, l.convArrays()...)
		ws = append(ws, l.inputNorm, l.postNorm, l.qNorm, l.kNorm)
		for _, x := range []*model.Linear{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
			ws = append(ws, x.Arrays()...)
		}
	}
	return ws
}

// Free releases the drafter's weights (not the target's).
func (d *Drafter) Free() {
	d.fc.Free()
	d.hiddenNorm.Free()
	d.norm.Free()
	for i := range d.layers {
		l := &d.layers[i]
		l.inputNorm.Free()
		l.postNorm.Free()
		l.qNorm.Free()
		l.kNorm.Free()
		for _, x := range []*model.Linear{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
			x.Free()
		}
		l.qkv.Free()
		l.gateUp.Free()
		l.kv.Free()
		l.freeConvs()
	}
	d.Selector.Free()
	d.conv.Free()
	d.rope.Free()
	d.swiglu.Free()
	d.scaleArr.Free()
	d.freeContextPos()
	d.fused.Free()
}

// AddContext appends committed context rows [1, T, n·H] to the draft cache without
// drafting (used for prefill chunks).
func (d *Drafter) AddContext(ctx *mlxc.Array, c *model.KVCaches) {
	proj := d.project(mlxc.Reshape(ctx, ctx.Dim(1), -1))
	for i := range d.layers {
		lc := c.Layers[i]
		lc.Append(d.keysValues(&d.layers[i], proj, lc.Offset()))
	}
}
