package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/deltanet"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// kernelChecks are the self-checks of every kernel with a check (model's and deltanet's).
func kernelChecks() []kernelcheck.Check {
	return append(model.KernelChecks(), deltanet.KernelCheck())
}

// gateKernels admits st's kernels on this device before a model uses them (MLX thread):
// each check runs once per device and kernel version, its verdict kept in the user's
// cache (in memory only where there is none), and a failing kernel is disabled with one
// line to warn. On a CUDA device the first use's checks run at the same time, one process
// each (checksElsewhere). noQuantized: the models to load hold no quantized weights, so
// kernels for those are neither checked nor used.
func gateKernels(st settings.Settings, warn io.Writer, noQuantized bool) (settings.Settings, []kernelcheck.State) {
	path, err := kernelcheck.DefaultPath()
	if err != nil {
		path = ""
	}
	g := kernelGate(st, kernelcheck.OpenStore(path, warn), warn)
	g.NoQuantized = noQuantized
	var states []kernelcheck.State
	st.Kernels, states = g.Apply(st.Kernels, kernelChecks())
	return st, states
}

// kernelGate is the gate for this device with store's verdicts: on a CUDA device, with
// st's compiles ahead on, pending checks run at the same time (checksElsewhere).
func kernelGate(st settings.Settings, store *kernelcheck.Store, warn io.Writer) kernelcheck.Gate {
	g := kernelcheck.Gate{Device: kernelcheck.Here(), Store: store, Warn: warn}
	if g.Device.Backend == kernels.CUDA && st.Runtime.CompileAhead {
		g.Elsewhere = checksElsewhere
	}
	return g
}

// checkElsewhereTimeout bounds how long the checks run elsewhere may take: a process that
// hangs costs this much, and its check then runs in the process that asked.
const checkElsewhereTimeout = 5 * time.Minute

// checkVerdict is one line of `kernel-check`'s output.
type checkVerdict struct {
	Name string `json:"name"`
	kernelcheck.Verdict
}

// checksElsewhere runs each named check in a process of its own (this executable's
// kernel-check command), all at once, and returns the verdicts they print. A check's time
// on a GPU's first use is mostly compiles (our kernel's and those of MLX's ops it is
// compared with), which a process does one after another. Each process gets a PTX folder
// of its own for MLX's kernels, so that none reads a file another is writing; the
// compiled-kernel cache they share is written whole-file (mlxc/csrc/nvrtc_cache.cpp), and
// what they compile there is what the asking process then finds.
func checksElsewhere(names []string) map[string]kernelcheck.Verdict {
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	tmp, err := os.MkdirTemp("", "dflash-kernel-check-")
	if err != nil {
		return nil
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), checkElsewhereTimeout)
	defer cancel()
	var mu sync.Mutex
	out := map[string]kernelcheck.Verdict{}
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, exe, "kernel-check", name)
			cmd.Env = append(os.Environ(), "MLX_PTX_CACHE_DIR="+filepath.Join(tmp, strconv.Itoa(i)))
			b, err := cmd.Output()
			if err != nil {
				return
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				var v checkVerdict
				if json.Unmarshal(sc.Bytes(), &v) == nil && v.Name == name {
					mu.Lock()
					out[name] = v.Verdict
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// kernelCheckCommand runs named self-checks and prints their verdicts, one JSON line each:
// the process checksElsewhere starts per check.
func kernelCheckCommand() *cli.Command {
	return &cli.Command{
		Name:      "kernel-check",
		Usage:     "run custom kernels' self-checks by name and print their verdicts (used by the first run on a GPU)",
		ArgsUsage: "CHECK...",
		Hidden:    true,
		Description: `Runs each named check (as 'doctor --json' lists them) on this device against MLX's
ops and prints {"name", "ok", "reason", "checked", "seconds"} per check. The first run of a
build on a CUDA GPU starts one of these per pending check, so that the checks' compiles
run at the same time.

Examples:
  dflash-mlx kernel-check "few-query attention" "greedy verdict argmax"`,
		Action: func(c *cli.Context) error {
			checks := map[string]kernelcheck.Check{}
			for _, ch := range kernelChecks() {
				checks[ch.Name] = ch
			}
			enc := json.NewEncoder(c.App.Writer)
			return mlxc.Do(func() error {
				for _, name := range c.Args().Slice() {
					ch, ok := checks[name]
					if !ok {
						return fmt.Errorf("no kernel check named %q", name)
					}
					start := time.Now()
					err := ch.Run()
					v := checkVerdict{Name: name, Verdict: kernelcheck.Verdict{OK: err == nil, Checked: start.UTC(), Seconds: time.Since(start).Seconds()}}
					if err != nil {
						v.Reason = err.Error()
					}
					if err := enc.Encode(v); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
}

// nvrtcCompileCommand is the command a compile ahead runs as (mlxc.Config.CompileHelper):
// one kernel's compile, described by a job file, into the compiled-kernel cache.
const nvrtcCompileCommand = "nvrtc-compile"

func nvrtcCompileCommandDef() *cli.Command {
	return helperJobCommand(nvrtcCompileCommand,
		"compile one custom kernel described by a job file into the compiled-kernel cache (started by compiles ahead)",
		`The runtime starts one of these per kernel it compiles ahead, so that several compile at
once (NVRTC compiles one program at a time in a process). Exit code 0: compiled and kept.

Examples:
  dflash-mlx nvrtc-compile ~/.cache/dflash-mlx/nvrtc/.job-1234-0`, nil,
		func(c *cli.Context, job string) error {
			if code := mlxc.CompileJob(job); code != 0 {
				return cli.Exit(fmt.Sprintf("nvrtc-compile: job %s failed (%d)", job, code), code)
			}
			return nil
		})
}

// helperJobCommand is a hidden command the runtime starts with one job file: run gets it.
func helperJobCommand(name, usage, description string, flags []cli.Flag, run func(c *cli.Context, job string) error) *cli.Command {
	return &cli.Command{Name: name, Usage: usage, ArgsUsage: "JOB", Hidden: true, Flags: flags, Description: description,
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit(name+": want one job file", 2)
			}
			return run(c, c.Args().First())
		}}
}

// fusedCompileCommand is the command a fused-kernel job runs as (mlxc.Config.FusedHelper):
// one compiled function, exported by the process that met its fused kernels, compiled and
// run on zeros so that MLX's programs for those kernels reach the compiled-kernel cache.
const fusedCompileCommand = "fused-compile"

func fusedCompileCommandDef() *cli.Command {
	return helperJobCommand(fusedCompileCommand,
		"compile the fused kernels of one compiled function described by a job file (started by the runtime)",
		`The runtime starts one of these per compiled function whose fused kernels a process meets
for the first time, so that MLX's compiles of them run at the same time, in other
processes. Exit code 0: the job's kernels were met, compiled and kept.

Examples:
  dflash-mlx fused-compile ~/.cache/dflash-mlx/nvrtc/.fused-1234-1.mlxfn`,
		[]cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the names of the fused kernels met as JSON"}},
		func(c *cli.Context, job string) error {
			found, err := mlxc.RunFusedJob(job)
			if c.Bool("json") {
				if jerr := json.NewEncoder(c.App.Writer).Encode(map[string][]string{"found": found}); jerr != nil {
					return jerr
				}
			}
			if err != nil {
				return cli.Exit("fused-compile: "+err.Error(), 1)
			}
			return nil
		})
}
