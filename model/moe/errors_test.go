package moe_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// TestBlockErrors checks the load errors a family's user sees for a bad checkpoint.
func TestBlockErrors(t *testing.T) {
	c := blockCase{family: "next", E: 8, K: 2, H: 128, Im: 64, Is: 64, norm: true, dtype: "float32", rows: []int{1}}
	dir := writeRef(t, c)
	// The reference file is not a weight shard: keep it out of the way.
	if err := os.Rename(filepath.Join(dir, "ref.safetensors"), filepath.Join(t.TempDir(), "ref.safetensors")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(dir string)
		cfg  func(*blockCase)
		want []string
	}{
		{
			name: "expert count",
			cfg:  func(c *blockCase) { c.E = 16 },
			want: []string{"tensor model.layers.0.mlp.gate.weight has 8 experts but the config has num_experts 16"},
		},
		{
			name: "missing expert tensor",
			edit: func(dir string) { dropTensor(t, dir, "model.layers.0.mlp.switch_mlp.down_proj.weight") },
			want: []string{"expert tensor model.layers.0.mlp.switch_mlp.down_proj.weight is missing"},
		},
		{
			name: "missing shared expert tensor",
			edit: func(dir string) { dropTensor(t, dir, "model.layers.0.mlp.shared_expert_gate.weight") },
			want: []string{"model.layers.0.mlp.shared_expert_gate.weight is missing"},
		},
		{
			name: "wrong intermediate size",
			cfg:  func(c *blockCase) { c.Im = 32 },
			want: []string{"model.layers.0.mlp.switch_mlp.gate_proj.weight has shape [8 64 128], want [8 32 128]",
				"model.layers.0.mlp.switch_mlp.down_proj.weight has shape [8 128 64], want [8 128 32]"},
		},
		{
			name: "no shared expert in the config",
			cfg:  func(c *blockCase) { c.family = "moe" },
			want: []string{"unexpected tensors in the checkpoint: model.layers.0.mlp.shared_expert.down_proj.weight"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			for _, f := range []string{"model.safetensors", "config.json"} {
				b, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.edit != nil {
				tc.edit(d)
			}
			cc := c
			if tc.cfg != nil {
				tc.cfg(&cc)
			}
			err := mlxc.Do(func() error {
				blk, err := load(d, cc.config(), false)
				if err == nil {
					blk.Free()
				}
				return err
			})
			if err == nil {
				t.Fatalf("load succeeded, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// dropTensor rewrites dir/model.safetensors without name.
func dropTensor(t *testing.T, dir, name string) {
	t.Helper()
	if err := mlxc.Do(func() error { return modelgen.DropTensors(dir, name) }); err != nil {
		t.Fatal(err)
	}
}
