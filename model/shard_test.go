package model_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	_ "github.com/dflash-mlx/dflash-mlx/model/families"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// A split the checkpoint's shape or family does not allow is refused at load with the
// reason, before any collective runs (the group is never used, so none is made here).
func TestShardRefusals(t *testing.T) {
	qwen3 := func(edit func(*modelgen.Qwen3Spec)) func(string) error {
		return func(dir string) error {
			s := modelgen.TinyQwen3()
			edit(&s)
			return modelgen.WriteQwen3(dir, s)
		}
	}
	for _, tc := range []struct {
		name  string
		ranks int
		write func(dir string) error
		want  string
	}{
		{"fewer KV heads than ranks", 3, qwen3(func(s *modelgen.Qwen3Spec) {}), "2 KV heads cannot be split over 3 ranks"},
		{"heads", 3, qwen3(func(s *modelgen.Qwen3Spec) { s.Heads, s.KVHeads = 4, 4 }), "4 attention heads do not split over 3 ranks"},
		{"MLP width", 3, qwen3(func(s *modelgen.Qwen3Spec) { s.Heads, s.KVHeads, s.HeadDim = 6, 6, 16 }), "128 MLP columns (intermediate_size) do not split over 3 ranks"},
		{"quantization groups", 4, qwen3(func(s *modelgen.Qwen3Spec) { s.KVHeads, s.QuantBits, s.QuantGroup = 4, 4, 64 }), "32 input columns per rank are not whole 64-wide quantization groups"},
		{"qwen3_moe expert width", 3, func(dir string) error {
			s := modelgen.TinyQwen3MoE()
			s.Heads, s.KVHeads, s.HeadDim, s.Inter = 6, 6, 16, 192
			return modelgen.WriteQwen3(dir, s)
		}, "64 expert MLP columns (moe_intermediate_size) do not split over 3 ranks"},
		{"qwen3_moe expert quantization groups", 2, func(dir string) error {
			s := modelgen.TinyQwen3MoE()
			s.QuantBits, s.QuantGroup, s.PerExpert = 4, 64, false
			return modelgen.WriteQwen3(dir, s)
		}, "32 expert columns per rank are not whole 64-wide quantization groups"},
		{"qwen3_5 KV heads", 3, func(dir string) error { return modelgen.WriteQwen35(dir, modelgen.TinyQwen35()) }, "2 KV heads cannot be split over 3 ranks"},
		{"qwen3_5 GatedDeltaNet heads", 4, func(dir string) error {
			s := modelgen.TinyQwen35()
			s.KVHeads = 4
			return modelgen.WriteQwen35(dir, s)
		}, "2 GatedDeltaNet key heads do not split over 4 ranks"},
		{"qwen3_5_moe shared expert", 2, func(dir string) error {
			s := modelgen.TinyQwen35MoE()
			s.SharedInter = 63
			return modelgen.WriteQwen35(dir, s)
		}, "63 shared expert MLP columns do not split over 2 ranks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			err := mlxc.Do(func() error {
				if err := tc.write(dir); err != nil {
					return fmt.Errorf("writing the checkpoint: %w", err)
				}
				m, err := model.Load(dir, model.LoadOptions{Shard: &model.Shard{Rank: 1, Size: tc.ranks}})
				if err == nil {
					m.Free()
				}
				return err
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("load over %d ranks: %v; want an error with %q", tc.ranks, err, tc.want)
			}
		})
	}
}
