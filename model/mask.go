package model

import (
	"math"
	"os"
	"strconv"
	"sync"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// KeyBucketDefault is the key-length bucket for multi-token attention (verify blocks and
// drafts) on the current backend: 256 on CUDA, where MLX builds a cuDNN attention plan per
// distinct key length (a new length every cycle otherwise), and 0 (exact lengths, causal
// mask mode) elsewhere. DFLASH_KV_BUCKET overrides it (0 turns bucketing off).
func KeyBucketDefault() int {
	keyBucketOnce.Do(func() {
		keyBucket = 0
		if mlxc.Backend() == "cuda" && mlxc.CurrentDevice().GPU {
			keyBucket = kvStep
		}
		if v, ok := os.LookupEnv("DFLASH_KV_BUCKET"); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				keyBucket = n
			}
		}
	})
	return keyBucket
}

var (
	keyBucketOnce sync.Once
	keyBucket     int
)

// maxBucketedQueries bounds the blocks that use padded keys: the additive mask is
// L × padded-keys, fine for verify blocks, too large for long prefill chunks.
const maxBucketedQueries = 64

// PrefixMask is an additive attention mask [1, 1, L, K] in dtype dt (0 = attend, −∞ =
// masked): query row i sees keys [0, visible(i)). Padded key buffers (KVCache
// UpdateAndFetchPadded, Scratch) use it to hide their rows past the valid ones.
func PrefixMask(L, K int, visible func(i int) int, dt mlxc.Dtype) *mlxc.Array {
	switch dt {
	case mlxc.BFloat16, mlxc.Float16:
		neg := uint16(0xFF80) // bf16 −∞
		if dt == mlxc.Float16 {
			neg = 0xFC00
		}
		bits := make([]uint16, L*K)
		for i := 0; i < L; i++ {
			row := bits[i*K : (i+1)*K]
			for j := min(max(visible(i), 0), K); j < K; j++ {
				row[j] = neg
			}
		}
		if dt == mlxc.Float16 {
			return mlxc.FromF16Bits(bits, 1, 1, L, K)
		}
		return mlxc.FromBF16Bits(bits, 1, 1, L, K)
	}
	vals := make([]float32, L*K)
	for i := 0; i < L; i++ {
		row := vals[i*K : (i+1)*K]
		for j := min(max(visible(i), 0), K); j < K; j++ {
			row[j] = float32(math.Inf(-1))
		}
	}
	return mlxc.AsType(mlxc.FromSlice(vals, 1, 1, L, K), dt)
}
