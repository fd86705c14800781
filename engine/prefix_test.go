package engine

import (
	"fmt"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// prefixLoops are the loops a cached request can run in.
var prefixLoops = []struct {
	name         string
	draft, ahead bool
}{
	{"plain", false, false},
	{"serial", true, false},
	{"ahead", true, true},
}

func newPrefixCache(t *testing.T, budget int64, every int) *prefixcache.Cache {
	t.Helper()
	c, err := prefixcache.New(prefixcache.Options{Budget: budget, MarkEvery: every})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A request resumed from the prefix cache emits the uncached request's tokens, greedy and
// seeded sampling, in the plain, serial and run-ahead loops, for Qwen3 and Qwen3.5
// targets: a second turn (the first turn's prompt and answer and new tokens), the same
// prompt again (a full hit), a prompt that leaves the cached one part way (attention
// layers resume at the common prefix, recurrent ones at the last mark before it), and
// after the budget evicted entries. The statistics count what was reused.
func TestPrefixCacheMatchesUncached(t *testing.T) {
	if testenv.GPU() {
		// A resumed prefill runs the rest of the prompt as other chunks, which a GPU rounds
		// apart (its products pick kernels by row count) even in GPU-exact mode.
		t.Skip("needs rows that round alike whatever the prefill's chunking: the CPU backend")
	}
	mtp := mtpTargets(t)["bf16"]
	pairs := []struct {
		name      string
		p         *pair
		recurrent bool
		mtp       bool // draft with the target's MTP head
	}{
		{"qwen3", loadPair(t, "decisive-bf16", decisiveSpec(11), 2), false, false},
		{"qwen35", loadHybridPair(t, "hybrid-decisive-bf16", decisiveHybrid(31), 2), true, false},
		{"qwen3-dflash2", dflash2Pairs(t)["qwen3-bf16"], false, false},
		{"qwen35-dflash2", dflash2Pairs(t)["qwen35-bf16"], true, false},
		{"qwen35-mtp", &pair{target: mtp, vocab: mtp.Arch().VocabSize}, true, true},
	}
	const every = 4
	for _, pc := range pairs {
		v := pc.p.vocab
		turn1 := []int32{5, 9, 2, 77, 31, 64, 64, 2, 1, 40, 41, 42, 43, 44, 45, 46, 47}
		for _, lp := range prefixLoops {
			for _, sp := range []sample.Params{{}, {Temperature: 0.8, TopP: 0.95, Seed: 7}} {
				name := fmt.Sprintf("%s/%s/T%v", pc.name, lp.name, sp.Temperature)
				t.Run(name, func(t *testing.T) {
					newEngine := func(pcache *prefixcache.Cache) *Engine {
						e := &Engine{Target: pc.p.target, RunAhead: lp.ahead, Prefix: pcache}
						switch {
						case lp.draft && pc.mtp:
							e.Proposer = verify.NewMTP(mtp.MTP(), 4)
						case lp.draft:
							e.Proposer = proposerOf(pc.p.drft)
						}
						return e
					}
					uncached := newEngine(nil)
					req := func(prompt []int32, n int) Request {
						// A mark at 10 (a message start, as the CLI marks them) besides every 4.
						return Request{Prompt: prompt, MaxTokens: n, Sampling: sp, IgnoreEOS: true, BlockSize: 4, PrefixMarks: []int{10}}
					}
					pcache := newPrefixCache(t, 0, every)
					defer pcache.Free()
					cached := newEngine(pcache)
					check := func(step string, prompt []int32, n, wantReused int) Result {
						t.Helper()
						want, _ := run(t, uncached, req(prompt, n))
						got, _ := run(t, cached, req(prompt, n))
						if i, ok := eqTokens(got.Tokens, want.Tokens); !ok {
							t.Fatalf("%s: tokens differ from the uncached run at %d:\n got %v\nwant %v", step, i, got.Tokens, want.Tokens)
						}
						if r := got.Stats.PromptCacheTokens; (wantReused >= 0 && r != wantReused) || got.Stats.PrefillTokens != len(prompt)-r {
							t.Errorf("%s: reused %d, prefilled %d of %d prompt tokens; want %d reused", step, r, got.Stats.PrefillTokens, len(prompt), wantReused)
						}
						return got
					}
					a := check("turn 1", turn1, 12, 0)
					turn2 := append(append(append([]int32(nil), turn1...), a.Tokens...), 3, 4, int32(v-2), 8, 8)
					// The end of turn 1 holds the prompt and every answer token but the last
					// (which no step has run yet).
					b := check("turn 2", turn2, 9, len(turn1)+len(a.Tokens)-1)
					turn3 := append(append(append([]int32(nil), turn2...), b.Tokens...), 11, 12)
					check("turn 3", turn3, 6, len(turn2)+len(b.Tokens)-1)
					check("same prompt", turn1, 12, len(turn1)-1)
					// 10 common tokens: every layer resumes there (a requested mark); 7: attention
					// layers resume there, recurrent layers at the last mark before it.
					branch := append(append([]int32(nil), turn1[:10]...), 100, 101, 102, 103)
					check("branch at a mark", branch, 7, 10)
					branch7 := append(append([]int32(nil), turn1[:7]...), 100, 101, 102, 103)
					partial := 7
					if pc.recurrent {
						partial = 7 / every * every
					}
					check("branch", branch7, 7, partial)
					if st := pcache.Stats(); st.Hits < 4 || st.Bytes > st.Budget || st.Entries == 0 {
						t.Errorf("cache stats %+v", st)
					}

					// A budget that holds about one entry: every new prompt evicts, and the
					// answers stay the uncached ones.
					small := newPrefixCache(t, pcache.Stats().PeakBytes*4/10, every)
					defer small.Free()
					cached = newEngine(small)
					for i, p := range [][]int32{turn1, branch, turn2, turn1, turn3} {
						check(fmt.Sprintf("small budget %d", i), p, 5, -1)
					}
					if st := small.Stats(); st.Evictions+st.Rejected == 0 || st.PeakBytes > st.Budget {
						t.Errorf("small budget stats %+v: want evictions and the budget never exceeded", st)
					}
				})
			}
		}
	}
}

// A drafter context window changes the drafts, never the output: with a long prompt, DFlash
// through a window of 32 rows (8 sink rows) emits plain decoding's tokens in both loops.
func TestDraftWindowKeepsOutput(t *testing.T) {
	testenv.RequireShapeExact(t)
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := make([]int32, 300)
	for i := range prompt {
		prompt[i] = int32((i*37 + 11) % p.vocab)
	}
	want := plainGreedy(t, p, prompt, 40)
	p.drft.ContextWindow, p.drft.ContextSink = 32, 8
	defer func() { p.drft.ContextWindow, p.drft.ContextSink = 0, 0 }()
	for _, ahead := range []bool{false, true} {
		e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: ahead}
		res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: 40, BlockSize: 8, IgnoreEOS: true})
		checkLossless(t, res, evs, want, 8)
		if res.Stats.RunAhead != ahead {
			t.Errorf("run ahead %v, asked %v", res.Stats.RunAhead, ahead)
		}
	}
}
