package model

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Projections that read the same input (q, k, v; gate, up) are merged into one matrix
// when the fused kernels run, which read the merged products. Merging without them was
// measured on an H200 (random Qwen3-4B shape, one process, alternating runs): DFlash 691
// vs 669 tok/s at τ 7.1 (within the noise), plain decoding 236 vs 269 tok/s (the column
// slices add 72 nodes per step), so that variant is gone. mergeProjections merges without
// the fused kernels too: tests set it to check merged products against separate ones on
// the CPU backend, where they must match bit for bit.
var mergeProjections bool

// MergesProjections reports whether families merge their projections without the fused
// kernels (set only by tests).
func MergesProjections() bool { return mergeProjections }

// MergedLinear is several dense projections of one input stacked into one weight; the
// parts keep working as views into it (no second copy of the weights).
type MergedLinear struct {
	all   *Linear
	sizes []int
}

// MergeLinears stacks the parts' weights (dense, unbiased, same dtype and input size) and
// rewires each part's W to a view of the stack. It returns nil, leaving the parts alone,
// when they cannot be merged (quantized or biased layers). MLX thread; weights evaluated.
func MergeLinears(parts ...*Linear) *MergedLinear {
	if len(parts) < 2 {
		return nil
	}
	ws := make([]*mlxc.Array, len(parts))
	sizes := make([]int, len(parts))
	for i, p := range parts {
		if p == nil || p.Q != nil || p.Bias != nil || p.W == nil || p.W.Ndim() != 2 ||
			p.W.Dtype() != parts[0].W.Dtype() || p.W.Dim(1) != parts[0].W.Dim(1) {
			return nil
		}
		ws[i], sizes[i] = p.W, p.W.Dim(0)
	}
	all := &Linear{W: mlxc.Concatenate(ws, 0).Detach(), skinny: parts[0].skinny}
	mlxc.Eval(all.W)
	all.prepare()
	off := 0
	for i, p := range parts {
		view := mlxc.SliceAxis(all.W, 0, off, off+sizes[i]).Detach()
		mlxc.Eval(view)
		p.wT.Free()
		p.tc.Free()
		p.W.Free()
		p.W, p.wT = view, nil
		p.prepare()
		off += sizes[i]
	}
	return &MergedLinear{all: all, sizes: sizes}
}

// Merge stacks dense parts (MergeLinears) or quantized ones (MergeQuantizedLinears); nil
// when neither can.
func Merge(parts ...*Linear) *MergedLinear {
	if m := MergeLinears(parts...); m != nil {
		return m
	}
	return MergeQuantizedLinears(parts...)
}

// MergeQuantizedLinears is MergeLinears for quantized parts: their packed weights, scales
// and biases are stacked (the same bits, group size, mode and input size; no biases added
// after the product), each part's arrays rewired to views of the stacks. Quantization
// runs along a row's inputs, so a stacked row is the part's row, bit for bit. Nil, leaving
// the parts alone, when they cannot be merged. MLX thread; weights evaluated.
func MergeQuantizedLinears(parts ...*Linear) *MergedLinear {
	if len(parts) < 2 {
		return nil
	}
	first := parts[0]
	if first == nil || first.Q == nil {
		return nil
	}
	q0 := first.Q
	var ws, ss, bs []*mlxc.Array
	sizes := make([]int, len(parts))
	for i, p := range parts {
		if p == nil || p.Q == nil || p.Bias != nil || p.Q.W.Ndim() != 2 || p.Q.Bits != q0.Bits || p.Q.GroupSize != q0.GroupSize ||
			p.Q.Mode != q0.Mode || p.Q.W.Dim(1) != q0.W.Dim(1) || p.Q.W.Dtype() != q0.W.Dtype() ||
			p.Q.Scales.Dtype() != q0.Scales.Dtype() || (p.Q.Biases == nil) != (q0.Biases == nil) {
			return nil
		}
		ws, ss = append(ws, p.Q.W), append(ss, p.Q.Scales)
		if p.Q.Biases != nil {
			bs = append(bs, p.Q.Biases)
		}
		sizes[i] = p.Q.W.Dim(0)
	}
	stack := func(xs []*mlxc.Array) *mlxc.Array {
		if len(xs) == 0 {
			return nil
		}
		a := mlxc.Concatenate(xs, 0).Detach()
		mlxc.Eval(a)
		return a
	}
	all := &Linear{Q: &mlxc.Quantized{W: stack(ws), Scales: stack(ss), Biases: stack(bs), GroupSize: q0.GroupSize, Bits: q0.Bits, Mode: q0.Mode},
		skinny: first.skinny, qmm: first.qmm}
	view := func(a *mlxc.Array, off, n int) *mlxc.Array {
		if a == nil {
			return nil
		}
		v := mlxc.SliceAxis(a, 0, off, off+n).Detach()
		mlxc.Eval(v)
		return v
	}
	off := 0
	for i, p := range parts {
		q := &mlxc.Quantized{W: view(all.Q.W, off, sizes[i]), Scales: view(all.Q.Scales, off, sizes[i]),
			Biases: view(all.Q.Biases, off, sizes[i]), GroupSize: p.Q.GroupSize, Bits: p.Q.Bits, Mode: p.Q.Mode}
		p.Q.Free()
		p.Q = q
		off += sizes[i]
	}
	return &MergedLinear{all: all, sizes: sizes}
}

// Span returns parts i..j−1 as one Linear whose weight is a view of the stack (the parts are
// adjacent rows of it: no copy), for rows that need only those parts (the drafter's context
// rows need k and v, not q); nil for a quantized stack. The caller frees it. MLX thread.
func (m *MergedLinear) Span(i, j int) *Linear {
	if m == nil || m.all.W == nil || i < 0 || j > len(m.sizes) || i >= j {
		return nil // no stack, or a quantized one
	}
	off, end := 0, 0
	for p, n := range m.sizes {
		if p < i {
			off += n
		}
		if p < j {
			end += n
		}
	}
	w := mlxc.SliceAxis(m.all.W, 0, off, end).Detach()
	mlxc.Eval(w)
	l := &Linear{W: w, skinny: m.all.skinny}
	l.prepare()
	return l
}

// Apply returns each part's output for rows x [R, K], as column views of one product cut
// by a single split node (not a slice node per part).
func (m *MergedLinear) Apply(x *mlxc.Array) []*mlxc.Array {
	y := m.all.Apply(x)
	return mlxc.Split(y, m.SplitAt(), y.Ndim()-1)
}

// SplitAt returns where the parts' columns start in the merged product, the first's
// aside: the indices a split of Whole's last axis into the parts takes.
func (m *MergedLinear) SplitAt() []int {
	at := make([]int, len(m.sizes)-1)
	off := 0
	for i := range at {
		off += m.sizes[i]
		at[i] = off
	}
	return at
}

// Whole returns the merged product for rows x [R, K]: the parts' outputs side by side
// [R, Σ sizes], for kernels that read them in place (no slice nodes).
func (m *MergedLinear) Whole(x *mlxc.Array) *mlxc.Array { return m.all.Apply(x) }

// Gated returns silu(gate)·up [R, I] for a merged gate/up projection (two parts, gate
// first) of rows x: one kernel where the tensor-core product can apply the activation as
// it writes (SkinnyGEMM.ApplyAct), else act (GatedAct) of the merged product.
func (m *MergedLinear) Gated(x *mlxc.Array, act func(*mlxc.Array) *mlxc.Array) *mlxc.Array {
	if l := m.all; len(m.sizes) == 2 && m.sizes[0] == m.sizes[1] && l.Q == nil && l.Bias == nil && l.skinny.FitsAct(x, l.W) {
		return l.skinny.ApplyAct(x, l.W, &l.tc)
	}
	return act(m.Whole(x))
}

// ApplyParts returns each part's output for rows x: the slices of one merged product when m
// is set (the parts were merged into it), otherwise one product per part.
func ApplyParts(m *MergedLinear, x *mlxc.Array, parts ...*Linear) []*mlxc.Array {
	if m != nil {
		return m.Apply(x)
	}
	out := make([]*mlxc.Array, len(parts))
	for i, p := range parts {
		out[i] = p.Apply(x)
	}
	return out
}

// UseSkinny routes the merged product through s (see Linear.UseSkinny).
func (m *MergedLinear) UseSkinny(s *SkinnyGEMM) {
	if m != nil {
		m.all.UseSkinny(s)
	}
}

// Free releases the stacked weight (the parts' views are freed with the parts).
func (m *MergedLinear) Free() {
	if m != nil {
		m.all.Free()
	}
}
