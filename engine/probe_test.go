package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// The pipeline probe measures (host time within wall time, for cycles and for verify
// blocks alone), refuses what it cannot run, and leaves the engine as it found it: a
// DFlash generation afterwards still equals plain decoding.
func TestProbePipeline(t *testing.T) {
	spec := decisiveSpec(11)
	p := loadPair(t, "decisive-bf16", spec, 2)
	prompt := prompts(spec.Vocab)[0]
	e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft)}
	probe := func(e *Engine, prompt []int32, cycles int) (PipelineProbe, error) {
		var res PipelineProbe
		err := mlxc.Do(func() error {
			var err error
			res, err = e.ProbePipeline(context.Background(), prompt, cycles)
			return err
		})
		return res, err
	}
	res, err := probe(e, prompt, 4)
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 4 || res.CycleMS <= 0 || res.HostMS <= 0 || res.HostMS > res.CycleMS ||
		res.VerifyMS <= 0 || res.VerifyHostMS <= 0 || res.VerifyHostMS > res.VerifyMS {
		t.Errorf("probe %+v: want 4 cycles, 0 < host ≤ wall for cycles and for verify blocks", res)
	}

	want := plainGreedy(t, p, prompt, 20)
	got, _ := run(t, e, Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: true})
	// Plain decoding's tokens where rounding does not depend on the shape (elsewhere a
	// near-tie may flip one); the probe's measurements are checked everywhere.
	if i, ok := eqTokens(got.Tokens, want); !ok && testenv.ShapeExact() {
		t.Fatalf("DFlash after the probe diverges from plain at %d: %v vs %v", i, got.Tokens, want)
	}

	for _, tc := range []struct {
		name   string
		e      *Engine
		prompt []int32
		cycles int
		err    string
	}{
		{"no drafter", &Engine{Target: p.target}, prompt, 4, "no drafter"},
		{"no cycles", e, prompt, 0, "at least one cycle"},
		{"empty prompt", e, nil, 4, "need a prompt"},
		{"too long", &Engine{Target: p.target, Proposer: e.Proposer, ContextLength: len(prompt) + 3}, prompt, 4, ErrPromptTooLong.Error()},
	} {
		_, err := probe(tc.e, tc.prompt, tc.cycles)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
		}
		if tc.name == "too long" && !errors.Is(err, ErrPromptTooLong) {
			t.Errorf("too long: %v is not ErrPromptTooLong", err)
		}
	}
}
