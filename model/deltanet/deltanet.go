// Package deltanet is the numerical core of a GatedDeltaNet (linear attention) layer in
// plain MLX ops, and its recurrent per-layer cache. The ops follow mlx-lm's ops path
// (gated_delta_ops and qwen3_5.GatedDeltaNet) step for step, so on the CPU the results are
// bit-identical to it; later kernels are tested against these functions.
//
// Shapes: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g float32 [B, T, Hv]; beta [B, T, Hv];
// state float32 [B, Hv, Dv, Dk]. Hv = r·Hk and value head h reads key head h/r.
package deltanet

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// fail reports a shape or argument error the way model code does: a panic with *mlxc.Error,
// which mlxc.Do and mlxc.Catch turn into an ordinary error.
func fail(op, format string, args ...any) {
	panic(&mlxc.Error{Op: op, Msg: fmt.Sprintf(format, args...)})
}

// Gates returns the decay g = exp(−exp(A_log)·softplus(a + dt_bias)) and the write
// strength beta = sigmoid(b). The add and softplus stay in the dtype of a and dt_bias, the
// rest is float32 (A_log is cast first), so g is float32; beta keeps b's dtype.
func Gates(a, b, aLog, dtBias *mlxc.Array) (g, beta *mlxc.Array) {
	beta = mlxc.Sigmoid(b)
	decay := mlxc.Negative(mlxc.Exp(mlxc.AsType(aLog, mlxc.Float32)))
	g = mlxc.Exp(mlxc.Multiply(decay, mlxc.Softplus(mlxc.Add(a, dtBias))))
	return g, beta
}

// dims checks the recurrence's operands and returns their sizes.
func dims(op string, q, k, v, g, beta, state *mlxc.Array) (B, T, Hk, Dk, Hv, Dv int) {
	qs, ks, vs := q.Shape(), k.Shape(), v.Shape()
	if len(qs) != 4 || len(ks) != 4 || len(vs) != 4 {
		fail(op, "q, k, v must be 4-D, got %v, %v, %v", qs, ks, vs)
	}
	B, T, Hk, Dk = qs[0], qs[1], qs[2], qs[3]
	Hv, Dv = vs[2], vs[3]
	if ks[0] != B || ks[1] != T || ks[2] != Hk || ks[3] != Dk {
		fail(op, "k is %v, q is %v", ks, qs)
	}
	if vs[0] != B || vs[1] != T || Hk == 0 || Hv%Hk != 0 {
		fail(op, "v %v does not fit q %v (value heads must be a multiple of key heads)", vs, qs)
	}
	if gs := g.Shape(); len(gs) != 3 || gs[0] != B || gs[1] != T || gs[2] != Hv {
		fail(op, "g must be [%d %d %d], got %v", B, T, Hv, gs)
	}
	if bs := beta.Shape(); len(bs) != 3 || bs[0] != B || bs[1] != T || bs[2] != Hv {
		fail(op, "beta must be [%d %d %d], got %v", B, T, Hv, bs)
	}
	if ss := state.Shape(); len(ss) != 4 || ss[0] != B || ss[1] != Hv || ss[2] != Dv || ss[3] != Dk {
		fail(op, "state must be [%d %d %d %d], got %v", B, Hv, Dv, Dk, ss)
	}
	return
}

// repeatHeads repeats each head of x [B, T, H, D] r times in place (h0 h0 h1 h1 …), as
// mx.repeat along the head axis does: value heads h·r … h·r+r−1 share key head h.
func repeatHeads(x *mlxc.Array, r int) *mlxc.Array {
	if r == 1 {
		return x
	}
	s := x.Shape()
	e := mlxc.BroadcastTo(mlxc.ExpandDims(x, 3), s[0], s[1], s[2], r, s[3])
	return mlxc.Reshape(e, s[0], s[1], s[2]*r, s[3])
}

// step returns row t of x [B, T, …] without the time axis.
func step(x *mlxc.Array, t int) *mlxc.Array { return mlxc.Squeeze(mlxc.SliceAxis(x, 1, t, t+1), 1) }

// Recurrence runs the delta rule over T steps from state: per step and value head,
// S ← g·S; δ = β·(v − S·k); S ← S + δ⊗k; y = S·q, every product and sum in float32 and y
// cast to q's dtype. It returns y [B, T, Hv, Dv] and the final state.
func Recurrence(q, k, v, g, beta, state *mlxc.Array) (y, stateOut *mlxc.Array) {
	y, stateOut, _ = recurrence("deltanet.recurrence", q, k, v, g, beta, state, false)
	return y, stateOut
}

// Tape is what a tentative forward records so that its state can be rebuilt for any
// number of accepted steps without q, v or beta: per step the innovation δ float32
// [B, T, Hv, Dv], the keys k [B, T, Hk, Dk] as the recurrence used them (normalised, not
// head-repeated) and the decay g float32 [B, T, Hv].
type Tape struct{ Delta, K, G *mlxc.Array }

// Steps is the number of steps the tape holds (0 for an empty tape).
func (t Tape) Steps() int {
	if t.G == nil {
		return 0
	}
	return t.G.Dim(1)
}

// Free releases the tape's arrays.
func (t Tape) Free() {
	t.Delta.Free()
	t.K.Free()
	t.G.Free()
}

// RecurrenceTape is Recurrence that also returns the tape; y and the state are the same
// bits, since δ is the very array the state update uses.
func RecurrenceTape(q, k, v, g, beta, state *mlxc.Array) (y, stateOut *mlxc.Array, tape Tape) {
	return recurrence("deltanet.recurrence", q, k, v, g, beta, state, true)
}

func recurrence(op string, q, k, v, g, beta, state *mlxc.Array, record bool) (y, stateOut *mlxc.Array, tape Tape) {
	_, T, Hk, _, Hv, _ := dims(op, q, k, v, g, beta, state)
	r := Hv / Hk
	qr, kr := repeatHeads(q, r), repeatHeads(k, r)
	ys := make([]*mlxc.Array, T)
	var deltas []*mlxc.Array
	if record {
		deltas = make([]*mlxc.Array, T)
	}
	s := state
	for t := 0; t < T; t++ {
		qt := mlxc.ExpandDims(step(qr, t), 2) // [B, Hv, 1, Dk]
		kt := mlxc.ExpandDims(step(kr, t), 2)
		vt := step(v, t)                        // [B, Hv, Dv]
		gt := mlxc.ExpandDims(step(g, t), 2, 3) // [B, Hv, 1, 1]
		bt := mlxc.ExpandDims(step(beta, t), 2) // [B, Hv, 1]
		s = mlxc.Multiply(s, gt)                // decay
		mem := mlxc.Sum(mlxc.Multiply(s, kt), []int{-1}, false)
		delta := mlxc.Multiply(mlxc.Subtract(vt, mem), bt) // [B, Hv, Dv] float32
		s = mlxc.Add(s, mlxc.Multiply(kt, mlxc.ExpandDims(delta, 3)))
		ys[t] = mlxc.AsType(mlxc.Sum(mlxc.Multiply(s, qt), []int{-1}, false), q.Dtype())
		if record {
			deltas[t] = delta
		}
	}
	if T == 0 {
		y = mlxc.Zeros([]int{q.Dim(0), 0, Hv, v.Dim(3)}, q.Dtype())
		s = mlxc.Reshape(state, state.Shape()...)
	} else {
		y = mlxc.Stack(ys, 1)
	}
	if record {
		if T == 0 {
			tape.Delta = mlxc.Zeros([]int{q.Dim(0), 0, Hv, v.Dim(3)}, mlxc.Float32)
		} else {
			tape.Delta = mlxc.Stack(deltas, 1)
		}
		tape.K = mlxc.Reshape(k, k.Shape()...)
		tape.G = mlxc.Reshape(g, g.Shape()...)
	}
	return y, s, tape
}

// replayStep is one step of the replay, S ← g_t·S + δ_t⊗k_t: the same two products and the
// same sum as the recurrence's decay and update, so the state has the same bits.
func replayStep(s *mlxc.Array, tape Tape, kr *mlxc.Array, t int) *mlxc.Array {
	gt := mlxc.ExpandDims(step(tape.G, t), 2, 3)
	kt := mlxc.ExpandDims(step(kr, t), 2)
	dt := mlxc.ExpandDims(step(tape.Delta, t), 3)
	return mlxc.Add(mlxc.Multiply(s, gt), mlxc.Multiply(kt, dt))
}

// checkTape checks that tape fits state [B, Hv, Dv, Dk] and returns the key-head repeat.
func checkTape(op string, state *mlxc.Array, tape Tape) int {
	ss, ds, ks, gs := state.Shape(), tape.Delta.Shape(), tape.K.Shape(), tape.G.Shape()
	if len(ss) != 4 || len(ds) != 4 || len(ks) != 4 || len(gs) != 3 ||
		ds[0] != ss[0] || ds[2] != ss[1] || ds[3] != ss[2] || ks[3] != ss[3] ||
		ks[1] != ds[1] || gs[1] != ds[1] || gs[2] != ss[1] || ks[2] == 0 || ss[1]%ks[2] != 0 {
		fail(op, "tape (δ %v, k %v, g %v) does not fit state %v", ds, ks, gs, ss)
	}
	return ss[1] / ks[2]
}

// Replay applies the first n steps of tape to state (the state before the tape's first
// step): the state the recurrence had after those n steps, bit for bit.
func Replay(state *mlxc.Array, tape Tape, n int) *mlxc.Array {
	r := checkTape("deltanet.replay", state, tape)
	if n < 0 || n > tape.Steps() {
		fail("deltanet.replay", "cannot replay %d of %d steps", n, tape.Steps())
	}
	s := mlxc.Reshape(state, state.Shape()...) // a handle of the caller's scope even for n = 0
	if n == 0 {
		return s
	}
	kr := repeatHeads(tape.K, r)
	for t := 0; t < n; t++ {
		s = replayStep(s, tape, kr, t)
	}
	return s
}

// ReplayAt is Replay with the step count on the device, so that no host sync is needed:
// count is int32 [1], one count for every row, or [B], row b's own count (a batched
// verify's accepted prefixes). Every step is computed and the ones at t ≥ a row's count
// leave its state as it was (a select, which keeps the bits of the steps taken).
func ReplayAt(state *mlxc.Array, tape Tape, count *mlxc.Array) *mlxc.Array {
	r := checkTape("deltanet.replay_at", state, tape)
	cnt := replayCounts("deltanet.replay_at", state, count)
	s := mlxc.Reshape(state, state.Shape()...)
	T := tape.Steps()
	if T == 0 {
		return s
	}
	kr := repeatHeads(tape.K, r)
	for t := 0; t < T; t++ {
		take := mlxc.Less(mlxc.ScalarInt(int64(t), mlxc.Int32), cnt)
		s = mlxc.Where(take, replayStep(s, tape, kr, t), s)
	}
	return s
}

// replayCounts checks a device count for a replay of state [B, Hv, Dv, Dk], one count or
// one per row, and shapes it int32 [1 or B, 1, 1, 1] to select the state's rows.
func replayCounts(op string, state, count *mlxc.Array) *mlxc.Array {
	n := count.Size()
	if n != 1 && n != state.Dim(0) {
		fail(op, "count must hold 1 or %d (one per row) step counts, got %v", state.Dim(0), count.Shape())
	}
	return mlxc.AsType(mlxc.Reshape(count, n, 1, 1, 1), mlxc.Int32)
}

// CausalConv is the layer's depthwise causal convolution over the raw projection rows x
// [B, T, C], continued from tail [B, K−1, C] (the last K−1 rows before x; nil is zeros in
// x's dtype as for an empty cache), with weights w [C, K, 1] (MLX layout). It returns
// silu(conv) [B, T, C] and the new tail: the last K−1 rows of concat(tail, x), raw rows
// and not convolved ones.
func CausalConv(x, tail, w *mlxc.Array) (out, newTail *mlxc.Array) {
	out, _, newTail = causalConv(x, tail, w, nil, true)
	return out, newTail
}

// causalConv is CausalConv with the activation run by f (nil: the ops) that also returns
// the conv's input rows concat(tail, x) [B, K−1+T, C], and the new tail only when
// wantTail (a forward placed at a device position never reads it: the next one starts
// from the rows).
func causalConv(x, tail, w *mlxc.Array, f *Fused, wantTail bool) (out, rows, newTail *mlxc.Array) {
	const op = "deltanet.conv"
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 3 {
		fail(op, "input must be [B, T, C], got %v", xs)
	}
	if len(ws) != 3 || ws[0] != xs[2] || ws[2] != 1 || ws[1] < 1 {
		fail(op, "conv weight %v does not fit %d channels (want [%d, K, 1])", ws, xs[2], xs[2])
	}
	B, C, K := xs[0], xs[2], ws[1]
	if tail == nil {
		tail = mlxc.Zeros([]int{B, K - 1, C}, x.Dtype())
	} else if ts := tail.Shape(); len(ts) != 3 || ts[0] != B || ts[1] != K-1 || ts[2] != C {
		fail(op, "conv tail must be [%d %d %d], got %v", B, K-1, C, ts)
	}
	in := mlxc.Concatenate([]*mlxc.Array{tail, x}, 1)
	if wantTail {
		L := in.Dim(1)
		newTail = mlxc.Contiguous(mlxc.SliceAxis(in, 1, L-(K-1), L))
	}
	out = f.SiLU(mlxc.Conv1D(in, w, 1, 0, 1, C))
	return out, in, newTail
}

// NormalizeQK is the layer's parameter-free q/k normalisation: the reference l2 norm with
// eps 1e-6 on the sum of squares, written as rms_norm with eps 1e-6/Dk on the mean, then
// q scaled by 1/Dk and k by 1/√Dk (the readout scale folded into q), both in the input
// dtype.
func NormalizeQK(q, k *mlxc.Array) (qn, kn *mlxc.Array) {
	eps := normEps(q.Dim(q.Ndim() - 1))
	return scaleQK(mlxc.RMSNorm(q, nil, eps), mlxc.RMSNorm(k, nil, eps), math.Pow(float64(q.Dim(q.Ndim()-1)), -0.5))
}

// normEps is the rms_norm epsilon that stands for the l2 norm's 1e-6 on Dk-wide heads.
func normEps(dk int) float32 {
	inv := math.Pow(float64(dk), -0.5)
	return float32(1e-6 * inv * inv)
}

// scaleQK scales the normed q by inv² and k by inv (inv = 1/√Dk), in their dtype.
func scaleQK(q, k *mlxc.Array, inv float64) (qs, ks *mlxc.Array) {
	return mlxc.Multiply(mlxc.Scalar(inv*inv, q.Dtype()), q), mlxc.Multiply(mlxc.Scalar(inv, k.Dtype()), k)
}
