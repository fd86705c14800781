package sample

import (
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

func on(t *testing.T, fn func()) {
	t.Helper()
	if err := mlxc.Do(func() error { s := mlxc.NewScope(); defer s.Close(); fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

func kept(v []float32) []bool {
	out := make([]bool, len(v))
	for i, x := range v {
		out[i] = !math.IsInf(float64(x), -1)
	}
	return out
}

// Filters against hand-computed keep sets (mlx-lm semantics): probabilities
// [0.5, 0.25, 0.15, 0.1] at indices 2, 0, 3, 1.
func TestFilters(t *testing.T) {
	probs := []float64{0.25, 0.1, 0.5, 0.15}
	lp := make([]float32, len(probs))
	for i, p := range probs {
		lp[i] = float32(math.Log(p))
	}
	cases := []struct {
		name string
		p    Params
		want []bool
	}{
		{"none", Params{Temperature: 1}, []bool{true, true, true, true}},
		{"top-k 2", Params{Temperature: 1, TopK: 2}, []bool{true, false, true, false}},
		{"top-k 1", Params{Temperature: 1, TopK: 1}, []bool{false, false, true, false}},
		// Keep tokens whose ascending cumulative probability exceeds 1 − top_p = 0.3:
		// sorted 0.1 (cum .1), .15 (.25), .25 (.5), .5 (1.0) → keep 0.25 and 0.5.
		{"top-p 0.7", Params{Temperature: 1, TopP: 0.7}, []bool{true, false, true, false}},
		{"top-p 0.85", Params{Temperature: 1, TopP: 0.85}, []bool{true, false, true, true}},
		// min-p 0.4: keep p ≥ 0.4·0.5 = 0.2.
		{"min-p 0.4", Params{Temperature: 1, MinP: 0.4}, []bool{true, false, true, false}},
		{"min-p 0.25 + top-k 1", Params{Temperature: 1, MinP: 0.25, TopK: 1}, []bool{false, false, true, false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			on(t, func() {
				got := kept(c.p.Filter(mlxc.FromSlice(lp, 1, 4)).Float32s())
				for i := range got {
					if got[i] != c.want[i] {
						t.Errorf("kept %v, want %v", got, c.want)
						break
					}
				}
			})
		})
	}
}

// Probs renormalises the kept tokens at temperature T: p_i^(1/T) / Σ.
func TestProbsTemperature(t *testing.T) {
	on(t, func() {
		lp := mlxc.FromSlice([]float32{float32(math.Log(0.5)), float32(math.Log(0.25)), float32(math.Log(0.25))}, 1, 3)
		got := Params{Temperature: 0.5}.Probs(lp).Float32s()
		want := []float64{0.25 / 0.375, 0.0625 / 0.375, 0.0625 / 0.375}
		for i := range want {
			if math.Abs(float64(got[i])-want[i]) > 1e-5 {
				t.Errorf("probs %v, want %v", got, want)
				break
			}
		}
	})
}

// Repetition penalty rows: row r sees history plus the first r drafts (mlx-lm: negative
// logits ×p, positive ÷p, each distinct token once).
func TestPenaltyRows(t *testing.T) {
	on(t, func() {
		logits := mlxc.FromSlice([]float32{
			2, -2, 1, 4,
			2, -2, 1, 4,
			2, -2, 1, 4,
		}, 3, 4)
		drafts := mlxc.FromSlice([]int32{3, 2}, 2)
		got := Params{RepetitionPenalty: 2}.PenaltyRows(logits, []int32{1, 1}, drafts).Float32s()
		want := []float32{
			2, -4, 1, 4, // history {1}
			2, -4, 1, 2, // + draft 3
			2, -4, 0.5, 2, // + draft 2
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("penalised %v, want %v", got, want)
			}
		}
		// Without history, row 0 is untouched.
		got = Params{RepetitionPenalty: 2}.PenaltyRows(mlxc.FromSlice([]float32{2, -2, 1, 4, 2, -2, 1, 4}, 2, 4), nil, mlxc.FromSlice([]int32{0}, 1)).Float32s()
		want = []float32{2, -2, 1, 4, 1, -2, 1, 4}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("no-history rows %v, want %v", got, want)
			}
		}
	})
}

func TestValidate(t *testing.T) {
	bad := []Params{{Temperature: -1}, {TopP: 1.5}, {TopK: -1}, {MinP: 2}, {RepetitionPenalty: -1}, {Temperature: math.NaN()}}
	for _, p := range bad {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if (Params{Temperature: 0.7, TopP: 0.9, TopK: 40, MinP: 0.05}).Validate() != nil {
		t.Error("valid params rejected")
	}
}

// Temperatures too cold for 1/T in float32 (and everything below GreedyBelow) decode
// greedily; just above it, sampling still concentrates on the best token.
func TestColdTemperatureIsGreedy(t *testing.T) {
	lp := []float32{-3, -0.2, -1.9, -0.21, -7}
	for _, temp := range []float64{0, 1e-45, 1e-40, 1e-38, 1e-9, GreedyBelow / 2, GreedyBelow} {
		p := Params{Temperature: temp, TopP: 0.9}
		if p.Validate() != nil {
			t.Errorf("T=%g refused", temp)
		}
		if got, want := p.Greedy(), temp < GreedyBelow; got != want {
			t.Errorf("T=%g: Greedy() = %v, want %v", temp, got, want)
		}
		on(t, func() {
			for seed := uint64(0); seed < 4; seed++ {
				tok := mlxc.AsType(p.Draw(mlxc.FromSlice(lp, 1, len(lp)), NewKeys(seed).Next()), mlxc.Int32).Int32s()
				if tok[0] != 1 {
					t.Errorf("T=%g seed %d: drew %d, want the best token 1", temp, seed, tok[0])
				}
			}
			if !p.Greedy() {
				probs := p.Probs(p.Filter(mlxc.FromSlice(lp, 1, len(lp)))).Float32s()
				for i, q := range probs {
					if math.IsNaN(float64(q)) || (i != 1 && q != 0) {
						t.Errorf("T=%g: probs %v, want a point mass on token 1", temp, probs)
						break
					}
				}
			}
		})
	}
}
