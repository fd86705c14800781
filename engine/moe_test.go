package engine

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// decisiveQwen3MoE is a tiny qwen3_moe target (dense first layer, eight experts, top-2)
// with large logit gaps and no EOS.
func decisiveQwen3MoE(seed uint64) modelgen.Qwen3Spec {
	s := modelgen.TinyQwen3MoE()
	s.Seed, s.WeightStd, s.EOS = seed, 0.12, []int{-1}
	return s
}

// decisiveQwen35MoE is the decisive hybrid with a sparse MoE MLP in every layer.
func decisiveQwen35MoE(seed uint64) modelgen.Qwen35Spec {
	s := decisiveHybrid(seed)
	s.Experts, s.TopK, s.MoEInter, s.SharedInter, s.NormTopK = 8, 2, 64, 64, true
	return s
}

// moePairs are MoE targets of both families with their drafters: qwen3_moe in bf16, in
// 4-bit (routers at 8 bits) and with sixteen experts, top-4 (verify blocks past the
// sorted-gather threshold), and qwen3_5_moe.
func moePairs(t *testing.T) map[string]*pair {
	q4 := decisiveQwen3MoE(42)
	q4.PerExpert, q4.QuantBits, q4.QuantGroup = false, 4, 64
	wide := decisiveQwen3MoE(43)
	wide.Experts, wide.TopK, wide.MoEInter = 16, 4, 32
	return map[string]*pair{
		"qwen3_moe-bf16":   loadPair(t, "moe-decisive-bf16", decisiveQwen3MoE(41), 2),
		"qwen3_moe-4bit":   loadPair(t, "moe-decisive-4bit", q4, 2),
		"qwen3_moe-e16k4":  loadPair(t, "moe-decisive-e16k4", wide, 2),
		"qwen3_5_moe-bf16": loadHybridPair(t, "hybrid-decisive-moe", decisiveQwen35MoE(34), 2),
	}
}

// Greedy DFlash on MoE targets emits plain decoding's tokens in both loops, for several
// prompts, lengths and block sizes (a verify block routes each row by itself, so its
// experts and their products are those of the one-token steps).
func TestMoEDFlashGreedyEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	for name, p := range moePairs(t) {
		greedyBothLoops(t, name, p, prompts(p.vocab)[:2], []int{5, 37}, []int{4, 16})
	}
}

// Rollback exactness on the qwen3_moe target in the serial loop, as for the hybrid one
// (TestHybridScriptedRollbackMatchesFreshRun runs qwen3_5_moe): every acceptance length,
// caches equal to a plain decoding's after every cycle.
func TestMoEScriptedRollbackMatchesFreshRun(t *testing.T) {
	testenv.RequireShapeExact(t)
	scriptedRollback(t, "qwen3_moe", moePairs(t)["qwen3_moe-e16k4"])
}
