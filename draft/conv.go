package draft

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// Conv is DFlash2's grouped dynamic causal convolution over a block (DFLASH2.md §6.2):
//
//	y[l, c] = Σ_t base[t, c]·h[l−t, c] + coeff[l, t, ⌊c/g⌋]·h[l−t, c],  h[l−t] = 0 for l < t,
//
// so it never reads across the block's start. Its terms are summed in the reference's
// order — per tap, the base term and then the dynamic one — which fixes the rounding.
// The element-wise chain runs as one MLX compiled function (one fused kernel on a GPU
// for each block length), whose compiled element-wise code rounds where the ops do, so
// the compiled and the ops results are the same bit for bit (TestConvCompiledMatchesOps).
type Conv struct {
	fn *mlxc.Compiled
}

// NewConv compiles the convolution for channel groups of size group; call on the MLX
// thread.
func NewConv(group int) *Conv {
	return &Conv{fn: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
		return []*mlxc.Array{ConvOps(in[0], in[1], in[2], group)}
	}, false)}
}

// Apply convolves rows h [L, H] with coefficients coeff [L, K, G] (G = H/group) and the
// base kernel base [K, H]; or R blocks at once, h [R, L, H] and coeff [R, L, K, G], each
// block convolved on its own (the same values as R calls).
func (c *Conv) Apply(h, coeff, base *mlxc.Array) *mlxc.Array {
	return c.fn.Call(h, coeff, base)[0]
}

// Free releases the compiled function.
func (c *Conv) Free() {
	if c != nil {
		c.fn.Free()
	}
}

// ConvOps is the convolution as MLX ops (Conv's contract): rows h [L, H], coefficients
// [L, K, G] shared by the group channels of a group, base [K, H] cast to h's dtype; or
// blocks h [R, L, H] with coefficients [R, L, K, G]. Every term is element-wise, so a block's
// values do not depend on how many blocks go with it.
func ConvOps(h, coeff, base *mlxc.Array, group int) *mlxc.Array {
	shape := h.Shape()
	lead := shape[:len(shape)-2] // [] for one block, [R] for R
	ax := len(lead)              // the rows' axis
	L, H := shape[ax], shape[ax+1]
	K := base.Dim(0)
	G := H / group
	dims := func(d ...int) []int { return append(append([]int(nil), lead...), d...) }
	blocks := mlxc.Reshape(h, dims(L, G, group)...)
	dyn := mlxc.Reshape(coeff, dims(L, K, G, 1)...)
	var out *mlxc.Array
	for t := 0; t < K && t < L; t++ {
		values := blocks
		if t > 0 {
			values = mlxc.Concatenate([]*mlxc.Array{mlxc.Zeros(dims(t, G, group), h.Dtype()), mlxc.SliceAxis(blocks, ax, 0, L-t)}, ax)
		}
		kernel := mlxc.AsType(mlxc.Reshape(mlxc.SliceAxis(base, 0, t, t+1), 1, G, group), h.Dtype())
		term := mlxc.Multiply(kernel, values)
		if out == nil {
			out = term
		} else {
			out = mlxc.Add(out, term)
		}
		d := mlxc.Reshape(mlxc.SliceAxis(dyn, ax+1, t, t+1), dims(L, G, 1)...)
		out = mlxc.Add(out, mlxc.Multiply(d, values))
	}
	return mlxc.Reshape(out, shape...)
}
