package cli

import (
	"time"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// selectorSplit is a DFlash2 draft's cost taken apart: the drafter's forward (its layers
// and the target's head over the block) and the candidate selector's walk, each timed
// alone (median of repeats) on a window of selectorProbeRows context rows.
type selectorSplit struct {
	ForwardMS  float64 `json:"forward_ms"`
	SelectorMS float64 `json:"selector_ms"`
	// Share is the selector's part of the draft.
	Share float64 `json:"selector_share_of_draft"`
}

// selectorProbeRows is the context the split is measured after.
const selectorProbeRows = 64

// measureSelectorSplit times the forward and the selector of d's full block, greedy, on
// the MLX thread.
func measureSelectorSplit(d *draft.Drafter, repeats int) (selectorSplit, error) {
	var sp selectorSplit
	err := mlxc.Catch(func() {
		s := mlxc.NewScope()
		defer s.Close()
		cfg := d.Cfg
		B := cfg.BlockSize
		c := draft.NewWindowCache(cfg.NumLayers, cfg.SlidingWindow-1)
		defer c.Free()
		ctx := mlxc.Normal([]int{1, selectorProbeRows, len(cfg.TargetLayerIDs) * cfg.HiddenSize}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(1))
		if err := d.AddWindowContext(ctx, c); err != nil {
			panic(&mlxc.Error{Op: "selector split", Msg: err.Error()})
		}
		mlxc.Eval(c.Arrays()...)
		ids := make([]int32, B)
		for i := 1; i < B; i++ {
			ids[i] = int32(cfg.MaskTokenID)
		}
		block := mlxc.FromSlice(ids, 1, B)
		anchor := mlxc.FromSlice(ids[:1], 1)
		var fwd, sel []float64
		for r := 0; r <= max(repeats, 1); r++ {
			inner := mlxc.NewScope()
			t0 := time.Now()
			b, err := d.ForwardWindow(block, nil, c)
			if err != nil {
				panic(&mlxc.Error{Op: "selector split", Msg: err.Error()})
			}
			mlxc.Eval(b.Hidden, b.Logits)
			t1 := time.Now()
			mlxc.Eval(d.Selector.Walk(b, anchor, B-1, 0, nil).Tokens)
			t2 := time.Now()
			inner.Close()
			if r > 0 { // the first run compiles
				fwd = append(fwd, float64(t1.Sub(t0).Microseconds())/1000)
				sel = append(sel, float64(t2.Sub(t1).Microseconds())/1000)
			}
		}
		sp.ForwardMS, sp.SelectorMS = median(fwd), median(sel)
		if total := sp.ForwardMS + sp.SelectorMS; total > 0 {
			sp.Share = sp.SelectorMS / total
		}
	})
	return sp, err
}
