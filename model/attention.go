package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// Attention is the one attention routing that the target families and the drafters
// share, so that a single function decides which path attends a block: the few-query
// kernel when it serves the block, else SDPA.
type Attention struct {
	FQA      *FewQueryAttention // nil: the kernel is off
	Scale    float32            // 1/√D, for SDPA
	ScaleArr *mlxc.Array        // Scale as a 0-d float32 array, for the kernel
	// Causal: query i sees keys [0, visible+i+1); otherwise every query sees [0, visible)
	// (FewQueryAttention.Apply).
	Causal bool
}

// AttendKeys is where one layer's keys and values come from on each path: the caller's
// cache decides how they are stored, Attend which path reads them.
type AttendKeys struct {
	// Fits are the keys whose shape the kernel checks (FewQueryAttention.Fits).
	Fits *mlxc.Array
	// Kernel gives the kernel's keys, values and visible count or position; nil: the
	// kernel may not run for this block.
	Kernel func() (keys, values, visible *mlxc.Array)
	// Dense gives SDPA's keys and values, and its mask mode and mask.
	Dense func() (keys, values *mlxc.Array, mode string, mask *mlxc.Array)
	// MaxKeys bounds the keys any query sees on the kernel's path (0: the buffers' rows):
	// it picks the few-query or the split-key kernel (FewQueryAttention.Apply).
	MaxKeys int
	// Rowwise runs the SDPA path as one-query attentions, row i over keys [0, Off0+i+1)
	// (rowwiseAttention); Dense's mask is then unused.
	Rowwise bool
	Off0    int
}

// Attend attends the queries q [B, n, L, D] on the path the keys k allow and returns the
// attention rows [rows, n·D].
func (a *Attention) Attend(q *mlxc.Array, k AttendKeys, rows int) *mlxc.Array {
	if k.Kernel != nil && a.FQA.Fits(q, k.Fits) {
		keys, values, visible := k.Kernel()
		return a.FQA.Apply(q, keys, values, a.ScaleArr, visible, a.Causal, k.MaxKeys)
	}
	keys, values, mode, mask := k.Dense()
	var o *mlxc.Array
	if k.Rowwise {
		o = rowwiseAttention(q, keys, values, a.Scale, k.Off0)
	} else {
		o = mlxc.ScaledDotProductAttention(q, keys, values, a.Scale, mode, mask, nil)
	}
	return mergeHeads(o, rows)
}
