package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// Normed is x = RMSNorm(H) with weight W and epsilon Eps for rows H [R, D], made only when
// something needs x itself (a model's last layer, for instance, needs no norm of rows whose
// logits nobody asked for). The product that wrote H may have written x too
// (SkinnyGEMM.ApplyAddNorm, the fused add-norm kernel): then X costs nothing; otherwise X
// makes MLX's RMSNorm node once.
type Normed struct {
	H, W *mlxc.Array
	Eps  float32
	x    *mlxc.Array
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
// kernel wrote it).
func (n *Normed) X() *mlxc.Array {
	if n.x == nil {
		n.x = mlxc.RMSNorm(n.H, n.W, n.Eps)
	}
	return n.x
}

// Rows returns rows i..j−1 (of a 2-D H): the same norm of fewer rows.
func (n *Normed) Rows(i, j int) *Normed {
	out := &Normed{H: mlxc.SliceAxis(n.H, 0, i, j), W: n.W, Eps: n.Eps}
	if n.x != nil {
		out.x = mlxc.SliceAxis(n.x, 0, i, j)
	}
	return out
}

// ApplyAddNorm returns h = r + x·Wᵀ (ApplyAdd) and h's RMSNorm with weight norm: written by
// the same kernel where the tensor-core product can (SkinnyGEMM.ApplyAddNorm), else for X
// to make.
func (l *Linear) ApplyAddNorm(x, r, norm *mlxc.Array, eps float32) (*mlxc.Array, *Normed) {
	if l.Q == nil && l.Bias == nil && l.Reduce == nil && l.skinny.FitsNormOut(x, l.W, r, norm) {
		h, xn := l.skinny.ApplyAddNorm(x, l.W, r, norm, eps, &l.tc)
		return h, NormedAs(h, xn)
	}
	h := l.ApplyAdd(x, r)
	return h, NormOf(h, norm, eps)
}
