package model_test

import (
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// A loaded model holds its checkpoint's tensors once: no dequantized expert stacks, no
// transposed or float32 copies (the transposed views share their weights' memory, and
// merged projections replace their parts). MLX's active memory grows by the tensor bytes
// the model kept, within 64 KiB of constants (rotary frequencies, scales).
func TestResidentMatchesCheckpoint(t *testing.T) {
	q3 := modelgen.TinyQwen3MoE()
	q3.PerExpert, q3.QuantBits, q3.QuantGroup = false, 4, 64
	q35 := modelgen.TinyQwen35MoE()
	q35.QuantBits, q35.QuantGroup = 4, 64
	q35bf := modelgen.TinyQwen35MoE()
	q35bf.Layout = modelgen.Qwen35HF // fused experts split at load
	cases := []struct {
		name  string
		write func(dir string) error
	}{
		{"qwen3_moe-4bit", func(d string) error { return modelgen.WriteQwen3(d, q3) }},
		{"qwen3_moe-hf-bf16", func(d string) error { return modelgen.WriteQwen3(d, modelgen.TinyQwen3MoE()) }},
		{"qwen3_5_moe-4bit", func(d string) error { return modelgen.WriteQwen35(d, q35) }},
		{"qwen3_5_moe-hf-bf16", func(d string) error { return modelgen.WriteQwen35(d, q35bf) }},
		{"qwen3_5_moe-mlx-bf16", func(d string) error { return modelgen.WriteQwen35(d, modelgen.TinyQwen35MoE()) }},
		{"qwen3-bf16", func(d string) error { return modelgen.WriteQwen3(d, modelgen.TinyQwen3()) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			err := mlxc.Do(func() error {
				if err := c.write(dir); err != nil {
					return err
				}
				mlxc.ClearCache()
				before := mlxc.ActiveMemory()
				s := settings.ForTests()
				m, err := model.Load(dir, model.LoadOptions{Settings: &s})
				if err != nil {
					return err
				}
				defer m.Free()
				held := int64(mlxc.ActiveMemory()) - int64(before)
				want := m.Arch().WeightBytes
				if d := held - want; d < 0 || d > 64<<10 {
					t.Errorf("the loaded model holds %d bytes, its tensors are %d (%+d)", held, want, d)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
