package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// The key changes with everything a cycle's cost depends on, and only with that.
func TestBlockCostKey(t *testing.T) {
	dir := t.TempDir()
	writeConfig := func(name, text string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "config.json"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	target := writeConfig("t", `{"hidden_size": 64}`)
	target2 := writeConfig("t2", `{"hidden_size": 128}`)
	drafter := writeConfig("d", `{"block_size": 16}`)
	dev := kernelcheck.Device{Name: "gpu", MLX: "0.32.4", Backend: "cuda"}
	st := settings.Settings{}
	base, err := blockCostKey(dev, "v1", target, drafter, st, []int{1, 2, 4}, 64)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := blockCostKey(dev, "v1", target, drafter, st, []int{1, 2, 4}, 64)
	if again != base {
		t.Fatalf("the same inputs gave keys %s and %s", base, again)
	}
	gpuExact := st
	gpuExact.Loop.GPUExact = true
	otherDev := dev
	otherDev.Name = "another gpu"
	for _, tc := range []struct {
		name string
		key  func() (string, error)
	}{
		{"device", func() (string, error) { return blockCostKey(otherDev, "v1", target, drafter, st, []int{1, 2, 4}, 64) }},
		{"build", func() (string, error) { return blockCostKey(dev, "v2", target, drafter, st, []int{1, 2, 4}, 64) }},
		{"target config", func() (string, error) { return blockCostKey(dev, "v1", target2, drafter, st, []int{1, 2, 4}, 64) }},
		{"drafter", func() (string, error) { return blockCostKey(dev, "v1", target, target, st, []int{1, 2, 4}, 64) }},
		{"settings", func() (string, error) {
			return blockCostKey(dev, "v1", target, drafter, gpuExact, []int{1, 2, 4}, 64)
		}},
		{"sizes", func() (string, error) { return blockCostKey(dev, "v1", target, drafter, st, []int{1, 2}, 64) }},
		{"probe", func() (string, error) { return blockCostKey(dev, "v1", target, drafter, st, []int{1, 2, 4}, 32) }},
	} {
		k, err := tc.key()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if k == base {
			t.Errorf("another %s gave the same key", tc.name)
		}
	}
	if _, err := blockCostKey(dev, "v1", filepath.Join(dir, "missing"), drafter, st, nil, 64); err == nil {
		t.Error("a target folder without config.json gave a key")
	}
}

func TestBlockCostStore(t *testing.T) {
	good := engine.BlockCosts{Sizes: []int{1, 4, 16}, MS: []float64{3.5, 5.8, 6.0}, Probe: 64}
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	t.Run("round trip", func(t *testing.T) {
		s := blockCostStore{path: filepath.Join(t.TempDir(), "sub", "block-costs.json")}
		if _, ok := s.get("k"); ok {
			t.Fatal("an empty store returned costs")
		}
		if err := s.put("k", good, t0); err != nil {
			t.Fatal(err)
		}
		got, ok := s.get("k")
		if !ok {
			t.Fatal("the costs just kept were not found")
		}
		if diff := cmp.Diff(good, got); diff != "" {
			t.Errorf("costs changed on the way (-kept +read):\n%s", diff)
		}
		if _, ok := s.get("other"); ok {
			t.Error("another key found the costs")
		}
	})
	t.Run("damaged or foreign files read as empty and are replaced", func(t *testing.T) {
		for _, text := range []string{"{", `{"format": 99, "entries": {"k": {}}}`, `{"format": 1, "entries": {"k": {"costs": {"sizes": [4, 1], "cycle_ms": [1, 2]}}}}`,
			`{"format": 1, "entries": {"k": {"costs": {"sizes": [1, 4], "cycle_ms": [1]}}}}`, `{"format": 1, "entries": {"k": {"costs": {"sizes": [1], "cycle_ms": [0]}}}}`} {
			s := blockCostStore{path: filepath.Join(t.TempDir(), "block-costs.json")}
			if err := os.WriteFile(s.path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, ok := s.get("k"); ok {
				t.Errorf("file %s gave costs", text)
			}
			if err := s.put("k", good, t0); err != nil {
				t.Fatal(err)
			}
			if _, ok := s.get("k"); !ok {
				t.Errorf("file %s: not replaced by a good one", text)
			}
		}
	})
	t.Run("the newest are kept", func(t *testing.T) {
		s := blockCostStore{path: filepath.Join(t.TempDir(), "block-costs.json")}
		for i := range blockCostsKept + 5 {
			if err := s.put(fmt.Sprint(i), good, t0.Add(time.Duration(i)*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(s.read()); n != blockCostsKept {
			t.Errorf("%d entries kept, want %d", n, blockCostsKept)
		}
		for i, want := range map[int]bool{0: false, 4: false, 5: true, blockCostsKept + 4: true} {
			if _, ok := s.get(fmt.Sprint(i)); ok != want {
				t.Errorf("entry %d kept %v, want %v", i, ok, want)
			}
		}
	})
	t.Run("no path keeps nothing", func(t *testing.T) {
		s := blockCostStore{}
		if err := s.put("k", good, t0); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.get("k"); ok {
			t.Error("a store without a file returned costs")
		}
	})
}

// A second session on the same models starts from the first one's measurement, and one
// that asks for fresh costs (bench) measures again.
func TestSessionsRememberBlockCosts(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	td, dd := tinyPair(t)
	open := func(fresh bool) *Session {
		s, err := Open(context.Background(), LoadConfig{Target: td, Draft: dd, Quiet: true, Log: io.Discard, FreshBlockCosts: fresh})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		if s.Engine.BlockCosts == nil {
			t.Fatal("no block costs: the block is not adaptive")
		}
		return s
	}
	first := open(false)
	second := open(false)
	if first.BlockCostsRemembered || !second.BlockCostsRemembered {
		t.Fatalf("remembered: first %v, second %v; want false, true", first.BlockCostsRemembered, second.BlockCostsRemembered)
	}
	if diff := cmp.Diff(*first.Engine.BlockCosts, *second.Engine.BlockCosts); diff != "" {
		t.Errorf("the second session's costs differ from the first's (-first +second):\n%s", diff)
	}
	if third := open(true); third.BlockCostsRemembered {
		t.Error("a session asking for fresh costs took remembered ones")
	}
}
