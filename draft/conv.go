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
// base kernel base [K, H].
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
// [L, K, G] shared by the group channels of a group, base [K, H] cast to h's dtype.
func ConvOps(h, coeff, base *mlxc.Array, group int) *mlxc.Array {
	L, H := h.Dim(0), h.Dim(1)
	K := base.Dim(0)
	G := H / group
	blocks := mlxc.Reshape(h, L, G, group)
	dyn := mlxc.Reshape(coeff, L, K, G, 1)
	var out *mlxc.Array
	for t := 0; t < K && t < L; t++ {
		values := blocks
		if t > 0 {
			values = mlxc.Concatenate([]*mlxc.Array{mlxc.Zeros([]int{t, G, group}, h.Dtype()), mlxc.SliceAxis(blocks, 0, 0, L-t)}, 0)
		}
		kernel := mlxc.AsType(mlxc.Reshape(mlxc.SliceAxis(base, 0, t, t+1), 1, G, group), h.Dtype())
		term := mlxc.Multiply(kernel, values)
		if out == nil {
			out = term
		} else {
			out = mlxc.Add(out, term)
		}
		d := mlxc.Reshape(mlxc.SliceAxis(dyn, 1, t, t+1), L, G, 1)
		out = mlxc.Add(out, mlxc.Multiply(d, values))
	}
	return mlxc.Reshape(out, L, H)
}
