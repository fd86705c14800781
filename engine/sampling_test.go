package engine

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

func sampleParams(temp float64) sample.Params { return sample.Params{Temperature: temp} }

// exactJoint enumerates p(t1, t2, t3 | prompt) with the model's own distributions.
func exactJoint(t *testing.T, m model.Model, prompt []int32, V int, sp sample.Params) map[[3]int32]float64 {
	return exactJointUnder(t, m, prompt, V, sp, nil)
}

// exactJointUnder is exactJoint with each step's logits masked to the tokens allowed
// after the ones generated before it (nil: all).
func exactJointUnder(t *testing.T, m model.Model, prompt []int32, V int, sp sample.Params, allowed func(gen []int32, tok int32) bool) map[[3]int32]float64 {
	probs := func(seq []int32) []float32 {
		var out []float32
		err := mlxc.Do(func() error {
			s := mlxc.NewScope()
			defer s.Close()
			c := m.NewCache()
			defer c.Free()
			o := m.Forward(mlxc.FromSlice(seq, 1, len(seq)), c, model.ForwardOptions{Logits: model.LogitsLast})
			lg := mlxc.Reshape(o.Logits, 1, -1)
			if allowed != nil {
				lg = maskedBy(lg, seq[len(prompt):], allowed)
			}
			lp := sample.LogProbs(lg)
			out = sp.Probs(sp.Filter(lp)).Float32s()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Only the support is enumerated (zero-probability prefixes need no forward pass), so a
	// large vocabulary stays cheap when the filters keep few tokens; chiSquare pools every
	// observation outside the support with the unlikely cells.
	joint := map[[3]int32]float64{}
	p1 := probs(prompt)
	for a := 0; a < V; a++ {
		if p1[a] == 0 {
			continue
		}
		p2 := probs(append(append([]int32(nil), prompt...), int32(a)))
		for b := 0; b < V; b++ {
			if p2[b] == 0 {
				continue
			}
			p3 := probs(append(append([]int32(nil), prompt...), int32(a), int32(b)))
			for c := 0; c < V; c++ {
				if p3[c] > 0 {
					joint[[3]int32{int32(a), int32(b), int32(c)}] = float64(p1[a]) * float64(p2[b]) * float64(p3[c])
				}
			}
		}
	}
	return joint
}

// chiSquare compares observed counts with expected probabilities, pooling cells whose
// expected count is below 5 together with every observation outside exp (probability 0).
// It returns the statistic and the degrees of freedom.
func chiSquare(obs map[[3]int32]int, exp map[[3]int32]float64, n int) (float64, int) {
	keys := make([][3]int32, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return exp[keys[i]] > exp[keys[j]] })
	stat, cells := 0.0, 0
	var poolE float64
	var poolO int
	for _, k := range keys {
		e := exp[k] * float64(n)
		if e < 5 {
			poolE += e
			poolO += obs[k]
			continue
		}
		d := float64(obs[k]) - e
		stat += d * d / e
		cells++
	}
	for k, o := range obs {
		if _, ok := exp[k]; !ok {
			poolO += o
		}
	}
	if poolE > 0 || poolO > 0 {
		d := float64(poolO) - poolE
		stat += d * d / math.Max(poolE, 1e-9)
		cells++
	}
	return stat, cells - 1
}

// chiCritical is the upper α quantile of χ²(df) (Wilson–Hilferty approximation).
func chiCritical(df int, z float64) float64 {
	k := float64(df)
	x := 1 - 2/(9*k) + z*math.Sqrt(2/(9*k))
	return k * x * x * x
}

func sampleJoint(t *testing.T, e *Engine, prompt []int32, sp sample.Params, n, B int) map[[3]int32]int {
	counts := map[[3]int32]int{}
	err := mlxc.Do(func() error {
		for i := 0; i < n; i++ {
			sp.Seed = uint64(i)*7919 + 17
			res, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 4, Sampling: sp, IgnoreEOS: true, BlockSize: B}, nil)
			if err != nil {
				return err
			}
			counts[[3]int32{res.Tokens[0], res.Tokens[1], res.Tokens[2]}]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

// At temperature > 0 DFlash must sample from the target's distribution. A chi-square
// goodness-of-fit test of the first three tokens' joint distribution against the exact
// distribution (enumerated), for plain sampling and for DFlash with a real random drafter
// (q ≠ p) and a scripted one (point masses). α = 0.001 per test. A deliberately wrong rule
// (accept every draft) must be rejected by the same test: that shows it has power.
func TestSpeculativeSamplingMatchesTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("statistical test; skipped with -short")
	}
	// The 6-token vocabulary enumerates every cell; the 1 024-token one runs the filters'
	// sorts and sums at a size where low-precision sums go wrong, with decisive weights and
	// top-p so that the kept sets (and the enumeration) stay small.
	// The hybrid target (Qwen3.5: recurrent layers rolled back by tape replay) and a MoE
	// target (qwen3_moe: routing per verify row) run the same test at the 6-token
	// vocabulary; the MoE one only the two DFlash variants, the ones its routing touches
	// (plain sampling and the test's power are the dense targets' cases).
	const (
		dense = iota
		hybrid
		moe
	)
	configs := []struct {
		name       string
		vocab      int
		std        float32
		sp         sample.Params
		kind       int
		dflashOnly bool
	}{
		{"v6", 6, 0.1, sample.Params{Temperature: 0.9, TopP: 0.97}, dense, false},
		{"v1024", 1024, 0.5, sample.Params{Temperature: 0.9, TopP: 0.9}, dense, false},
		{"hybrid-v6", 6, 0.1, sample.Params{Temperature: 0.9, TopP: 0.97}, hybrid, false},
		{"moe-v6", 6, 0.1, sample.Params{Temperature: 0.9, TopP: 0.97}, moe, true},
	}
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			var p *pair
			switch cfg.kind {
			case hybrid:
				spec := modelgen.TinyQwen35()
				spec.Vocab, spec.Seed, spec.WeightStd, spec.EOS = cfg.vocab, 21, cfg.std, []int{-1}
				p = loadHybridPair(t, "sampling-"+cfg.name, spec, 1)
			case moe:
				spec := modelgen.TinyQwen3MoE()
				spec.Vocab, spec.Seed, spec.WeightStd, spec.EOS = cfg.vocab, 21, cfg.std, []int{-1}
				p = loadPair(t, "sampling-"+cfg.name, spec, 1)
			default:
				spec := modelgen.TinyQwen3()
				spec.Vocab, spec.Seed, spec.WeightStd, spec.EOS = cfg.vocab, 21, cfg.std, []int{-1}
				p = loadPair(t, fmt.Sprintf("sampling-v%d", cfg.vocab), spec, 1)
			}
			speculativeMatchesTarget(t, p, cfg.sp, cfg.dflashOnly)
		})
	}
}

func speculativeMatchesTarget(t *testing.T, p *pair, sp sample.Params, dflashOnly bool) {
	vocab := p.vocab
	prompt := []int32{1, 3, 5}
	exp := exactJoint(t, p.target, prompt, vocab, sp)
	const N = 1500
	ref := make([]int32, 0, 16)
	ref = append(ref, prompt...)
	ref = append(ref, 0, 1, 2, 3, 4, 5, 0, 1)
	type variant struct {
		name     string
		engine   *Engine
		wantFail bool
	}
	wrong := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft)}
	wrong.speculative = func(lp, drafts, probs *mlxc.Array, sp sample.Params, keys *sample.Keys) verify.Verdict {
		v := verify.Speculative(lp, drafts, probs, sp, keys)
		v.Accept = mlxc.Equal(drafts, drafts) // accept everything: wrong
		return v
	}
	variants := []variant{
		{"plain", &Engine{Target: p.target}, false},
		{"dflash-random-drafter", &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft)}, false},
		{"dflash-scripted", &Engine{Target: p.target, Proposer: &verify.Scripted{Ref: ref, Vocab: vocab, Block: 4}}, false},
		{"wrong-rule-accept-all", wrong, true},
	}
	for _, v := range variants {
		if dflashOnly && !strings.HasPrefix(v.name, "dflash-") {
			continue
		}
		t.Run(v.name, func(t *testing.T) { checkJoint(t, v.name, v.engine, prompt, sp, exp, N, v.wantFail) })
	}
}

// checkJoint samples the joint of the first three tokens N times with e (blocks of 4)
// and tests it against the target's exact joint exp (χ², α = 0.001): it must pass, or
// with wantFail (a deliberately wrong rule) be rejected.
func checkJoint(t *testing.T, name string, e *Engine, prompt []int32, sp sample.Params, exp map[[3]int32]float64, N int, wantFail bool) {
	t.Helper()
	obs := sampleJoint(t, e, prompt, sp, N, 4)
	stat, df := chiSquare(obs, exp, N)
	crit := chiCritical(df, 3.09) // z for α = 0.001
	t.Logf("%s: χ² = %.1f, df = %d, critical (α=0.001) = %.1f", name, stat, df, crit)
	if wantFail && stat <= crit {
		t.Errorf("the wrong acceptance rule was not detected (χ² %.1f ≤ %.1f)", stat, crit)
	}
	if !wantFail && stat > crit {
		t.Errorf("distribution differs from the target's: χ² %.1f > %.1f", stat, crit)
	}
}
