package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Weights is the set of tensors of a checkpoint: validated headers first, arrays (lazy
// until evaluated) once Load ran. Arrays are caller-owned (detached from scopes).
type Weights struct {
	Dir    string
	Info   map[string]TensorInfo
	File   map[string]string // tensor name → file it lives in
	Arrays map[string]*mlxc.Array
	Bytes  int64
	// Shard, when it splits, is the part of a tensor-parallel model this process loads
	// (Builder.SplitOut, SplitIn); shardTaken records that the family split something, so
	// that Load refuses a family that cannot split rather than load it whole on every rank.
	Shard      *Shard
	shardTaken bool
	// MTP: the caller asked for the multi-token-prediction head (LoadOptions.MTP); a
	// family that has one keeps its tensors, the others ignore it.
	MTP bool
}

// Progress reports loading progress: done and total bytes.
type Progress func(done, total int64)

// ShardFiles lists a checkpoint's safetensors files. With model.safetensors.index.json the
// index decides (and every shard it names must exist); otherwise `model*.safetensors` as
// mlx-lm globs it, or any *.safetensors for drafter checkpoints.
func ShardFiles(dir string) ([]string, error) {
	idx := filepath.Join(dir, "model.safetensors.index.json")
	if b, err := os.ReadFile(idx); err == nil {
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &index); err != nil {
			return nil, fmt.Errorf("%s: bad JSON: %w", idx, err)
		}
		if len(index.WeightMap) == 0 {
			return nil, fmt.Errorf("%s: weight_map is empty", idx)
		}
		seen := map[string]bool{}
		var files []string
		for _, f := range index.WeightMap {
			if strings.Contains(f, "/") || strings.Contains(f, `\`) {
				return nil, fmt.Errorf("%s: shard name %q must be a file in the model folder", idx, f)
			}
			if !seen[f] {
				seen[f] = true
				p := filepath.Join(dir, f)
				if _, err := os.Stat(p); err != nil {
					return nil, fmt.Errorf("%s names shard %s, which is missing: %w", idx, f, err)
				}
				files = append(files, p)
			}
		}
		// Shards present on disk but absent from the index would silently be ignored by the
		// index; mlx-lm loads them (glob), so we do too.
		extra, _ := filepath.Glob(filepath.Join(dir, "model*.safetensors"))
		for _, p := range extra {
			if !seen[filepath.Base(p)] {
				files = append(files, p)
			}
		}
		sort.Strings(files)
		return files, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", idx, err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "model*.safetensors"))
	if len(files) == 0 {
		files, _ = filepath.Glob(filepath.Join(dir, "*.safetensors"))
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no *.safetensors weights found", dir)
	}
	sort.Strings(files)
	return files, nil
}

// ReadWeightHeaders validates every shard's header and indexes tensors by name.
func ReadWeightHeaders(dir string) (*Weights, error) {
	files, err := ShardFiles(dir)
	if err != nil {
		return nil, err
	}
	w := &Weights{Dir: dir, Info: map[string]TensorInfo{}, File: map[string]string{}}
	for _, f := range files {
		h, err := ReadSafetensorsHeader(f)
		if err != nil {
			return nil, err
		}
		for name, t := range h.Tensors {
			if prev, dup := w.File[name]; dup {
				return nil, fmt.Errorf("tensor %q is in both %s and %s", name, filepath.Base(prev), filepath.Base(f))
			}
			w.Info[name] = t
			w.File[name] = f
			w.Bytes += t.End - t.Begin
		}
	}
	return w, nil
}

// Load maps every tensor (lazily) through MLX. Must run on the MLX thread. The arrays are
// detached: Free releases them.
func (w *Weights) Load(progress Progress) error {
	files := map[string]bool{}
	for _, f := range w.File {
		files[f] = true
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	w.Arrays = make(map[string]*mlxc.Array, len(w.Info))
	var done int64
	for _, f := range names {
		var tensors map[string]*mlxc.Array
		err := mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			tensors, _ = mlxc.LoadSafetensors(f)
			for _, a := range tensors {
				a.Detach()
			}
		})
		if err != nil {
			w.Free()
			return fmt.Errorf("load %s: %w", f, err)
		}
		for name, a := range tensors {
			w.Arrays[name] = a
			if info, ok := w.Info[name]; ok {
				done += info.End - info.Begin
			}
		}
		if progress != nil {
			progress(done, w.Bytes)
		}
	}
	return nil
}

// Take removes and returns a tensor; the caller owns it.
func (w *Weights) Take(name string) (*mlxc.Array, bool) {
	a, ok := w.Arrays[name]
	if ok {
		delete(w.Arrays, name)
	}
	return a, ok
}

// Free releases all arrays still held.
func (w *Weights) Free() {
	for k, a := range w.Arrays {
		a.Free()
		delete(w.Arrays, k)
	}
}

// Has reports whether a tensor exists (by header).
func (w *Weights) Has(name string) bool { _, ok := w.Info[name]; return ok }

// fileOf names the shard holding a tensor, for error messages.
func (w *Weights) fileOf(name string) string {
	if f, ok := w.File[name]; ok {
		return filepath.Base(f)
	}
	return "(no file)"
}

// The rewrites below are for the families' sanitize steps, which turn a checkpoint's
// stored form into the one their modules load (mlx-lm's Model.sanitize). Each keeps Info,
// File, Arrays and Bytes consistent, so that Builder's checks and the resident-size report
// see the rewritten set.

// Drop removes a tensor (header and array) from the set.
func (w *Weights) Drop(name string) {
	if a, ok := w.Take(name); ok {
		a.Free()
	}
	info := w.Info[name]
	w.Bytes -= info.End - info.Begin
	delete(w.Info, name)
	delete(w.File, name)
}

// Rename moves a tensor to a new name.
func (w *Weights) Rename(from, to string) {
	info := w.Info[from]
	info.Name = to
	w.Info[to] = info
	w.File[to] = w.File[from]
	delete(w.Info, from)
	delete(w.File, from)
	if a, ok := w.Take(from); ok {
		w.Arrays[to] = a
	}
}

// Replace swaps a tensor's array for a, a function of it of the given shape (same dtype
// and size); a is detached like the arrays Load makes, and the old handle released.
func (w *Weights) Replace(name string, a *mlxc.Array, shape []int) {
	a.Detach()
	if old, ok := w.Arrays[name]; ok {
		old.Free()
	}
	w.Arrays[name] = a
	info := w.Info[name]
	info.Shape = shape
	w.Info[name] = info
}

// Combine puts a, made from the tensors parts (same dtype; their arrays already taken
// and owned by the caller), in their place under the name to: the parts' headers go, and
// to's header takes a's shape and the parts' bytes, so Bytes does not change.
func (w *Weights) Combine(to string, a *mlxc.Array, parts []string) {
	info := TensorInfo{Name: to, Dtype: a.Dtype(), Shape: a.Shape()}
	for _, p := range parts {
		pi := w.Info[p]
		info.End += pi.End - pi.Begin
		if _, ok := w.File[to]; !ok {
			w.File[to] = w.File[p]
		}
		delete(w.Info, p)
		delete(w.File, p)
	}
	w.Info[to] = info
	w.Arrays[to] = a.Detach()
}
