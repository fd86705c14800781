package cli

import (
	"encoding/json"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/sample"
)

func modelFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "target-model", Aliases: []string{"model", "m"}, Value: DefaultTarget, Usage: "target model: Hugging Face ID or local folder", EnvVars: []string{"DFLASH_TARGET_MODEL"}},
		&cli.StringFlag{Name: "draft-model", Usage: "DFlash drafter (ID or folder); default: looked up from the target", EnvVars: []string{"DFLASH_DRAFT_MODEL"}},
		&cli.BoolFlag{Name: "no-draft", Usage: "plain decoding, no drafter"},
		&cli.StringFlag{Name: "draft-kind", Value: "auto", Usage: "what drafts: auto (a known DFlash drafter, else the checkpoint's multi-token-prediction head when it has one, else plain decoding), dflash, mtp (the head; Qwen3.5/3.6/3.8 checkpoints that keep it) or none"},
		&cli.BoolFlag{Name: "require-draft", Usage: "fail when no drafter is known for the target"},
		&cli.StringFlag{Name: "drafts-file", Usage: "extra target→draft pairs (JSON); default ~/.config/dflash-mlx/drafts.json"},
		&cli.StringFlag{Name: "revision", Usage: "target revision (branch, tag or commit)"},
		&cli.IntFlag{Name: "context-length", Usage: "limit the context (0: the model's)"},
		&cli.IntFlag{Name: "draft-window", Usage: "in long contexts the drafter attends to the first 64 context tokens and the last N only (0: all; a faster draft, the same output)"},
		&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress or notices"},
		&cli.StringFlag{Name: "dist-backend", Usage: "run as one rank of a target split over processes or machines (tensor parallelism) through MLX's backend: ring, jaccl, mpi, nccl or any; the ranks are configured as MLX's launcher does (MLX_RANK, MLX_HOSTFILE, …); `dflash-mlx launch` starts them", EnvVars: []string{"DFLASH_DIST_BACKEND"}},
	}
}

func samplingFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "max-new-tokens", Aliases: []string{"max-tokens", "n"}, Value: 256, Usage: "most tokens to generate"},
		&cli.Float64Flag{Name: "temperature", Aliases: []string{"temp"}, Value: 0, Usage: "0 (or below 1e-5) = greedy; > 0 samples (losslessly with DFlash)"},
		&cli.Float64Flag{Name: "top-p", Value: 1, Usage: "nucleus sampling threshold (1 = off)"},
		&cli.IntFlag{Name: "top-k", Value: 0, Usage: "keep the k most likely tokens (0 = off)"},
		&cli.Float64Flag{Name: "min-p", Value: 0, Usage: "drop tokens below max·min-p (0 = off)"},
		&cli.Float64Flag{Name: "repetition-penalty", Value: 0, Usage: "penalise the last 20 tokens (1 or 0 = off)"},
		&cli.Uint64Flag{Name: "seed", Value: 0, Usage: "random seed for sampling"},
		&cli.IntFlag{Name: "block-size", Value: 0, Usage: "DFlash block (staged token + drafts); 0 = the drafter's (16)"},
	}
}

func loadConfig(c *cli.Context) LoadConfig {
	return LoadConfig{
		Target:        c.String("target-model"),
		Draft:         c.String("draft-model"),
		NoDraft:       c.Bool("no-draft"),
		DraftKind:     c.String("draft-kind"),
		RequireDraft:  c.Bool("require-draft"),
		DraftsFile:    c.String("drafts-file"),
		MaxBlock:      c.Int("block-size"),
		Revision:      c.String("revision"),
		Quiet:         c.Bool("quiet") || c.Bool("json"),
		Log:           os.Stderr,
		ContextLength: c.Int("context-length"),
		DraftWindow:   c.Int("draft-window"),
		Settings:      commandSettings(c),
		DistBackend:   c.String("dist-backend"),
	}
}

func samplingParams(c *cli.Context) (sample.Params, error) {
	p := sample.Params{
		Temperature:       c.Float64("temperature"),
		TopP:              c.Float64("top-p"),
		TopK:              c.Int("top-k"),
		MinP:              c.Float64("min-p"),
		RepetitionPenalty: c.Float64("repetition-penalty"),
		Seed:              c.Uint64("seed"),
	}
	if err := p.Validate(); err != nil {
		return p, cli.Exit("bad sampling flag: "+err.Error(), 2)
	}
	if c.Int("max-new-tokens") < 0 {
		return p, cli.Exit("--max-new-tokens must be ≥ 0", 2)
	}
	if c.Int("block-size") < 0 {
		return p, cli.Exit("--block-size must be ≥ 0", 2)
	}
	return p, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
