package engine

import (
	"fmt"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// The hybrid target (Qwen3.5: GatedDeltaNet layers, whose recurrent caches roll back by
// restoring a snapshot and replaying the kept steps of the tape, beside KV layers) in the
// serial and the run-ahead DFlash loops.

// loadHybridPair writes and loads a Qwen3.5 target with a drafter of drafterLayers layers
// (none for 0).
func loadHybridPair(t *testing.T, name string, spec modelgen.Qwen35Spec, drafterLayers int) *pair {
	t.Helper()
	var ds *modelgen.DrafterSpec
	if drafterLayers > 0 {
		d := modelgen.DrafterForQwen35(spec, drafterLayers)
		ds = &d
	}
	return loadPairWith(t, name, spec.Vocab, func(dir string) error { return modelgen.WriteQwen35(dir, spec) }, ds)
}

// decisiveHybrid is a tiny Qwen3.5 whose logits have large gaps (no bf16 near-ties between a
// verify block and decode steps) and no EOS.
func decisiveHybrid(seed uint64) modelgen.Qwen35Spec {
	s := modelgen.TinyQwen35()
	s.Seed, s.WeightStd, s.EOS = seed, 0.12, []int{-1}
	return s
}

func hybridPairs(t *testing.T) map[string]*pair {
	q4 := decisiveHybrid(32)
	q4.QuantBits, q4.QuantGroup = 4, 32
	untied := decisiveHybrid(33)
	untied.Tied, untied.Layout = false, modelgen.Qwen35HF
	return map[string]*pair{
		"bf16":      loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2),
		"4bit":      loadHybridPair(t, "hybrid-decisive-4bit", q4, 2),
		"hf-untied": loadHybridPair(t, "hybrid-decisive-hf-untied", untied, 2),
	}
}

// Greedy DFlash on a hybrid target emits plain decoding's tokens in both loops, for many
// prompts, lengths and block sizes, and the run-ahead loop really runs ahead (the
// recurrent caches can be placed at a device-side position).
func TestHybridDFlashGreedyEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	for name, p := range hybridPairs(t) {
		greedyBothLoops(t, name, p, prompts(p.vocab), []int{1, 5, 37}, []int{2, 4, 8, 16})
	}
}

// greedyBothLoops checks that greedy DFlash on p (either drafter generation) emits plain
// decoding's tokens in the serial and the run-ahead loop (which must really run ahead),
// for each prompt, length and block size.
func greedyBothLoops(t *testing.T, name string, p *pair, ps [][]int32, lengths, blocks []int) {
	for pi, prompt := range ps {
		for _, maxTok := range lengths {
			want := plainGreedy(t, p, prompt, maxTok)
			for _, B := range blocks {
				for _, ahead := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/p%d/n%d/B%d/ahead%v", name, pi, maxTok, B, ahead), func(t *testing.T) {
						e := &Engine{Target: p.target, Proposer: proposerOf(p.drft), RunAhead: ahead}
						res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: maxTok, BlockSize: B, IgnoreEOS: true})
						checkLossless(t, res, evs, want, B)
						if st := res.Stats; st.RunAhead != ahead || st.RunAheadFallback != "" {
							t.Errorf("run ahead %v (fallback %q), asked %v", st.RunAhead, st.RunAheadFallback, ahead)
						}
					})
				}
			}
		}
	}
}

// Rollback exactness in the serial loop: a scripted drafter makes every acceptance length
// 0..B−1 and full acceptance happen, and after every cycle each layer's cache (KV rows,
// conv tail, recurrent state) equals, bit for bit on the CPU, that of a fresh plain
// decoding of the committed tokens (compareWithDecoding); the tokens are plain decoding's.
func TestHybridScriptedRollbackMatchesFreshRun(t *testing.T) {
	testenv.RequireShapeExact(t) // the scripted drafts are plain decoding's tokens
	moe := decisiveHybrid(34)    // the hybrid with a sparse MoE MLP in every layer (qwen3_5_moe)
	moe.Experts, moe.TopK, moe.MoEInter, moe.SharedInter, moe.NormTopK = 8, 2, 64, 64, true
	scriptedRollback(t, "bf16", hybridPairs(t)["bf16"])
	scriptedRollback(t, "moe", loadHybridPair(t, "hybrid-decisive-moe", moe, 2))
}

func scriptedRollback(t *testing.T, name string, p *pair) {
	prompt := []int32{4, 8, 15, 16, 23, 42}
	const N = 180 // one schedule of B = 16 (0..16 accepted) commits 153 tokens
	want := plainGreedy(t, p, prompt, N)
	ref := append(append([]int32(nil), prompt...), want...)
	for _, B := range []int{4, 16} {
		t.Run(fmt.Sprintf("%s/B%d", name, B), func(t *testing.T) {
			sched := func(cycle, n int) int { return cycle % (B + 1) } // 0..B−1 and "all"
			sp := &verify.Scripted{Ref: ref, Correct: sched, Vocab: p.vocab, Block: B}
			e := &Engine{Target: p.target, Proposer: sp}
			checked := 0
			ref := newDecodingRef(p, len(prompt))
			defer ref.free()
			e.afterCycle = func(c model.Cache, committed []int32) {
				checked++
				ref.compare(t, c, committed)
			}
			res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: B, IgnoreEOS: true})
			if i, ok := eqTokens(res.Tokens, want); !ok {
				t.Fatalf("diverges at %d", i)
			}
			for a := 0; a < B; a++ {
				if res.Stats.AcceptHist[a] == 0 {
					t.Errorf("acceptance length %d never happened: %v", a, res.Stats.AcceptHist)
				}
			}
			if checked < N/B {
				t.Errorf("only %d cycles checked", checked)
			}
		})
	}
}

// Rollback exactness in the run-ahead loop, with the next cycle already in flight when the
// caches are compared: replayed acceptance counts (every length 0..B−1 and full, committed
// whatever the drafts were, as bench --replay-drafts does) leave the target caches and the
// draft cache equal to a fresh run's over the committed tokens, and the serial loop
// commits the same tokens with the same statistics. The hybrid, its MoE sibling and the
// qwen3_moe target run it.
func TestHybridRunAheadRollbackMatchesFreshRun(t *testing.T) {
	moe := moePairs(t)
	for _, c := range []struct {
		name string
		p    *pair
	}{{"qwen3_5-bf16", hybridPairs(t)["bf16"]}, {"qwen3_5_moe", moe["qwen3_5_moe-bf16"]}, {"qwen3_moe", moe["qwen3_moe-e16k4"]}} {
		t.Run(c.name, func(t *testing.T) { runAheadRollback(t, c.p) })
	}
}

func runAheadRollback(t *testing.T, p *pair) {
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	const B, N = 8, 90
	replay := func() func(n int) int {
		i := 0
		return func(n int) int { i++; return i % (n + 2) } // n+1 (beyond n) clamps to full acceptance
	}
	var results [2]Result
	for k, ahead := range []bool{false, true} {
		dfl := verify.NewDFlash(p.drft)
		e := &Engine{Target: p.target, Proposer: dfl, RunAhead: ahead, ReplayAccept: replay()}
		checked := 0
		e.afterCycle = func(c model.Cache, committed []int32) {
			checked++
			compareWithFresh(t, p, c, committed, dfl)
		}
		results[k], _ = run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: B, IgnoreEOS: true})
		if results[k].Stats.RunAhead != ahead {
			t.Fatalf("run ahead %v (fallback %q), asked %v", results[k].Stats.RunAhead, results[k].Stats.RunAheadFallback, ahead)
		}
		if checked < 10 {
			t.Errorf("ahead %v: only %d cycles checked", ahead, checked)
		}
		for a := 0; a < B; a++ {
			if results[k].Stats.AcceptHist[a] == 0 {
				t.Errorf("ahead %v: acceptance length %d never happened: %v", ahead, a, results[k].Stats.AcceptHist)
			}
		}
	}
	loop, ahead := results[0], results[1]
	if i, ok := eqTokens(ahead.Tokens, loop.Tokens); (!ok || len(ahead.Tokens) != len(loop.Tokens)) && testenv.ShapeExact() {
		t.Fatalf("tokens differ at %d:\n ahead %v\n loop  %v", i, ahead.Tokens, loop.Tokens)
	}
	if a, l := ahead.Stats, loop.Stats; a.Cycles != l.Cycles || a.Accepted != l.Accepted || fmt.Sprint(a.AcceptHist) != fmt.Sprint(l.AcceptHist) {
		t.Errorf("stats: ahead %d cycles, %d accepted, %v; loop %d, %d, %v", a.Cycles, a.Accepted, a.AcceptHist, l.Cycles, l.Accepted, l.AcceptHist)
	}
}

// decodingRef compares the caches after each cycle with those of a fresh plain decoding of
// the committed tokens: the prompt but its last token in one forward, then one token per
// step, which is what a verify row computes in GPU-exact mode (on the CPU always). The
// reference decodes only the tokens committed since the last comparison (committed grows
// by appending). A single long prefill is no reference on a GPU for a hybrid: its products
// and its conv round otherwise, and the recurrent state carries the differences through
// every later layer. On a GPU the bound is freshExceeds'.
type decodingRef struct {
	p         *pair
	promptLen int
	c         model.Cache // nil until the first comparison
	done      int         // tokens the reference has taken
}

func newDecodingRef(p *pair, promptLen int) *decodingRef {
	return &decodingRef{p: p, promptLen: promptLen}
}

// compare runs on the MLX thread (inside the loop's hook).
func (r *decodingRef) compare(t *testing.T, c model.Cache, committed []int32) {
	t.Helper()
	s := mlxc.NewScope()
	defer s.Close()
	if c.Offset() != len(committed) {
		t.Errorf("target cache offset %d, committed %d", c.Offset(), len(committed))
		return
	}
	if r.c == nil {
		r.c = r.p.target.NewCache()
		if n := r.promptLen - 1; n > 0 {
			r.p.target.Forward(mlxc.FromSlice(committed[:n], 1, n), r.c, model.ForwardOptions{Logits: model.LogitsNone})
			r.done = n
		}
	}
	for ; r.done < len(committed); r.done++ {
		r.p.target.Forward(mlxc.FromSlice(committed[r.done:r.done+1], 1, 1), r.c, model.ForwardOptions{Logits: model.LogitsNone})
		mlxc.Eval(r.c.Arrays()...)
	}
	compareCacheLayers(t, c, r.c, freshExceeds())
}

// free releases the reference's caches (on the MLX thread).
func (r *decodingRef) free() {
	if r.c != nil {
		_ = mlxc.Do(func() error { r.c.Free(); return nil })
	}
}
