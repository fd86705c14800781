package engine

import (
	"fmt"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// DFlash2 drafters (convolutions, bidirectional windowed block attention, the candidate
// selector) over dense and hybrid targets, bf16 and 4-bit, in both loops.

func dflash2Pairs(t *testing.T) map[string]*pair {
	t.Helper()
	q := decisiveSpec(51)
	q4 := decisiveSpec(52)
	q4.QuantBits, q4.QuantGroup = 4, 64
	h := decisiveHybrid(53)
	h4 := decisiveHybrid(54)
	h4.QuantBits, h4.QuantGroup = 4, 32
	qd := modelgen.DrafterFor(q, 2).DFlash2For()
	q4d := modelgen.DrafterFor(q4, 2).DFlash2For()
	q4d.QuantBits, q4d.QuantGroup = 4, 32
	hd := modelgen.DrafterForQwen35(h, 2).DFlash2For()
	h4d := modelgen.DrafterForQwen35(h4, 2).DFlash2For()
	return map[string]*pair{
		"qwen3-bf16":  loadPairWith(t, "dflash2-qwen3-bf16", q.Vocab, func(dir string) error { return modelgen.WriteQwen3(dir, q) }, &qd),
		"qwen3-4bit":  loadPairWith(t, "dflash2-qwen3-4bit", q4.Vocab, func(dir string) error { return modelgen.WriteQwen3(dir, q4) }, &q4d),
		"qwen35-bf16": loadPairWith(t, "dflash2-qwen35-bf16", h.Vocab, func(dir string) error { return modelgen.WriteQwen35(dir, h) }, &hd),
		"qwen35-4bit": loadPairWith(t, "dflash2-qwen35-4bit", h4.Vocab, func(dir string) error { return modelgen.WriteQwen35(dir, h4) }, &h4d),
	}
}

// proposerOf is the proposer of a loaded drafter's generation.
func proposerOf(d *draft.Drafter) verify.Proposer {
	if d.Cfg.Kind == draft.DFlash2 {
		return verify.NewDFlash2(d)
	}
	return verify.NewDFlash(d)
}

// longPrompt is a prompt longer than the test drafters' window (64), so the window drops
// rows during prefill and again while decoding.
func longPrompt(vocab, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*37 + 11) % (vocab - 1))
	}
	return p
}

// Greedy DFlash2 emits plain decoding's tokens: serial and run-ahead loops, dense and
// hybrid targets, bf16 and 4-bit, short prompts and prompts past the drafter's window.
func TestDFlash2GreedyEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	for name, p := range dflash2Pairs(t) {
		if p.drft.Cfg.Kind.String() != "dflash2" {
			t.Fatalf("%s: drafter loaded as %s", name, p.drft.Cfg.Kind)
		}
		greedyBothLoops(t, name, p, prompts(p.vocab)[:3], []int{1, 9}, []int{3, 8})
		greedyBothLoops(t, name+"/long", p, [][]int32{longPrompt(p.vocab, 100)}, []int{90}, []int{3, 8})
	}
}

// A window narrower than the drafter's own (the --draft-window option) changes drafts,
// never the output; a second turn resumed from the prefix cache past the window's length
// emits what the uncached turn does.
func TestDFlash2WindowOptionAndPrefixCache(t *testing.T) {
	testenv.RequireShapeExact(t)
	p := dflash2Pairs(t)["qwen35-bf16"]
	prompt := longPrompt(p.vocab, 100)
	want := plainGreedy(t, p, prompt, 40)
	for _, w := range []int{16, 2} { // 2: narrower than a block, which the window still holds
		for _, ahead := range []bool{false, true} {
			p.drft.ContextWindow = w
			e := &Engine{Target: p.target, Proposer: verify.NewDFlash2(p.drft), RunAhead: ahead}
			res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: 40, IgnoreEOS: true})
			p.drft.ContextWindow = 0
			checkLossless(t, res, evs, want, p.drft.BlockSize())
		}
	}

	pc := newPrefixCache(t, 0, 4)
	defer pc.Free()
	cached := &Engine{Target: p.target, Proposer: verify.NewDFlash2(p.drft), Prefix: pc}
	first, _ := run(t, cached, Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: true})
	turn2 := append(append(append([]int32(nil), prompt...), first.Tokens...), 5, 6, 7)
	want2 := plainGreedy(t, p, turn2, 30)
	got, evs := run(t, cached, Request{Prompt: turn2, MaxTokens: 30, IgnoreEOS: true})
	checkLossless(t, got, evs, want2, p.drft.BlockSize())
	if got.Stats.PromptCacheTokens < len(prompt) {
		t.Errorf("second turn reused %d prompt tokens, want at least the first prompt's %d", got.Stats.PromptCacheTokens, len(prompt))
	}
}

// Under the adaptive block a DFlash2 drafter takes one-token steps where drafting cannot
// pay (its window then takes the steps' rows as context, in both loops) and drafts where
// verify is cheap: the output stays plain decoding's, several block sizes run.
func TestDFlash2AdaptiveBlockEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	pairs := dflash2Pairs(t)
	for _, name := range []string{"qwen3-bf16", "qwen35-bf16"} {
		p := pairs[name]
		prompt := longPrompt(p.vocab, 70)
		want := plainGreedy(t, p, prompt, 60)
		for _, costs := range []*BlockCosts{oneTokenWins, {Sizes: []int{2, 4, 8}, MS: []float64{3, 3.2, 3.4}}} {
			for _, ahead := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/costs%v/ahead%v", name, costs.MS, ahead), func(t *testing.T) {
					e := &Engine{Target: p.target, Proposer: verify.NewDFlash2(p.drft), RunAhead: ahead, BlockCosts: costs}
					res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: 60, IgnoreEOS: true})
					checkLossless(t, res, evs, want, p.drft.BlockSize())
					if len(res.Stats.BlockSizes) < 2 {
						t.Errorf("one block size only: %v", res.Stats.BlockSizes)
					}
				})
			}
		}
	}
}
