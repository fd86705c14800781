package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// SplitHeads turns projected rows [B·L, n·D] into heads [B, n, L, D], with the per-head
// RMSNorm (q_norm/k_norm) when norm is set, normalising before the transpose like mlx-lm.
// For one token both layouts hold the same element order, so a single reshape gives a
// row-contiguous result (no strided view that kernels would copy; values identical).
func SplitHeads(x *mlxc.Array, B, L, n int, norm *mlxc.Array, eps float32) *mlxc.Array {
	if L == 1 {
		x = mlxc.Reshape(x, B, n, 1, -1)
		if norm != nil {
			x = mlxc.RMSNorm(x, norm, eps)
		}
		return x
	}
	x = mlxc.Reshape(x, B, L, n, -1)
	if norm != nil {
		x = mlxc.RMSNorm(x, norm, eps)
	}
	return mlxc.Transpose(x, 0, 2, 1, 3)
}

// mergeHeads turns attention output [B, n, L, D] back into rows [B·L, n·D] (for one token
// a plain reshape: same element order).
func mergeHeads(o *mlxc.Array, rows int) *mlxc.Array {
	if o.Dim(2) > 1 {
		o = mlxc.Transpose(o, 0, 2, 1, 3)
	}
	return mlxc.Reshape(o, rows, -1)
}

// rowwiseAttention is causal attention for a block of queries q [B, H, L, D] whose first
// row sits at position off0, computed as L one-query attentions over keys [0, off0+i+1):
// exactly what a one-token decode step computes for that position.
func rowwiseAttention(q, keys, values *mlxc.Array, scale float32, off0 int) *mlxc.Array {
	L := q.Dim(2)
	rows := make([]*mlxc.Array, L)
	for i := range rows {
		n := off0 + i + 1
		rows[i] = mlxc.ScaledDotProductAttention(mlxc.SliceAxis(q, 2, i, i+1),
			mlxc.SliceAxis(keys, 2, 0, n), mlxc.SliceAxis(values, 2, 0, n), scale, mlxc.MaskNone, nil, nil)
	}
	return mlxc.Concatenate(rows, 2)
}
