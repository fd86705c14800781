package model

import (
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// PrepAttention (default on; DFLASH_FUSE_PREP_ATTN=0 turns it off; bit for bit the two
// kernels it replaces on the H200: TestPrepAttentionMatchesSeparate) is HeadPrepInto and the few-query attention kernel in
// one kernel for a block whose keys and values go into the KV cache in place: one node per
// layer instead of two (41 of a DFlash cycle's 331 on the 4B shape), each node being host
// time on every cycle. Each block of the grid (one per q head and row, as the attention
// kernel's) prepares its own q row and the new key and value rows it sees (q/k norm and
// rotation as HeadPrep computes them, rounded to T where that kernel stores) into
// shared memory, reads the keys before the block from the cache and the block's own from
// shared memory, and attends in the attention kernel's order. Its source (kernels.PrepAttention) shares the
// head-prep kernel's row and the attention kernel's declarations, and its loop reads as the
// attention kernel's does, so the values are meant to be the same bit for bit.
// One block per kv head and row (the group's first q head) also stores that row's key and
// value into the cache for later steps; no block reads a row another writes.

// prepAttnMaxRows is the most block rows the kernel keeps in shared memory (a verify block
// of 16 tokens; 16 KB of keys and values at D = 256).
const prepAttnMaxRows = 16

// newPrepAttention makes the kernel when on (settings.Kernels.FusePrepAttn), nil otherwise.
func newPrepAttention(on bool) *mlxc.Kernel {
	if !on {
		return nil
	}
	return mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: kernels.PrepAttention.Name,
		Inputs:  []string{"y", "qn", "kn", "inv", "eps", "off", "ck", "cv", "scale"},
		Outputs: []string{"out"}, Source: kernels.PrepAttention.CUDA.Body, EnsureRowContiguous: false})
}

// prepAttentionFits reports whether PrepAttention serves a block's merged q/k/v product
// y [L, ·] (PrepFits's conditions) with head size D and cache buffers ck [1, hk, R, D]: the
// kernel is on and L ≤ 16.
func (f *Fused) prepAttentionFits(x *mlxc.Array, D int, qn, kn, ck *mlxc.Array) bool {
	return f != nil && f.prepAttn != nil && f.PrepFits(x, D, qn, kn) && x.Dim(0) <= prepAttnMaxRows &&
		ck != nil && ck.Ndim() == 4 && ck.Dim(3) == D && ck.Dtype() == x.Dtype()
}

// PrepInto prepares a block whose keys and values go into the cache buffers ck, cv in
// place, from its merged q/k/v product y: when attend (the few-query attention kernel
// serves blocks of its rows) and prepAttentionFits, head prep and attention in one kernel,
// returning the attention rows (merged); otherwise HeadPrepInto, returning q for the
// caller's attention, which must take it (it orders the reads after the cache writes).
func (f *Fused) PrepInto(y *mlxc.Array, hq, hk, D int, qn, kn, pos, ck, cv, scale *mlxc.Array, causal, attend bool) (merged, q *mlxc.Array) {
	if attend && f.prepAttentionFits(y, D, qn, kn, ck) {
		return f.PrepAttention(y, hq, hk, D, qn, kn, pos, ck, cv, scale, causal), nil
	}
	return nil, f.HeadPrepInto(y, hq, hk, D, qn, kn, pos, ck, cv)
}

// PrepAttention returns the attention rows [L, hq·D] of a block from its merged q/k/v
// product y [L, (hq+2·hk)·D], writing its keys and values into the cache buffers ck, cv
// [1, hk, R, D] at rows pos..pos+L−1 (rows past R dropped): HeadPrepInto followed by
// FewQueryAttention.Apply over the cache, bit for bit, in one kernel. causal: row i sees
// keys [0, pos+i+1); otherwise every row sees [0, pos+L). pos must be OnDevice's; scale is
// the model's 1/√D as a 0-d float32 array (OnDeviceConst).
func (f *Fused) PrepAttention(y *mlxc.Array, hq, hk, D int, qn, kn, pos, ck, cv, scale *mlxc.Array, causal bool) *mlxc.Array {
	L := y.Dim(0)
	dt := y.Dtype()
	return f.prepAttn.Call([]*mlxc.Array{y, qn, kn, f.inv, f.eps, pos, ck, cv, scale}, mlxc.KernelCall{
		OutputShapes: [][]int{{L, hq * D}},
		OutputDtypes: []mlxc.Dtype{dt},
		Grid:         [3]int{hq * L * f.attnWarps * 32, 1, 1},
		ThreadGroup:  [3]int{f.attnWarps * 32, 1, 1},
		Template: f.attnTemplates.get(prepAttnKey{dt, D, hq, hk, causal}, func() []mlxc.TemplateArg {
			return prepAttnTemplate(dt, D, hq, hk, f.attnWarps, causal)
		}),
	})[0]
}

type prepAttnKey struct {
	dt     mlxc.Dtype
	d      int
	hq, hk int
	causal bool
}

// prepAttnTemplate is the kernel's compile-time arguments (the offline compile check uses
// it too): q heads, then k, then v in the merged product's columns.
func prepAttnTemplate(dt mlxc.Dtype, D, hq, hk, warps int, causal bool) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}, {Name: "HQ", Value: hq},
		{Name: "HK", Value: hk}, {Name: "QO", Value: 0}, {Name: "KO", Value: hq * D}, {Name: "VO", Value: (hq + hk) * D},
		{Name: "WARPS", Value: warps}, {Name: "CAUSAL", Value: causal}, {Name: "LMAX", Value: prepAttnMaxRows}}
}
