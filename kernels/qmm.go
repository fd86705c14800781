package kernels

import _ "embed" // the small-M quantized product's sources

// The small-M quantized product: y = x·dequant(w)ᵀ for 1..16 rows of x over an MLX
// affine-quantized weight (4 or 8 bits, groups of 32, 64 or 128), each weight read once
// per launch and used for every row through the GPU's matrix units; the layout and the
// rounding points are in the sources' top comments.
var (
	//go:embed cuda/qmm_small_m.cu
	qmmSmallM string
	//go:embed metal/qmm_small_m.metal
	metalQmmSmallM string
)

// QuantMatmulSmallM is the small-M quantized product (x, w, scales, biases → y), with
// template arguments T (x's, the scales' and y's type), BITS, GS, NT (tiles of 8 columns
// per warp) and WARPS (warps per block, splitting K).
var QuantMatmulSmallM = Kernel{Name: "dflash_qmm_small_m", CUDA: Source{Body: qmmSmallM},
	Metal:    Source{Body: metalQmmSmallM},
	Contract: Contract{Inputs: []string{"x", "w", "scales", "biases"}, Outputs: []string{"y"}, Template: []string{"T", "BITS", "GS", "NT", "WARPS"}}}
