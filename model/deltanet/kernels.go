package deltanet

import (
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Kernels runs the recurrence and the tape replay as one GPU launch each (CUDA, or the
// Metal twins) instead of the ops path's loop of about ten MLX ops per step: one warp
// (SIMD group) per state row keeps the row in registers over all the steps. Where a
// kernel does not fit (see RecurrenceFits, ReplayFits), and for a nil Kernels (off a GPU,
// or with DFLASH_DELTANET_KERNEL=0), the methods run the package's ops functions, the same
// contract.
//
// The state's element steps round where the ops round, so the replay gives the ops path's
// state bit for bit, and a replayed state is the recurrence kernel's own state for the same
// tape. The recurrence's two row sums over Dk (S·k and S·q) run in the kernels' fixed
// order, not MLX's: its y, state and δ agree with the ops path to float32 rounding of
// those sums, not in every bit.
type Kernels struct {
	backend      mlxc.KernelBackend
	tape, replay *mlxc.Kernel
	none         *mlxc.Array // the count a replay of all its steps passes (unread)
}

// The kernels' limits: a lane holds Dk/32 ≤ 8 state columns in registers (the sources'
// DFLASH_GD_MAXNK), and B·Hv and ⌈Dv/4⌉ are grid dimensions in blocks (CUDA allows
// 65 535 in y and z).
const (
	kernelMaxKeyDim   = 32 * 8
	kernelMaxValueDim = 4 * 65535
	kernelMaxRows     = 65535
)

// NewKernels makes the kernels on a GPU with custom CUDA or Metal kernels when
// k.DeltaNetKernel asks for them; nil otherwise (the ops path).
func NewKernels(k settings.Kernels) *Kernels {
	if !k.DeltaNetKernel || !mlxc.CurrentDevice().GPU || !k.Allowed(kernels.GatedDeltaTape.Name) || !k.Allowed(kernels.GatedDeltaReplay.Name) {
		return nil
	}
	var be mlxc.KernelBackend
	src := func(x kernels.Kernel) kernels.Source { return x.CUDA }
	switch {
	case mlxc.CUDAKernelsAvailable():
		be = mlxc.KernelCUDA
	case mlxc.MetalKernelsAvailable():
		be = mlxc.KernelMetal
		src = func(x kernels.Kernel) kernels.Source { return x.Metal }
	default:
		return nil
	}
	mk := func(x kernels.Kernel) *mlxc.Kernel {
		s := src(x)
		return mlxc.NewKernel(mlxc.KernelSpec{Backend: be, Name: x.Name, Inputs: x.Contract.Inputs, Outputs: x.Contract.Outputs,
			Source: s.Body, Header: s.Header, EnsureRowContiguous: true})
	}
	none := mlxc.FromSlice([]int32{0}, 1)
	mlxc.Eval(none)
	return &Kernels{
		backend: be,
		tape:    mk(kernels.GatedDeltaTape),
		replay:  mk(kernels.GatedDeltaReplay),
		none:    none.Detach(),
	}
}

// Free releases the kernels.
func (kn *Kernels) Free() {
	if kn == nil {
		return
	}
	kn.tape.Free()
	kn.replay.Free()
	kn.none.Free()
}

// Backend is the kernels' backend (0 for nil).
func (kn *Kernels) Backend() mlxc.KernelBackend {
	if kn == nil {
		return 0
	}
	return kn.backend
}

// kernelType reports whether the kernels take elements of dt: their InT and KT.
func kernelType(dt mlxc.Dtype) bool {
	return dt == mlxc.BFloat16 || dt == mlxc.Float16 || dt == mlxc.Float32
}

// rowsFit reports whether the kernels' layout serves a state [B, Hv, Dv, Dk].
func rowsFit(B, Hv, Dv, Dk int) bool {
	return Dk >= 32 && Dk%32 == 0 && Dk <= kernelMaxKeyDim && Dv >= 1 && Dv <= kernelMaxValueDim &&
		B >= 1 && B*Hv >= 1 && B*Hv <= kernelMaxRows
}

// recurrenceFits is RecurrenceFits for operands dims has checked.
func (kn *Kernels) recurrenceFits(q, k, v, g, beta, state *mlxc.Array, B, T, Hv, Dv, Dk int) bool {
	dt := q.Dtype()
	return kn != nil && T >= 1 && rowsFit(B, Hv, Dv, Dk) && kernelType(dt) &&
		k.Dtype() == dt && v.Dtype() == dt && beta.Dtype() == dt &&
		g.Dtype() == mlxc.Float32 && state.Dtype() == mlxc.Float32
}

// RecurrenceFits reports whether the recurrence kernel takes these operands (false for a
// nil kn or operands Recurrence would refuse): q, k, v and beta of one type, bfloat16,
// float16 or float32; g and the state float32; T ≥ 1; Dk a multiple of 32 up to 256;
// Dv ≤ 262 140; B·Hv ≤ 65 535.
func (kn *Kernels) RecurrenceFits(q, k, v, g, beta, state *mlxc.Array) bool {
	if kn == nil {
		return false
	}
	fits := false
	if err := mlxc.Catch(func() {
		B, T, _, Dk, Hv, Dv := dims("deltanet.recurrence", q, k, v, g, beta, state)
		fits = kn.recurrenceFits(q, k, v, g, beta, state, B, T, Hv, Dv, Dk)
	}); err != nil {
		return false
	}
	return fits
}

// Recurrence is the package's Recurrence, through the kernel where it fits.
func (kn *Kernels) Recurrence(q, k, v, g, beta, state *mlxc.Array) (y, stateOut *mlxc.Array) {
	y, stateOut, _ = kn.recurrence(q, k, v, g, beta, state, false)
	return y, stateOut
}

// RecurrenceTape is the package's RecurrenceTape, through the kernel where it fits.
func (kn *Kernels) RecurrenceTape(q, k, v, g, beta, state *mlxc.Array) (y, stateOut *mlxc.Array, tape Tape) {
	return kn.recurrence(q, k, v, g, beta, state, true)
}

func (kn *Kernels) recurrence(q, k, v, g, beta, state *mlxc.Array, record bool) (y, stateOut *mlxc.Array, tape Tape) {
	const op = "deltanet.recurrence"
	if kn == nil {
		return recurrence(op, q, k, v, g, beta, state, record)
	}
	B, T, _, Dk, Hv, Dv := dims(op, q, k, v, g, beta, state)
	if !kn.recurrenceFits(q, k, v, g, beta, state, B, T, Hv, Dv, Dk) {
		return recurrence(op, q, k, v, g, beta, state, record)
	}
	tapeShape := []int{1} // unwritten without TAPE
	if record {
		tapeShape = []int{B, T, Hv, Dv}
	}
	out := kn.tape.Call([]*mlxc.Array{q, k, v, g, beta, state}, mlxc.KernelCall{
		OutputShapes: [][]int{{B, T, Hv, Dv}, {B, Hv, Dv, Dk}, tapeShape},
		OutputDtypes: []mlxc.Dtype{q.Dtype(), mlxc.Float32, mlxc.Float32},
		Grid:         [3]int{32, Dv, B * Hv},
		ThreadGroup:  [3]int{32, min(4, Dv), 1},
		Template:     []mlxc.TemplateArg{{Name: "InT", Value: q.Dtype()}, {Name: "TAPE", Value: record}},
	})
	if !record {
		return out[0], out[1], Tape{} // out[2] unwritten; the scope frees it
	}
	return out[0], out[1], Tape{Delta: out[2], K: mlxc.Reshape(k, k.Shape()...), G: mlxc.Reshape(g, g.Shape()...)}
}

// ReplayFits reports whether the replay kernel takes state and tape (false for a nil kn or
// a tape that does not fit the state): the state, δ and g float32, the keys bfloat16,
// float16 or float32, at least one step, and the recurrence kernel's limits on the state.
func (kn *Kernels) ReplayFits(state *mlxc.Array, tape Tape) bool {
	if kn == nil {
		return false
	}
	fits := false
	if err := mlxc.Catch(func() {
		checkTape("deltanet.replay", state, tape)
		fits = kn.replayFits(state, tape)
	}); err != nil {
		return false
	}
	return fits
}

// replayFits is ReplayFits for a tape checkTape has checked.
func (kn *Kernels) replayFits(state *mlxc.Array, tape Tape) bool {
	s := state.Shape()
	return kn != nil && tape.Steps() >= 1 && rowsFit(s[0], s[1], s[2], s[3]) && state.Dtype() == mlxc.Float32 &&
		tape.Delta.Dtype() == mlxc.Float32 && tape.G.Dtype() == mlxc.Float32 && kernelType(tape.K.Dtype())
}

// Replay is the package's Replay, through the kernel where it fits: a tape of more than n
// steps is cut to n (a view for B = 1), so the launch runs all of its steps.
func (kn *Kernels) Replay(state *mlxc.Array, tape Tape, n int) *mlxc.Array {
	if kn == nil {
		return Replay(state, tape, n)
	}
	checkTape("deltanet.replay", state, tape)
	if n <= 0 || n > tape.Steps() || !kn.replayFits(state, tape) {
		return Replay(state, tape, n) // n = 0, or out of range: Replay's answer or error
	}
	if n < tape.Steps() {
		tape = Tape{Delta: mlxc.SliceAxis(tape.Delta, 1, 0, n), K: mlxc.SliceAxis(tape.K, 1, 0, n), G: mlxc.SliceAxis(tape.G, 1, 0, n)}
	}
	return kn.replayCall(state, tape, kn.none, false)
}

// ReplayAt is the package's ReplayAt, through the kernel where it fits: the launch reads
// the count (one for all rows, or one per row) on the device (no host sync) and stops
// there.
func (kn *Kernels) ReplayAt(state *mlxc.Array, tape Tape, count *mlxc.Array) *mlxc.Array {
	if kn == nil {
		return ReplayAt(state, tape, count)
	}
	checkTape("deltanet.replay_at", state, tape)
	cnt := replayCounts("deltanet.replay_at", state, count)
	if !kn.replayFits(state, tape) {
		return ReplayAt(state, tape, count)
	}
	return kn.replayCall(state, tape, mlxc.Reshape(cnt, -1), true)
}

func (kn *Kernels) replayCall(state *mlxc.Array, tape Tape, count *mlxc.Array, counted bool) *mlxc.Array {
	s := state.Shape()
	B, Hv, Dv, Dk := s[0], s[1], s[2], s[3]
	out := kn.replay.Call([]*mlxc.Array{tape.Delta, tape.K, tape.G, state, count}, mlxc.KernelCall{
		OutputShapes: [][]int{{B, Hv, Dv, Dk}},
		OutputDtypes: []mlxc.Dtype{mlxc.Float32},
		Grid:         [3]int{32, Dv, B * Hv},
		ThreadGroup:  [3]int{32, min(4, Dv), 1},
		Template:     []mlxc.TemplateArg{{Name: "KT", Value: tape.K.Dtype()}, {Name: "COUNTED", Value: counted}},
	})
	return out[0]
}
