package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// SwiGLU is silu(gate)·up fused into one kernel with MLX's compile (shapeless, so one trace
// serves every shape). It saves two kernel launches per layer on the GPU, where each
// launch costs host time. The op sequence inside equals mlx-lm's (x·sigmoid(x), then ×up),
// and compiled element-wise code rounds at the same points, so results are unchanged.
type SwiGLU struct {
	fn *mlxc.Compiled
}

// NewSwiGLU compiles the activation; call on the MLX thread.
func NewSwiGLU() *SwiGLU {
	return &SwiGLU{fn: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
		return []*mlxc.Array{mlxc.Multiply(mlxc.SiLU(in[0]), in[1])}
	}, true)}
}

// Apply returns silu(gate)·up.
func (s *SwiGLU) Apply(gate, up *mlxc.Array) *mlxc.Array {
	if s == nil || s.fn == nil {
		return mlxc.Multiply(mlxc.SiLU(gate), up)
	}
	return s.fn.Call(gate, up)[0]
}

// Free releases the compiled function.
func (s *SwiGLU) Free() {
	if s != nil {
		s.fn.Free()
	}
}
