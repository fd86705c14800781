package mlxc

/*
#include "mlxc.h"
*/
import "C"

// Quantized holds an affine-quantized matrix as MLX stores it: packed uint32 weights
// [N, K·bits/32], and scales and biases [N, K/groupSize].
type Quantized struct {
	W, Scales, Biases *Array
	GroupSize, Bits   int
	Mode              string // "affine" (default), "mxfp4", "mxfp8", "nvfp4"
}

// Free releases the packed weights, scales and biases (safe on nil and twice).
func (q *Quantized) Free() {
	if q != nil {
		q.W.Free()
		q.Scales.Free()
		q.Biases.Free()
	}
}

// Quantize quantizes w along its last axis.
func Quantize(w *Array, groupSize, bits int, mode string) Quantized {
	var wq, sc, bi C.mlxc_array
	m, free := cstr(mode)
	defer free()
	check("quantize", C.mlxc_quantize(&wq, &sc, &bi, w.handle("quantize"), C.int(groupSize), C.int(bits), m, curStream.c))
	q := Quantized{W: newArray(wq), Scales: newArray(sc), GroupSize: groupSize, Bits: bits, Mode: mode}
	if bi != nil {
		q.Biases = newArray(bi)
	}
	return q
}

// Dequantize rebuilds the dense matrix; outDtype < 0 keeps MLX's default (the scales' type).
func Dequantize(q Quantized, outDtype Dtype) *Array {
	var h C.mlxc_array
	m, free := cstr(q.Mode)
	defer free()
	check("dequantize", C.mlxc_dequantize(&h, q.W.handle("dequantize"), q.Scales.handle("dequantize"), optHandle("dequantize", q.Biases), C.int(q.GroupSize), C.int(q.Bits), m, C.int(outDtype), curStream.c))
	return newArray(h)
}

// QuantizedMatmul computes x @ dequant(w)ᵀ (transpose=true) without materialising w.
func QuantizedMatmul(x *Array, q Quantized, transpose bool) *Array {
	if transpose && hopperQMMSingleGroup(x, q) {
		return singleGroupRows(x, q)
	}
	return quantizedMatmul(x, q, transpose)
}

func quantizedMatmul(x *Array, q Quantized, transpose bool) *Array {
	var h C.mlxc_array
	m, free := cstr(q.Mode)
	defer free()
	check("quantized_matmul", C.mlxc_quantized_matmul(&h, x.handle("quantized_matmul"), q.W.handle("quantized_matmul"), q.Scales.handle("quantized_matmul"), optHandle("quantized_matmul", q.Biases), C.bool(transpose), C.int(q.GroupSize), C.int(q.Bits), m, curStream.c))
	return newArray(h)
}

// GatherQMM is a quantized matmul that picks matrices per row (mixture-of-experts).
func GatherQMM(x *Array, q Quantized, lhsIdx, rhsIdx *Array, transpose, sorted bool) *Array {
	var h C.mlxc_array
	m, free := cstr(q.Mode)
	defer free()
	check("gather_qmm", C.mlxc_gather_qmm(&h, x.handle("gather_qmm"), q.W.handle("gather_qmm"), q.Scales.handle("gather_qmm"), optHandle("gather_qmm", q.Biases), optHandle("gather_qmm", lhsIdx), optHandle("gather_qmm", rhsIdx), C.bool(transpose), C.int(q.GroupSize), C.int(q.Bits), m, C.bool(sorted), curStream.c))
	return newArray(h)
}

// GatherMM is a matmul that picks matrices per row.
func GatherMM(a, b, lhsIdx, rhsIdx *Array, sorted bool) *Array {
	var h C.mlxc_array
	check("gather_mm", C.mlxc_gather_mm(&h, a.handle("gather_mm"), b.handle("gather_mm"), optHandle("gather_mm", lhsIdx), optHandle("gather_mm", rhsIdx), C.bool(sorted), curStream.c))
	return newArray(h)
}

// singleGroupRows computes a product hopperQMMSingleGroup picks without the Hopper GEMM: one row at a time through
// qmv (the product a one-row decode step makes, so a verify block rounds exactly like decode;
// dequantizing to bf16 first rounded every weight and flipped greedy tokens of the 4-bit
// equality test), or, past 64 rows, through float32 dequantized weights. Only models this
// narrow (hidden size ≤ group size: test models) get here, so launches do not matter.
func singleGroupRows(x *Array, q Quantized) *Array {
	if x.Size()/x.Dim(-1) <= 64 {
		return QuantizedMatmulRows(x, q)
	}
	k := x.Dim(-1)
	flat := Reshape(x, x.Size()/k, k)
	y := Matmul(AsType(flat, Float32), SwapAxes(Dequantize(q, Float32), -1, -2))
	return Reshape(AsType(y, x.Dtype()), append(x.Shape()[:x.Ndim()-1:x.Ndim()-1], q.W.Dim(0))...)
}

// QuantizedMatmulRows is QuantizedMatmul (transposed) one row at a time: each row through
// the one-row kernel (qmv on CUDA), exactly the product a one-token decode step makes. MLX
// sends blocks of rows to other kernels, which round differently on a GPU; GPU-exact mode
// (model.GPUExactDefault) uses this for verify blocks of quantized models. A node per row:
// for blocks of a few rows.
func QuantizedMatmulRows(x *Array, q Quantized) *Array {
	k := x.Dim(-1)
	rows := x.Size() / k
	shape := append(x.Shape()[:x.Ndim()-1:x.Ndim()-1], q.W.Dim(0))
	flat := Reshape(x, rows, k)
	parts := make([]*Array, rows)
	for i := range parts {
		parts[i] = quantizedMatmul(Slice(flat, []int{i, 0}, []int{i + 1, k}), q, true)
	}
	return Reshape(Concatenate(parts, 0), shape...)
}

// hopperQMMSingleGroup reports the products that MLX's CUDA backend sends to its Hopper
// quantized GEMM on a compute-capability-9 GPU: affine, transposed, more than one row, K a
// multiple of 64 within a single group (MLX's own test for that kernel; the capability is
// not asked here, other GPUs take the same detour). On the H200 (MLX 0.32.4) it returned
// zeros for such rows while one row (qmv) was right (see docs/perf/quantized-products.md);
// QuantizedMatmul routes these through singleGroupRows.
// TestQuantizedMatmulRows covers both sides of the test on a GPU.
func hopperQMMSingleGroup(x *Array, q Quantized) bool {
	if !curDevice.GPU || Backend() != "cuda" || (q.Mode != "" && q.Mode != "affine") || q.Biases == nil || x.Ndim() < 1 {
		return false
	}
	k := x.Dim(-1)
	return k%64 == 0 && q.GroupSize >= k && x.Size()/k >= 2
}
