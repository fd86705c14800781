package engine

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// mtpTarget writes spec with an MTP head and loads it with the head.
func mtpTarget(t *testing.T, name string, spec modelgen.Qwen35Spec) *qwen35.Model {
	t.Helper()
	if m, ok := pairCache.Load("mtp-" + name); ok {
		return m.(*qwen35.Model)
	}
	spec.MTP = true
	dir := filepath.Join(t.TempDir(), "target")
	var m model.Model
	err := mlxc.Do(func() error {
		if err := modelgen.WriteQwen35(dir, spec); err != nil {
			return err
		}
		var err error
		m, err = model.Load(dir, model.LoadOptions{Settings: testSettings(), MTP: true})
		return err
	})
	if err != nil {
		t.Fatalf("mtp target %s: %v", name, err)
	}
	q := m.(*qwen35.Model)
	if q.MTP() == nil {
		t.Fatalf("mtp target %s: loaded without its head", name)
	}
	pairCache.Store("mtp-"+name, q)
	return q
}

func mtpTargets(t *testing.T) map[string]*qwen35.Model {
	q4 := decisiveHybrid(42)
	q4.QuantBits, q4.QuantGroup = 4, 32
	moe := modelgen.TinyQwen35MoE()
	moe.Seed, moe.WeightStd, moe.EOS, moe.Dtype = 43, 0.12, []int{-1}, mlxc.Float32
	hf := decisiveHybrid(44)
	hf.Tied, hf.Layout = false, modelgen.Qwen35HF
	return map[string]*qwen35.Model{
		"bf16":      mtpTarget(t, "bf16", decisiveHybrid(41)),
		"4bit":      mtpTarget(t, "4bit", q4),
		"moe-f32":   mtpTarget(t, "moe-f32", moe),
		"hf-untied": mtpTarget(t, "hf-untied", hf),
	}
}

// Greedy MTP speculation emits plain decoding's tokens on hybrid targets (dense and MoE,
// bf16, float32 and 4-bit, both layouts), for several prompts, lengths and blocks, alone
// and as rows of a batch; and it accepts drafts (the accepted positions' pairs are made
// from the committed tokens, so a wrong pairing would show as a divergence or as no
// acceptance at all).
func TestMTPGreedyEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	accepted := 0
	for name, m := range mtpTargets(t) {
		p := &pair{target: m, vocab: m.Arch().VocabSize}
		for pi, prompt := range prompts(p.vocab) {
			for _, n := range []int{1, 9, 40} {
				want := plainGreedy(t, p, prompt, n)
				for _, B := range []int{2, 4, 6} {
					t.Run(fmt.Sprintf("%s/p%d/n%d/B%d", name, pi, n, B), func(t *testing.T) {
						e := &Engine{Target: m, Proposer: verify.NewMTP(m.MTP(), 6)}
						res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: n, BlockSize: B, IgnoreEOS: true})
						checkLossless(t, res, evs, want, B)
						if res.Stats.Mode != "dflash" && n > 1 {
							t.Errorf("mode %q, want speculation", res.Stats.Mode)
						}
						accepted += res.Stats.Accepted
					})
				}
			}
		}
	}
	if accepted == 0 {
		t.Errorf("no draft was ever accepted: the test exercised rejections only")
	}
	t.Logf("accepted drafts over all runs: %d", accepted)
}

// Rows of a batch, each with its own MTP proposer (Fork), give each row's plain tokens.
func TestMTPBatchedRowsEqualPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	m := mtpTargets(t)["bf16"]
	p := &pair{target: m, vocab: m.Arch().VocabSize}
	ps := prompts(p.vocab)
	var reqs []Request
	var want [][]int32
	for i, prompt := range ps {
		n := 12 + 7*i
		reqs = append(reqs, Request{Prompt: prompt, MaxTokens: n, BlockSize: 4, IgnoreEOS: true})
		want = append(want, plainGreedy(t, p, prompt, n))
	}
	e := &Engine{Target: m, Proposer: verify.NewMTP(m.MTP(), 4)}
	s := e.NewScheduler(SchedulerConfig{MaxBatch: 4})
	got := runConcurrently(t, s, reqs)
	for i := range reqs {
		if j, ok := eqTokens(got[i].Tokens, want[i]); !ok {
			t.Errorf("row %d diverges from plain at %d:\n mtp   %v\n plain %v", i, j, got[i].Tokens, want[i])
		}
	}
}

// Sampled MTP speculation has the target's distribution: the joint of the first three
// sampled tokens, over 1 500 runs, passes a χ² test against the target's exact joint
// (drafts drawn from the head's own q and accepted by the speculative rule), and the same
// test rejects an acceptance rule that takes every draft.
func TestMTPSamplingMatchesTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("statistical test; skipped with -short")
	}
	spec := modelgen.TinyQwen35()
	spec.Vocab, spec.Seed, spec.WeightStd, spec.EOS = 6, 21, 0.1, []int{-1}
	m := mtpTarget(t, "sampling-v6", spec)
	sp := sample.Params{Temperature: 0.9, TopP: 0.97}
	prompt := []int32{1, 3, 5}
	exp := exactJoint(t, m, prompt, 6, sp)
	const N = 1500
	wrong := &Engine{Target: m, Proposer: verify.NewMTP(m.MTP(), 4)}
	wrong.speculative = func(lp, drafts, probs *mlxc.Array, sp sample.Params, keys *sample.Keys) verify.Verdict {
		v := verify.Speculative(lp, drafts, probs, sp, keys)
		v.Accept = mlxc.Equal(drafts, drafts) // accept everything: wrong
		return v
	}
	for _, v := range []struct {
		name     string
		e        *Engine
		wantFail bool
	}{
		{"mtp", &Engine{Target: m, Proposer: verify.NewMTP(m.MTP(), 4)}, false},
		{"wrong-rule-accept-all", wrong, true},
	} {
		t.Run(v.name, func(t *testing.T) { checkJoint(t, v.name, v.e, prompt, sp, exp, N, v.wantFail) })
	}
}
