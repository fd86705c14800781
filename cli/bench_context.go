package cli

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
)

// contextPoint is one prompt length of `bench --context`: plain decoding and DFlash after
// a prompt of that many tokens, medians of the repeats, run alternately in this process.
type contextPoint struct {
	Tokens   int     `json:"prompt_tokens"`
	PlainTPS float64 `json:"plain_tok_s"`
	DFlash   float64 `json:"dflash_tok_s"`
	Speedup  float64 `json:"speedup"`
	Tau      float64 `json:"tau"`
	// CycleMS is a DFlash cycle's time (decode time over cycles) and StepMS a plain step's.
	CycleMS float64 `json:"cycle_ms"`
	StepMS  float64 `json:"step_ms"`
	// ContextShare is the part of a cycle that the context adds over the shortest length
	// measured: (cycle − cycle at the first length) / cycle, attention over the cached keys
	// for the most part.
	ContextShare float64 `json:"context_share"`
	// KeepsSpeed is DFlash's tok/s here over its tok/s at the first length.
	KeepsSpeed float64 `json:"keeps_speed"`
	TTFTMS     float64 `json:"ttft_ms"`
	PeakBytes  uint64  `json:"peak_memory_bytes"`
}

type contextReport struct {
	Target    string         `json:"target_model"`
	Draft     string         `json:"draft_model"`
	Note      string         `json:"note,omitempty"`
	MaxTokens int            `json:"max_new_tokens"`
	Repeats   int            `json:"repeats"`
	Replay    *float64       `json:"replay_error_rate,omitempty"`
	Points    []contextPoint `json:"points"`
}

// contextPrompt makes a prompt of exactly n tokens: built-in text through the model's
// tokenizer, repeated and cut to n (random token ids for --random shapes' stand-in
// tokenizer, as the table's prompts are).
func contextPrompt(c *cli.Context, s *Session, n int) ([]int32, error) {
	if s.Tok != nil && c.String("random") == "" {
		var ids []int32
		for i := 0; len(ids) < n; i++ {
			more, err := s.Tok.Encode(benchPrompts[i%len(benchPrompts)]+"\n", false)
			if err != nil {
				return nil, err
			}
			if len(more) == 0 {
				return nil, fmt.Errorf("the tokenizer made no tokens of the built-in text")
			}
			ids = append(ids, more...)
		}
		return ids[:n], nil
	}
	return randomIDs(rand.New(rand.NewPCG(uint64(n), 5)), n, s.Engine.Target.Arch().VocabSize), nil
}

// benchContext runs plain decoding and DFlash after prompts of each length.
func benchContext(c *cli.Context, s *Session, lengths []int, note string, replay float64) error {
	ctx := context.Background()
	n, repeats := c.Int("max-new-tokens"), max(1, c.Int("repeats"))
	rep := contextReport{Target: s.TargetRef, Draft: s.DraftRef, Note: note, MaxTokens: n, Repeats: repeats}
	if replay >= 0 {
		rep.Replay = &replay
	}
	for _, L := range lengths {
		if L < 2 || L+n+s.Engine.Proposer.BlockSize() > s.Engine.ContextLen() {
			return cli.Exit(fmt.Sprintf("--context %d: a prompt of 2 up to %d tokens fits %d new ones in the context of %d", L, s.Engine.ContextLen()-n-s.Engine.Proposer.BlockSize(), n, s.Engine.ContextLen()), 2)
		}
	}
	for _, L := range lengths {
		prompt, err := contextPrompt(c, s, L)
		if err != nil {
			return err
		}
		run := func(noDraft bool, r int) (engine.Result, error) {
			if replay >= 0 && !noDraft {
				s.Engine.ReplayAccept = replayAccept(replay, replaySeed(L, r))
				defer func() { s.Engine.ReplayAccept = nil }()
			}
			return s.Generate(ctx, engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, NoDraft: noDraft, BlockSize: c.Int("block-size")}, nil)
		}
		for w := 0; w < c.Int("warmup"); w++ {
			if _, err := run(true, -1-w); err != nil {
				return err
			}
			if _, err := run(false, -1-w); err != nil {
				return err
			}
		}
		var plain, dfl, taus, cyc, step, ttft []float64
		var peak uint64
		for r := 0; r < repeats; r++ {
			p, err := run(true, r)
			if err != nil {
				return err
			}
			d, err := run(false, r)
			if err != nil {
				return err
			}
			plain = append(plain, p.Stats.GenerationTPS)
			dfl = append(dfl, d.Stats.GenerationTPS)
			taus = append(taus, d.Stats.Tau)
			cyc = append(cyc, ms(d.Stats.DecodeTime)/float64(max(1, d.Stats.Cycles)))
			step = append(step, ms(p.Stats.DecodeTime)/float64(max(1, p.Stats.GeneratedTokens-1)))
			ttft = append(ttft, ms(d.Stats.FirstTokenTime))
			peak = max(peak, d.Stats.PeakMemory, p.Stats.PeakMemory)
		}
		pt := contextPoint{Tokens: L, PlainTPS: median(plain), DFlash: median(dfl), Tau: median(taus), CycleMS: median(cyc),
			StepMS: median(step), TTFTMS: median(ttft), PeakBytes: peak}
		if pt.PlainTPS > 0 {
			pt.Speedup = pt.DFlash / pt.PlainTPS
		}
		if len(rep.Points) > 0 {
			first := rep.Points[0]
			if pt.CycleMS > 0 {
				pt.ContextShare = max(0, (pt.CycleMS-first.CycleMS)/pt.CycleMS)
			}
			if first.DFlash > 0 {
				pt.KeepsSpeed = pt.DFlash / first.DFlash
			}
		} else {
			pt.KeepsSpeed = 1
		}
		rep.Points = append(rep.Points, pt)
	}
	if c.Bool("json") {
		return printJSON(rep)
	}
	fmt.Printf("context sweep, %s + %s (%d new tokens, median of %d)\n", s.TargetRef, s.DraftRef, n, repeats)
	if note != "" {
		fmt.Println(note)
	}
	fmt.Printf("%8s %10s %10s %8s %6s %9s %9s %8s %8s %10s %10s\n", "prompt", "plain t/s", "dflash t/s", "speedup", "tau", "cycle ms", "step ms", "ctx part", "keeps", "TTFT ms", "peak")
	for _, p := range rep.Points {
		fmt.Printf("%8d %10.1f %10.1f %7.2fx %6.2f %9.2f %9.2f %7.0f%% %7.0f%% %10.0f %10s\n", p.Tokens, p.PlainTPS, p.DFlash, p.Speedup, p.Tau,
			p.CycleMS, p.StepMS, 100*p.ContextShare, 100*p.KeepsSpeed, p.TTFTMS, human(int64(p.PeakBytes)))
	}
	return nil
}

// parseLengths reads --context's comma-separated prompt lengths (k suffix: ×1024).
func parseLengths(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		if strings.HasSuffix(strings.ToLower(f), "k") {
			mult, f = 1024, f[:len(f)-1]
		}
		var v int
		if _, err := fmt.Sscanf(f, "%d", &v); err != nil || v*mult < 2 || fmt.Sprint(v) != f {
			return nil, fmt.Errorf("--context %q: want prompt lengths like 512,2k,8k,32k", s)
		}
		out = append(out, v*mult)
	}
	return out, nil
}
