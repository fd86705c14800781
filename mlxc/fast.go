package mlxc

/*
#include "mlxc.h"
*/
import "C"

// RMSNorm is MLX's fused rms_norm; weight may be nil.
func RMSNorm(x, weight *Array, eps float32) *Array {
	var h C.mlxc_array
	check("rms_norm", C.mlxc_rms_norm(&h, x.handle("rms_norm"), optHandle("rms_norm", weight), C.float(eps), curStream.c))
	return newArray(h)
}

// LayerNorm with optional weight and bias.
func LayerNorm(x, weight, bias *Array, eps float32) *Array {
	var h C.mlxc_array
	check("layer_norm", C.mlxc_layer_norm(&h, x.handle("layer_norm"), optHandle("layer_norm", weight), optHandle("layer_norm", bias), C.float(eps), curStream.c))
	return newArray(h)
}

// RoPE rotates the first dims features of x ([..., L, D]); positions start at offset.
// freqs ([dims/2]) replaces base when not nil: pair i turns by pos/freqs[i], so freqs are
// the reciprocals of the inverse frequencies (base^(2i/dims) reproduces the base schedule).
func RoPE(x *Array, dims int, traditional bool, base, scale float32, offset int, freqs *Array) *Array {
	var h C.mlxc_array
	check("rope", C.mlxc_rope(&h, x.handle("rope"), C.int(dims), C.bool(traditional), C.float(base), C.float(scale), C.int(offset), nil, optHandle("rope", freqs), curStream.c))
	return newArray(h)
}

// RoPEDynamic is RoPE with the offset as an integer array on the device (scalar, or one
// per batch row), so the offset need not be known on the host.
func RoPEDynamic(x *Array, dims int, traditional bool, base, scale float32, offset, freqs *Array) *Array {
	var h C.mlxc_array
	check("rope", C.mlxc_rope(&h, x.handle("rope"), C.int(dims), C.bool(traditional), C.float(base), C.float(scale), 0, offset.handle("rope"), optHandle("rope", freqs), curStream.c))
	return newArray(h)
}

// Attention mask modes for ScaledDotProductAttention.
const (
	MaskNone   = ""
	MaskCausal = "causal" // bottom-right aligned: query i sees key j when j ≤ i + (Lk − Lq)
	MaskArray  = "array"
)

// ScaledDotProductAttention is MLX's fused SDPA over [B, H, L, D] inputs (GQA allowed).
// mask is used only with MaskArray (bool: true = keep, or additive); sinks may be nil.
func ScaledDotProductAttention(q, k, v *Array, scale float32, maskMode string, mask, sinks *Array) *Array {
	var h C.mlxc_array
	m, free := cstr(maskMode)
	defer free()
	check("sdpa", C.mlxc_sdpa(&h, q.handle("sdpa"), k.handle("sdpa"), v.handle("sdpa"), C.float(scale), m, optHandle("sdpa", mask), optHandle("sdpa", sinks), curStream.c))
	return newArray(h)
}
