package deltanet

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// The compiled element-wise steps give the ops functions' bits, in each activation dtype
// and for shapes of one row, a verify block and a prefill chunk (one trace serves them all),
// and a whole mixing step through them gives the ops step's y, state and tail while its
// graph loses the nodes the fusion is for.
func TestFusedMatchesOps(t *testing.T) {
	cases := []struct {
		g  geometry
		dt mlxc.Dtype
	}{
		{geometry{1, 1, 2, 4, 32, 32, 4}, mlxc.BFloat16},
		{geometry{1, 16, 2, 4, 32, 32, 4}, mlxc.BFloat16},
		{geometry{2, 37, 2, 2, 32, 64, 4}, mlxc.BFloat16},
		{geometry{1, 16, 2, 4, 32, 32, 4}, mlxc.Float16},
		{geometry{1, 5, 1, 2, 32, 32, 3}, mlxc.Float32},
	}
	do(t, func() {
		f := NewFused(32)
		defer f.Free()
		for i, tc := range cases {
			g, dt := tc.g, tc.dt
			name := g.String() + "-" + dt.String()
			in := inputs(newRNG(uint64(700+i)), g)
			for k, v := range in {
				if k != "A_log" && k != "state" {
					in[k] = mlxc.AsType(v, dt)
				}
			}
			ga, ba := f.Gates(in["a"], in["b"], in["A_log"], in["dt_bias"])
			gw, bw := Gates(in["a"], in["b"], in["A_log"], in["dt_bias"])
			same(t, name+" gates g", ga, gw)
			same(t, name+" gates beta", ba, bw)
			same(t, name+" silu", f.SiLU(in["qkv"]), mlxc.SiLU(in["qkv"]))
			qf, kf := f.NormalizeQK(in["q"], in["k"])
			qw, kw := NormalizeQK(in["q"], in["k"])
			same(t, name+" q", qf, qw)
			same(t, name+" k", kf, kw)
			z := in["v"] // any [B, T, Hv, Dv] activation serves as the gate
			nn := mlxc.RMSNorm(mlxc.Multiply(in["v"], in["v"]), nil, 1e-6)
			same(t, name+" gated out", f.GatedOut(z, nn), GatedOut(z, nn))

			// The whole step, from a non-zero state and tail.
			plain := &Mixer{ConvW: in["conv_w"], ALog: in["A_log"], DtBias: in["dt_bias"],
				KeyHeads: g.Hk, ValueHeads: g.Hv, KeyDim: g.Dk, ValueDim: g.Dv, ConvKernel: g.K}
			fused := *plain
			fused.Fused = f
			var ys [2]*mlxc.Array
			var caches [2]*Cache
			var nodes [2]int
			for j, m := range []*Mixer{plain, &fused} {
				c := NewCache()
				defer c.Free()
				c.set(mlxc.Copy(in["state"]), mlxc.Copy(in["tail"]))
				ys[j] = m.Apply(in["qkv"], in["a"], in["b"], c, nil)
				nodes[j] = mlxc.GraphNodes(ys[j])
				caches[j] = c
			}
			same(t, name+" mixer y", ys[1], ys[0])
			sameCache(t, name+" mixer cache", caches[1], caches[0])
			// Gates 8 → 1 (as type, exp, negative, add, softplus, multiply, exp, sigmoid),
			// SiLU 2 → 1, the scales 2 → 1 at least.
			if nodes[1] > nodes[0]-9 {
				t.Errorf("%s: the fused step has %d graph nodes, the ops step %d: the fusion saved fewer than 9", name, nodes[1], nodes[0])
			}
		}
		// Keys of another width than the compiled scales' take the ops.
		in := inputs(newRNG(800), geometry{1, 3, 2, 2, 64, 64, 4})
		qf, kf := f.NormalizeQK(in["q"], in["k"])
		qw, kw := NormalizeQK(in["q"], in["k"])
		same(t, "Dk 64 with Fused(32): q", qf, qw)
		same(t, "Dk 64 with Fused(32): k", kf, kw)
	})
}

// splitHeads gives the heads a split of the channels and a reshape of each part give, as
// views; where key and value heads are equally wide, in two graph nodes instead of four.
func TestSplitHeads(t *testing.T) {
	do(t, func() {
		for _, g := range []geometry{{2, 3, 2, 4, 32, 32, 4}, {1, 5, 2, 4, 16, 24, 4}} {
			C := 2*g.Hk*g.Dk + g.Hv*g.Dv
			conv := mlxc.Normal([]int{g.B, g.T, C}, mlxc.Float32, 0, 1, mlxc.RandomKey(uint64(C)))
			mlxc.Eval(conv)
			q, k, v := splitHeads(conv, g.B, g.T, g.Hk, g.Hv, g.Dk, g.Dv)
			want := 4
			if g.Dk == g.Dv {
				want = 2
			}
			if n := mlxc.GraphNodes(q, k, v); n != want {
				t.Errorf("%s: %d graph nodes, want %d", g.String(), n, want)
			}
			parts := mlxc.Split(conv, []int{g.Hk * g.Dk, 2 * g.Hk * g.Dk}, -1)
			same(t, g.String()+" q", q, mlxc.Reshape(parts[0], g.B, g.T, g.Hk, g.Dk))
			same(t, g.String()+" k", k, mlxc.Reshape(parts[1], g.B, g.T, g.Hk, g.Dk))
			same(t, g.String()+" v", v, mlxc.Reshape(parts[2], g.B, g.T, g.Hv, g.Dv))
		}
	})
}
