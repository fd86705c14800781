package engine

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// At temperature > 0, DFlash2 samples its path from the selector's q (a distribution over
// each row's candidates, zero elsewhere) and the verdict takes that sparse q: the output
// must have the target's distribution. The χ² test of speculativeMatchesTarget runs on
// a 6-token vocabulary whose drafter ranks 4 candidates per row (so the target's likely
// tokens are among them at some rows and not at others) and on Qwen3.8's vocabulary of
// 248 320 ids with 16 candidates. A wrong rule (the verdict given the dense softmax of the
// drafter's logits instead of the selector's q) must be rejected by the same statistic.
func TestDFlash2SamplingMatchesTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("statistical test; skipped with -short")
	}
	configs := []struct {
		name           string
		vocab, topK, n int
		std            float32
		sp             sample.Params
		wrongRule      bool
	}{
		{"v6-k4", 6, 4, 1500, 0.1, sample.Params{Temperature: 0.9, TopP: 0.97}, true},
		// Top-k 2 keeps the enumeration at 8 cells, so fewer samples test it as hard.
		{"v248320-k16", 248320, 16, 300, 0.5, sample.Params{Temperature: 0.9, TopK: 2}, false},
	}
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			spec := modelgen.TinyQwen3()
			spec.Vocab, spec.Seed, spec.WeightStd, spec.EOS = cfg.vocab, 61, cfg.std, []int{-1}
			ds := modelgen.DrafterFor(spec, 1).DFlash2For()
			ds.SelectorTopK = cfg.topK
			p := loadPairWith(t, "dflash2-sampling-"+cfg.name, spec.Vocab, func(dir string) error { return modelgen.WriteQwen3(dir, spec) }, &ds)
			exp := exactJoint(t, p.target, []int32{1, 3, 5}, cfg.vocab, cfg.sp)
			N := cfg.n
			variants := []struct {
				name     string
				prop     *verify.DFlash2
				wantFail bool
			}{
				{"selector-q", verify.NewDFlash2(p.drft), false},
			}
			if cfg.wrongRule {
				wrong := verify.NewDFlash2(p.drft)
				wrong.ProposalQ = func(b draft.Block, path draft.Path, T float64) *mlxc.Array {
					n := path.Tokens.Dim(0)
					lp := sample.LogProbs(mlxc.SliceAxis(b.Logits, 0, 0, n))
					return mlxc.Softmax(mlxc.Divide(mlxc.AsType(lp, mlxc.Float32), mlxc.Scalar(T, mlxc.Float32)), []int{-1}, false)
				}
				variants = append(variants, struct {
					name     string
					prop     *verify.DFlash2
					wantFail bool
				}{"wrong-dense-q", wrong, true})
			}
			for _, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					e := &Engine{Target: p.target, Proposer: v.prop}
					obs := sampleJoint(t, e, []int32{1, 3, 5}, cfg.sp, N, 4)
					stat, df := chiSquare(obs, exp, N)
					crit := chiCritical(df, 3.09)
					t.Logf("%s: χ² = %.1f, df = %d, critical (α=0.001) = %.1f", v.name, stat, df, crit)
					if v.wantFail && stat <= crit {
						t.Errorf("the wrong proposal distribution was not detected (χ² %.1f ≤ %.1f)", stat, crit)
					}
					if !v.wantFail && stat > crit {
						t.Errorf("distribution differs from the target's: χ² %.1f > %.1f", stat, crit)
					}
				})
			}
		})
	}
}
