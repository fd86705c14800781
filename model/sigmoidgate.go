package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// SigmoidGating holds a Qwen3.5 layer's sigmoid gates fused with MLX's compile (shapeless,
// one trace serves every shape): an attention output's x·sigmoid(g), one kernel for two,
// and a MoE block's shared expert joined to the routed experts' output, y + sigmoid(g)·s,
// one for three. On a GPU each graph node costs the host a few microseconds whatever its
// size (docs/perf/hybrid.md). The op sequences inside are mlx-lm's and compiled
// element-wise code rounds where the ops do, so the values are the ops' bit for bit
// (TestSigmoidGatingMatchesOps). A nil *SigmoidGating runs the ops.
type SigmoidGating struct {
	gate, join *mlxc.Compiled
}

// NewSigmoidGating compiles the gates; call on the MLX thread.
func NewSigmoidGating() *SigmoidGating {
	return &SigmoidGating{
		gate: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			return []*mlxc.Array{gateOps(in[0], in[1])}
		}, true),
		join: mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
			return []*mlxc.Array{joinOps(in[0], in[1], in[2])}
		}, true),
	}
}

func gateOps(x, g *mlxc.Array) *mlxc.Array { return mlxc.Multiply(x, mlxc.Sigmoid(g)) }

func joinOps(y, g, s *mlxc.Array) *mlxc.Array {
	return mlxc.Add(y, mlxc.Multiply(mlxc.Sigmoid(g), s))
}

// Gate returns x·sigmoid(g) (g broadcast against x).
func (s *SigmoidGating) Gate(x, g *mlxc.Array) *mlxc.Array {
	if s == nil {
		return gateOps(x, g)
	}
	return s.gate.Call(x, g)[0]
}

// Join returns y + sigmoid(g)·sh: the routed experts' output y with the shared expert's sh
// under its gate g (broadcast against sh).
func (s *SigmoidGating) Join(y, g, sh *mlxc.Array) *mlxc.Array {
	if s == nil {
		return joinOps(y, g, sh)
	}
	return s.join.Call(y, g, sh)[0]
}

// Free releases the compiled functions.
func (s *SigmoidGating) Free() {
	if s != nil {
		s.gate.Free()
		s.join.Free()
	}
}
