package familytest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	_ "github.com/dflash-mlx/dflash-mlx/model/qwen3" // the family the test family wraps
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// renamedType is a test family: Qwen3's math under another model_type, with a guard that
// proves the family's own constructor ran.
const renamedType = "qwen3_familytest"

var built int

func init() {
	qwen3, ok := model.LookupFamily("qwen3")
	if !ok {
		panic("qwen3 is not registered")
	}
	model.Register(renamedType, func(cfg *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings) (model.Model, error) {
		built++
		return qwen3(cfg, w, q, s)
	})
}

// A checkpoint whose config names the test family loads through model.Load, is built by
// that family, and computes what the same weights give as a qwen3 checkpoint; a model_type
// nobody registered is refused naming the registered ones; registering a name twice panics.
func TestFamilyRegisteredOutsideModel(t *testing.T) {
	dir := t.TempDir()
	plain, renamed := filepath.Join(dir, "qwen3"), filepath.Join(dir, "renamed")
	unknown := filepath.Join(dir, "unknown")
	spec := modelgen.TinyQwen3()
	// modelgen evaluates the random weights with MLX: on the MLX thread.
	err := mlxc.Do(func() error {
		for _, d := range []string{plain, renamed, unknown} {
			if err := modelgen.WriteQwen3(d, spec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	setModelType(t, renamed, renamedType)
	setModelType(t, unknown, "qwen3_not_registered")

	logits := func(d string) []float32 {
		var out []float32
		err := mlxc.Do(func() error {
			m, err := model.Load(d, model.LoadOptions{})
			if err != nil {
				return err
			}
			defer m.Free()
			s := mlxc.NewScope()
			defer s.Close()
			c := m.NewCache()
			defer c.Free()
			o := m.Forward(mlxc.FromSlice([]int32{1, 5, 9, 2}, 1, 4), c, model.ForwardOptions{Logits: model.LogitsAll})
			out = mlxc.AsType(o.Logits, mlxc.Float32).Float32s()
			return nil
		})
		if err != nil {
			t.Fatalf("load %s: %v", d, err)
		}
		return out
	}
	want := logits(plain)
	before := built
	got := logits(renamed)
	if built != before+1 {
		t.Fatalf("the test family's constructor ran %d times, want once", built-before)
	}
	if len(got) != len(want) {
		t.Fatalf("%d logits, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %v, qwen3 gives %v", i, got[i], want[i])
		}
	}

	err = mlxc.Do(func() error { _, err := model.Load(unknown, model.LoadOptions{}); return err })
	if err == nil || !strings.Contains(err.Error(), "qwen3_not_registered") || !strings.Contains(err.Error(), renamedType) {
		t.Errorf("unregistered model_type: %v, want an error naming it and the registered families", err)
	}

	defer func() {
		if recover() == nil {
			t.Error("registering qwen3 twice did not panic")
		}
	}()
	model.Register("qwen3", func(*model.RawConfig, *model.Weights, *model.QuantConfig, settings.Settings) (model.Model, error) {
		return nil, nil
	})
}

func setModelType(t *testing.T, dir, modelType string) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["model_type"] = modelType
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
