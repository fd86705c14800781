package cli

import (
	"fmt"
	"runtime/debug"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/hub"
	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// doctorReport is what `dflash-mlx doctor` finds.
type doctorReport struct {
	Version     string `json:"version"`
	MLX         string `json:"mlx"`
	Backend     string `json:"backend"`
	Device      string `json:"device"`
	DeviceName  string `json:"device_name,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	// KernelBackend is the custom kernels' backend here ("" where none can run).
	KernelBackend string `json:"kernel_backend"`
	KernelMode    string `json:"kernel_mode"`
	// Kernels is every custom kernel's state on this device after the self-check (which
	// doctor runs where a verdict is missing); Checks the checks' verdicts.
	Kernels      []kernelcheck.State `json:"kernels"`
	Checks       []doctorCheck       `json:"checks"`
	VerdictsFile string              `json:"verdicts_file,omitempty"`
	// CompileCache is the compiled-kernel cache (CUDA): its folder, whether this binary
	// reaches it, and what this process took from it.
	CompileCache mlxc.CompileCacheStats `json:"compile_cache"`
	HFCache      string                 `json:"hf_cache"`
	CachedModels int                    `json:"cached_models"`
	// KnownPairs are the target → draft pairs of the registry (your own first).
	KnownPairs map[string]string `json:"known_pairs"`
	Tokenizers string            `json:"tokenizers_library"`
	// Problems are what the user asked for that cannot work here; any makes the exit code 1.
	Problems []string `json:"problems"`
}

type doctorCheck struct {
	Name    string  `json:"name"`
	Checked bool    `json:"checked"` // a verdict exists (not in trust mode)
	OK      bool    `json:"ok"`
	Reason  string  `json:"reason,omitempty"`
	Seconds float64 `json:"seconds"` // how long the check took when it ran
	// The operation's seconds per call on a fixed small shape through its kernels and
	// through its fallback, for kernels in use here (0: not measured).
	KernelSeconds   float64 `json:"kernel_seconds,omitempty"`
	FallbackSeconds float64 `json:"fallback_seconds,omitempty"`
	Speedup         float64 `json:"speedup,omitempty"`
	SpeedError      string  `json:"speed_error,omitempty"`
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check this machine: backend, device, kernels, caches",
		Description: `Reports the MLX backend and device, the versions, every custom kernel's state on
this device (verified against its fallback, disabled and why, or not applicable), the
Hugging Face cache and the known target → draft pairs. Kernels without a remembered
verdict are checked now (DFLASH_KERNELS=trust skips that, off turns them all off).
The exit code is 1 when something asked for cannot work here.

Examples:
  dflash-mlx doctor
  dflash-mlx doctor --json | jq '.kernels[] | select(.state != "verified")'
  DFLASH_DEVICE=cpu dflash-mlx doctor`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			r := doctorReport{Version: Version, KnownPairs: map[string]string{}, Problems: []string{}, Checks: []doctorCheck{}}
			err := mlxc.Do(func() error {
				r.MLX, r.Backend = mlxc.Version(), mlxc.Backend()
				d := mlxc.CurrentDevice()
				r.Device = d.String()
				if d.GPU {
					info := mlxc.DeviceInfo(d)
					r.DeviceName = info["device_name"]
					r.MemoryBytes, _ = strconv.ParseInt(info["memory_size"], 10, 64)
				} else if resolved.Runtime.Device == "gpu" {
					r.Problems = append(r.Problems, "DFLASH_DEVICE=gpu but MLX computes on the CPU")
				}
				here := kernelcheck.Here()
				r.KernelBackend, r.KernelMode = string(here.Backend), string(resolved.Kernels.Mode)
				path, err := kernelcheck.DefaultPath()
				if err != nil {
					r.Problems = append(r.Problems, err.Error())
					path = ""
				}
				r.VerdictsFile = path
				store := kernelcheck.OpenStore(path, c.App.ErrWriter)
				checks := kernelChecks()
				_, r.Kernels = kernelGate(resolved, store, c.App.ErrWriter).Apply(resolved.Kernels, checks)
				inUse := map[string]bool{}
				for _, st := range r.Kernels {
					inUse[st.Kernel] = st.State == "verified" || st.State == "trusted"
				}
				for _, ch := range checks {
					dc := doctorCheck{Name: ch.Name}
					if v, ok := store.Get(kernelcheck.Key(here, ch)); ok {
						dc.Checked, dc.OK, dc.Reason, dc.Seconds = true, v.OK, v.Reason, v.Seconds
					}
					use := len(ch.Kernels) > 0
					for _, k := range ch.Kernels {
						use = use && inUse[k.Name]
					}
					if use && ch.Speed != nil {
						k, f, err := ch.Speed()
						if err != nil {
							dc.SpeedError = err.Error()
						} else if k > 0 {
							dc.KernelSeconds, dc.FallbackSeconds, dc.Speedup = k, f, f/k
						}
					}
					if dc.Checked || dc.KernelSeconds > 0 || dc.SpeedError != "" {
						r.Checks = append(r.Checks, dc)
					}
				}
				r.CompileCache = mlxc.CompileCache()
				if here.Backend == kernels.CUDA && !r.CompileCache.Active && r.CompileCache.Dir != "" {
					r.Problems = append(r.Problems, "compiled-kernel cache unused: this binary does not export its NVRTC entry points (build it with make), so every process compiles its CUDA kernels again")
				}
				for _, st := range r.Kernels {
					if st.State == "disabled" && st.Reason != "" {
						r.Problems = append(r.Problems, fmt.Sprintf("kernel %s is disabled on this device: %s", st.Kernel, st.Reason))
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			if env, err := hub.LoadEnv(); err != nil {
				r.Problems = append(r.Problems, "Hugging Face cache: "+err.Error())
			} else {
				r.HFCache = env.CacheDir
				if cached, err := hub.ListCachedModels(env.CacheDir); err == nil {
					r.CachedModels = len(cached)
				}
			}
			if reg, err := draft.NewRegistry(draft.DefaultUserFile()); err != nil {
				r.Problems = append(r.Problems, "drafts file: "+err.Error())
			} else {
				for _, p := range reg.Pairs() {
					r.KnownPairs[p.Target] = p.Draft
				}
			}
			r.Tokenizers = "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, m := range bi.Deps {
					if m.Path == "github.com/daulet/tokenizers" {
						r.Tokenizers = m.Path + " " + m.Version
					}
				}
			}
			if c.Bool("json") {
				if err := printJSON(r); err != nil {
					return err
				}
			} else {
				printDoctor(r)
			}
			if len(r.Problems) > 0 {
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}

func printDoctor(r doctorReport) {
	fmt.Printf("dflash-mlx %s, MLX %s, backend %s, device %s", r.Version, r.MLX, r.Backend, r.Device)
	if r.DeviceName != "" {
		fmt.Printf(" (%s, %s)", r.DeviceName, human(r.MemoryBytes))
	}
	fmt.Println()
	kb := r.KernelBackend
	if kb == "" {
		kb = "none here: MLX's ops run everything"
	}
	fmt.Printf("custom kernels: %s (DFLASH_KERNELS=%s)\n", kb, r.KernelMode)
	if cc := r.CompileCache; r.KernelBackend == string(kernels.CUDA) {
		fmt.Printf("compiled kernels: %s, reached %v; this process %d compiled, %d from the cache\n", cc.Dir, cc.Active, cc.Compiles, cc.Hits)
	}
	for _, k := range r.Kernels {
		line := fmt.Sprintf("  %-34s %s", k.Kernel, k.State)
		if k.Reason != "" {
			line += ": " + k.Reason
		}
		if k.Remembered {
			line += " (remembered)"
		}
		fmt.Println(line)
	}
	for _, ch := range r.Checks {
		line := fmt.Sprintf("  %-34s", ch.Name)
		if ch.Checked {
			line += fmt.Sprintf(" check ok=%v (%.2f s)", ch.OK, ch.Seconds)
		}
		if ch.KernelSeconds > 0 {
			line += fmt.Sprintf(" kernel %.1f µs, fallback %.1f µs (%.2fx)", ch.KernelSeconds*1e6, ch.FallbackSeconds*1e6, ch.Speedup)
		}
		if ch.SpeedError != "" {
			line += " speed not measured: " + ch.SpeedError
		}
		fmt.Println(line)
	}
	fmt.Printf("Hugging Face cache: %s (%d models)\nknown pairs: %d\ntokenizers: %s\n", r.HFCache, r.CachedModels, len(r.KnownPairs), r.Tokenizers)
	for _, p := range r.Problems {
		fmt.Println("problem:", p)
	}
}
