package deltanet

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// geometry is one test layer's shape.
type geometry struct {
	B, T, Hk, Hv, Dk, Dv, K int
}

func (g geometry) C() int { return 2*g.Hk*g.Dk + g.Hv*g.Dv }

func (g geometry) String() string {
	return fmt.Sprintf("B%d-T%d-Hk%d-Hv%d-Dk%d-Dv%d-K%d", g.B, g.T, g.Hk, g.Hv, g.Dk, g.Dv, g.K)
}

// inputs draws every operand the parity script reads: recurrence operands at the scale the
// normalisation gives (|q|, |k| ≈ 1/√Dk·√Dk), a non-zero state and tail, bf16 activations,
// float32 A_log as checkpoints keep it.
func inputs(r *rng, g geometry) map[string]*mlxc.Array {
	bf := mlxc.BFloat16
	ks := float32(1 / math.Sqrt(float64(g.Dk)))
	return map[string]*mlxc.Array{
		"q":       r.normal(bf, ks, g.B, g.T, g.Hk, g.Dk),
		"k":       r.normal(bf, ks, g.B, g.T, g.Hk, g.Dk),
		"v":       r.normal(bf, 1, g.B, g.T, g.Hv, g.Dv),
		"a":       r.normal(bf, 1, g.B, g.T, g.Hv),
		"b":       r.normal(bf, 1, g.B, g.T, g.Hv),
		"A_log":   mlxc.Log(r.uniform(1, 16, g.Hv)),
		"dt_bias": r.normal(bf, 0.5, g.Hv),
		"state":   r.normal(mlxc.Float32, 0.1, g.B, g.Hv, g.Dv, g.Dk),
		"qkv":     r.normal(bf, 1, g.B, g.T, g.C()),
		"conv_w":  r.normal(bf, 0.5, g.C(), g.K, 1),
		"tail":    r.normal(bf, 1, g.B, g.K-1, g.C()),
	}
}

// On the CPU mlx-lm runs the ops path (gated_delta_ops) for the recurrence, and the same
// MLX ops here give the same bits: gates, recurrence, conv and the whole mixing step of a
// qwen3_5 GatedDeltaNet, from a non-zero state and tail and from an empty cache. On a GPU
// mlx-lm would take its Metal kernel, whose sums run in another order, so the test asks for
// the CPU.
func TestMatchesMLXLM(t *testing.T) {
	if testenv.GPU() {
		t.Skip("bit-exact parity with mlx-lm's ops path holds on the CPU backend")
	}
	py := reftest.Python(t)
	script := filepath.Join(reftest.RepoRoot(), "model", "deltanet", "testdata", "gated_delta_ref.py")
	cases := []struct {
		g     geometry
		fresh bool
	}{
		{geometry{1, 1, 2, 2, 32, 32, 4}, false},
		{geometry{1, 5, 2, 4, 32, 32, 4}, false},
		{geometry{1, 16, 2, 2, 64, 64, 4}, false},
		{geometry{1, 16, 2, 4, 64, 64, 4}, false},
		{geometry{2, 5, 1, 2, 64, 32, 4}, false},
		{geometry{1, 5, 2, 4, 32, 32, 4}, true},
		{geometry{1, 1, 2, 4, 64, 64, 4}, true},
	}
	for i, tc := range cases {
		name := tc.g.String()
		if tc.fresh {
			name += "-fresh"
		}
		t.Run(name, func(t *testing.T) {
			g := tc.g
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "out.safetensors")
			do(t, func() {
				mlxc.SaveSafetensors(in, inputs(newRNG(uint64(100+i)), g), nil)
			})
			fresh := "0"
			if tc.fresh {
				fresh = "1"
			}
			args := []string{"ref", in, out}
			for _, v := range []int{g.Hk, g.Hv, g.Dk, g.Dv, g.K} {
				args = append(args, strconv.Itoa(v))
			}
			reftest.Run(t, py, script, append(args, fresh)...)
			do(t, func() {
				x, _ := mlxc.LoadSafetensors(in)
				ref, _ := mlxc.LoadSafetensors(out)
				gate, beta := Gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
				same(t, "g", gate, ref["g"])
				same(t, "beta", beta, ref["beta"])
				// The recurrence alone, on mlx-lm's gates (so a gate difference is not counted twice).
				y, st := Recurrence(x["q"], x["k"], x["v"], ref["g"], ref["beta"], x["state"])
				same(t, "recurrence y", y, ref["y"])
				same(t, "recurrence state", st, ref["state_out"])
				conv, tail := CausalConv(x["qkv"], x["tail"], x["conv_w"])
				same(t, "conv", conv, ref["conv"])
				same(t, "conv tail", tail, ref["conv_tail"])

				// The mixer through the ops and through the compiled element-wise steps.
				f := NewFused(g.Dk)
				defer f.Free()
				for _, fused := range []*Fused{nil, f} {
					what := "mixer"
					if fused != nil {
						what = "fused mixer"
					}
					m := &Mixer{ConvW: x["conv_w"], ALog: x["A_log"], DtBias: x["dt_bias"],
						KeyHeads: g.Hk, ValueHeads: g.Hv, KeyDim: g.Dk, ValueDim: g.Dv, ConvKernel: g.K, Fused: fused}
					c := NewCache()
					defer c.Free()
					if !tc.fresh {
						c.set(mlxc.Copy(x["state"]), mlxc.Copy(x["tail"]))
					}
					my := m.Apply(x["qkv"], x["a"], x["b"], c, nil)
					ct, cs := c.State()
					same(t, what+" y", my, ref["mix_y"])
					same(t, what+" state", cs, ref["mix_state"])
					same(t, what+" tail", ct, ref["mix_tail"])
					if want := g.T; c.Offset() != want && tc.fresh {
						t.Errorf("%s: offset %d after %d rows", what, c.Offset(), want)
					}
				}
			})
		})
	}
}
