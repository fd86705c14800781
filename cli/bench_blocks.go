package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// blockPoint is one block size of a prompt's τ-vs-cost curve: what a cycle of that block
// costs (measured on its own, engine.MeasureBlockCosts) and what DFlash gets from it.
type blockPoint struct {
	Block   int     `json:"block"`
	CycleMS float64 `json:"cycle_ms"`
	// TauEstimated is the τ a fixed block of this size would get, from the per-position
	// acceptance of the table's runs (engine.EstimatedTau), and TPSEstimated that τ over
	// the cost.
	TauEstimated float64 `json:"tau_estimated,omitempty"`
	TPSEstimated float64 `json:"tok_s_estimated,omitempty"`
	// TPS and Tau were measured by a DFlash run at this fixed block (--block-sweep).
	TPS float64 `json:"tok_s,omitempty"`
	Tau float64 `json:"tau,omitempty"`
}

// blockCurve measures the cycle cost per block size after prompt and estimates each
// size's τ and tok/s from st, the per-position acceptance of the table's runs.
func blockCurve(ctx context.Context, s *Session, prompt []int32, st engine.Stats) ([]blockPoint, error) {
	bc, err := s.blockCosts(ctx, prompt, probeSizes(s.maxBlock))
	if err != nil {
		return nil, err
	}
	pts := make([]blockPoint, len(bc.Sizes))
	for i, B := range bc.Sizes {
		pts[i] = blockPoint{Block: B, CycleMS: bc.MS[i], TauEstimated: engine.EstimatedTau(st, B)}
		if bc.MS[i] > 0 {
			pts[i].TPSEstimated = 1000 * pts[i].TauEstimated / bc.MS[i]
		}
	}
	return pts, nil
}

// formatBlockSizes prints a block-size histogram as "16×30 8×4" (largest first).
func formatBlockSizes(h map[int]int) string {
	var b strings.Builder
	for B := 64; B >= 1; B-- {
		if k := h[B]; k > 0 {
			fmt.Fprintf(&b, "%d×%d ", B, k)
		}
	}
	return strings.TrimSpace(b.String())
}

// sweepBlocks runs DFlash at each point's fixed block (run), after warm untimed runs of
// it (a block size's first run pays for compiling its kernels), filling the measured τ
// and tok/s.
func sweepBlocks(pts []blockPoint, warm int, run func(b int) (engine.Result, error)) error {
	for i := range pts {
		for w := 0; w < warm; w++ {
			if _, err := run(pts[i].Block); err != nil {
				return fmt.Errorf("block %d: %w", pts[i].Block, err)
			}
		}
		res, err := run(pts[i].Block)
		if err != nil {
			return fmt.Errorf("block %d: %w", pts[i].Block, err)
		}
		pts[i].TPS, pts[i].Tau = res.Stats.GenerationTPS, res.Stats.Tau
	}
	return nil
}

// printBlockCurve prints a row's block sizes and τ-vs-cost curve.
func printBlockCurve(x benchRow) {
	if x.AdaptiveBlock {
		fmt.Printf("adaptive block: cycles per block size %s\n", formatBlockSizes(x.BlockSizes))
	}
	if len(x.BlockCurve) == 0 {
		return
	}
	fmt.Printf("τ-vs-cost (block: cycle ms, estimated τ and tok/s, measured τ and tok/s):")
	for _, p := range x.BlockCurve {
		fmt.Printf(" %d: %.1f", p.Block, p.CycleMS)
		if p.TauEstimated > 0 {
			fmt.Printf(" %.2f %.1f", p.TauEstimated, p.TPSEstimated)
		}
		if p.TPS > 0 {
			fmt.Printf(" | %.2f %.1f", p.Tau, p.TPS)
		}
		fmt.Print(";")
	}
	fmt.Println()
}

// widthRow is one mode of --compare-widths: plain decoding, DFlash with the adaptive
// block, or DFlash at a fixed block.
type widthRow struct {
	Mode  string `json:"mode"`            // "plain", "adaptive" or "fixed"
	Block int    `json:"block,omitempty"` // the fixed block
	// TPS is the median over prompts of each prompt's median over the timed runs; Runs are
	// every timed run, prompt by prompt.
	TPS     float64   `json:"tok_s"`
	Runs    []float64 `json:"runs_tok_s"`
	Tau     float64   `json:"tau"`
	Speedup float64   `json:"speedup"`
	// Exact: every run gave plain decoding's tokens (greedy, no replay; null otherwise).
	Exact *bool `json:"exact"`
	// BlockSizes counts the timed runs' cycles per block size (staged token + drafts):
	// for the adaptive rows the widths the policy chose, 1 a one-token step.
	BlockSizes map[int]int `json:"block_sizes,omitempty"`
}

// widthReport is --compare-widths' report.
type widthReport struct {
	Target      string             `json:"target"`
	Draft       string             `json:"draft"`
	Backend     string             `json:"backend"`
	Device      string             `json:"device"`
	Note        string             `json:"note,omitempty"`
	Replay      *float64           `json:"replay_error_rate,omitempty"`
	Temperature float64            `json:"temperature,omitempty"`
	MaxTokens   int                `json:"max_new_tokens"`
	Repeats     int                `json:"repeats"`
	Prompts     int                `json:"prompts"`
	BlockCosts  *engine.BlockCosts `json:"block_costs"`
	Rows        []widthRow         `json:"rows"`
	Settings    settings.Settings  `json:"settings"`
}

// benchWidths (--compare-widths) runs, per prompt and repeat, plain decoding, DFlash with
// the adaptive block and DFlash at each fixed block in widths, one after another in this
// process (so drift hits all alike), after warmup untimed runs of each, and prints tok/s,
// τ and the widths the adaptive runs chose. replay ≥ 0 replays acceptance; temp > 0
// samples.
func benchWidths(c *cli.Context, s *Session, prompts [][]int32, widths []int, rep widthReport, replay, temp float64) error {
	ctx := context.Background()
	costs := s.Engine.BlockCosts
	if costs == nil {
		return cli.Exit("--compare-widths compares the adaptive block with fixed ones: leave DFLASH_ADAPTIVE_BLOCK unset", 2)
	}
	defer func() { s.Engine.BlockCosts, s.Engine.ReplayAccept = costs, nil }()
	rep.BlockCosts = costs
	n, repeats, bs := rep.MaxTokens, rep.Repeats, c.Int("block-size")
	rows := []widthRow{{Mode: "plain"}, {Mode: "adaptive", BlockSizes: map[int]int{}}}
	for _, w := range widths {
		rows = append(rows, widthRow{Mode: "fixed", Block: w, BlockSizes: map[int]int{}})
	}
	checkExact := replay < 0 && temp == 0
	exact := make([]bool, len(rows))
	for i := range exact {
		exact[i] = true
	}
	perPrompt := make([][]float64, len(rows)) // each row's per-prompt median tok/s
	taus := make([][]float64, len(rows))
	runs := 0
	gen := func(i, run int, prompt []int32, row widthRow) (engine.Result, error) {
		req := engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, NoDraft: row.Mode == "plain", BlockSize: bs}
		if temp > 0 {
			req.Sampling = sample.Params{Temperature: temp, TopP: 1, Seed: c.Uint64("seed") + uint64(runs)}
		}
		runs++
		s.Engine.BlockCosts, s.Engine.ReplayAccept = costs, nil
		if row.Mode == "fixed" {
			s.Engine.BlockCosts, req.BlockSize = nil, row.Block
		}
		if replay >= 0 && row.Mode != "plain" {
			s.Engine.ReplayAccept = replayAccept(replay, replaySeed(i, run))
		}
		return s.Generate(ctx, req, nil)
	}
	for i, prompt := range prompts {
		for w := 0; w < c.Int("warmup"); w++ {
			for _, row := range rows {
				if _, err := gen(i, -1-w, prompt, row); err != nil {
					return fmt.Errorf("warm-up, %s %d: %w", row.Mode, row.Block, err)
				}
			}
		}
		tps := make([][]float64, len(rows))
		var ptaus = make([][]float64, len(rows))
		for r := 0; r < repeats; r++ {
			var ref []int32
			for k, row := range rows {
				res, err := gen(i, r, prompt, row)
				if err != nil {
					return fmt.Errorf("%s %d: %w", row.Mode, row.Block, err)
				}
				tps[k] = append(tps[k], res.Stats.GenerationTPS)
				rows[k].Runs = append(rows[k].Runs, res.Stats.GenerationTPS)
				if row.Mode == "plain" {
					ref = res.Tokens
					continue
				}
				ptaus[k] = append(ptaus[k], res.Stats.Tau)
				for b, cycles := range res.Stats.BlockSizes {
					rows[k].BlockSizes[b] += cycles
				}
				if _, ok := sameTokens(res.Tokens, ref); !ok {
					exact[k] = false
				}
			}
		}
		for k := range rows {
			perPrompt[k] = append(perPrompt[k], median(tps[k]))
			taus[k] = append(taus[k], median(ptaus[k]))
		}
		if !c.Bool("json") {
			fmt.Fprintf(os.Stderr, "prompt %d: plain %.1f tok/s, adaptive %.1f tok/s\n", i, median(tps[0]), median(tps[1]))
		}
	}
	for k := range rows {
		rows[k].TPS = median(perPrompt[k])
		if rows[k].Mode != "plain" {
			rows[k].Tau = median(taus[k])
			if checkExact {
				ok := exact[k]
				rows[k].Exact = &ok
			}
		}
		if rows[0].TPS > 0 {
			rows[k].Speedup = rows[k].TPS / rows[0].TPS
		}
	}
	rep.Rows = rows
	if c.Bool("json") {
		return printJSON(rep)
	}
	printWidths(rep)
	return nil
}

// printWidths prints --compare-widths' table.
func printWidths(r widthReport) {
	fmt.Printf("target %s, draft %s, %s on %s, %d prompts × %d new tokens, median of %d runs each, modes alternating in one process\n",
		r.Target, r.Draft, r.Backend, r.Device, r.Prompts, r.MaxTokens, r.Repeats)
	if r.Note != "" {
		fmt.Printf("note: %s\n", r.Note)
	}
	if bc := r.BlockCosts; bc != nil {
		parts := make([]string, len(bc.Sizes))
		for i, B := range bc.Sizes {
			parts[i] = fmt.Sprintf("%d: %.1f", B, bc.MS[i])
		}
		fmt.Printf("measured cycle costs (block: ms; 1 = a one-token step): %s\n", strings.Join(parts, ", "))
	}
	fmt.Printf("%-9s %6s %9s %8s %6s %6s  %s\n", "mode", "block", "tok/s", "speedup", "τ", "exact", "cycles per block (chosen widths)")
	for _, x := range r.Rows {
		block, tau := "-", "-"
		if x.Mode == "fixed" {
			block = fmt.Sprint(x.Block)
		}
		if x.Mode != "plain" {
			tau = fmt.Sprintf("%.2f", x.Tau)
		}
		sizes := ""
		if x.Mode == "adaptive" {
			sizes = formatBlockSizes(x.BlockSizes)
		}
		fmt.Printf("%-9s %6s %9.1f %7.2fx %6s %6s  %s\n", x.Mode, block, x.TPS, x.Speedup, tau, checkMark(x.Exact, "-"), sizes)
	}
}

// compareWidths are the fixed blocks --compare-widths runs: the probed sizes from 2 up to
// the largest block (the drafter's, or --block-size), and the largest.
func compareWidths(drafterBlock, requested int) []int {
	top := blockSizeOf(drafterBlock, requested)
	var ws []int
	for _, B := range engine.ProbeBlockSizes {
		if B >= 2 && B < top {
			ws = append(ws, B)
		}
	}
	if top >= 2 {
		ws = append(ws, top)
	}
	return ws
}
