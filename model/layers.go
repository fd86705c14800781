package model

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Linear is y = x·Wᵀ (+ b), dense or affine-quantized.
type Linear struct {
	W    *mlxc.Array
	Q    *mlxc.Quantized
	Bias *mlxc.Array
	// wT is Wᵀ as an evaluated view (no copy) made once at load, so a step does not build
	// a transpose node per layer: MLX spends host time on every graph node.
	wT *mlxc.Array
	// skinny, when set (CUDA), computes 2..16-row products (verify blocks, drafts); tc is
	// what its tensor-core kernel keeps for W between calls.
	skinny *SkinnyGEMM
	tc     TCState
	// qmm, when set, computes quantized products of 2..16 rows (UseQMM).
	qmm *SmallMQuantMatmul
	// Reduce, when set, is the tensor-parallel split of this product's input columns
	// (Builder.SplitIn): each rank's product is a partial sum, all-summed over the ranks
	// before the bias, the residual add or a norm.
	Reduce *Shard
}

// prepare makes the transposed view once (call on the MLX thread after loading).
func (l *Linear) prepare() {
	if l != nil && l.W != nil && l.wT == nil {
		l.wT = mlxc.Transpose(l.W).Detach()
		mlxc.Eval(l.wT)
	}
}

func (l *Linear) transposed() *mlxc.Array {
	if l.wT != nil {
		return l.wT
	}
	return mlxc.Transpose(l.W)
}

// Apply runs the layer with mlx-lm's op sequence (matmul with Wᵀ, or addmm with a bias).
// A split product (Reduce) has no bias (SplitIn), so its partial sums are all-summed as
// they are.
func (l *Linear) Apply(x *mlxc.Array) *mlxc.Array {
	if l.Reduce != nil {
		return l.Reduce.AllSum(l.apply(x))
	}
	return l.apply(x)
}

func (l *Linear) apply(x *mlxc.Array) *mlxc.Array {
	if l.Q != nil {
		y := quantizedProduct(x, *l.Q, l.skinny, l.qmm)
		if l.Bias != nil {
			y = mlxc.Add(y, l.Bias)
		}
		return y
	}
	if l.Bias != nil {
		return mlxc.AddMM(l.Bias, x, l.transposed(), 1, 1)
	}
	if l.skinny.Fits(x, l.W) {
		return l.skinny.ApplyOwned(x, l.W, &l.tc)
	}
	return mlxc.Matmul(x, l.transposed())
}

// ApplyAdd returns r + x·Wᵀ (r: rows [R, N] of x's type, the residual stream). Where the
// tensor-core product serves the layer, one kernel adds r as it writes; elsewhere the
// product and MLX's Add. The same values either way (SkinnyGEMM.ApplyFused).
func (l *Linear) ApplyAdd(x, r *mlxc.Array) *mlxc.Array {
	if l.Q == nil && l.Bias == nil && l.Reduce == nil && l.skinny.FitsFused(x, l.W, r) {
		return l.skinny.ApplyFused(x, l.W, r, &l.tc)
	}
	return mlxc.Add(r, l.Apply(x))
}

// OutAdd is a layer's attention output for the target and the drafter alike: h = r +
// o(merged), the add in the o projection's kernel where it can be (ApplyAdd), and x, the
// post-attention norm of h, written by the same kernel where the product can (ApplyAddNorm).
// A separate kernel for the add and the norm was no faster (docs/gpu.md) and is gone.
func OutAdd(f *Fused, o *Linear, merged, r, norm *mlxc.Array, eps float32) (h *mlxc.Array, x *Normed) {
	return o.ApplyAddNorm(merged, r, norm, eps)
}

// MLPAdd is a layer's MLP and residual add for normed rows x and residual r: h = r +
// down(silu(gate)·up), the target's and the drafter's alike, and next, h's norm with
// weight nextNorm (the next layer's input norm or the final norm; nil: none). With the
// fused kernels and merged gate/up weights the norm, the activation and the add go into
// the products' kernels where they can (gatedDownAdd).
func MLPAdd(f *Fused, sw *SwiGLU, gateUp *MergedLinear, gate, up, down *Linear, x *Normed, r, nextNorm *mlxc.Array, eps float32) (h *mlxc.Array, next *Normed) {
	if f != nil && gateUp != nil {
		return gatedDownAdd(gateUp, down, x, r, f.GatedAct, nextNorm, eps)
	}
	gu := ApplyParts(gateUp, x.X(), gate, up)
	dn := down.Apply(sw.Apply(gu[0], gu[1]))
	h = mlxc.Add(r, dn)
	return h, normOrNil(h, nextNorm, eps)
}

// gatedDownAdd returns r + down(silu(gate)·up) for normed rows x of an MLP with a merged
// gate/up projection, and its norm with weight nextNorm (nil: none): the activation in
// the gate/up product's kernel where it can (MergedLinear.Gated), else act's (GatedAct);
// the residual add and the next norm in the down projection's kernel (ApplyAdd,
// ApplyAddNorm).
func gatedDownAdd(gateUp *MergedLinear, down *Linear, x *Normed, r *mlxc.Array, act func(*mlxc.Array) *mlxc.Array, nextNorm *mlxc.Array, eps float32) (*mlxc.Array, *Normed) {
	if nextNorm != nil {
		return down.ApplyAddNorm(gateUp.Gated(x.X(), act), r, nextNorm, eps)
	}
	return down.ApplyAdd(gateUp.Gated(x.X(), act), r), nil
}

// quantizedProduct is x·dequant(q)ᵀ; in GPU-exact mode (s serves one-row products too) a
// block of 2..16 rows goes one row at a time, so that each row rounds like the one-token
// step's product (MLX's block kernels round differently on a GPU). Otherwise a block of
// 2..16 rows goes through op where it fits; one row stays on MLX's qmv.
func quantizedProduct(x *mlxc.Array, q mlxc.Quantized, s *SkinnyGEMM, op *SmallMQuantMatmul) *mlxc.Array {
	exact := s != nil && s.minRows == 1
	if (exact || op != nil) && x.Ndim() >= 1 {
		if rows := x.Size() / x.Dim(-1); rows >= 2 && rows <= 16 {
			if exact {
				return mlxc.QuantizedMatmulRows(x, q)
			}
			if op.Fits(x, q) {
				return op.apply(x, q)
			}
		}
	}
	return mlxc.QuantizedMatmul(x, q, true)
}

// UseSkinny routes the layer's few-row products through s (nil: MLX's matmul).
func (l *Linear) UseSkinny(s *SkinnyGEMM) {
	if l != nil {
		l.skinny = s
	}
}

// UseQMM routes the layer's quantized products of 2..16 rows through op where it fits
// (nil: MLX's quantized_matmul).
func (l *Linear) UseQMM(op *SmallMQuantMatmul) {
	if l != nil {
		l.qmm = op
	}
}

// Prepare readies the layer for repeated use (the transposed view). MLX thread only.
func (l *Linear) Prepare() { l.prepare() }

// Arrays lists the layer's weight arrays (for evaluation after loading).
func (l *Linear) Arrays() []*mlxc.Array {
	if l == nil {
		return nil
	}
	var ws []*mlxc.Array
	if l.Q != nil {
		ws = append(ws, l.Q.W, l.Q.Scales)
		if l.Q.Biases != nil {
			ws = append(ws, l.Q.Biases)
		}
	} else {
		ws = append(ws, l.W)
	}
	if l.Bias != nil {
		ws = append(ws, l.Bias)
	}
	return ws
}

func (l *Linear) Free() {
	if l == nil {
		return
	}
	l.wT.Free()
	l.tc.Free()
	l.W.Free()
	l.Bias.Free()
	l.Q.Free()
}

// Embedding is a token table [V, H], dense or quantized; AsLinear serves tied LM heads.
type Embedding struct {
	W      *mlxc.Array
	Q      *mlxc.Quantized
	wT     *mlxc.Array // Eᵀ view for the tied head, made once at load
	skinny *SkinnyGEMM // few-row head products on CUDA (see Linear)
	tc     TCState     // what its tensor-core kernel keeps for E
}

// Prepare makes the tied head's view once the table is evaluated, and gives the head the
// few-row product kernel s (nil: off).
func (e *Embedding) Prepare(s *SkinnyGEMM) {
	if e == nil {
		return
	}
	e.prepare()
	e.skinny = s
}

func (e *Embedding) prepare() {
	if e != nil && e.W != nil && e.wT == nil {
		e.wT = mlxc.Transpose(e.W).Detach()
		mlxc.Eval(e.wT)
	}
}

// Lookup gathers rows for ids.
func (e *Embedding) Lookup(ids *mlxc.Array) *mlxc.Array {
	if e.Q != nil {
		var b *mlxc.Array
		if e.Q.Biases != nil {
			b = mlxc.Take(e.Q.Biases, ids, 0)
		}
		q := mlxc.Quantized{W: mlxc.Take(e.Q.W, ids, 0), Scales: mlxc.Take(e.Q.Scales, ids, 0), Biases: b,
			GroupSize: e.Q.GroupSize, Bits: e.Q.Bits, Mode: e.Q.Mode}
		return mlxc.Dequantize(q, -1)
	}
	return mlxc.Take(e.W, ids, 0)
}

// AsLinear is x·Eᵀ (a tied output head), quantized with the embedding's own parameters.
func (e *Embedding) AsLinear(x *mlxc.Array) *mlxc.Array {
	if e.Q != nil {
		return quantizedProduct(x, *e.Q, e.skinny, nil)
	}
	if e.skinny.Fits(x, e.W) {
		return e.skinny.ApplyOwned(x, e.W, &e.tc)
	}
	if e.wT != nil {
		return mlxc.Matmul(x, e.wT)
	}
	return mlxc.Matmul(x, mlxc.Transpose(e.W))
}

// Dtype is the table's activation dtype: that of the scales when quantized.
func (e *Embedding) Dtype() mlxc.Dtype {
	if e.Q != nil {
		return e.Q.Scales.Dtype()
	}
	return e.W.Dtype()
}

// Arrays lists the table's weight arrays (for evaluation at load).
func (e *Embedding) Arrays() []*mlxc.Array {
	if e.Q != nil {
		return (&Linear{Q: e.Q}).Arrays()
	}
	return []*mlxc.Array{e.W}
}

func (e *Embedding) Free() {
	if e == nil {
		return
	}
	e.wT.Free()
	e.tc.Free()
	e.W.Free()
	e.Q.Free()
}

// Builder takes tensors out of a Weights set while checking names, shapes and dtypes
// against what the architecture expects. All problems are collected so the user sees
// them at once; on any problem nothing is kept (Release frees what was taken).
type Builder struct {
	w     *Weights
	q     *QuantConfig
	errs  []error
	taken []*mlxc.Array
}

func NewBuilder(w *Weights, q *QuantConfig) *Builder { return &Builder{w: w, q: q} }

func (b *Builder) errf(format string, args ...any) {
	b.errs = append(b.errs, fmt.Errorf(format, args...))
}

func (b *Builder) take(name string) *mlxc.Array {
	a, ok := b.w.Take(name)
	if !ok {
		b.errf("tensor %s is missing from the checkpoint", name)
		return nil
	}
	b.taken = append(b.taken, a)
	return a
}

// float takes a floating-point tensor of the given shape.
func (b *Builder) Float(name string, shape ...int) *mlxc.Array {
	info, ok := b.w.Info[name]
	if !ok {
		b.errf("tensor %s is missing from the checkpoint", name)
		return nil
	}
	if !slices.Equal(info.Shape, shape) {
		b.errf("%s: tensor %s has shape %v, want %v", b.w.fileOf(name), name, info.Shape, shape)
	}
	if !info.Dtype.IsFloat() || info.Dtype == mlxc.Float64 {
		b.errf("%s: tensor %s has dtype %s, want bfloat16, float16 or float32", b.w.fileOf(name), name, info.Dtype)
	}
	return b.take(name)
}

// quantized takes the weight/scales/biases triple of a quantized module.
func (b *Builder) quantized(path string, q *Quant, out, in int) *mlxc.Quantized {
	wn, sn, bn := path+".weight", path+".scales", path+".biases"
	if in%q.GroupSize != 0 {
		b.errf("%s: input size %d is not a multiple of the group size %d", path, in, q.GroupSize)
		return nil
	}
	if (in*q.Bits)%32 != 0 {
		b.errf("%s: input size %d × %d bits does not pack into 32-bit words", path, in, q.Bits)
		return nil
	}
	wi, ok := b.w.Info[wn]
	if !ok {
		b.errf("tensor %s is missing from the checkpoint", wn)
		return nil
	}
	if wi.Dtype != mlxc.Uint32 {
		b.errf("%s: quantized tensor %s has dtype %s, want uint32", b.w.fileOf(wn), wn, wi.Dtype)
	}
	if want := []int{out, in * q.Bits / 32}; !slices.Equal(wi.Shape, want) {
		b.errf("%s: tensor %s has shape %v, want %v (%d-bit, in=%d)", b.w.fileOf(wn), wn, wi.Shape, want, q.Bits, in)
	}
	si, ok := b.w.Info[sn]
	if !ok {
		b.errf("%s is quantized (config.json \"quantization\") but tensor %s is missing", path, sn)
		return nil
	}
	if want := []int{out, in / q.GroupSize}; !slices.Equal(si.Shape, want) {
		b.errf("%s: tensor %s has shape %v, want %v (group size %d)", b.w.fileOf(sn), sn, si.Shape, want, q.GroupSize)
	}
	res := &mlxc.Quantized{GroupSize: q.GroupSize, Bits: q.Bits, Mode: q.Mode}
	if q.Mode == "affine" {
		bi, ok := b.w.Info[bn]
		if !ok {
			b.errf("%s is affine-quantized but tensor %s is missing", path, bn)
			return nil
		}
		if !slices.Equal(bi.Shape, si.Shape) {
			b.errf("%s: tensor %s has shape %v, want %v", b.w.fileOf(bn), bn, bi.Shape, si.Shape)
		}
		res.Biases = b.take(bn)
	}
	res.W = b.take(wn)
	res.Scales = b.take(sn)
	return res
}

// linear takes a Linear module at path with the given sizes.
func (b *Builder) Linear(path string, out, in int, bias bool) *Linear {
	l := &Linear{}
	if q := b.q.For(path, b.w.Has(path+".scales")); q != nil {
		l.Q = b.quantized(path, q, out, in)
	} else {
		if info, ok := b.w.Info[path+".weight"]; ok && info.Dtype == mlxc.Uint32 {
			b.errf("%s: tensor %s.weight is packed (uint32) but there is no quantization for it (config.json \"quantization\" or %s.scales missing)", b.w.fileOf(path+".weight"), path, path)
			return l
		}
		if b.w.Has(path + ".scales") {
			b.errf("tensor %s.scales exists but config.json has no \"quantization\" block", path)
		}
		l.W = b.Float(path+".weight", out, in)
	}
	if bias {
		l.Bias = b.Float(path+".bias", out)
	}
	return l
}

// embedding takes an Embedding module.
func (b *Builder) Embedding(path string, vocab, dim int) *Embedding {
	e := &Embedding{}
	if q := b.q.For(path, b.w.Has(path+".scales")); q != nil {
		e.Q = b.quantized(path, q, vocab, dim)
		return e
	}
	if info, ok := b.w.Info[path+".weight"]; ok && info.Dtype == mlxc.Uint32 {
		b.errf("%s: tensor %s.weight is packed (uint32) but %s.scales / config.json \"quantization\" is missing", b.w.fileOf(path+".weight"), path, path)
		return e
	}
	e.W = b.Float(path+".weight", vocab, dim)
	return e
}

// Adopt makes arrays a family took from the Weights itself (tensors the Builder's
// modules do not describe, such as stacked experts) the Builder's to free when the build
// fails, like the ones it gave out.
func (b *Builder) Adopt(arrs ...*mlxc.Array) { b.taken = append(b.taken, arrs...) }

// Abandon ends a build that cannot go on because of err: err is reported first, then the
// problems found so far, but not the tensors left over (the build stopped before taking
// them), and everything taken or adopted is freed.
func (b *Builder) Abandon(err error) error {
	b.errs = append([]error{err}, b.errs...)
	return b.Finish(func(string) bool { return true })
}

// finish checks that no tensor was left unused (mlx-lm loads strictly) and returns all
// problems as one error; on error everything taken is freed.
func (b *Builder) Finish(ignore func(name string) bool) error {
	var extra []string
	for name := range b.w.Info {
		if _, still := b.w.Arrays[name]; still && (ignore == nil || !ignore(name)) {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		more := ""
		if len(extra) > 5 {
			more = fmt.Sprintf(" and %d more", len(extra)-5)
			extra = extra[:5]
		}
		b.errf("unexpected tensors in the checkpoint: %s%s", strings.Join(extra, ", "), more)
	}
	b.w.Free()
	if len(b.errs) > 0 {
		for _, a := range b.taken {
			a.Free()
		}
		b.taken = nil
		if len(b.errs) > 8 {
			n := len(b.errs)
			b.errs = append(b.errs[:8], fmt.Errorf("... and %d more problems", n-8))
		}
		return errors.Join(b.errs...)
	}
	return nil
}
