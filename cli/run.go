package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/grammar"
	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/structured"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

func runCommand() *cli.Command {
	flags := append(modelFlags(), samplingFlags()...)
	flags = append(flags, promptCacheFlags(false)...)
	flags = append(flags, gpuExactFlag(),
		&cli.StringFlag{Name: "prompt", Aliases: []string{"p"}, Usage: "the prompt; without it, stdin is read"},
		&cli.StringFlag{Name: "system", Usage: "system message"},
		&cli.BoolFlag{Name: "no-chat-template", Usage: "send the prompt as raw text, without the chat template"},
		&cli.BoolFlag{Name: "enable-thinking", Usage: "let Qwen3 think (<think>…</think>) before answering"},
		&cli.BoolFlag{Name: "stats", Usage: "print statistics to stderr when done"},
		&cli.BoolFlag{Name: "json", Usage: "print one JSON object (text, finish reason, statistics) instead of streaming"},
		&cli.BoolFlag{Name: "profile", Usage: "split draft and verify time (adds a sync per cycle)"},
		&cli.BoolFlag{Name: "ignore-eos", Usage: "keep generating past end-of-sequence tokens (benchmarks)"},
		&cli.StringFlag{Name: "json-schema", Usage: "answer with JSON valid for the JSON Schema in `FILE`, enforced token by token"},
		&cli.StringFlag{Name: "grammar", Usage: "answer with text the Lark grammar in `FILE` matches (llguidance's dialect), enforced token by token"},
	)
	return &cli.Command{
		Name:      "run",
		Usage:     "generate a completion for one prompt, streaming tokens as they are verified",
		ArgsUsage: " ",
		Description: `Generates with the target model, using its DFlash drafter when one is known.
The prompt goes through the model's chat template unless --no-chat-template.

Examples:
  dflash-mlx run --prompt "Write a haiku about GPUs."
  echo "Summarise: ..." | dflash-mlx run --max-new-tokens 200 --stats
  dflash-mlx run --target-model ./my-model --draft-model ./my-draft --json
  dflash-mlx run --prompt "Invent a user." --json-schema user.schema.json
  dflash-mlx run --prompt "Pick a colour." --grammar colour.lark   # start: "red" | "green"

With --json-schema or --grammar the answer follows the schema or grammar: each token
is chosen among those it allows (the drafts are checked against it too), thinking is
off, and the answer ends where the grammar does.`,
		Flags:  flags,
		Action: runAction,
	}
}

func readPrompt(c *cli.Context) (string, error) {
	if c.IsSet("prompt") {
		return c.String("prompt"), nil
	}
	if isTerminal(os.Stdin) {
		return "", cli.Exit("no prompt: pass --prompt or pipe text on stdin", 2)
	}
	b, err := io.ReadAll(os.Stdin)
	if err != nil {
		return "", fmt.Errorf("read stdin: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

func runAction(c *cli.Context) (err error) {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("unexpected argument %q (use --prompt)", c.Args().First()), 2)
	}
	sp, err := samplingParams(c)
	if err != nil {
		return err
	}
	constraint, err := runConstraint(c)
	if err != nil {
		return err
	}
	prompt, err := readPrompt(c)
	if err != nil {
		return err
	}
	if prompt == "" {
		return cli.Exit("empty prompt", 2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg := loadConfig(c)
	if cfg.PromptCache, err = promptCacheConfig(c); err != nil {
		return err
	}
	s, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	defer func() {
		if err == nil {
			s.AwaitRanks()
		}
	}()
	s.Notice(s.BlockSizeNote(c.Int("block-size")))
	var ids []int32
	if c.Bool("no-chat-template") {
		ids, err = s.Tok.Encode(prompt, true)
	} else {
		var msgs []tokenizer.Message
		if sys := c.String("system"); sys != "" {
			msgs = append(msgs, tokenizer.NewMessage("system", sys))
		}
		msgs = append(msgs, tokenizer.NewMessage("user", prompt))
		think := c.Bool("enable-thinking") && constraint == nil
		ids, err = s.ChatPrompt(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: &think})
	}
	if err != nil {
		return err
	}
	if err := s.CheckRoom(len(ids), c.Int("max-new-tokens"), c.IsSet("max-new-tokens")); err != nil {
		return err
	}
	req := engine.Request{
		Prompt:      ids,
		PrefixMarks: s.PrefixMarks(ids),
		MaxTokens:   c.Int("max-new-tokens"),
		Sampling:    sp,
		StopTokens:  s.StopTokens(),
		BlockSize:   c.Int("block-size"),
		Detok:       s.Tok.NewStreamDecoder(true),
		Profile:     c.Bool("profile"),
		IgnoreEOS:   c.Bool("ignore-eos"),
	}
	if req.IgnoreEOS {
		req.StopTokens = nil
	}
	if constraint != nil {
		g := newGrammars(s)
		defer g.close()
		m, err := g.matcher(*constraint)
		if err == nil {
			defer m.Close()
			err = m.startable()
		}
		if err != nil {
			return cli.Exit(fmt.Sprintf("%s: %v", constraintFlag(c), err), 2)
		}
		req.Constraint = m
	}
	jsonOut := c.Bool("json")
	start := time.Now()
	res, err := s.Generate(ctx, req, func(ev engine.Event) error {
		if !jsonOut && ev.Text != "" {
			fmt.Print(ev.Text)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !jsonOut {
		fmt.Println()
	}
	out := runOutput{
		Text: res.Text, FinishReason: res.FinishReason, TargetModel: s.TargetRef, DraftModel: s.DraftRef,
		DraftKind: s.DraftKind(), TargetDir: s.TargetDir, DraftDir: s.DraftDir, Stats: res.Stats, WallSeconds: time.Since(start).Seconds(),
		LoadSeconds: s.LoadTime.Seconds(), Tokens: res.Tokens, Kernels: s.Kernels,
	}
	_ = mlxc.Do(func() error {
		out.CompileCache, out.CompileAhead, out.FusedAhead = mlxc.CompileCache(), mlxc.CompileAhead(), mlxc.FusedAhead()
		return nil
	})
	if out.Tokens == nil {
		out.Tokens = []int32{} // a list, empty when nothing was generated, never null
	}
	if jsonOut {
		return printJSON(out)
	}
	if c.Bool("stats") {
		printRunStats(os.Stderr, out)
	}
	return nil
}

type runOutput struct {
	Text         string  `json:"text"`
	Tokens       []int32 `json:"tokens"`
	FinishReason string  `json:"finish_reason"`
	TargetModel  string  `json:"target_model"`
	DraftModel   string  `json:"draft_model,omitempty"`
	// DraftKind is the drafter's generation: "dflash" or "dflash2".
	DraftKind string       `json:"draft_kind,omitempty"`
	TargetDir string       `json:"target_dir"`
	DraftDir  string       `json:"draft_dir,omitempty"`
	Stats     engine.Stats `json:"stats"`
	// Kernels is every custom kernel's state on this device (the self-check's verdicts);
	// Stats.KernelCalls says which ran.
	Kernels     []kernelcheck.State `json:"kernels"`
	WallSeconds float64             `json:"wall_seconds"`
	LoadSeconds float64             `json:"load_seconds"`
	// CompileCache counts the CUDA kernels this process took from the compiled-kernel
	// cache and those NVRTC compiled (a first run pays the compiles once).
	CompileCache mlxc.CompileCacheStats `json:"compile_cache"`
	// CompileAhead counts the custom kernels compiled before MLX asked for them, in
	// processes of their own (mlxc/ahead.go).
	CompileAhead mlxc.AheadStats `json:"compile_ahead"`
	// FusedAhead counts MLX's fused kernels compiled by processes that ran the same
	// compiled functions (mlxc/fusedahead.go).
	FusedAhead mlxc.FusedStats `json:"fused_ahead"`
}

func printRunStats(w io.Writer, o runOutput) {
	st := o.Stats
	fmt.Fprintf(w, "── %s ", st.Mode)
	if st.RunAhead {
		fmt.Fprint(w, "run-ahead ")
	}
	if st.RunAheadFallback != "" {
		fmt.Fprintf(w, "serial loop (no run-ahead: %s) ", st.RunAheadFallback)
	}
	if o.DraftModel != "" {
		fmt.Fprintf(w, "(target %s, draft %s)", o.TargetModel, o.DraftModel)
	} else {
		fmt.Fprintf(w, "(target %s)", o.TargetModel)
	}
	fmt.Fprintf(w, "\nprompt:     %d tokens, %.1f tok/s (time to first token %.0f ms)\n", st.PromptTokens, st.PromptTPS, ms(st.FirstTokenTime))
	if st.PromptCacheTokens > 0 {
		fmt.Fprintf(w, "            %d resumed from the prompt cache, %d prefilled\n", st.PromptCacheTokens, st.PrefillTokens)
	}
	fmt.Fprintf(w, "generation: %d tokens, %.1f tok/s, finish %s\n", st.GeneratedTokens, st.GenerationTPS, o.FinishReason)
	if st.Mode == "dflash" && st.Cycles > 0 {
		fmt.Fprintf(w, "dflash:     %d cycles, τ = %.2f tokens/cycle, %d/%d drafts accepted\n", st.Cycles, st.Tau, st.Accepted, st.Drafted)
		fmt.Fprintf(w, "accepted:   %s\n", histogram(st.AcceptHist))
	}
	fmt.Fprintf(w, "time split: build %.0f ms, device wait %.0f ms, rollback %.1f ms, host %.0f ms", ms(st.BuildTime), ms(st.WaitTime), ms(st.RollbackTime), ms(st.HostTime))
	if st.DraftTime > 0 {
		fmt.Fprintf(w, " (draft %.0f ms, verify %.0f ms)", ms(st.DraftTime), ms(st.VerifyTime))
	}
	fmt.Fprintf(w, "\nmemory:     peak %s\n", human(int64(st.PeakMemory)))
	if cc := o.CompileCache; cc.Hits+cc.Compiles > 0 {
		fmt.Fprintf(w, "kernels:    %d compiled (NVRTC %.1f s), %d from the cache %s\n", cc.Compiles, cc.CompileSeconds, cc.Hits, cc.Dir)
		if ca := o.CompileAhead; ca.Submitted > 0 {
			fmt.Fprintf(w, "            ahead: %d submitted, %d compiled, %d cached before, %d failed; %d answered MLX (%.1f s waited), %d built otherwise by MLX\n",
				ca.Submitted, ca.Compiled, ca.Present, ca.Failed, ca.Answered, ca.Waited.Seconds(), ca.Mismatched)
		}
		if fa := o.FusedAhead; fa.Submitted+fa.ExportFailures > 0 {
			fmt.Fprintf(w, "            MLX's fused kernels: %d jobs, %d compiled, %d failed, %d not exported; %d answered MLX (%.1f s waited)\n",
				fa.Submitted, fa.Compiled, fa.Failed, fa.ExportFailures, fa.Answered, fa.Waited.Seconds())
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func histogram(h []int) string {
	var b strings.Builder
	for a, n := range h {
		if n > 0 {
			fmt.Fprintf(&b, "%d:%d ", a, n)
		}
	}
	return strings.TrimSpace(b.String())
}

// runConstraint reads --json-schema or --grammar (at most one): nil without either. A
// schema the engine cannot enforce is refused here, before the model loads.
func runConstraint(c *cli.Context) (*grammar.Grammar, error) {
	schema, lark := c.String("json-schema"), c.String("grammar")
	switch {
	case schema != "" && lark != "":
		return nil, cli.Exit("--json-schema and --grammar cannot be used together", 2)
	case schema != "":
		data, err := os.ReadFile(schema)
		if err != nil {
			return nil, cli.Exit(fmt.Sprintf("--json-schema: %v", err), 2)
		}
		if !json.Valid(data) {
			return nil, cli.Exit(fmt.Sprintf("--json-schema: %s is not valid JSON", schema), 2)
		}
		if err := structured.CheckSchema(data); err != nil {
			return nil, cli.Exit(fmt.Sprintf("--json-schema: %s: %v", schema, err), 2)
		}
		g := structured.Answer(data)
		return &grammar.Grammar{Kind: grammar.Kind(g.Kind), Source: g.Source}, nil
	case lark != "":
		data, err := os.ReadFile(lark)
		if err != nil {
			return nil, cli.Exit(fmt.Sprintf("--grammar: %v", err), 2)
		}
		return &grammar.Grammar{Kind: grammar.Lark, Source: string(data)}, nil
	}
	return nil, nil
}

// constraintFlag names the flag that gave the constraint, for errors.
func constraintFlag(c *cli.Context) string {
	if c.String("json-schema") != "" {
		return "--json-schema"
	}
	return "--grammar"
}
