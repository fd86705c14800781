package modelgen_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// Every layout and precision WriteQwen35 writes loads in mlx-lm strictly: no tensor
// missing, none left over, every shape what mlx-lm's modules (after its sanitize and its
// quantization rule) expect.
func TestQwen35LoadsInMLXLM(t *testing.T) {
	py := reftest.Python(t)
	script := filepath.Join(reftest.RepoRoot(), "model", "qwen35", "testdata", "mlxlm_ref.py")
	cases := []struct {
		name string
		mod  func(*modelgen.Qwen35Spec)
	}{
		{"hf-bf16-tied", func(s *modelgen.Qwen35Spec) { s.Layout = modelgen.Qwen35HF }},
		{"hf-bf16-untied", func(s *modelgen.Qwen35Spec) { s.Layout = modelgen.Qwen35HF; s.Tied = false }},
		{"mlx-bf16-untied", func(s *modelgen.Qwen35Spec) { s.Tied = false }},
		{"mlx-4bit-tied", func(s *modelgen.Qwen35Spec) { s.QuantBits, s.QuantGroup = 4, 64 }},
		{"mlx-8bit-untied", func(s *modelgen.Qwen35Spec) { s.Tied = false; s.QuantBits, s.QuantGroup = 8, 32 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35()
			tc.mod(&spec)
			dir := t.TempDir()
			if err := mlxc.Do(func() error { return modelgen.WriteQwen35(dir, spec) }); err != nil {
				t.Fatal(err)
			}
			if spec.Layout == modelgen.Qwen35HF {
				b, err := os.ReadFile(filepath.Join(dir, "config.json"))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(b), "vision_config") {
					t.Error("the HF layout's config.json has no vision_config")
				}
			}
			if out := reftest.Run(t, py, script, "load", dir); !strings.HasPrefix(out, "ok") {
				t.Errorf("mlx-lm load: %s", out)
			}
		})
	}
}
