package deltanet

import (
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Fused runs a GatedDeltaNet layer's element-wise steps as MLX compiled functions (one
// fused kernel each, traced once for every shape) instead of chains of MLX ops: the gates
// (about ten nodes), the conv's SiLU (two), the q/k readout scales (two, and their
// scalars' broadcasts) and the gated norm's product (six). On a GPU a hybrid model's cycle
// is host-bound, its cost set by the graph's node count (docs/perf/hybrid.md).
//
// Each function is the op sequence of the ops functions (Gates, CausalConv's SiLU,
// NormalizeQK, GatedOut) and compiled element-wise code rounds where the ops round, so the
// results are the ops path's bit for bit (TestFusedMatchesOps, and TestMatchesMLXLM
// against mlx-lm, whose gates are compiled too). A nil *Fused runs the ops functions.
type Fused struct {
	keyDim                         int
	gates, silu, scaleQK, gatedOut *mlxc.Compiled
}

// NewFused compiles the functions for layers with keyDim-wide key heads (the readout
// scales are constants of it); call on the MLX thread.
func NewFused(keyDim int) *Fused {
	inv := math.Pow(float64(keyDim), -0.5)
	return &Fused{
		keyDim: keyDim,
		gates: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			g, beta := Gates(in[0], in[1], in[2], in[3])
			return []*mlxc.Array{g, beta}
		}, true),
		silu: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			return []*mlxc.Array{mlxc.SiLU(in[0])}
		}, true),
		scaleQK: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			q, k := scaleQK(in[0], in[1], inv)
			return []*mlxc.Array{q, k}
		}, true),
		gatedOut: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			return []*mlxc.Array{GatedOut(in[0], in[1])}
		}, true),
	}
}

// Gates is the package's Gates.
func (f *Fused) Gates(a, b, aLog, dtBias *mlxc.Array) (g, beta *mlxc.Array) {
	if f == nil {
		return Gates(a, b, aLog, dtBias)
	}
	out := f.gates.Call(a, b, aLog, dtBias)
	return out[0], out[1]
}

// SiLU is x·sigmoid(x), the conv's activation.
func (f *Fused) SiLU(x *mlxc.Array) *mlxc.Array {
	if f == nil {
		return mlxc.SiLU(x)
	}
	return f.silu.Call(x)[0]
}

// NormalizeQK is the package's NormalizeQK.
func (f *Fused) NormalizeQK(q, k *mlxc.Array) (qn, kn *mlxc.Array) {
	if f == nil || q.Dim(q.Ndim()-1) != f.keyDim {
		return NormalizeQK(q, k)
	}
	eps := normEps(f.keyDim)
	out := f.scaleQK.Call(mlxc.RMSNorm(q, nil, eps), mlxc.RMSNorm(k, nil, eps))
	return out[0], out[1]
}

// GatedOut is the package's GatedOut.
func (f *Fused) GatedOut(z, n *mlxc.Array) *mlxc.Array {
	if f == nil {
		return GatedOut(z, n)
	}
	return f.gatedOut.Call(z, n)[0]
}

// Free releases the compiled functions.
func (f *Fused) Free() {
	if f == nil {
		return
	}
	for _, c := range []*mlxc.Compiled{f.gates, f.silu, f.scaleQK, f.gatedOut} {
		c.Free()
	}
}

// GatedOut is the gated RMSNorm's gate, silu(z)·n with the silu and the product in
// float32, cast back to n's dtype (n is the normed recurrence output, z the gate
// projection, of one shape).
func GatedOut(z, n *mlxc.Array) *mlxc.Array {
	return mlxc.AsType(mlxc.Multiply(mlxc.SiLU(mlxc.AsType(z, mlxc.Float32)), mlxc.AsType(n, mlxc.Float32)), n.Dtype())
}
