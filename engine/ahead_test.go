package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// The run-ahead loop emits plain greedy decoding token for token, for bf16 and 4-bit
// targets, many prompts, lengths and block sizes; streamed tokens equal the result and the
// statistics add up.
func TestRunAheadEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	for _, sc := range []struct {
		name string
		spec modelgen.Qwen3Spec
	}{
		{"bf16", decisiveSpec(11)},
		{"4bit", func() modelgen.Qwen3Spec { s := decisiveSpec(12); s.QuantBits, s.QuantGroup = 4, 64; return s }()},
	} {
		p := loadPair(t, "decisive-"+sc.name, sc.spec, 2)
		for pi, prompt := range prompts(sc.spec.Vocab) {
			for _, maxTok := range []int{1, 2, 5, 37} {
				want := plainGreedy(t, p, prompt, maxTok)
				for _, B := range []int{2, 4, 8, 16} {
					t.Run(fmt.Sprintf("%s/p%d/n%d/B%d", sc.name, pi, maxTok, B), func(t *testing.T) {
						e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: true, aheadMode: os.Getenv("DFLASH_AHEAD_DEBUG")}
						res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: maxTok, BlockSize: B, IgnoreEOS: true})
						if i, ok := eqTokens(res.Tokens, want); !ok || len(res.Tokens) != len(want) {
							t.Fatalf("run-ahead diverges from plain at %d:\n got   %v\n plain %v", i, res.Tokens, want)
						}
						var streamed []int32
						for _, ev := range evs {
							streamed = append(streamed, ev.Tokens...)
						}
						if _, ok := eqTokens(streamed, res.Tokens); !ok || len(streamed) != len(res.Tokens) {
							t.Errorf("streamed %v, result %v", streamed, res.Tokens)
						}
						st := res.Stats
						if got := 1 + st.Cycles + st.Accepted; got < st.GeneratedTokens || got > st.GeneratedTokens+B {
							t.Errorf("1 + cycles %d + accepted %d = %d, generated %d", st.Cycles, st.Accepted, got, st.GeneratedTokens)
						}
						if res.FinishReason != FinishLength || !st.RunAhead {
							t.Errorf("finish %q, run ahead %v", res.FinishReason, st.RunAhead)
						}
					})
				}
			}
		}
	}
}

// The overlap modes used to tell a backend's fault from the loop's (cycles built only
// after the previous one is read; each cycle waited for once enqueued) emit the same
// tokens as plain decoding too.
func TestRunAheadModesEqualPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{5, 3, 5, 8, 9}
	want := plainGreedy(t, p, prompt, 30)
	for _, mode := range []string{"late", "eval"} {
		e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: true, aheadMode: mode}
		res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: 30, BlockSize: 8, IgnoreEOS: true})
		if i, ok := eqTokens(res.Tokens, want); !ok || len(res.Tokens) != len(want) || !res.Stats.RunAhead {
			t.Errorf("mode %s diverges from plain at %d:\n got   %v\n plain %v", mode, i, res.Tokens, want)
		}
	}
}

// The run-ahead loop's profile mode (cycles one at a time) emits the same tokens, counts the
// drafter's nodes apart from the rest, and splits a cycle into building, encoding and the
// device's remainder.
func TestRunAheadProfileMode(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{5, 3, 5, 8, 9}
	want := plainGreedy(t, p, prompt, 30)
	dump := filepath.Join(t.TempDir(), "cycle.txt")
	s := settings.Default()
	s.Diagnostics.GraphDump = dump
	e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: true, Settings: &s}
	res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: 30, BlockSize: 8, IgnoreEOS: true, Profile: true})
	// Equal to plain decoding where rounding does not depend on the shape; the profile is
	// checked everywhere.
	if i, ok := eqTokens(res.Tokens, want); (!ok || len(res.Tokens) != len(want)) && testenv.ShapeExact() {
		t.Fatalf("profiled run-ahead diverges from plain at %d:\n got   %v\n plain %v", i, res.Tokens, want)
	}
	checkGraphDump(t, dump)
	st := res.Stats
	if !st.RunAhead || st.Cycles == 0 {
		t.Fatalf("run ahead %v, %d cycles", st.RunAhead, st.Cycles)
	}
	if st.DraftNodes <= 0 || st.VerifyNodes <= 0 || st.CycleConstructTime <= 0 || st.CycleEncodeTime <= 0 {
		t.Errorf("profile fields unset: draft nodes %d, verify nodes %d, building %v, encoding %v", st.DraftNodes, st.VerifyNodes, st.CycleConstructTime, st.CycleEncodeTime)
	}
	sum := func(m map[string]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	if sum(st.DraftOps) != st.DraftNodes || sum(st.VerifyOps) != st.VerifyNodes {
		t.Errorf("ops by name add up to %d and %d, nodes %d and %d", sum(st.DraftOps), sum(st.VerifyOps), st.DraftNodes, st.VerifyNodes)
	}
	// The drafter runs 2 layers to the target's 4: fewer nodes than the verify.
	if st.DraftNodes >= st.VerifyNodes {
		t.Errorf("drafter %d nodes, verify %d: the split looks wrong", st.DraftNodes, st.VerifyNodes)
	}
}

// After every cycle of the run-ahead loop — with the next cycle already in flight — the
// target and draft caches hold what a fresh run over the committed tokens would.
func TestRunAheadCachesMatchFreshRun(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	const N = 60
	want := plainGreedy(t, p, prompt, N)
	dfl := verify.NewDFlash(p.drft)
	checked := 0
	e := &Engine{Target: p.target, Proposer: dfl, RunAhead: true}
	e.afterCycle = func(c model.Cache, committed []int32) {
		checked++
		compareWithFresh(t, p, c, committed, dfl)
	}
	res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: 8, IgnoreEOS: true})
	// A near-tie may flip a token where rounding depends on the shape; the caches are still
	// compared with the fresh run over whatever was committed.
	if _, ok := eqTokens(res.Tokens, want); !ok && testenv.ShapeExact() {
		t.Fatalf("output differs from plain")
	}
	if checked < 5 {
		t.Fatalf("only %d cycles checked", checked)
	}
}

// With replayed acceptance (bench --replay-drafts), the run-ahead loop commits exactly what
// the plain DFlash loop commits: the same tokens and the same cycle statistics.
func TestRunAheadReplayMatchesLoop(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{2, 7, 1, 8, 2, 8}
	replay := func() func(n int) int {
		i := 0
		return func(n int) int { i++; return (i * 5) % (n + 1) }
	}
	var results [2]Result
	for k, ahead := range []bool{false, true} {
		e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: ahead, ReplayAccept: replay()}
		results[k], _ = run(t, e, Request{Prompt: prompt, MaxTokens: 50, BlockSize: 8, IgnoreEOS: true})
	}
	loop, ahead := results[0], results[1]
	// The run-ahead verify attends through a device-placed window, the loop's through the
	// exact keys: the same tokens only where rounding does not depend on the shape. The
	// statistics follow the replayed acceptance and hold everywhere.
	if i, ok := eqTokens(ahead.Tokens, loop.Tokens); (!ok || len(ahead.Tokens) != len(loop.Tokens)) && testenv.ShapeExact() {
		t.Fatalf("tokens differ at %d:\n ahead %v\n loop  %v", i, ahead.Tokens, loop.Tokens)
	}
	a, l := ahead.Stats, loop.Stats
	if a.Cycles != l.Cycles || a.Accepted != l.Accepted || fmt.Sprint(a.AcceptHist) != fmt.Sprint(l.AcceptHist) {
		t.Errorf("stats: ahead %d cycles, %d accepted, %v; loop %d, %d, %v", a.Cycles, a.Accepted, a.AcceptHist, l.Cycles, l.Accepted, l.AcceptHist)
	}
}

// Stop tokens, the token budget and stop strings end a run-ahead generation where they
// end the plain DFlash loop's, with the same finish reason (the cycle already in flight is
// dropped).
func TestRunAheadStops(t *testing.T) {
	testenv.RequireShapeExact(t) // the two loops' verify blocks attend differently
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{9, 8, 7, 6}
	want := plainGreedy(t, p, prompt, 40)
	stop := textOf(want)[11:15]
	for _, req := range []Request{
		{MaxTokens: 40, StopTokens: []int32{want[9]}},
		{MaxTokens: 7, IgnoreEOS: true},
		{MaxTokens: 23, IgnoreEOS: true, BlockSize: 4},
		{MaxTokens: 40, IgnoreEOS: true, Stop: []string{stop}, Detok: letters{}},
	} {
		req.Prompt = prompt
		var results [2]Result
		for k, ahead := range []bool{false, true} {
			e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: ahead}
			results[k], _ = run(t, e, req)
		}
		loop, ahead := results[0], results[1]
		if _, ok := eqTokens(ahead.Tokens, loop.Tokens); !ok || len(ahead.Tokens) != len(loop.Tokens) ||
			ahead.Text != loop.Text || ahead.FinishReason != loop.FinishReason {
			t.Errorf("max %d, stop tokens %v, stop %q: run-ahead %v %q %s; loop %v %q %s", req.MaxTokens, req.StopTokens, req.Stop,
				ahead.Tokens, ahead.Text, ahead.FinishReason, loop.Tokens, loop.Text, loop.FinishReason)
		}
	}
}

// With temperature > 0 the run-ahead loop draws the random keys in the plain loop's order:
// a seeded request samples the same tokens in both, for several block sizes and filters.
func TestRunAheadSamplingMatchesLoop(t *testing.T) {
	testenv.RequireShapeExact(t) // the two loops' verify blocks attend differently
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	for i, sp := range []sample.Params{
		{Temperature: 1, Seed: 3},
		{Temperature: 0.7, TopP: 0.9, Seed: 11},
		{Temperature: 1.3, TopK: 20, MinP: 0.05, Seed: 5},
	} {
		for _, B := range []int{4, 16} {
			req := Request{Prompt: prompts(p.spec.Vocab)[i%3], MaxTokens: 33, BlockSize: B, IgnoreEOS: true, Sampling: sp}
			var results [2]Result
			for k, ahead := range []bool{false, true} {
				e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: ahead}
				results[k], _ = run(t, e, req)
			}
			loop, ahead := results[0], results[1]
			if j, ok := eqTokens(ahead.Tokens, loop.Tokens); !ok || len(ahead.Tokens) != len(loop.Tokens) {
				t.Errorf("%+v B=%d: differs at %d:\n ahead %v\n loop  %v", sp, B, j, ahead.Tokens, loop.Tokens)
			}
			if ahead.Stats.Cycles != loop.Stats.Cycles || ahead.Stats.Accepted != loop.Stats.Accepted {
				t.Errorf("%+v B=%d: %d cycles, %d accepted; loop %d, %d", sp, B, ahead.Stats.Cycles, ahead.Stats.Accepted, loop.Stats.Cycles, loop.Stats.Accepted)
			}
		}
	}
}

// Which requests the run-ahead loop serves (the others go to the plain DFlash loop).
func TestRunAheadRequests(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), RunAhead: true}
	for _, tc := range []struct {
		sp   sample.Params
		want bool
	}{
		{sample.Params{}, true},
		{sample.Params{Temperature: 0.7}, true},
		{sample.Params{RepetitionPenalty: 1.1}, false},
		{sample.Params{Temperature: 0.7, RepetitionPenalty: 1.1}, false},
	} {
		if got := e.canRunAhead(Request{Sampling: tc.sp}); got != tc.want {
			t.Errorf("%+v: run ahead %v, want %v", tc.sp, got, tc.want)
		}
	}
	e.RunAhead = false
	if e.canRunAhead(Request{}) {
		t.Error("runs ahead with RunAhead off")
	}
	e.Proposer = &verify.Scripted{Vocab: 8, Block: 4}
	e.RunAhead = true
	if e.canRunAhead(Request{}) {
		t.Error("runs ahead with a proposer that cannot draft from device-side acceptance")
	}
}

var dumpHeader = regexp.MustCompile(`^# [a-z ]+: (\d+) nodes$`)

// checkGraphDump reads the graph dump's file (settings.Diagnostics.GraphDump): two sections (the drafter's nodes, the
// rest) whose headers count their lines, each line a node with its output shapes and inputs.
func checkGraphDump(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("graph dump: %v", err)
	}
	var sections []int
	lines := 0
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if m := dumpHeader.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			if len(sections) > 0 && lines != sections[len(sections)-1] {
				t.Errorf("section of %d nodes has %d lines", sections[len(sections)-1], lines)
			}
			sections, lines = append(sections, n), 0
			continue
		}
		if !strings.Contains(l, " <-") || !strings.Contains(l, "[") {
			t.Errorf("not a node line: %q", l)
		}
		lines++
	}
	if len(sections) != 2 || lines != sections[1] || sections[0] == 0 || sections[1] == 0 {
		t.Errorf("graph dump sections %v (last has %d lines):\n%s", sections, lines, b)
	}
}
