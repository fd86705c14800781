package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// Normed is x = RMSNorm(H) with weight W and epsilon Eps for rows H [R, D], made only when
// something needs x itself. The product that wrote H may have left each row's scale
// (Scales, float32 [R]: rsqrt(mean(H²) + Eps), SkinnyGEMM.ApplyAddNorm); a tensor-core
// product that reads x then applies the norm as it loads H (ApplyNormed), so a layer's two
// norms cost no kernel and no graph node of their own. Everything else calls X, which
// makes MLX's RMSNorm node once.
type Normed struct {
	H, Scales, W *mlxc.Array
	Eps          float32
	x            *mlxc.Array
}

// NormOf is RMSNorm(h) with weight w, for X to make.
func NormOf(h, w *mlxc.Array, eps float32) *Normed { return &Normed{H: h, W: w, Eps: eps} }

// NormedAs wraps rows x that are already RMSNorm(h) (the fused add-norm kernel's).
func NormedAs(h, x *mlxc.Array) *Normed { return &Normed{H: h, x: x} }

// normOrNil is NormOf, or nil when no norm follows (w nil).
func normOrNil(h, w *mlxc.Array, eps float32) *Normed {
	if w == nil {
		return nil
	}
	return NormOf(h, w, eps)
}

// fusedInto reports whether s's product of weight w can apply n's norm as it reads n.H
// (n's rows not yet normed, and row scales that s can read: SkinnyGEMM.FitsNormIn).
func (n *Normed) fusedInto(s *SkinnyGEMM, w *mlxc.Array) bool {
	return n.x == nil && s.FitsNormIn(n.H, w, n.Scales, n.W)
}

// X returns RMSNorm(H)·W as an array (MLX's RMSNorm, made on the first call).
func (n *Normed) X() *mlxc.Array {
	if n.x == nil {
		n.x = mlxc.RMSNorm(n.H, n.W, n.Eps)
	}
	return n.x
}

// Rows returns rows i..j−1 (of a 2-D H): the same norm of fewer rows.
func (n *Normed) Rows(i, j int) *Normed {
	out := &Normed{H: mlxc.SliceAxis(n.H, 0, i, j), W: n.W, Eps: n.Eps}
	switch {
	case n.x != nil:
		out.x = mlxc.SliceAxis(n.x, 0, i, j)
	case n.Scales != nil:
		out.Scales = mlxc.SliceAxis(n.Scales, 0, i, j)
	}
	return out
}

// ApplyNormed returns x·Wᵀ for x = n's norm: in the tensor-core kernel straight from n.H
// when n has scales and the kernel serves the layer, else Apply(n.X()).
func (l *Linear) ApplyNormed(n *Normed) *mlxc.Array {
	if l.Q == nil && l.Bias == nil && n.fusedInto(l.skinny, l.W) {
		return l.skinny.ApplyNormed(n.H, l.W, n.Scales, n.W, &l.tc)
	}
	return l.Apply(n.X())
}

// ApplyAddNorm returns h = r + x·Wᵀ (ApplyAdd) and h's RMSNorm with weight norm: with its
// rows' scales from the same kernel where the tensor-core product can write them
// (SkinnyGEMM.ApplyAddNorm), else for X to make.
func (l *Linear) ApplyAddNorm(x, r, norm *mlxc.Array, eps float32) (*mlxc.Array, *Normed) {
	if l.Q == nil && l.Bias == nil && l.skinny.FitsNormOut(x, l.W, r) {
		h, scales := l.skinny.ApplyAddNorm(x, l.W, r, eps, &l.tc)
		return h, &Normed{H: h, Scales: scales, W: norm, Eps: eps}
	}
	h := l.ApplyAdd(x, r)
	return h, NormOf(h, norm, eps)
}
