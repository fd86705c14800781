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
	"github.com/dflash-mlx/dflash-mlx/sample"
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
const randomShapes = "demo, tiny, tiny-moe, qwen3-4b, qwen3-4b-4bit, qwen3-4b-thin, qwen3-4b-thin-4bit, qwen3-8b, qwen3.5-4b, qwen3.5-4b-thin, qwen3.5-9b, qwen3.5-27b, qwen3.5-27b-4bit, qwen3.5-35b-a3b, qwen3.5-35b-a3b-thin, qwen3.8-27b-4bit, qwen3.8-27b-thin"

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
	case "qwen3-4b", "qwen3-4b-4bit", "qwen3-4b-thin", "qwen3-4b-thin-4bit":
		t = modelgen.Qwen3Spec{Hidden: 2560, Layers: 36, Heads: 32, KVHeads: 8, HeadDim: 128, Inter: 9728, Vocab: qwen3Vocab,
			Tied: true, Seed: 7, RopeTheta: 1000000, MaxPositions: 40960, EOS: []int{qwen3ImEnd, qwen3EndOfText}, WeightStd: 0.02}
		if shape == "qwen3-4b-thin" || shape == "qwen3-4b-thin-4bit" {
			// The 4B shape's layers, heads, head size and vocabulary around 256-wide hidden
			// and MLP matrices: the same graph per cycle at a small fraction of the weight
			// reads, so its cycle time is close to the host's cost of a cycle.
			t.Hidden, t.Inter = 256, 256
		}
		if shape == "qwen3-4b-4bit" || shape == "qwen3-4b-thin-4bit" {
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
	if shape == "qwen3-4b" || shape == "qwen3-4b-4bit" || shape == "qwen3-4b-thin" || shape == "qwen3-4b-thin-4bit" || shape == "qwen3-8b" {
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

// demoPrompt is a held-out file of the Go-code pair's corpus: the target never saw it.
const demoPrompt = "Write the Go file cmd/asm/internal/asm/parse.go."

// trainedPair finds the Go-code pair the repository ships (testdata/gocode: a Qwen3 target
// and its DFlash drafter trained by train/): dir when given, else beside the executable's
// checkout or under the working directory. ok is false when none is there.
func trainedPair(dir string) (target, draft string, ok bool) {
	var cands []string
	if dir != "" {
		cands = []string{dir}
	} else {
		if exe, err := os.Executable(); err == nil {
			cands = append(cands, filepath.Join(filepath.Dir(exe), "..", "testdata", "gocode"))
		}
		cands = append(cands, filepath.Join("testdata", "gocode"))
	}
	for _, d := range cands {
		t, dr := filepath.Join(d, "target"), filepath.Join(d, "draft")
		_, e1 := os.Stat(filepath.Join(t, "model.safetensors"))
		_, e2 := os.Stat(filepath.Join(dr, "model.safetensors"))
		if e1 == nil && e2 == nil {
			return t, dr, true
		}
	}
	return "", "", false
}

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "offline end-to-end demo: our own trained Go-code pair, DFlash against plain decoding",
		Description: `Runs DFlash on the model pair this repository ships (testdata/gocode): a 12.6M-parameter
Qwen3 target trained on the Go standard library and a 2-layer DFlash drafter trained on
the target's own outputs (train/README.md). The prompt goes through the pair's chat
template and tokenizer, the answer streams as DFlash verifies it, then plain decoding of
the same prompt runs and the two are compared: the same tokens, and the speedup with the
acceptance the drafter really reaches. Nothing is downloaded.

--random uses a tiny random-weight pair with the real Qwen3 tokenizer instead (gibberish,
τ ≈ 1: every stage runs, and DFlash stays lossless).

Examples:
  dflash-mlx demo
  dflash-mlx demo --prompt "Write the Go file net/http/cookie.go." --max-new-tokens 400
  dflash-mlx demo --temperature 0.7        # sampled: the target's distribution, not its greedy tokens
  dflash-mlx demo --random --dir /tmp/dflash-demo`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "pair", Usage: "a folder with target/ and draft/ (default: the repository's testdata/gocode)"},
			&cli.BoolFlag{Name: "random", Usage: "a tiny random pair with the Qwen3 tokenizer instead of the trained one"},
			&cli.StringFlag{Name: "dir", Value: filepath.Join("build", "demo"), Usage: "where --random writes its pair"},
			&cli.StringFlag{Name: "prompt", Usage: "prompt (default: a held-out Go file for the trained pair)"},
			&cli.IntFlag{Name: "max-new-tokens", Value: 256, Usage: "tokens to generate"},
			&cli.Float64Flag{Name: "temperature", Aliases: []string{"temp"}, Usage: "sample at this temperature (0: greedy)"},
			&cli.IntFlag{Name: "block-size", Usage: "the largest DFlash block (0: the drafter's 16; the random pair uses 4 on a CPU, where its 151936-row head dominates a cycle); each cycle's block adapts up to it unless DFLASH_ADAPTIVE_BLOCK=0 pins it"},
		},
		Action: demoAction,
	}
}

func demoAction(c *cli.Context) error {
	td, dd, trained := trainedPair(c.String("pair"))
	if c.String("pair") != "" && !trained {
		return cli.Exit(fmt.Sprintf("--pair %s: no target/model.safetensors and draft/model.safetensors there", c.String("pair")), 2)
	}
	prompt, block := c.String("prompt"), c.Int("block-size")
	if c.Bool("random") || !trained {
		if !c.Bool("random") {
			fmt.Fprintln(os.Stderr, "the trained pair (testdata/gocode) is not here; using a tiny random pair")
		}
		dir := c.String("dir")
		td, dd = filepath.Join(dir, "target"), filepath.Join(dir, "draft")
		t, d, _ := pairShape("demo")
		fmt.Fprintf(os.Stderr, "writing a tiny random Qwen3 pair to %s …\n", dir)
		if err := writePair(td, dd, t, d); err != nil {
			return err
		}
		trained = false
		if prompt == "" {
			prompt = "Explain speculative decoding in one sentence."
		}
		if block == 0 {
			block = 4
		}
	}
	if prompt == "" {
		prompt = demoPrompt
	}
	if c.Int("max-new-tokens") < 1 {
		return cli.Exit("--max-new-tokens must be at least 1", 2)
	}
	samp := sample.Params{Temperature: c.Float64("temperature"), TopP: 1, Seed: 1}
	if err := samp.Validate(); err != nil {
		return cli.Exit("bad --temperature: "+err.Error(), 2)
	}
	ctx := context.Background()
	s, err := Open(ctx, LoadConfig{Target: td, Draft: dd, Log: os.Stderr, MaxBlock: block})
	if err != nil {
		return err
	}
	defer s.Close()
	f := false
	ids, err := s.ChatPrompt([]tokenizer.Message{tokenizer.NewMessage("user", prompt)}, tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: &f})
	if err != nil {
		return err
	}
	fmt.Printf("prompt (%d tokens through the pair's chat template): %q\n\n", len(ids), prompt)
	req := engine.Request{Prompt: ids, MaxTokens: c.Int("max-new-tokens"), StopTokens: s.StopTokens(), Detok: s.Tok.NewStreamDecoder(true), BlockSize: block, Sampling: samp}
	fmt.Print("DFlash output:\n")
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
	if s.Engine.BlockCosts != nil {
		fmt.Printf("adaptive block: cycles per block size %s (1: a one-token step, no drafts)\n", formatBlockSizes(res.Stats.BlockSizes))
	}
	if p := plain.Stats.GenerationTPS; p > 0 {
		ratio := res.Stats.GenerationTPS / p
		fmt.Printf("plain decoding: %d tokens, %.1f tok/s; DFlash %.1f tok/s: %.2fx\n", len(plain.Tokens), p, res.Stats.GenerationTPS, ratio)
		onGPU := false
		_ = mlxc.Do(func() error { onGPU = mlxc.CurrentDevice().GPU; return nil })
		if !onGPU && s.Engine.BlockCosts != nil {
			fmt.Println("(on a CPU a wide verify costs several one-token steps, so the block adapts: narrow blocks, and one-token steps where no block pays; docs/perf/adaptive-width.md)")
		} else if ratio < 1 && !onGPU {
			fmt.Println("(on a CPU a verify of a 16-token block costs several one-token steps, so the accepted drafts do not pay; on a GPU, where it costs about one, they do: docs/perf/trained-pair.md)")
		}
	}
	if samp.Temperature > 0 {
		fmt.Println("sampled: DFlash draws from the target's distribution, so its tokens need not be plain decoding's")
	} else if _, ok := sameTokens(res.Tokens, plain.Tokens); ok {
		fmt.Printf("lossless: DFlash output is identical to plain decoding (%d tokens)\n", len(res.Tokens))
	} else {
		return fmt.Errorf("DFlash output differs from plain decoding")
	}
	if !trained {
		fmt.Println("(random weights: the drafter rarely guesses right, so τ ≈ 1 here; see `dflash-mlx bench --replay-drafts` for speed at a real τ)")
	}
	return nil
}
