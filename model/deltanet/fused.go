package deltanet

import (
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Fused runs a GatedDeltaNet layer's element-wise steps as MLX compiled functions (one
// fused kernel each, traced once for every shape) instead of chains of MLX ops: the gates
// (about ten nodes), the conv's SiLU (two) and the gated norm's product (six); and the q/k
// readout scales as the q/k norms' weights, no node of their own. On a GPU a hybrid
// model's cycle is host-bound, its cost set by the graph's node count (docs/perf/hybrid.md).
//
// Each function is the op sequence of the ops functions (Gates, CausalConv's SiLU,
// GatedOut), and compiled element-wise code rounds where the ops round; the weighted norms
// round as NormalizeQK's norm and product do (on the CPU and CUDA; see NormalizeQK). So the
// results are the ops path's bit for bit (TestFusedMatchesOps, and TestMatchesMLXLM against
// mlx-lm, whose gates are compiled too).
// A nil *Fused runs the ops functions.
type Fused struct {
	keyDim                int
	gates, silu, gatedOut *mlxc.Compiled
	// scales holds, per activation dtype, the q and k norms' weights: Dk copies of the
	// readout scale inv² (q) and inv (k) in that dtype (made once, then constants).
	scales map[mlxc.Dtype][2]*mlxc.Array
}

// NewFused compiles the functions for layers with keyDim-wide key heads (the readout
// scales are constants of it); call on the MLX thread.
func NewFused(keyDim int) *Fused {
	return &Fused{
		keyDim: keyDim,
		scales: map[mlxc.Dtype][2]*mlxc.Array{},
		gates: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			g, beta := Gates(in[0], in[1], in[2], in[3])
			return []*mlxc.Array{g, beta}
		}, true),
		silu: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			return []*mlxc.Array{mlxc.SiLU(in[0])}
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

// NormalizeQK is the package's NormalizeQK in two nodes: each norm takes its readout
// scale as its weight. MLX's rms_norm on the CPU (its fallback ops) and in MLX 0.32.4's
// CUDA kernel rounds the normed value to the input dtype and then multiplies by the weight
// in that dtype: the ops path's norm then scalar product, bit for bit (TestFusedMatchesOps).
// A kernel that multiplies before rounding (MLX's newer Metal kernel) rounds once where the
// ops round twice, a last-bit difference; decode steps and verify blocks still round alike.
func (f *Fused) NormalizeQK(q, k *mlxc.Array) (qn, kn *mlxc.Array) {
	if f == nil || q.Dim(q.Ndim()-1) != f.keyDim || k.Dtype() != q.Dtype() {
		return NormalizeQK(q, k)
	}
	w := f.scaleWeights(q.Dtype())
	eps := normEps(f.keyDim)
	return mlxc.RMSNorm(q, w[0], eps), mlxc.RMSNorm(k, w[1], eps)
}

// scaleWeights returns the q and k norms' weights in dtype dt, made on first use.
func (f *Fused) scaleWeights(dt mlxc.Dtype) [2]*mlxc.Array {
	if w, ok := f.scales[dt]; ok {
		return w
	}
	inv := math.Pow(float64(f.keyDim), -0.5)
	var w [2]*mlxc.Array
	for i, v := range []float64{inv * inv, inv} {
		w[i] = mlxc.Full([]int{f.keyDim}, mlxc.Scalar(v, dt), dt)
		mlxc.Eval(w[i])
		w[i] = w[i].Detach()
	}
	f.scales[dt] = w
	return w
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
	for _, c := range []*mlxc.Compiled{f.gates, f.silu, f.gatedOut} {
		c.Free()
	}
	for dt, w := range f.scales {
		w[0].Free()
		w[1].Free()
		delete(f.scales, dt)
	}
}

// GatedOut is the gated RMSNorm's gate, silu(z)·n with the silu and the product in
// float32, cast back to n's dtype (n is the normed recurrence output, z the gate
// projection, of one shape).
func GatedOut(z, n *mlxc.Array) *mlxc.Array {
	return mlxc.AsType(mlxc.Multiply(mlxc.SiLU(mlxc.AsType(z, mlxc.Float32)), mlxc.AsType(n, mlxc.Float32)), n.Dtype())
}
