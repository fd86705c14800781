package model_test

import (
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/batchtest"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// eachBatchModel runs f on Qwen3 bf16, 4-bit and qwen3_moe tiny checkpoints, each a
// subtest, after checking that the family decodes batches.
func eachBatchModel(t *testing.T, f func(t *testing.T, m model.BatchModel, spec modelgen.Qwen3Spec)) {
	quant4 := modelgen.TinyQwen3()
	quant4.QuantBits, quant4.QuantGroup, quant4.Seed = 4, 64, 7
	specs := []struct {
		name string
		spec modelgen.Qwen3Spec
	}{
		{"qwen3-bf16", modelgen.TinyQwen3()},
		{"qwen3-4bit", quant4},
		{"qwen3_moe-bf16", modelgen.TinyQwen3MoE()},
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

// Qwen3 (bf16, 4-bit) and qwen3_moe rows decoded in one batch, joining, leaving and held,
// give at every step the logits of the same row decoded alone, and a row's extracted
// state is the single-sequence cache of the same tokens: bit for bit on the CPU, with
// per-row attention and with padded keys under a mask alike; on a GPU within GPUTol.
func TestBatchedDecodeMatchesSolo(t *testing.T) {
	eachBatchModel(t, func(t *testing.T, m model.BatchModel, spec modelgen.Qwen3Spec) {
		batchtest.RunScenarios(t, m, spec.Vocab)
	})
}

// Qwen3 (bf16, 4-bit) and qwen3_moe rows verifying draft blocks in one batched step of
// several tokens per row (widths 0, 1, some and a full block), tentatively, with each
// row keeping its own prefix (none, some, all), between decode steps, joins and leaves:
// each row's logits and tapped hidden rows at every step are its single-sequence verify
// forward's (Speculate, the block, Commit of the prefix), and its extracted state is
// that single cache's, bit for bit on the CPU, with per-row attention and with padded
// keys under the per-query mask alike (the masked keys add exact zeros). On a GPU within
// GPUVerifyTol.
func TestBatchedVerifyMatchesSolo(t *testing.T) {
	eachBatchModel(t, func(t *testing.T, m model.BatchModel, spec modelgen.Qwen3Spec) {
		batchtest.RunVerifyScenarios(t, m, spec.Vocab, []int{spec.Layers - 1, 1})
	})
}
