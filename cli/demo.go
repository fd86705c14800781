package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

// Qwen3 vocabulary facts the demo pair shares with the real models.
const (
	qwen3Vocab     = 151936
	qwen3ImEnd     = 151645
	qwen3EndOfText = 151643
	qwen3MaskToken = 151669
)

// randomShapes lists the shapes --random and pairShape know.
const randomShapes = "demo, tiny, tiny-moe, qwen3-4b, qwen3-4b-4bit, qwen3-4b-thin, qwen3-8b, qwen3.5-4b, qwen3.5-4b-thin, qwen3.5-27b, qwen3.5-35b-a3b, qwen3.5-35b-a3b-thin"

func pairShape(shape string) (modelgen.Qwen3Spec, modelgen.DrafterSpec, error) {
	var t modelgen.Qwen3Spec
	switch shape {
	case "demo", "tiny", "tiny-moe":
		t = modelgen.Qwen3Spec{Hidden: 64, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 32, Inter: 128, Vocab: qwen3Vocab,
			Tied: true, Seed: 7, RopeTheta: 1000000, MaxPositions: 40960, EOS: []int{qwen3ImEnd, qwen3EndOfText}, WeightStd: 0.08}
		if shape == "tiny-moe" {
			// A qwen3_moe target: eight experts of 64, two per token, in every layer but
			// the first (Hugging Face's per-expert tensors).
			t.Experts, t.TopK, t.MoEInter, t.NormTopK, t.MLPOnly, t.PerExpert = 8, 2, 64, true, []int{0}, true
		}
	case "qwen3-4b", "qwen3-4b-4bit", "qwen3-4b-thin":
		t = modelgen.Qwen3Spec{Hidden: 2560, Layers: 36, Heads: 32, KVHeads: 8, HeadDim: 128, Inter: 9728, Vocab: qwen3Vocab,
			Tied: true, Seed: 7, RopeTheta: 1000000, MaxPositions: 40960, EOS: []int{qwen3ImEnd, qwen3EndOfText}, WeightStd: 0.02}
		if shape == "qwen3-4b-thin" {
			// The 4B shape's layers, heads, head size and vocabulary around 256-wide hidden
			// and MLP matrices: the same graph per cycle at a small fraction of the weight
			// reads, so its cycle time is close to the host's cost of a cycle.
			t.Hidden, t.Inter = 256, 256
		}
		if shape == "qwen3-4b-4bit" {
			// mlx-community's 4-bit layout (groups of 64): verify blocks take the quantized
			// products the small-M kernel serves.
			t.QuantBits, t.QuantGroup = 4, 64
		}
	case "qwen3-8b":
		t = modelgen.Qwen3Spec{Hidden: 4096, Layers: 36, Heads: 32, KVHeads: 8, HeadDim: 128, Inter: 12288, Vocab: qwen3Vocab,
			Tied: false, Seed: 7, RopeTheta: 1000000, MaxPositions: 40960, EOS: []int{qwen3ImEnd, qwen3EndOfText}, WeightStd: 0.02}
	default:
		return t, modelgen.DrafterSpec{}, fmt.Errorf("unknown shape %q (%s)", shape, randomShapes)
	}
	t.Dtype = mlxc.BFloat16
	d := modelgen.DrafterFor(t, 2)
	if shape == "qwen3-4b" || shape == "qwen3-4b-4bit" || shape == "qwen3-4b-thin" || shape == "qwen3-8b" {
		// The real z-lab Qwen3 DFlash drafters: 5 layers reading 5 target layers.
		d = modelgen.DrafterFor(t, 5)
		d.TargetLayerIDs = []int{1, 9, 17, 25, 33}
	}
	d.MaskTokenID = qwen3MaskToken
	d.BlockSize = 16
	return t, d, nil
}

// tokenizerAssets finds the real Qwen3 tokenizer files installed by `make deps`.
func tokenizerAssets() (string, error) {
	var cands []string
	if d := resolved.Diagnostics.TokenizerDir; d != "" {
		cands = append(cands, d)
	}
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "..", "third_party", "testdata", "qwen3"))
	}
	cands = append(cands, filepath.Join("third_party", "testdata", "qwen3"))
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("the Qwen3 tokenizer test asset is missing (run `make deps`, or set DFLASH_TOKENIZER_DIR)")
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// writePair writes target and drafter; the target gets the real tokenizer files and a
// generation_config.json like the real checkpoints.
func writePair(td, dd string, t modelgen.Qwen3Spec, d modelgen.DrafterSpec) error {
	return writePairWith(td, dd, func() error { return modelgen.WriteQwen3(td, t) }, []int{qwen3ImEnd, qwen3EndOfText}, d)
}

// writePairWith writes a target with writeTarget (on the MLX thread) and the drafter d;
// the target gets the Qwen3 tokenizer files and a generation_config.json with the end
// tokens eos, like the real checkpoints.
func writePairWith(td, dd string, writeTarget func() error, eos []int, d modelgen.DrafterSpec) error {
	if err := mlxc.Do(func() error {
		if err := writeTarget(); err != nil {
			return err
		}
		return modelgen.WriteDrafter(dd, d)
	}); err != nil {
		return err
	}
	tokDir, err := tokenizerAssets()
	if err != nil {
		return err
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := copyFile(filepath.Join(tokDir, f), filepath.Join(td, f)); err != nil {
			return fmt.Errorf("copy %s: %w", f, err)
		}
	}
	gen, _ := json.MarshalIndent(map[string]any{"eos_token_id": eos, "temperature": 0.6, "top_p": 0.95}, "", "  ")
	return os.WriteFile(filepath.Join(td, "generation_config.json"), gen, 0o644)
}

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "offline end-to-end demo on a tiny random model pair with the real Qwen3 tokenizer",
		Description: `Writes a tiny Qwen3 target and DFlash drafter with random weights, in the real
checkpoint formats and with the real Qwen3 tokenizer and chat template, then runs the
whole pipeline: chat template → tokenizer → prefill → DFlash cycles → streamed text,
and checks the output against plain decoding. The text is gibberish (random weights);
the point is that every stage runs, offline, and that DFlash is lossless.

Examples:
  dflash-mlx demo
  dflash-mlx demo --prompt "Write a limerick." --max-new-tokens 64
  dflash-mlx demo --dir /tmp/dflash-demo --block-size 16   # the drafter's full block`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Value: filepath.Join("build", "demo"), Usage: "where to write the pair"},
			&cli.StringFlag{Name: "prompt", Value: "Explain speculative decoding in one sentence.", Usage: "prompt"},
			&cli.IntFlag{Name: "max-new-tokens", Value: 32, Usage: "tokens to generate"},
			// On the CPU backend the 151936-row head dominates a cycle (reference BLAS); a
			// short block keeps the demo quick there. GPUs use the drafter's 16.
			&cli.IntFlag{Name: "block-size", Value: 4, Usage: "DFlash block"},
		},
		Action: func(c *cli.Context) error {
			dir := c.String("dir")
			td, dd := filepath.Join(dir, "target"), filepath.Join(dir, "draft")
			t, d, _ := pairShape("demo")
			fmt.Fprintf(os.Stderr, "writing a tiny random Qwen3 pair to %s …\n", dir)
			if err := writePair(td, dd, t, d); err != nil {
				return err
			}
			ctx := context.Background()
			s, err := Open(ctx, LoadConfig{Target: td, Draft: dd, Log: os.Stderr})
			if err != nil {
				return err
			}
			defer s.Close()
			f := false
			ids, err := s.ChatPrompt([]tokenizer.Message{tokenizer.NewMessage("user", c.String("prompt"))}, tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: &f})
			if err != nil {
				return err
			}
			fmt.Printf("prompt (%d tokens through the Qwen3 chat template): %q\n\n", len(ids), c.String("prompt"))
			req := engine.Request{Prompt: ids, MaxTokens: c.Int("max-new-tokens"), StopTokens: s.StopTokens(), Detok: s.Tok.NewStreamDecoder(true), BlockSize: c.Int("block-size")}
			fmt.Print("DFlash output: ")
			res, err := s.Generate(ctx, req, func(ev engine.Event) error { fmt.Print(ev.Text); return nil })
			if err != nil {
				return err
			}
			fmt.Print("\n\n")
			plainReq := req
			plainReq.NoDraft = true
			plainReq.Detok = s.Tok.NewStreamDecoder(true)
			plain, err := s.Generate(ctx, plainReq, nil)
			if err != nil {
				return err
			}
			printRunStats(os.Stdout, runOutput{TargetModel: td, DraftModel: dd, FinishReason: res.FinishReason, Stats: res.Stats})
			if _, ok := sameTokens(res.Tokens, plain.Tokens); ok {
				fmt.Printf("lossless: DFlash output is identical to plain decoding (%d tokens)\n", len(res.Tokens))
			} else {
				return fmt.Errorf("DFlash output differs from plain decoding")
			}
			fmt.Println("(random weights: the drafter rarely guesses right, so τ ≈ 1 here; see `dflash-mlx bench --replay-drafts` for speed at a real τ)")
			return nil
		},
	}
}
