package engine

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// testGrammar is a Constraint with a rule simple enough to restate in a reference: after
// the tokens gen, token t is allowed when (t·31 + last·17 + len(gen)) mod k ≠ 0 (last:
// gen's last token, 0 at first), end tokens never, until length tokens have been
// consumed; then the grammar is complete and only the end tokens are allowed. About
// (k−1)/k of the vocabulary is allowed at each step, so an unconstrained model's choices
// are often outside it.
type testGrammar struct {
	V, k, length int
	ends         []int32
	gen          []int32
	calls        int // masks computed
}

func newTestGrammar(V, k, length int, ends ...int32) *testGrammar {
	return &testGrammar{V: V, k: k, length: length, ends: ends}
}

// stopAt reports whether the grammar is complete after n tokens.
func (g *testGrammar) stopAt(n int) bool { return n >= g.length }

// allows is the rule: whether tok may follow gen.
func (g *testGrammar) allows(gen []int32, tok int32) bool {
	if slices.Contains(g.ends, tok) {
		return g.stopAt(len(gen))
	}
	if g.stopAt(len(gen)) {
		return false
	}
	last := int32(0)
	if len(gen) > 0 {
		last = gen[len(gen)-1]
	}
	return (int(tok)*31+int(last)*17+len(gen))%g.k != 0
}

func (g *testGrammar) maskAfter(gen []int32, dst []uint32) {
	clear(dst)
	for v := range g.V {
		if g.allows(gen, int32(v)) {
			dst[v>>5] |= 1 << (v & 31)
		}
	}
	g.calls++
}

func (g *testGrammar) MaskWords() int { return (g.V + 31) / 32 }

func (g *testGrammar) MaskInto(dst []uint32) error {
	if len(dst) != (g.V+31)/32 {
		return fmt.Errorf("mask of %d words for %d tokens", len(dst), g.V)
	}
	g.maskAfter(g.gen, dst)
	return nil
}

func (g *testGrammar) ChainMasks(drafts []int32, dst []uint32) (int, error) {
	W := (g.V + 31) / 32
	if len(dst) != (len(drafts)+1)*W {
		return 0, fmt.Errorf("chain masks: %d words for %d drafts", len(dst), len(drafts))
	}
	gen := slices.Clone(g.gen)
	k := 0
	g.maskAfter(gen, dst[:W])
	for ; k < len(drafts) && g.allows(gen, drafts[k]); k++ {
		gen = append(gen, drafts[k])
		g.maskAfter(gen, dst[(k+1)*W:(k+2)*W])
	}
	for j := k + 1; j <= len(drafts); j++ {
		copy(dst[j*W:(j+1)*W], dst[k*W:(k+1)*W])
	}
	return k, nil
}

func (g *testGrammar) Consume(tokens ...int32) error {
	for _, t := range tokens {
		if !g.allows(g.gen, t) {
			return fmt.Errorf("token %d not allowed after %v", t, g.gen)
		}
		g.gen = append(g.gen, t)
	}
	return nil
}

func (g *testGrammar) Stopped() bool { return g.stopAt(len(g.gen)) }

func (g *testGrammar) Rollback(n int) error {
	if n > len(g.gen) {
		return fmt.Errorf("rollback of %d past the %d consumed", n, len(g.gen))
	}
	g.gen = g.gen[:len(g.gen)-n]
	return nil
}

// maskedBy sets logits [1, V] to −∞ where allowed(gen, v) is false (the references' own
// masking, independent of the engine's).
func maskedBy(logits *mlxc.Array, gen []int32, allowed func([]int32, int32) bool) *mlxc.Array {
	V := logits.Dim(1)
	ok := make([]bool, V)
	for v := range V {
		ok[v] = allowed(gen, int32(v))
	}
	return mlxc.Where(mlxc.FromSlice(ok, 1, V), logits, mlxc.Scalar(math.Inf(-1), logits.Dtype()))
}

// Constrained requests follow their grammar in every way the engine decodes: alone and
// batched, plain and speculating (DFlash and DFlash2; drafts the grammar rejects are
// rejected by the masked verify), with unconstrained rows beside them. Greedy output is
// the reference's (each step's argmax over the allowed tokens of the target's logits),
// every token is allowed, and the grammar's completion ends the request with "stop".
func TestConstrainedDecodingFollowsTheGrammar(t *testing.T) {
	testenv.RequireShapeExact(t)
	pairs := specPairs(t)
	for _, name := range []string{"dflash/qwen3-bf16", "dflash/qwen3_5-bf16", "dflash2/qwen3-bf16"} {
		p := pairs[name]
		t.Run(name, func(t *testing.T) {
			const length = 20
			ends := []int32{int32(p.vocab - 1)}
			reqs := []Request{
				{Prompt: []int32{1, 2, 3}, MaxTokens: 40},
				{Prompt: []int32{7, 9}, MaxTokens: 40, NoDraft: true},
				{Prompt: []int32{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 40, Sampling: sample.Params{Temperature: 0.9, TopP: 0.95, Seed: 3}},
				{Prompt: []int32{10, 20, 30}, MaxTokens: 12}, // the budget ends it before the grammar
				{Prompt: []int32{5, 6, 7, 8}, MaxTokens: 30}, // unconstrained
			}
			grammar := func(i int) *testGrammar {
				if i == 4 {
					return nil
				}
				return newTestGrammar(p.vocab, 3, length, ends...)
			}
			with := func(i int) (Request, *testGrammar) {
				r := reqs[i]
				r.StopTokens = ends
				g := grammar(i)
				if g != nil {
					r.Constraint = g
				}
				return r, g
			}
			e := &Engine{Target: p.target, Proposer: proposerOf(p.drft)}
			// Alone, with the greedy drafts chosen under the grammar (the default) and as the
			// drafter proposed them: the same tokens either way.
			unmasked := testSettings()
			unmasked.Loop.MaskDrafts = settings.Off
			eOwn := &Engine{Target: p.target, Proposer: proposerOf(p.drft), Settings: unmasked}
			alone := make([]Result, len(reqs))
			for i := range reqs {
				r, g := with(i)
				alone[i], _ = run(t, e, r)
				if g != nil {
					r2, _ := with(i)
					own, _ := run(t, eOwn, r2)
					if at, ok := eqTokens(own.Tokens, alone[i].Tokens); !ok || len(own.Tokens) != len(alone[i].Tokens) {
						t.Errorf("request %d: the drafter's own drafts give tokens that differ from drafts chosen under the grammar at %d", i, at)
					}
				}
				check := func(how string, res Result) {
					if g == nil {
						return
					}
					ref := newTestGrammar(p.vocab, 3, length, ends...)
					for j, tok := range res.Tokens {
						if !ref.allows(res.Tokens[:j], tok) {
							t.Fatalf("request %d %s: token %d (%d) not allowed after %v", i, how, j, tok, res.Tokens[:j])
						}
					}
					wantLen, wantFinish := length, FinishStop
					if r.MaxTokens < length {
						wantLen, wantFinish = r.MaxTokens, FinishLength
					}
					if len(res.Tokens) != wantLen || res.FinishReason != wantFinish {
						t.Errorf("request %d %s: %d tokens, finish %q; want %d, %q", i, how, len(res.Tokens), res.FinishReason, wantLen, wantFinish)
					}
					if r.Sampling.Greedy() {
						rr := r
						rr.Constraint = newTestGrammar(p.vocab, 3, length, ends...)
						if at, ok := eqTokens(res.Tokens, soloReference(t, p.target, rr)); !ok {
							t.Errorf("request %d %s: differs from masked greedy decoding at token %d", i, how, at)
						}
					}
					if res.Stats.Masks == 0 {
						t.Errorf("request %d %s: no masks counted", i, how)
					}
				}
				check("alone", alone[i])
				if i == 0 && alone[i].Stats.Drafted == 0 {
					t.Errorf("request 0 alone drafted nothing: %+v", alone[i].Stats)
				}
			}
			// Batched: every request's output is its output alone.
			s := e.NewScheduler(SchedulerConfig{MaxBatch: 8, PrefillSlice: time.Nanosecond})
			batched := make([]Request, len(reqs))
			for i := range reqs {
				batched[i], _ = with(i)
			}
			got := runConcurrently(t, s, batched)
			for i := range reqs {
				if at, ok := eqTokens(got[i].Tokens, alone[i].Tokens); !ok || len(got[i].Tokens) != len(alone[i].Tokens) {
					t.Errorf("request %d: batched output differs from alone at token %d:\n got %v\nwant %v", i, at, got[i].Tokens, alone[i].Tokens)
				}
				if got[i].FinishReason != alone[i].FinishReason {
					t.Errorf("request %d: batched finish %q, alone %q", i, got[i].FinishReason, alone[i].FinishReason)
				}
			}
		})
	}
}

// A constrained row sampling at T > 0 in a batch of speculating rows draws from the
// masked target distribution: each step's logits masked to the grammar's tokens, then
// filtered and renormalised (the χ² test of the first three tokens against the
// enumerated distribution).
func TestConstrainedSamplingMatchesMaskedTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("statistical test; skipped with -short")
	}
	for _, kind := range []string{"dflash", "dflash2"} {
		t.Run(kind, func(t *testing.T) {
			p := samplingPair(t, kind)
			sp := sample.Params{Temperature: 0.9, TopP: 0.97}
			prompt := []int32{1, 3, 5}
			rule := newTestGrammar(p.vocab, 2, 1000)
			exp := exactJointUnder(t, p.target, prompt, p.vocab, sp, rule.allows)
			e := &Engine{Target: p.target, Proposer: proposerOf(p.drft)}
			s := e.NewScheduler(SchedulerConfig{MaxBatch: 4})
			// Even rows constrained, odd ones not, in the same batches.
			obs, n := batchedFirstThree(t, s, prompt, sp, 1200, 4, func(r int, req *Request) bool {
				if r%2 == 1 {
					return false
				}
				req.Constraint = newTestGrammar(p.vocab, 2, 1000)
				return true
			})
			stat, df := chiSquare(obs, exp, n)
			crit := chiCritical(df, 3.09) // α = 0.001
			t.Logf("χ² = %.1f, df = %d, critical (α=0.001) = %.1f", stat, df, crit)
			if stat > crit {
				t.Errorf("distribution differs from the masked target's: χ² %.1f > %.1f", stat, crit)
			}
		})
	}
}

// Drafts chosen under a grammar: each position's most likely allowed candidate, the chain
// ending at the first position with none, the verify block's masks those along the chosen
// drafts, and the matcher back where it was.
func TestChooseDrafts(t *testing.T) {
	const V = 64
	g := newTestGrammar(V, 3, 100)
	if err := g.Consume(5); err != nil {
		t.Fatal(err)
	}
	c := &constrained{m: g}
	// Four candidates for each of four positions; which the grammar allows is worked out
	// with the grammar itself below.
	cands := []int32{1, 3, 4, 63, 7, 8, 10, 2, 1, 4, 7, 10, 2, 5, 8, 11}
	logits := []float32{9, 2, 8, 1, 9, 5, 9, 9, 1, 2, 3, 4, 1, 1, 1, 1}
	var want []int32
	gen := []int32{5}
	for i := 0; i < 4; i++ {
		best := int32(-1)
		var bl float32
		for j := i * 4; j < i*4+4; j++ {
			if g.allows(gen, cands[j]) && (best < 0 || logits[j] > bl) {
				best, bl = cands[j], logits[j]
			}
		}
		if best < 0 {
			break
		}
		want = append(want, best)
		gen = append(gen, best)
	}
	var st Stats
	var drafts, none []int32
	var rows []bool
	var errNone error
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		var allow *mlxc.Array
		var err error
		if drafts, allow, err = c.chooseDrafts(&st, V, cands, logits, 4); err != nil {
			return err
		}
		rows = mlxc.ToSlice[bool](allow)
		// No allowed candidate at the first position: no drafts.
		none, _, errNone = c.chooseDrafts(&st, V, []int32{1, 4, 7, 10}, []float32{1, 2, 3, 4}, 4)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(drafts) != fmt.Sprint(want) || len(want) < 2 {
		t.Fatalf("drafts %v, want %v (at least two)", drafts, want)
	}
	if len(g.gen) != 1 || g.gen[0] != 5 {
		t.Errorf("matcher left at %v, want [5]", g.gen)
	}
	if len(rows) != (len(drafts)+1)*V {
		t.Fatalf("masks of %d values, want %d rows of %d", len(rows), len(drafts)+1, V)
	}
	for j := 0; j <= len(drafts); j++ {
		prefix := append([]int32{5}, drafts[:j]...)
		for v := range V {
			if rows[j*V+v] != g.allows(prefix, int32(v)) {
				t.Fatalf("mask row %d token %d: %v, the grammar says %v", j, v, rows[j*V+v], g.allows(prefix, int32(v)))
			}
		}
	}
	if errNone != nil || len(none) != 0 {
		t.Errorf("no allowed candidate: drafts %v, %v", none, errNone)
	}
}
