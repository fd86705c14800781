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
)
