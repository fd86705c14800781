package draft_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

func TestDrafterValidatesAgainstTarget(t *testing.T) {
	dir := t.TempDir()
	spec := modelgen.TinyQwen3()
	target := loadTarget(t, dir, spec)
	cases := []struct {
		name string
		mod  func(*modelgen.DrafterSpec)
		edit func(m map[string]any)
		want string
	}{
		{"ok", func(*modelgen.DrafterSpec) {}, nil, ""},
		{"hidden size", func(s *modelgen.DrafterSpec) { s.Hidden = 32 }, nil, "hidden_size 32 does not match"},
		{"vocab", func(s *modelgen.DrafterSpec) { s.Vocab = 300 }, nil, "vocab_size 300"},
		{"layer id out of range", func(s *modelgen.DrafterSpec) { s.TargetLayerIDs = []int{0, 9} }, nil, "target_layer_ids has 9"},
		{"no mask token", nil, func(m map[string]any) { delete(m["dflash_config"].(map[string]any), "mask_token_id") }, "mask_token_id"},
		{"fallback ids", nil, func(m map[string]any) { delete(m["dflash_config"].(map[string]any), "target_layer_ids") }, "fc.weight has shape [64 128], want [64 64]"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ds := modelgen.DrafterFor(spec, 1)
			if c.mod != nil {
				c.mod(&ds)
			}
			dd := filepath.Join(dir, "d", string(rune('a'+i)))
			var err error
			_ = mlxc.Do(func() error {
				if e := modelgen.WriteDrafter(dd, ds); e != nil {
					t.Error(e)
					return nil
				}
				if c.edit != nil {
					p := filepath.Join(dd, "config.json")
					b, _ := os.ReadFile(p)
					var m map[string]any
					json.Unmarshal(b, &m)
					c.edit(m)
					b, _ = json.Marshal(m)
					os.WriteFile(p, b, 0o644)
				}
				var d *draft.Drafter
				d, err = draft.Load(dd, target, draft.LoadOptions{})
				if err == nil {
					d.Free()
				}
				return nil
			})
			if c.want == "" {
				if err != nil {
					t.Fatalf("valid drafter rejected: %v", err)
				}
				return
			}
			// "fallback ids": without target_layer_ids, num_target_layers 4 and one layer give
			// [2], so fc (written for two taps) has the wrong width: a clear shape error.
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want mention of %q", err, c.want)
			}
		})
	}
}
