package kernels

import _ "embed" // the Metal sources below

// The Metal twins of some CUDA kernels: the same inputs, outputs, template arguments,
// launch shape and rounding points, in fast::metal_kernel's conventions (MLX.md §3.4).
var (
	// metalGatedDelta is cuda/gated_delta.cuh's twin: the state steps and the SIMD group's
	// fixed-order row sum.
	//go:embed metal/gated_delta.h
	metalGatedDelta string
	//go:embed metal/gated_delta_tape.metal
	metalGatedDeltaTape string
	//go:embed metal/gated_delta_replay.metal
	metalGatedDeltaReplay string
	//go:embed metal/split_keys.metal
	metalSplitKeys string
	//go:embed metal/split_keys_merge.metal
	metalSplitKeysMerge string
	// metalFewQueryAttention is FewQueryAttention's twin (fqa_loop_decls.cuh, fqa_head.cuh
	// and fqa_loop.cuh over strided k and v rows); PrepAttention has none.
	//go:embed metal/few_query_attention.metal
	metalFewQueryAttention string
	// metalRowArgmaxOrder is cuda/row_argmax.cu's first-maximum order and its SIMD group
	// merge, for metalRowArgmax.
	//go:embed metal/row_argmax.h
	metalRowArgmaxOrder string
	//go:embed metal/row_argmax.metal
	metalRowArgmax string
	//go:embed metal/row_lead.metal
	metalRowLead string
)
