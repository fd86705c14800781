package cli

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
)

func TestDefaultMaxBatch(t *testing.T) {
	const gib = int64(1) << 30
	// Qwen3-8B bf16: 36 layers, 8 KV heads of 128: 144 KiB a token.
	q3 := model.Arch{NumLayers: 36, NumKVHeads: 8, HeadDim: 128, Dtype: mlxc.BFloat16, TrimmableCache: true}
	// Qwen3.5-27B: 64 layers, 16 of them attention, 4 KV heads of 256.
	q35 := model.Arch{NumLayers: 64, NumKVHeads: 4, HeadDim: 256, Dtype: mlxc.BFloat16}
	if got := kvBytesPerToken(q3); got != 36*2*8*128*2 {
		t.Errorf("qwen3 per token %d", got)
	}
	if got := kvBytesPerToken(q35); got != 16*2*4*256*2 {
		t.Errorf("qwen3.5 per token %d", got)
	}
	for _, c := range []struct {
		name           string
		mem, weights   int64
		perTok         int64
		rowTokens, out int
	}{
		// (64 − 16) / 2 GiB over 8192 × 144 KiB (1.125 GiB) a row: 21 rows.
		{"mac 64GiB, 8B bf16", 64 * gib, 16 * gib, 36 * 2 * 8 * 128 * 2, 8192, 21},
		{"H200, capped", 141 * gib, 16 * gib, 36 * 2 * 8 * 128 * 2, 8192, maxDefaultBatch},
		{"weights fill memory", 16 * gib, 16 * gib, 1024, 8192, 1},
		{"short context", 32 * gib, 8 * gib, 144 << 10, 512, maxDefaultBatch},
		{"no cache", 32 * gib, 8 * gib, 0, 512, 1},
	} {
		if got := defaultMaxBatch(c.mem, c.weights, c.perTok, c.rowTokens); got != c.out {
			t.Errorf("%s: %d rows, want %d", c.name, got, c.out)
		}
	}
}
