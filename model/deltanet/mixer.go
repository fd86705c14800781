package deltanet

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// Mixer is the token-mixing core of one GatedDeltaNet layer, between its input projections
// and its gated norm: the conv, the q/k normalisation, the gates and the recurrence.
// ConvW is [C, K, 1] with C = 2·KeyHeads·KeyDim + ValueHeads·ValueDim; ALog and DtBias are
// [ValueHeads].
type Mixer struct {
	ConvW, ALog, DtBias                                *mlxc.Array
	KeyHeads, ValueHeads, KeyDim, ValueDim, ConvKernel int
	// Kernels runs the recurrence and the cache's replays (nil: the ops path), Fused the
	// element-wise steps (nil: the ops); the family makes them once at load and owns them.
	Kernels *Kernels
	Fused   *Fused
}

// Channels is the conv's channel count C: the [q | k | v] projection width.
func (m *Mixer) Channels() int { return 2*m.KeyHeads*m.KeyDim + m.ValueHeads*m.ValueDim }

// check validates the mixer and its inputs and returns B, T.
func (m *Mixer) check(qkv, a, b *mlxc.Array) (B, T int) {
	const op = "deltanet.apply"
	if m.KeyHeads <= 0 || m.ValueHeads%m.KeyHeads != 0 || m.KeyDim <= 0 || m.ValueDim <= 0 || m.ConvKernel < 1 {
		fail(op, "bad mixer geometry: %d key heads of %d, %d value heads of %d, kernel %d", m.KeyHeads, m.KeyDim, m.ValueHeads, m.ValueDim, m.ConvKernel)
	}
	C := m.Channels()
	qs := qkv.Shape()
	if len(qs) != 3 || qs[2] != C {
		fail(op, "qkv must be [B, T, %d], got %v", C, qs)
	}
	if ws := m.ConvW.Shape(); len(ws) != 3 || ws[0] != C || ws[1] != m.ConvKernel || ws[2] != 1 {
		fail(op, "conv weight must be [%d %d 1], got %v", C, m.ConvKernel, ws)
	}
	B, T = qs[0], qs[1]
	for _, x := range []struct {
		name string
		a    *mlxc.Array
	}{{"a", a}, {"b", b}} {
		if s := x.a.Shape(); len(s) != 3 || s[0] != B || s[1] != T || s[2] != m.ValueHeads {
			fail(op, "%s must be [%d %d %d], got %v", x.name, B, T, m.ValueHeads, s)
		}
	}
	for _, x := range []struct {
		name string
		a    *mlxc.Array
	}{{"A_log", m.ALog}, {"dt_bias", m.DtBias}} {
		if s := x.a.Shape(); len(s) != 1 || s[0] != m.ValueHeads {
			fail(op, "%s must be [%d], got %v", x.name, m.ValueHeads, s)
		}
	}
	return B, T
}

// Apply runs the layer's mixing for the raw projections qkv [B, T, C], a and b [B, T, Hv]:
// the causal conv continued from the cache's tail, the split into [q | k | v], the q/k
// normalisation, the gates and the recurrence from the cache's state. It updates the cache
// (advancing it; recording the tape when the forward is tentative or placed) and returns
// y [B, T, Hv, Dv] in the input dtype. pos is the block's device position in the
// run-ahead loop (model.ForwardOptions.Pos), nil otherwise.
func (m *Mixer) Apply(qkv, a, b *mlxc.Array, c *Cache, pos *mlxc.Array) *mlxc.Array {
	B, T := m.check(qkv, a, b)
	Hk, Hv, Dk, Dv, K := m.KeyHeads, m.ValueHeads, m.KeyDim, m.ValueDim, m.ConvKernel
	record := c.recording(pos)
	c.kern = m.Kernels // the cache's replays (begin, Commit, SetOffset) run through them too
	state0, tail0 := c.begin(pos, []int{B, Hv, Dv, Dk}, []int{B, K - 1, m.Channels()}, qkv.Dtype())
	conv, rows, tail := causalConv(qkv, tail0, m.ConvW, m.Fused, pos == nil)
	q, k, v := splitHeads(conv, B, T, Hk, Hv, Dk, Dv)
	q, k = m.Fused.NormalizeQK(q, k)
	g, beta := m.Fused.Gates(a, b, m.ALog, m.DtBias)
	var y, state *mlxc.Array
	var tape Tape
	if record {
		y, state, tape = m.Kernels.RecurrenceTape(q, k, v, g, beta, state0)
	} else {
		y, state = m.Kernels.Recurrence(q, k, v, g, beta, state0)
	}
	c.end(pos, rows, state0, tail0, state, tail, tape)
	return y
}

// splitHeads splits the conv's output [B, T, C] into q, k [B, T, Hk, Dk] and v [B, T, Hv,
// Dv], views all. Where key and value heads are equally wide (Qwen3.5's), the rows are one
// reshape to heads and one split of them: two graph nodes where a split and three reshapes
// were four.
func splitHeads(conv *mlxc.Array, B, T, Hk, Hv, Dk, Dv int) (q, k, v *mlxc.Array) {
	if Dk == Dv {
		h := mlxc.Split(mlxc.Reshape(conv, B, T, 2*Hk+Hv, Dk), []int{Hk, 2 * Hk}, 2)
		return h[0], h[1], h[2]
	}
	parts := mlxc.Split(conv, []int{Hk * Dk, 2 * Hk * Dk}, -1)
	return mlxc.Reshape(parts[0], B, T, Hk, Dk), mlxc.Reshape(parts[1], B, T, Hk, Dk), mlxc.Reshape(parts[2], B, T, Hv, Dv)
}
