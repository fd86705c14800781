package engine

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// pair is a loaded target (+ drafter) written fresh for a test.
type pair struct {
	spec   modelgen.Qwen3Spec // the Qwen3 target's spec (zero for other families)
	vocab  int
	target model.Model
	drft   *draft.Drafter
}

var pairCache sync.Map // spec name → *pair (models are read-only once loaded)

func loadPair(t *testing.T, name string, spec modelgen.Qwen3Spec, drafterLayers int) *pair {
	t.Helper()
	var ds *modelgen.DrafterSpec
	if drafterLayers > 0 {
		d := modelgen.DrafterFor(spec, drafterLayers)
		ds = &d
	}
	p := loadPairWith(t, name, spec.Vocab, func(dir string) error { return modelgen.WriteQwen3(dir, spec) }, ds)
	p.spec = spec
	return p
}

// loadPairWith writes a target with writeTarget and, when ds is set, its drafter, loads
// both, and caches the pair under name.
func loadPairWith(t *testing.T, name string, vocab int, writeTarget func(dir string) error, ds *modelgen.DrafterSpec) *pair {
	t.Helper()
	if p, ok := pairCache.Load(name); ok {
		return p.(*pair)
	}
	dir := t.TempDir()
	p := &pair{vocab: vocab}
	err := mlxc.Do(func() error {
		td, dd := filepath.Join(dir, "target"), filepath.Join(dir, "draft")
		if err := writeTarget(td); err != nil {
			return err
		}
		var err error
		if p.target, err = model.Load(td, model.LoadOptions{Settings: testSettings()}); err != nil {
			return err
		}
		if ds != nil {
			if err := modelgen.WriteDrafter(dd, *ds); err != nil {
				return err
			}
			if p.drft, err = draft.Load(dd, p.target, draft.LoadOptions{Settings: testSettings()}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pair %s: %v", name, err)
	}
	pairCache.Store(name, p)
	return p
}

func run(t *testing.T, e *Engine, req Request) (Result, []Event) {
	t.Helper()
	var evs []Event
	var res Result
	err := mlxc.Do(func() error {
		var err error
		res, err = e.Generate(context.Background(), req, func(ev Event) error {
			evs = append(evs, ev)
			return nil
		})
		return err
	})
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	return res, evs
}

func plainGreedy(t *testing.T, p *pair, prompt []int32, n int) []int32 {
	t.Helper()
	e := &Engine{Target: p.target}
	res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true})
	return res.Tokens
}

func eqTokens(a, b []int32) (int, bool) {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i, false
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b)), false
	}
	return -1, true
}

func prompts(vocab int) [][]int32 {
	return [][]int32{
		{1, 2, 3},
		{7},
		{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170},
		{200, 5, 5, 5, 9},
		{int32(vocab - 2), 0, 13, 77, 31, 64, 64, 2, 1},
	}
}

var _ = verify.Greedy

// testSettings are the settings of the test run (settings.ForTests: GPU-exact when the GPU
// test run asks for it).
func testSettings() *settings.Settings {
	s := settings.ForTests()
	return &s
}
