package model

import (
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// KeyBucket is the key-length bucket for multi-token attention (verify blocks and drafts):
// k.KVBucket when set (0 turns bucketing off), else the current backend's: 256 on CUDA,
// where MLX builds a cuDNN attention plan per distinct key length (a new length every
// cycle otherwise), and 0 (exact lengths, causal mask mode) elsewhere.
func KeyBucket(k settings.Kernels) int {
	if k.KVBucket != settings.KVBucketAuto {
		return k.KVBucket
	}
	if mlxc.Backend() == "cuda" && mlxc.CurrentDevice().GPU {
		return kvStep
	}
	return 0
}

// MaxBucketedQueries bounds the blocks that use padded keys: the additive mask is
// L × padded-keys, fine for verify blocks, too large for long prefill chunks.
const MaxBucketedQueries = 64

// PrefixMask is an additive attention mask [1, 1, L, K] in dtype dt (0 = attend, −∞ =
// masked): query row i sees keys [0, visible(i)). Padded key buffers (KVCache
// UpdateAndFetchPadded, Scratch) use it to hide their rows past the valid ones.
func PrefixMask(L, K int, visible func(i int) int, dt mlxc.Dtype) *mlxc.Array {
	switch dt {
	case mlxc.BFloat16:
		return mlxc.FromBF16Bits(prefixMask(L, K, visible, uint16(0xFF80)), 1, 1, L, K) // bf16 −∞
	case mlxc.Float16:
		return mlxc.FromF16Bits(prefixMask(L, K, visible, uint16(0xFC00)), 1, 1, L, K) // f16 −∞
	}
	return mlxc.AsType(mlxc.FromSlice(prefixMask(L, K, visible, float32(math.Inf(-1))), 1, 1, L, K), dt)
}

// prefixMask lays out the mask's elements: zero, with neg from each row's visible count on.
func prefixMask[T uint16 | float32](L, K int, visible func(i int) int, neg T) []T {
	m := make([]T, L*K)
	for i := 0; i < L; i++ {
		row := m[i*K : (i+1)*K]
		for j := min(max(visible(i), 0), K); j < K; j++ {
			row[j] = neg
		}
	}
	return m
}

// WindowMask is a boolean attention mask [1, 1, L, W] for L query rows over the first W
// rows of a cache, where only the device knows how many are visible: with causal, row i
// sees keys j ≤ pos+i (pos: int32 [1], the position of row 0); without, every row sees keys
// j < pos (pos then counts the visible keys).
func WindowMask(pos *mlxc.Array, L, W int, causal bool) *mlxc.Array {
	j := mlxc.Reshape(mlxc.Arange(0, float64(W), 1, mlxc.Int32), 1, W)
	if !causal {
		return mlxc.Reshape(mlxc.Less(j, pos), 1, 1, 1, W)
	}
	lim := mlxc.Add(mlxc.Reshape(mlxc.Arange(0, float64(L), 1, mlxc.Int32), L, 1), pos)
	return mlxc.Reshape(mlxc.LessEqual(j, lim), 1, 1, L, W)
}
