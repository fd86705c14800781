package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// Normed is x = RMSNorm(H) with weight W and epsilon Eps for rows H [R, D], made only when
// something needs x itself (a model's last layer, for instance, needs no norm of rows whose
// logits nobody asked for). The kernel that wrote H may have written x too (the fused
// add-norm kernel): then X costs nothing. Or it left the rows' scales (scaled,
// SkinnyGEMM.ApplyAddNorm): then the next product normalizes H as it reads it
// (Linear.ApplyNormed), and X makes x from the scales with one kernel. Otherwise X makes
// MLX's RMSNorm node once.
type Normed struct {
	H, W   *mlxc.Array
	Eps    float32
	x      *mlxc.Array
	scaled *normScales
	row0   int // H is rows row0.. of the rows the scales were made for
}

// normScales is where a NormOut launch (SkinnyGEMM.ApplyAddNorm) left its rows' scales: the
// start of its weight's scratch sc (owned by st, which also orders the weight's next
// launch after every reader of the scales: readBy).
type normScales struct {
	s  *SkinnyGEMM
	sc *mlxc.Array
	st *TCState
}

// readBy records that y reads n's scales: the producing weight's next launch, which
// overwrites them, then takes y as its ordering input (TCState.prev). The model reads a
// norm once (one product, or X).
func (n *Normed) readBy(y *mlxc.Array) {
	st := n.scaled.st
	st.prev.Free()
	st.prev = y.Ref()
}

// NormOf is RMSNorm(h) with weight w, for X to make.
func NormOf(h, w *mlxc.Array, eps float32) *Normed { return &Normed{H: h, W: w, Eps: eps} }

// NormedAs wraps rows x that are already RMSNorm(h) (written by h's kernel).
func NormedAs(h, x *mlxc.Array) *Normed { return &Normed{H: h, x: x} }

// normOrNil is NormOf, or nil when no norm follows (w nil).
func normOrNil(h, w *mlxc.Array, eps float32) *Normed {
	if w == nil {
		return nil
	}
	return NormOf(h, w, eps)
}

// X returns RMSNorm(H)·W as an array (MLX's RMSNorm, made on the first call, unless a
// kernel wrote it; from the scales when a kernel left them).
func (n *Normed) X() *mlxc.Array {
	switch {
	case n.x != nil:
	case n.scaled != nil:
		n.x = n.scaled.s.scaledNorm(n)
	default:
		n.x = mlxc.RMSNorm(n.H, n.W, n.Eps)
	}
	return n.x
}

// Rows returns rows i..j−1 (of a 2-D H): the same norm of fewer rows.
func (n *Normed) Rows(i, j int) *Normed {
	out := &Normed{H: mlxc.SliceAxis(n.H, 0, i, j), W: n.W, Eps: n.Eps, scaled: n.scaled, row0: n.row0 + i}
	if n.x != nil {
		out.x = mlxc.SliceAxis(n.x, 0, i, j)
	}
	return out
}

// ApplyAddNorm returns h = r + x·Wᵀ (ApplyAdd) and h's RMSNorm with weight norm: its
// scales left by the same kernel where the tensor-core product can
// (SkinnyGEMM.ApplyAddNorm), else for X to make.
func (l *Linear) ApplyAddNorm(x, r, norm *mlxc.Array, eps float32) (*mlxc.Array, *Normed) {
	if l.Q == nil && l.Bias == nil && l.skinny.FitsNormOut(x, l.W, r, norm) {
		return l.skinny.ApplyAddNorm(x, l.W, r, norm, eps, &l.tc)
	}
	h := l.ApplyAdd(x, r)
	return h, NormOf(h, norm, eps)
}

// ApplyNormed returns x.X()·Wᵀ: the norm made by the product's kernel as it reads x.H
// where it can (SkinnyGEMM.ApplyNormIn), else Apply of X.
func (l *Linear) ApplyNormed(x *Normed) *mlxc.Array {
	if x.x == nil && l.Q == nil && l.Bias == nil && l.skinny.FitsNormIn(x, l.W) {
		return l.skinny.ApplyNormIn(x, l.W, false, &l.tc)
	}
	return l.Apply(x.X())
}
