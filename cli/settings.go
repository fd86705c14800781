package cli

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// resolved is the process's settings, read from the environment once when Main starts
// (resolveSettings) and handed to the runtime, the loaders and the engine from there.
var resolved = settings.Default()

// resolveSettings reads the DFLASH_* settings and configures the MLX runtime with them,
// before any command can start it.
func resolveSettings() error {
	s, err := settings.FromEnv()
	if err != nil {
		return err
	}
	mc := mlxc.Config{Device: s.Runtime.Device, KernelDir: s.Runtime.KernelDir, CompileCache: s.Runtime.CompileCache, CompileAhead: s.Runtime.CompileAhead}
	if exe, err := os.Executable(); err == nil {
		mc.CompileHelper = []string{exe, nvrtcCompileCommand}
		mc.FusedHelper = []string{exe, fusedCompileCommand}
	}
	if err := mlxc.Configure(mc); err != nil {
		return err
	}
	resolved = s
	return nil
}

// gpuExactFlag is run's, bench's and serve's --gpu-exact: a choice of what the output
// equals, so an option of the command rather than a tuning variable.
func gpuExactFlag() cli.Flag {
	return &cli.BoolFlag{Name: "gpu-exact", Usage: "verify blocks round every row as a one-token step does, so greedy DFlash output equals plain decoding bit for bit on a GPU too. Unset: on for unquantized targets on CUDA GPUs (no measurable cost on an H200), off on Metal (not measured there yet) and for quantized targets (their verify would go row by row); --gpu-exact=false turns it off. The CPU backend is always exact"}
}

// commandSettings are the resolved settings with the command's --gpu-exact: as given, or
// left to the session to decide once it knows the device and the target (GPUExactAuto).
func commandSettings(c *cli.Context) *settings.Settings {
	s := resolved
	s.Loop.GPUExact = c.Bool("gpu-exact")
	s.Loop.GPUExactAuto = !c.IsSet("gpu-exact")
	return &s
}

// decideGPUExact settles an unset --gpu-exact for the target in dir (MLX thread): on for
// a CUDA GPU and an unquantized target, where it was measured to cost nothing
// (docs/perf/gpu-exact.md), off elsewhere.
func decideGPUExact(st *settings.Settings, dir string) {
	if !st.Loop.GPUExactAuto {
		return
	}
	st.Loop.GPUExact = kernelcheck.Here().Backend == kernels.CUDA && !quantizedCheckpoint(dir)
	st.Loop.GPUExactAuto = false
}

// quantizedCheckpoint reports whether the config.json in dir declares MLX quantization
// (an unreadable config counts as quantized: the cheaper default).
func quantizedCheckpoint(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return true
	}
	var cfg struct {
		Quantization       json.RawMessage `json:"quantization"`
		QuantizationConfig json.RawMessage `json:"quantization_config"`
	}
	if json.Unmarshal(b, &cfg) != nil {
		return true
	}
	return len(cfg.Quantization) > 0 && string(cfg.Quantization) != "null" ||
		len(cfg.QuantizationConfig) > 0 && string(cfg.QuantizationConfig) != "null"
}
