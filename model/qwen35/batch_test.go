package qwen35_test

import (
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/batchtest"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// eachBatchModel runs f on Qwen3.5 bf16, 4-bit and qwen3_5_moe tiny checkpoints, each a
// subtest, after checking that the family decodes batches.
func eachBatchModel(t *testing.T, f func(t *testing.T, m model.BatchModel, spec modelgen.Qwen35Spec)) {
	quant4 := modelgen.TinyQwen35()
	quant4.QuantBits, quant4.QuantGroup, quant4.Seed = 4, 64, 21
	specs := []struct {
		name string
		spec modelgen.Qwen35Spec
	}{
		{"qwen3_5-bf16", modelgen.TinyQwen35()},
		{"qwen3_5-4bit", quant4},
		{"qwen3_5_moe-bf16", modelgen.TinyQwen35MoE()},
	}
	for _, s := range specs {
		t.Run(s.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			writeModel(t, dir, s.spec)
			m, ok := loadModel(t, dir).(model.BatchModel)
			if !ok {
				t.Fatalf("%s does not decode batches", s.name)
			}
			f(t, m, s.spec)
		})
	}
}

// The Qwen3.5 hybrid (bf16, 4-bit) and qwen3_5_moe: rows decoded in one batch, joining,
// leaving and held, give at every step the logits of the same row decoded alone, and a
// row's extracted KV rows, recurrent state and conv tail are the single-sequence cache of
// the same tokens, bit for bit on the CPU (on a GPU within GPUTol); with per-row
// attention and padded keys alike.
func TestBatchedDecodeMatchesSolo(t *testing.T) {
	eachBatchModel(t, func(t *testing.T, m model.BatchModel, spec modelgen.Qwen35Spec) {
		batchtest.RunScenarios(t, m, spec.Vocab)
	})
}

// The Qwen3.5 hybrid (bf16, 4-bit) and qwen3_5_moe rows verifying draft blocks in one
// batched step of several tokens per row, tentatively, each keeping its own prefix: every
// row's logits and tapped hidden rows are its single-sequence verify forward's, and after
// each commit its KV rows, recurrent state (replayed per row through its kept steps) and
// conv tail are that single cache's after Commit of the prefix, bit for bit on the CPU
// with per-row attention and with padded keys under the per-query mask alike. On a GPU
// within GPUVerifyTol.
func TestBatchedVerifyMatchesSolo(t *testing.T) {
	eachBatchModel(t, func(t *testing.T, m model.BatchModel, spec modelgen.Qwen35Spec) {
		// A linear layer's and an attention layer's residual rows (Interval 3: layer 2
		// attends).
		batchtest.RunVerifyScenarios(t, m, spec.Vocab, []int{2, spec.Layers - 2})
	})
}
