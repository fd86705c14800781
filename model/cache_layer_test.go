package model_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// equalCaches compares two caches' valid rows: bit for bit where rounding does not depend
// on the shape, else within 1/32 of the largest magnitude (a wrong row differs by the
// values' own size).
func equalCaches(t *testing.T, what string, got, want []*mlxc.Array) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d arrays, want %d", what, len(got), len(want))
	}
	for i := range got {
		if g, w := got[i].Shape(), want[i].Shape(); g[2] != w[2] {
			t.Errorf("%s: array %d holds %d rows, want %d", what, i, g[2], w[2])
			continue
		}
		d, m := maxAbsDiffArrays(got[i], want[i]), maxAbsArray(want[i])
		if testenv.ShapeExact() && d != 0 || d > m/32 {
			t.Errorf("%s: array %d differs by %g (largest magnitude %g)", what, i, d, m)
		}
	}
}

// A KV layer keeps the committed prefix of a tentative block: speculate, run a block,
// commit its first rows, run one more token, and the cache equals a fresh run over the
// same tokens. The refused commits change nothing.
func TestKVLayerSpeculateCommitMatchesFreshRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	writeModel(t, dir, modelgen.TinyQwen3())
	m := loadModel(t, dir)
	prompt := []int32{11, 22, 33, 44, 55, 66, 77}
	block := []int32{5, 6, 7, 8, 9, 10, 11, 12}
	none := model.ForwardOptions{Logits: model.LogitsNone}
	run := func(c model.Cache, toks []int32) {
		if len(toks) > 0 {
			m.Forward(mlxc.FromSlice(toks, 1, len(toks)), c, none)
		}
	}
	for _, keep := range []int{1, 4, len(block)} {
		err := mlxc.Do(func() error {
			s := mlxc.NewScope()
			defer s.Close()
			c, fresh := m.NewCache(), m.NewCache()
			defer c.Free()
			defer fresh.Free()
			run(c, prompt)
			c.Speculate()
			run(c, block)
			for _, bad := range [][]int{{1}, {0, 2}, cache.Prefix(len(block) + 1)} {
				if err := c.Commit(bad); err == nil {
					t.Errorf("keep %d: commit of rows %v accepted", keep, bad)
				}
			}
			if err := c.Commit(cache.Prefix(keep)); err != nil {
				return err
			}
			if got, want := c.Offset(), len(prompt)+keep; got != want {
				t.Errorf("keep %d: offset %d after commit, want %d", keep, got, want)
			}
			if err := c.Commit(cache.Prefix(keep)); err == nil {
				t.Errorf("keep %d: a second commit without speculate accepted", keep)
			}
			run(c, []int32{99})
			run(fresh, prompt)
			run(fresh, block[:keep])
			run(fresh, []int32{99})
			equalCaches(t, fmt.Sprintf("commit of %d rows", keep), kvSnapshot(c), kvSnapshot(fresh))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A KV layer's snapshot restores the state it was taken in: after more tokens and a
// restore, re-running them gives the same cache; a snapshot past the offset, or of
// another layer kind, is refused.
func TestKVLayerSnapshotRestore(t *testing.T) {
	m, prompt, more, none := tinyKVRun(t)
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		c := m.NewCache()
		defer c.Free()
		kv := c.(*model.KVCaches)
		m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, none)
		snap := kv.List.Snapshot()
		defer snap.Free()
		m.Forward(mlxc.FromSlice(more, 1, len(more)), c, none)
		before := kvSnapshot(c)
		late := kv.List.Snapshot()
		if err := kv.List.Restore(snap); err != nil {
			return err
		}
		if c.Offset() != len(prompt) {
			t.Errorf("offset %d after restore, want %d", c.Offset(), len(prompt))
		}
		if err := kv.List.Restore(late); err == nil {
			t.Error("restoring a snapshot past the offset accepted")
		}
		if err := kv.Layers[0].Restore(foreignSnapshot{}); err == nil {
			t.Error("restoring another layer kind's snapshot accepted")
		}
		m.Forward(mlxc.FromSlice(more, 1, len(more)), c, none)
		equalCaches(t, "restore and re-run", kvSnapshot(c), before)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// tinyKVRun loads a tiny Qwen3 and gives a prompt, more tokens after it and the options of
// a forward without logits.
func tinyKVRun(t *testing.T) (m model.Model, prompt, more []int32, none model.ForwardOptions) {
	dir := filepath.Join(t.TempDir(), "m")
	writeModel(t, dir, modelgen.TinyQwen3())
	return loadModel(t, dir), []int32{3, 1, 4, 1, 5, 9, 2, 6}, []int32{5, 3, 5, 8, 9}, model.ForwardOptions{Logits: model.LogitsNone}
}

type foreignSnapshot struct{}

func (foreignSnapshot) Free() {}

// A saved KV state is a copy: after the live cache rewinds and writes other rows over the
// saved positions, an empty cache loaded from it at any shorter position and run on equals
// a fresh run of the saved tokens (bit for bit where rounding does not depend on shape).
// Saves and loads that cannot be exact are refused: a load into a cache that holds rows
// changes nothing, one that fails part way leaves the list empty.
func TestKVLayerSaveLoad(t *testing.T) {
	m, prompt, more, none := tinyKVRun(t)
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		c := m.NewCache()
		defer c.Free()
		m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, none)
		saved, err := c.Save(len(prompt))
		if err != nil {
			return err
		}
		defer cache.FreeSaved(saved)
		mlxc.Eval(cache.SavedArrays(saved)...)
		if err := c.Rewind(4); err != nil {
			return err
		}
		m.Forward(mlxc.FromSlice(more, 1, len(more)), c, none) // over the saved rows 4..
		for _, n := range []int{len(prompt), 5, 1} {
			fresh := m.NewCache()
			m.Forward(mlxc.FromSlice(append(append([]int32(nil), prompt[:n]...), more...), 1, n+len(more)), fresh, none)
			loaded := m.NewCache()
			loaded.Reserve(64)
			if err := loaded.Load(saved, n); err != nil {
				return err
			}
			m.Forward(mlxc.FromSlice(more, 1, len(more)), loaded, none)
			equalCaches(t, fmt.Sprintf("loaded at %d and run on", n), kvSnapshot(loaded), kvSnapshot(fresh))
			fresh.Free()
			loaded.Free()
		}
		for _, bad := range []struct {
			what string
			err  func() error
		}{
			{"save past the offset", func() error { _, err := c.Save(c.Offset() + 1); return err }},
			{"load past the saved rows", func() error { x := m.NewCache(); defer x.Free(); return x.Load(saved, len(prompt)+1) }},
			{"load into a cache that holds rows", func() error {
				before := c.Offset()
				err := c.Load(saved, 2)
				if c.Offset() != before {
					t.Errorf("a refused load changed the offset from %d to %d", before, c.Offset())
				}
				return err
			}},
			{"load of another list", func() error { x := m.NewCache(); defer x.Free(); return x.Load(saved[:1], 1) }},
			{"load of another layer kind", func() error {
				x := m.NewCache()
				defer x.Free()
				other := append([]cache.Saved{{Kind: "recurrent", Offset: 1}}, saved[1:]...)
				err := x.Load(other, 1)
				if x.Offset() != 0 {
					t.Errorf("a refused load left %d positions", x.Offset())
				}
				return err
			}},
		} {
			if bad.err() == nil {
				t.Errorf("%s accepted", bad.what)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
