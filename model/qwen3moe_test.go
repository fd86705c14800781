package model_test

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// qwen3_moe checkpoints against mlx-lm: several expert counts and top-k, sparse steps and
// dense-only layers, both layouts (Hugging Face's per-expert tensors, which loading stacks,
// and mlx-community's switch_mlp), bf16, float32 and 4/8-bit (mlx-lm's converter puts the
// routers at 8 bits). Qwen3-MoE has no shared expert. On the CPU both sides run the bf16
// experts' gathered products on float32 casts (the script patches mlx-lm's gather_mm
// there the way the moe package does), so everything agrees bit for bit.
func TestQwen3MoEMatchesMLXLM(t *testing.T) {
	runParityCases(t, modelgen.TinyQwen3MoE(), "qwen3_moe", []parityCase{
		{name: "hf-bf16-e8-k2-dense-first", mod: func(s *modelgen.Qwen3Spec) {}},
		{name: "hf-f32-e4-k1-nonorm-untied", mod: func(s *modelgen.Qwen3Spec) {
			s.Dtype, s.Tied, s.Seed = mlxc.Float32, false, 31
			s.Experts, s.TopK, s.NormTopK = 4, 1, false
		}},
		// 20 rows × 4 experts is past the sort threshold: the sorted gather path.
		{name: "mlx-bf16-e16-k4-step2", mod: func(s *modelgen.Qwen3Spec) {
			s.Seed, s.PerExpert = 32, false
			s.Experts, s.TopK, s.MoEInter, s.SparseStep, s.MLPOnly = 16, 4, 32, 2, nil
		}},
		{name: "mlx-4bit-g64-e8-k2", mod: func(s *modelgen.Qwen3Spec) {
			s.Seed, s.PerExpert, s.QuantBits, s.QuantGroup = 33, false, 4, 64
		}},
		{name: "hf-converted-4bit-g32", mod: func(s *modelgen.Qwen3Spec) { s.Seed, s.Tied = 34, false }, bits: 4, group: 32},
		{name: "hf-converted-8bit-g64-e16-k4", mod: func(s *modelgen.Qwen3Spec) {
			s.Seed, s.Experts, s.TopK = 35, 16, 4
		}, bits: 8, group: 64},
	})
}
