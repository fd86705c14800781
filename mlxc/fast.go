package mlxc

/*
#include "mlxc.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
)

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
	if q.Ndim() == 4 && q.Dim(2) > 1 {
		attentionShapes.see(q, k, mask, maskMode)
	}
	var h C.mlxc_array
	m, free := cstr(maskMode)
	defer free()
	check("sdpa", C.mlxc_sdpa(&h, q.handle("sdpa"), k.handle("sdpa"), v.handle("sdpa"), C.float(scale), m, optHandle("sdpa", mask), optHandle("sdpa", sinks), curStream.c))
	return newArray(h)
}

// AttentionShapes counts the multi-query attention calls (ScaledDotProductAttention with
// more than one query row) of a shape this process had not attended before: the query's,
// key's and mask's shapes and the mask mode. MLX's CUDA backend builds a cuDNN plan the
// first time it meets each such shape (it keys its plans by the strides too, so this
// is a lower bound there), which costs milliseconds; a loop whose attention shapes change
// every step pays one each step. The shapes seen are forgotten every 65 536 of them.
func AttentionShapes() int64 { return attentionShapes.fresh.Load() }

var attentionShapes shapeSet

// shapeSet is the attention shapes seen (see AttentionShapes).
type shapeSet struct {
	mu    sync.Mutex
	seen  map[attentionShape]struct{}
	fresh atomic.Int64
}

type attentionShape struct {
	q, k, m [4]int
	mode    string
}

func (s *shapeSet) see(q, k, mask *Array, mode string) {
	var key attentionShape
	key.mode = mode
	copy(key.q[:], q.dims())
	copy(key.k[:], k.dims())
	if mask != nil {
		copy(key.m[:], mask.dims())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[key]; ok {
		return
	}
	if s.seen == nil || len(s.seen) >= 1<<16 {
		s.seen = map[attentionShape]struct{}{}
	}
	s.seen[key] = struct{}{}
	s.fresh.Add(1)
}
