package cli

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

// turnPoint is one turn of the multi-turn benchmark, with and without the prefix cache.
type turnPoint struct {
	Turn         int `json:"turn"`
	PromptTokens int `json:"prompt_tokens"`
	// PrefillTokens and ReusedTokens split the cached run's prompt: positions run through
	// the target and positions resumed from the prefix cache.
	PrefillTokens int `json:"prefill_tokens"`
	ReusedTokens  int `json:"reused_tokens"`
	// TTFT (median over the repeats) without and with the cache, and their ratio.
	TTFTMSUncached float64 `json:"ttft_ms_uncached"`
	TTFTMSCached   float64 `json:"ttft_ms_cached"`
	Speedup        float64 `json:"ttft_speedup"`
	// SameTokens: the cached run emitted the uncached run's tokens.
	SameTokens bool `json:"same_tokens"`
}

// turnsReport is `bench --multi-turn`'s result.
type turnsReport struct {
	Target    string            `json:"target_model"`
	Draft     string            `json:"draft_model,omitempty"`
	Note      string            `json:"note,omitempty"`
	Mode      string            `json:"mode"`
	MaxTokens int               `json:"max_new_tokens"`
	Repeats   int               `json:"repeats"`
	Turns     []turnPoint       `json:"turns"`
	Cache     prefixcache.Stats `json:"prompt_cache"`
	Template  bool              `json:"chat_template"`
}

// benchMultiTurn runs a chat of turns turns: each turn's prompt is the conversation so far
// (through the chat template when the model has one; else the token ids so far and new
// random ones) and its answer joins the history. Every turn runs without and with a prefix
// cache, alternating, in this process; the cached runs share one cache as a chat would.
func benchMultiTurn(c *cli.Context, s *Session, turns int, note string) error {
	ctx := context.Background()
	n, repeats := c.Int("max-new-tokens"), max(1, c.Int("repeats"))
	texts := benchPrompts
	rep := turnsReport{Target: s.TargetRef, Draft: s.DraftRef, Note: note, MaxTokens: n, Repeats: repeats, Mode: "dflash"}
	if s.Engine.Proposer == nil {
		rep.Mode = "plain"
	}
	// One cache per repeat, each of which has seen the earlier turns once: every cached
	// run is a chat's next turn, never a repeat of its own prompt.
	pcs := make([]*prefixcache.Cache, repeats)
	for i := range pcs {
		var err error
		if pcs[i], err = prefixcache.New(prefixcache.Options{}); err != nil {
			return err
		}
	}
	defer func() {
		_ = mlxc.Do(func() error {
			for _, pc := range pcs {
				pc.Free()
			}
			return nil
		})
	}()
	var err error
	useTemplate := s.Tok != nil && s.Tok.HasChatTemplate() && c.String("random") == ""
	rep.Template = useTemplate
	var history []tokenizer.Message
	var ids []int32 // the conversation's tokens without a template
	V := s.Engine.Target.Arch().VocabSize
	rng := rand.New(rand.NewPCG(7, 11))
	gen := func(prompt []int32, cache *prefixcache.Cache) (engine.Result, error) {
		s.Engine.Prefix = cache
		defer func() { s.Engine.Prefix = nil }()
		return s.Generate(ctx, engine.Request{Prompt: prompt, PrefixMarks: s.PrefixMarks(prompt), MaxTokens: n, IgnoreEOS: true, BlockSize: c.Int("block-size"),
			Detok: s.Tok.NewStreamDecoder(true)}, nil)
	}
	for turn := 1; turn <= turns; turn++ {
		var prompt []int32
		if useTemplate {
			history = append(history, tokenizer.NewMessage("user", texts[(turn-1)%len(texts)]))
			f := false
			if prompt, err = s.ChatPrompt(history, tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: &f}); err != nil {
				return err
			}
		} else {
			ids = append(ids, randomIDs(rng, c.Int("prompt-tokens"), V)...)
			prompt = append([]int32(nil), ids...)
		}
		if len(prompt)+n >= s.Engine.ContextLen() {
			return fmt.Errorf("turn %d: %d prompt tokens and %d new ones exceed the context of %d", turn, len(prompt), n, s.Engine.ContextLen())
		}
		pt := turnPoint{Turn: turn, PromptTokens: len(prompt), SameTokens: true}
		var unc, cac []float64
		var answer engine.Result
		for r := 0; r < repeats; r++ {
			u, err := gen(prompt, nil)
			if err != nil {
				return err
			}
			k, err := gen(prompt, pcs[r])
			if err != nil {
				return err
			}
			unc = append(unc, ms(u.Stats.FirstTokenTime))
			cac = append(cac, ms(k.Stats.FirstTokenTime))
			if _, ok := sameTokens(u.Tokens, k.Tokens); !ok {
				pt.SameTokens = false
			}
			if r == 0 {
				pt.PrefillTokens, pt.ReusedTokens = k.Stats.PrefillTokens, k.Stats.PromptCacheTokens
				answer = u
			}
		}
		pt.TTFTMSUncached, pt.TTFTMSCached = median(unc), median(cac)
		if pt.TTFTMSCached > 0 {
			pt.Speedup = pt.TTFTMSUncached / pt.TTFTMSCached
		}
		rep.Turns = append(rep.Turns, pt)
		if useTemplate {
			history = append(history, tokenizer.NewMessage("assistant", answer.Text))
		} else {
			ids = append(ids, answer.Tokens...)
		}
	}
	rep.Cache = pcs[0].Stats()
	if c.Bool("json") {
		return printJSON(rep)
	}
	fmt.Printf("multi-turn %s, %s (%d new tokens a turn, median of %d; prompt cache %s, peak %s)\n", rep.Mode, s.TargetRef, n, repeats,
		human(rep.Cache.Budget), human(rep.Cache.PeakBytes))
	if note != "" {
		fmt.Println(note)
	}
	fmt.Printf("%-5s %8s %9s %8s %12s %12s %8s %s\n", "turn", "prompt", "prefilled", "reused", "TTFT cold", "TTFT cached", "speedup", "same tokens")
	for _, t := range rep.Turns {
		fmt.Printf("%-5d %8d %9d %8d %10.1fms %10.1fms %7.2fx %s\n", t.Turn, t.PromptTokens, t.PrefillTokens, t.ReusedTokens,
			t.TTFTMSUncached, t.TTFTMSCached, t.Speedup, checkMark(&t.SameTokens, "?"))
	}
	for _, t := range rep.Turns {
		if !t.SameTokens {
			// Bit-equal only where rows round alike whatever the prefill's chunking (the CPU).
			fmt.Fprintln(os.Stderr, "note: the cached runs' tokens differ from the uncached ones (a near-tie rounded apart by a different prefill chunking)")
			break
		}
	}
	return nil
}
