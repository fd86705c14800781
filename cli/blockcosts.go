package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/internal/atomicfile"
	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// The adaptive block's start-up measurement times a DFlash cycle per block size. On a GPU
// it took 25–70 s of every process's start (it also meets each block's shapes for the
// first time), so a measurement is kept in the user's cache and a later process with the
// same device, build, models' shapes and settings starts from it. The decoder keeps
// learning step costs as it runs, so a remembered table is a starting point, as a fresh
// one is. bench always measures anew.

// blockCostsFormat is the file's layout version; another version reads as empty.
const blockCostsFormat = 1

// blockCostsKept is how many measurements the file holds (the oldest go first).
const blockCostsKept = 64

type blockCostEntry struct {
	Costs    engine.BlockCosts `json:"costs"`
	Measured time.Time         `json:"measured"`
}

type blockCostFile struct {
	Format  int                       `json:"format"`
	Entries map[string]blockCostEntry `json:"entries"`
}

// blockCostStore is the measurements' file ("" path: nothing is kept).
type blockCostStore struct{ path string }

// defaultBlockCostStore is the file in the user's cache folder (none where there is no
// such folder).
func defaultBlockCostStore() blockCostStore {
	base, err := os.UserCacheDir()
	if err != nil {
		return blockCostStore{}
	}
	return blockCostStore{path: filepath.Join(base, "dflash-mlx", "block-costs.json")}
}

// blockCostKey names what a measurement depends on: the device and MLX, this build, the
// target's and drafter's configs (their shapes, dtypes and quantization), the settings
// (kernels, loops) and the probe itself.
func blockCostKey(dev kernelcheck.Device, build, targetDir, draftDir string, st settings.Settings, sizes []int, probe int) (string, error) {
	h := sha256.New()
	stJSON, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("block costs key: %w", err)
	}
	fmt.Fprintf(h, "device %s|%s|%s\nbuild %s\nsettings %s\nsizes %v probe %d\n", dev.Name, dev.MLX, dev.Backend, build, stJSON, sizes, probe)
	for _, dir := range []string{targetDir, draftDir} {
		b, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			return "", fmt.Errorf("block costs key: %w", err)
		}
		fmt.Fprintf(h, "config %d\n", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// buildID names this build: its version, and for a development build ("dev", the same
// name for every change) the executable's size and modification time too.
func buildID() string {
	if Version != "dev" {
		return Version
	}
	exe, err := os.Executable()
	if err != nil {
		return Version
	}
	fi, err := os.Stat(exe)
	if err != nil {
		return Version
	}
	return fmt.Sprintf("%s %d %d", Version, fi.Size(), fi.ModTime().UnixNano())
}

// read returns the file's entries; a missing, damaged or other-format file reads as none.
func (s blockCostStore) read() map[string]blockCostEntry {
	f := blockCostFile{Entries: map[string]blockCostEntry{}}
	if s.path == "" {
		return f.Entries
	}
	b, err := os.ReadFile(s.path)
	if err != nil || json.Unmarshal(b, &f) != nil || f.Format != blockCostsFormat || f.Entries == nil {
		return map[string]blockCostEntry{}
	}
	return f.Entries
}

// get returns the measurement under key, if a valid one is kept.
func (s blockCostStore) get(key string) (engine.BlockCosts, bool) {
	e, ok := s.read()[key]
	if !ok || !validBlockCosts(e.Costs) {
		return engine.BlockCosts{}, false
	}
	return e.Costs, true
}

// validBlockCosts: ascending positive sizes, one positive finite cost each.
func validBlockCosts(bc engine.BlockCosts) bool {
	if len(bc.Sizes) == 0 || len(bc.Sizes) != len(bc.MS) {
		return false
	}
	for i, B := range bc.Sizes {
		if B < 1 || (i > 0 && B <= bc.Sizes[i-1]) || !(bc.MS[i] > 0 && bc.MS[i] < 1e9) {
			return false
		}
	}
	return true
}

// put keeps bc under key (the whole file rewritten atomically: a reader never sees part
// of it; of two processes writing at once, the last one's file stays).
func (s blockCostStore) put(key string, bc engine.BlockCosts, now time.Time) error {
	if s.path == "" {
		return nil
	}
	entries := s.read()
	entries[key] = blockCostEntry{Costs: bc, Measured: now}
	if len(entries) > blockCostsKept {
		keys := make([]string, 0, len(entries))
		for k := range entries {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return entries[keys[i]].Measured.Before(entries[keys[j]].Measured) })
		for _, k := range keys[:len(entries)-blockCostsKept] {
			delete(entries, k)
		}
	}
	b, err := json.MarshalIndent(blockCostFile{Format: blockCostsFormat, Entries: entries}, "", " ")
	if err != nil {
		return fmt.Errorf("block costs: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("block costs: %w", err)
	}
	if err := atomicfile.Write(s.path, b, 0o600); err != nil {
		return fmt.Errorf("block costs: %w", err)
	}
	return nil
}
