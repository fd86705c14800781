package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/engine"
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
	bc, err := s.blockCosts(ctx, prompt)
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
