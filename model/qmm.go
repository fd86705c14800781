package model

import (
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// SmallMQuantMatmul computes x·dequant(q)ᵀ for blocks of 1..16 rows (verify blocks, drafts)
// of an MLX affine-quantized weight with one custom kernel (CUDA, or its Metal twin):
// MLX's quantized_matmul is tuned for one row (qmv) or for large row tiles, which leave a
// 16-row verify product weak. The kernel reads each weight once per launch and uses it for
// every row through the matrix units, sums each group's products in float32 and rounds to
// the activation type once (kernels/cuda/qmm_small_m.cu has the layout). A row's result
// does not depend on the other rows of the block. Where it does not fit, and for a nil
// receiver (off a GPU, without custom kernels, or DFLASH_QMM_KERNEL off), Apply is MLX's
// quantized_matmul.
type SmallMQuantMatmul struct {
	k         *mlxc.Kernel
	templates templateCache[qmmKey]
}

type qmmKey struct {
	dt                     mlxc.Dtype
	bits, gs, tiles, warps int
}

// The kernel's limits and launch rule: at most 16 rows (one m16 tile); blocks of 8·tiles
// columns, the most tiles per warp (4, 2, 1) that still give qmmMinBlocks blocks, so that
// narrow products fill the GPU too; warps per block (8, 4, 2, 1) splitting K into whole
// groups, each warp at least qmmWarpK of it. N and K stay far below the grid's and the
// 32-bit offsets' limits.
const (
	qmmMaxRows   = 16
	qmmMinBlocks = 256
	qmmWarpK     = 256
	qmmMaxN      = 1 << 24
	qmmMaxK      = 1 << 24
)

// NewSmallMQuantMatmul returns the kernel on a GPU with custom CUDA or Metal kernels when
// k.QMMKernel asks for it (Auto and On alike: on the H200 it made the verify of a 4-bit
// Qwen3-4B 2.2x faster than MLX's kernels, docs/gpu.md), nil otherwise. MLX thread only.
func NewSmallMQuantMatmul(k settings.Kernels) *SmallMQuantMatmul {
	if k.QMMKernel == settings.Off || !mlxc.CurrentDevice().GPU || !k.Allowed(kernels.QuantMatmulSmallM.Name) {
		return nil
	}
	var be mlxc.KernelBackend
	var src kernels.Source
	switch {
	case mlxc.CUDAKernelsAvailable():
		be, src = mlxc.KernelCUDA, kernels.QuantMatmulSmallM.CUDA
	case mlxc.MetalKernelsAvailable():
		be, src = mlxc.KernelMetal, kernels.QuantMatmulSmallM.Metal
	default:
		return nil
	}
	c := kernels.QuantMatmulSmallM.Contract
	return &SmallMQuantMatmul{k: mlxc.NewKernel(mlxc.KernelSpec{Backend: be, Name: kernels.QuantMatmulSmallM.Name,
		Inputs: c.Inputs, Outputs: c.Outputs, Source: src.Body, Header: src.Header, EnsureRowContiguous: true})}
}

// Fits reports whether the kernel serves x [..., K] times q [N, K]ᵀ (false for a nil op):
// affine mode with biases, 4 or 8 bits, groups of 32, 64 or 128 (K a multiple of the
// group, so of the kernel's 32-wide chunks), 1..16 rows in x (x.Size()/K), x bfloat16 or
// float16 and the scales and biases of the same type, N and K within the kernel's limits.
func (o *SmallMQuantMatmul) Fits(x *mlxc.Array, q mlxc.Quantized) bool {
	if o == nil || x == nil || q.W == nil || q.Scales == nil || q.Biases == nil || x.Ndim() < 1 || q.W.Ndim() != 2 {
		return false
	}
	if q.Mode != "" && q.Mode != "affine" || q.Bits != 4 && q.Bits != 8 {
		return false
	}
	gs := q.GroupSize
	if gs != 32 && gs != 64 && gs != 128 {
		return false
	}
	K, N := x.Dim(-1), q.W.Dim(0)
	if K < gs || K%gs != 0 || K > qmmMaxK || N < 1 || N > qmmMaxN || q.W.Dim(1) != K*q.Bits/32 {
		return false
	}
	for _, a := range []*mlxc.Array{q.Scales, q.Biases} {
		if a.Ndim() != 2 || a.Dim(0) != N || a.Dim(1) != K/gs {
			return false
		}
	}
	dt := x.Dtype()
	rows := x.Size() / K
	return rows >= 1 && rows <= qmmMaxRows && (dt == mlxc.BFloat16 || dt == mlxc.Float16) &&
		q.Scales.Dtype() == dt && q.Biases.Dtype() == dt
}

// Apply returns x·dequant(q)ᵀ with x's leading shape and last dimension N, in x's type:
// through the kernel where it fits, else mlxc.QuantizedMatmul.
func (o *SmallMQuantMatmul) Apply(x *mlxc.Array, q mlxc.Quantized) *mlxc.Array {
	if !o.Fits(x, q) {
		return mlxc.QuantizedMatmul(x, q, true)
	}
	return o.apply(x, q)
}

// apply is Apply for operands Fits accepts.
func (o *SmallMQuantMatmul) apply(x *mlxc.Array, q mlxc.Quantized) *mlxc.Array {
	K, N, nd := x.Dim(-1), q.W.Dim(0), x.Ndim()
	tiles, warps := qmmLayout(N, K, q.GroupSize)
	blocks := (N + 8*tiles - 1) / (8 * tiles)
	dt := x.Dtype()
	return o.k.Call([]*mlxc.Array{x, q.W, q.Scales, q.Biases}, mlxc.KernelCall{
		OutputShapes: [][]int{append(x.Shape()[:nd-1:nd-1], N)},
		OutputDtypes: []mlxc.Dtype{dt},
		Grid:         [3]int{blocks * warps * 32, 1, 1},
		ThreadGroup:  [3]int{warps * 32, 1, 1},
		Template: o.templates.get(qmmKey{dt, q.Bits, q.GroupSize, tiles, warps}, func() []mlxc.TemplateArg {
			return qmmTemplate(dt, q.Bits, q.GroupSize, tiles, warps)
		}),
	})[0]
}

// qmmLayout is the launch for an [N, K] weight in groups of gs: tiles of 8 columns per warp
// and warps per block.
func qmmLayout(N, K, gs int) (tiles, warps int) {
	tiles, warps = 1, 1
	for _, t := range []int{4, 2} {
		if (N+8*t-1)/(8*t) >= qmmMinBlocks {
			tiles = t
			break
		}
	}
	for _, w := range []int{8, 4, 2} {
		if w <= K/gs && w*qmmWarpK <= K {
			warps = w
			break
		}
	}
	return tiles, warps
}

// qmmTemplate is the kernel's compile-time arguments (the offline compile check uses it too).
func qmmTemplate(dt mlxc.Dtype, bits, gs, tiles, warps int) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "BITS", Value: bits}, {Name: "GS", Value: gs},
		{Name: "NT", Value: tiles}, {Name: "WARPS", Value: warps}}
}

// Free releases the kernel.
func (o *SmallMQuantMatmul) Free() {
	if o != nil {
		o.k.Free()
	}
}

// qmmWanted reports whether k asks for the kernel (unless turned off):
// NewSmallMQuantMatmul's choice before its fit to the device.
func qmmWanted(k settings.Kernels) bool {
	return k.QMMKernel != settings.Off
}
