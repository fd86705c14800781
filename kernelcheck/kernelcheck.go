// Package kernelcheck admits custom kernels on the user's own device: before a model first
// uses a kernel there, the kernel runs on small random inputs against its fallback (the
// layer operation's MLX ops), and a compile failure or a mismatch disables it for that
// device with one warning line. Verdicts are remembered in the user's cache, keyed by the
// device, the MLX version and the kernel sources' hash, so that a check runs once per
// device and kernel version. settings.Kernels.Mode (DFLASH_KERNELS) picks check, trust
// (no check) or off (no custom kernel).
package kernelcheck

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/atomicfile"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Check is the self-check of one layer operation's kernels: they pass or fail together.
type Check struct {
	// Name says what is checked ("few-query attention").
	Name string
	// Kernels are the kernels the operation launches.
	Kernels []kernels.Kernel
	// Wanted reports whether the settings ask for the operation at all (nil: always).
	Wanted func(settings.Kernels) bool
	// Run runs the kernels and their fallback on small random inputs and returns why they
	// disagree (beyond the contract's bound) or failed to build or run; nil when they
	// agree. It runs on the MLX thread.
	Run func() error
	// Speed times the operation on a fixed small shape through its kernels and through its
	// fallback (seconds per call; nil: not measured). MLX thread.
	Speed func() (kernel, fallback float64, err error)
	// Quantized: the kernels serve quantized weights only (Gate.NoQuantized).
	Quantized bool
}

// Device is what a verdict holds for: a backend with a device name and an MLX version.
type Device struct {
	Backend kernels.Backend `json:"backend"` // "" where no custom kernel can run
	Name    string          `json:"name"`
	MLX     string          `json:"mlx"`
}

// Verdict is a check's outcome on one device.
type Verdict struct {
	OK      bool      `json:"ok"`
	Reason  string    `json:"reason,omitempty"`
	Checked time.Time `json:"checked"`
	Seconds float64   `json:"seconds"`
}

// State is one kernel's standing on this device, as doctor and --json report it.
type State struct {
	Kernel  string `json:"kernel"`
	Backend string `json:"backend"`
	// State is "verified" (checked against its fallback), "disabled" (Reason says why),
	// "trusted" (DFLASH_KERNELS=trust), "off" (DFLASH_KERNELS=off or its own setting),
	// "not needed" (for quantized weights, and the models loaded hold none: not checked),
	// or "not applicable" (no source for this backend, or no custom kernels here).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Remembered: the verdict came from the cache, not from a check run now.
	Remembered bool `json:"remembered,omitempty"`
	// Check names the check that covers the kernel ("" for none).
	Check string `json:"check,omitempty"`
}

// Key is what a verdict of c on d is stored under: the device, MLX's version, the check's
// name and every kernel's name, contract and source for d's backend.
func Key(d Device, c Check) string {
	h := sha256.New()
	fmt.Fprintf(h, "dflash-kernelcheck/1\x00%s\x00%s\x00%s\x00%s\x00", d.Backend, d.Name, d.MLX, c.Name)
	for _, k := range c.Kernels {
		src := source(k, d.Backend)
		js, _ := json.Marshal(k.Contract)
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", k.Name, js, src.Header, src.Body)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func source(k kernels.Kernel, b kernels.Backend) kernels.Source {
	switch b {
	case kernels.CUDA:
		return k.CUDA
	case kernels.Metal:
		return k.Metal
	}
	return kernels.Source{}
}

// Store keeps verdicts in one JSON file (an empty path: in memory only). Writes go to a
// temporary file that is renamed over the old one, so a reader never sees half a file; a
// damaged file counts as empty (one warning) and is replaced at the next write.
type Store struct {
	path string
	mu   sync.Mutex
	mem  map[string]Verdict
	warn io.Writer
}

type storeFile struct {
	Format   int                `json:"format"`
	Verdicts map[string]Verdict `json:"verdicts"`
}

const storeFormat = 1

// DefaultPath is the verdicts' file in the user's cache folder.
func DefaultPath() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kernel verdicts: %w", err)
	}
	return filepath.Join(base, "dflash-mlx", "kernel-verdicts.json"), nil
}

// OpenStore reads the verdicts at path ("" keeps them in memory); warn gets one line for
// a damaged file.
func OpenStore(path string, warn io.Writer) *Store {
	s := &Store{path: path, mem: map[string]Verdict{}, warn: warn}
	if path == "" {
		return s
	}
	b, err := os.ReadFile(path)
	if err != nil {
		if !os.IsNotExist(err) && warn != nil {
			fmt.Fprintf(warn, "warning: kernel verdicts %s unreadable (%v); checking kernels again\n", path, err)
		}
		return s
	}
	var f storeFile
	if err := json.Unmarshal(b, &f); err != nil || f.Format != storeFormat {
		if warn != nil {
			fmt.Fprintf(warn, "warning: kernel verdicts %s damaged or of another format; checking kernels again\n", path)
		}
		return s
	}
	for k, v := range f.Verdicts {
		s.mem[k] = v
	}
	return s
}

// Path is the store's file ("" in memory).
func (s *Store) Path() string { return s.path }

// Get returns the verdict under key.
func (s *Store) Get(key string) (Verdict, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.mem[key]
	return v, ok
}

// Put records v under key and writes the file (verdicts other processes wrote since it
// was read are kept).
func (s *Store) Put(key string, v Verdict) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mem[key] = v
	if s.path == "" {
		return nil
	}
	merged := map[string]Verdict{}
	if b, err := os.ReadFile(s.path); err == nil {
		var f storeFile
		if json.Unmarshal(b, &f) == nil && f.Format == storeFormat {
			merged = f.Verdicts
		}
	}
	for k, v := range s.mem {
		merged[k] = v
	}
	b, err := json.MarshalIndent(storeFile{Format: storeFormat, Verdicts: merged}, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return fmt.Errorf("kernel verdicts: %w", err)
	}
	if err := atomicfile.Write(s.path, b, 0o644); err != nil {
		return fmt.Errorf("kernel verdicts: %w", err)
	}
	return nil
}

// Gate admits kernels on one device.
type Gate struct {
	Device Device
	Store  *Store
	// Warn gets one line per kernel check that fails (nil: none).
	Warn io.Writer
	// NoQuantized: the models this gate admits kernels for hold no quantized weights, so
	// checks of kernels for quantized weights do not run and those kernels stay unused
	// ("not needed"); a first use then does not pay for compiles no model needs.
	NoQuantized bool
	// Elsewhere, when set, runs the named checks at the same time in other processes on
	// the same device (a check's time is mostly first-use compiles, one at a time in a
	// process) and returns the verdicts it got. Apply keeps the passing ones and runs
	// every other check itself: a failure seen elsewhere is confirmed here before a kernel
	// is disabled for good, and a check with no verdict (a process that died) runs here.
	Elsewhere func(names []string) map[string]Verdict
}

// announce says on Warn, when some wanted check has no verdict yet, that the first use
// of this build on the device checks (and compiles) kernels, which takes seconds (8–11 s
// on an H200); the returned func says when that is over.
func (g Gate) announce(pending []Check) func() {
	if len(pending) == 0 || g.Warn == nil {
		return func() {}
	}
	start := time.Now()
	fmt.Fprintf(g.Warn, "first use on %s: compiling and checking %d custom kernels against MLX's ops (once: the verdicts and compiled kernels are kept)…\n", g.Device.Name, len(pending))
	return func() {
		fmt.Fprintf(g.Warn, "kernel checks done in %.1fs\n", time.Since(start).Seconds())
	}
}

// pending are the checks that are wanted, applicable and needed here and have no verdict.
func (g Gate) pending(k settings.Kernels, checks []Check, applicable func(Check) bool) []Check {
	var out []Check
	for _, c := range checks {
		if !applicable(c) || c.Wanted != nil && !c.Wanted(k) || !g.needed(c) {
			continue
		}
		if g.Store != nil {
			if _, ok := g.Store.Get(Key(g.Device, c)); ok {
				continue
			}
		}
		out = append(out, c)
	}
	return out
}

// needed reports whether c's kernels can serve the models the gate admits kernels for.
func (g Gate) needed(c Check) bool { return !(c.Quantized && g.NoQuantized) }

// runElsewhere hands the pending checks to Elsewhere when there are two or more of them
// (one gains nothing from another process), and returns its verdicts.
func (g Gate) runElsewhere(pending []Check) map[string]Verdict {
	if g.Elsewhere == nil || len(pending) < 2 {
		return nil
	}
	names := make([]string, len(pending))
	for i, c := range pending {
		names[i] = c.Name
	}
	return g.Elsewhere(names)
}

// notNeeded is the reason a kernel for quantized weights is off where no model holds any.
const notNeeded = "no quantized weights in the models loaded"

// Apply returns k with the kernels whose check fails on the gate's device disabled
// (k.Disabled), and every kernel's state. In check mode each wanted check with a source
// for the device's backend runs unless the store has its verdict. Kernels no check
// covers keep their state from the mode ("trusted" in check mode too: nothing compares
// them here). Run on the MLX thread.
func (g Gate) Apply(k settings.Kernels, checks []Check) (settings.Kernels, []State) {
	covered := map[string]int{}
	for i, c := range checks {
		for _, kn := range c.Kernels {
			covered[kn.Name] = i
		}
	}
	verdicts := make([]*Verdict, len(checks))
	remembered := make([]bool, len(checks))
	disabled := map[string]string{}
	for n, r := range k.Disabled {
		disabled[n] = r
	}
	applicable := func(c Check) bool {
		for _, kn := range c.Kernels {
			if source(kn, g.Device.Backend).Body != "" {
				return true
			}
		}
		return false
	}
	if (k.Mode == settings.KernelsCheck || k.Mode == "") && g.Device.Backend != "" {
		pending := g.pending(k, checks, applicable)
		defer g.announce(pending)()
		elsewhere := g.runElsewhere(pending)
		for i, c := range checks {
			if !applicable(c) || c.Wanted != nil && !c.Wanted(k) {
				continue
			}
			if !g.needed(c) {
				for _, kn := range c.Kernels {
					disabled[kn.Name] = notNeeded
				}
				continue
			}
			key := Key(g.Device, c)
			v, ok := Verdict{}, false
			if g.Store != nil {
				v, ok = g.Store.Get(key)
			}
			remembered[i] = ok
			if ev, done := elsewhere[c.Name]; !ok && done && ev.OK {
				v = ev
				if g.Store != nil {
					if err := g.Store.Put(key, v); err != nil && g.Warn != nil {
						fmt.Fprintf(g.Warn, "warning: %v (the check runs again next time)\n", err)
					}
				}
			} else if !ok {
				start := time.Now()
				err := c.Run()
				v = Verdict{OK: err == nil, Checked: start.UTC(), Seconds: time.Since(start).Seconds()}
				if err != nil {
					v.Reason = oneLine(err.Error())
					if g.Warn != nil {
						fmt.Fprintf(g.Warn, "warning: kernel check %q failed on %s (%s): %s; using MLX's ops instead (DFLASH_KERNELS=trust skips the check)\n",
							c.Name, g.Device.Name, g.Device.Backend, v.Reason)
					}
				}
				if g.Store != nil {
					if err := g.Store.Put(key, v); err != nil && g.Warn != nil {
						fmt.Fprintf(g.Warn, "warning: %v (the check runs again next time)\n", err)
					}
				}
			}
			verdicts[i] = &v
			if !v.OK {
				for _, kn := range c.Kernels {
					disabled[kn.Name] = v.Reason
				}
			}
		}
	}
	if len(disabled) > 0 {
		k.Disabled = disabled
	}
	var states []State
	names := map[string]bool{}
	add := func(kn kernels.Kernel) {
		if names[kn.Name] {
			return
		}
		names[kn.Name] = true
		st := State{Kernel: kn.Name, Backend: string(g.Device.Backend)}
		i, has := covered[kn.Name]
		if has {
			st.Check = checks[i].Name
		}
		switch {
		case g.Device.Backend == "" || source(kn, g.Device.Backend).Body == "":
			st.State, st.Backend = "not applicable", kernels.FallbackBackend
		case k.Mode == settings.KernelsOff:
			st.State = "off"
		case disabled[kn.Name] == notNeeded:
			st.State, st.Reason = "not needed", notNeeded
		case disabled[kn.Name] != "" || !k.Allowed(kn.Name):
			st.State, st.Reason, st.Remembered = "disabled", disabled[kn.Name], has && remembered[i]
		case has && checks[i].Wanted != nil && !checks[i].Wanted(k):
			st.State, st.Reason = "off", "turned off by its setting"
		case has && verdicts[i] != nil:
			st.State, st.Remembered = "verified", remembered[i]
		default:
			st.State = "trusted"
		}
		states = append(states, st)
	}
	for _, kn := range kernels.All() {
		add(kn)
	}
	for _, c := range checks {
		for _, kn := range c.Kernels {
			add(kn)
		}
	}
	return k, states
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// Here is the device MLX computes on (MLX thread): its custom-kernel backend, "" where
// none can run (the CPU, or a GPU backend without custom kernels).
func Here() Device {
	d := Device{Name: mlxc.CurrentDevice().String(), MLX: mlxc.Version()}
	if !mlxc.CurrentDevice().GPU {
		return d
	}
	if n := mlxc.DeviceInfo(mlxc.CurrentDevice())["device_name"]; n != "" {
		d.Name = n
	}
	switch {
	case mlxc.CUDAKernelsAvailable():
		d.Backend = kernels.CUDA
	case mlxc.MetalKernelsAvailable():
		d.Backend = kernels.Metal
	}
	return d
}
