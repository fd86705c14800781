package engine

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// serialTarget wraps a target so that its caches lack the run-ahead capability, as a
// family with recurrent layers would until they implement it.
type serialTarget struct{ model.Model }

// serialCaches hides the capability of the caches it wraps.
type serialCaches struct{ model.Cache }

func (serialCaches) RunAhead() cache.Placed { return nil }

func (m serialTarget) NewCache() model.Cache { return serialCaches{m.Model.NewCache()} }

func (m serialTarget) Forward(ids *mlxc.Array, c model.Cache, opt model.ForwardOptions) model.Output {
	return m.Model.Forward(ids, c.(serialCaches).Cache, opt)
}

// A target whose caches cannot run ahead gets the serial DFlash loop even with RunAhead
// on, the statistics say which loop ran and why, and the tokens are plain decoding's.
func TestRunAheadFallsBackVisibly(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{5, 3, 5, 8, 9}
	const N = 24
	want := plainGreedy(t, p, prompt, N)
	for _, tc := range []struct {
		name     string
		target   model.Model
		sp       sample.Params
		runAhead bool
		fallback string
	}{
		{"capable", p.target, sample.Params{}, true, ""},
		{"caches lack it", serialTarget{p.target}, sample.Params{}, false, "the target's caches cannot be placed at a device-side position"},
		{"penalty", p.target, sample.Params{RepetitionPenalty: 1.1}, false, "repetition penalty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{Target: tc.target, Proposer: verify.NewDFlash(p.drft), RunAhead: true}
			res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: 8, IgnoreEOS: true, Sampling: tc.sp})
			st := res.Stats
			if st.Mode != "dflash" || st.RunAhead != tc.runAhead || st.RunAheadFallback != tc.fallback || st.Cycles == 0 {
				t.Errorf("mode %q, run ahead %v, fallback %q, %d cycles; want run ahead %v, fallback %q", st.Mode, st.RunAhead, st.RunAheadFallback, st.Cycles, tc.runAhead, tc.fallback)
			}
			// A penalty changes the tokens, so plain decoding without one is no reference; where
			// rounding depends on the shape a near-tie may flip a token.
			if tc.sp.RepetitionPenalty != 0 || !testenv.ShapeExact() {
				return
			}
			if i, ok := eqTokens(res.Tokens, want); !ok {
				t.Errorf("diverges from plain at %d:\n got   %v\n plain %v", i, res.Tokens, want)
			}
		})
	}
	// With RunAhead off nothing falls back: the serial loop was asked for.
	e := &Engine{Target: serialTarget{p.target}, Proposer: verify.NewDFlash(p.drft)}
	if res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: 8, IgnoreEOS: true}); res.Stats.RunAhead || res.Stats.RunAheadFallback != "" {
		t.Errorf("run ahead off: run ahead %v, fallback %q", res.Stats.RunAhead, res.Stats.RunAheadFallback)
	}
}
