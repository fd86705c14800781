package cli

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Version is set at build time (-ldflags "-X …/cli.Version=…").
var Version = "dev"

// Main runs the command line and returns the exit code.
func Main(args []string) int {
	app := &cli.App{
		Name:  "dflash-mlx",
		Usage: "fast, lossless LLM inference on MLX with DFlash speculative decoding",
		Description: `dflash-mlx runs Qwen-family models on MLX (Metal, CUDA or CPU) and decodes them
3-5x faster with DFlash: a small block-diffusion drafter proposes a block of tokens in one
pass, the target verifies the block in one pass, and only tokens the target itself would
have produced are kept. Output equals plain decoding of the target.

Models are Hugging Face IDs (downloaded into the standard HF cache) or local folders.
The drafter is found automatically for known targets (see 'dflash-mlx models').

Examples:
  dflash-mlx demo                                   # offline, tiny random model pair
  dflash-mlx run --prompt "Explain DFlash in one paragraph."
  dflash-mlx run --target-model mlx-community/Qwen3-8B-4bit --stats
  dflash-mlx chat
  dflash-mlx serve --port 8000                      # OpenAI-compatible API
  dflash-mlx bench --demo                           # plain vs DFlash, side by side`,
		Version: Version,
		Commands: []*cli.Command{
			runCommand(),
			chatCommand(),
			serveCommand(),
			benchCommand(),
			launchCommand(),
			downloadCommand(),
			modelsCommand(),
			demoCommand(),
			versionCommand(),
			doctorCommand(),
			kernelCheckCommand(),
			nvrtcCompileCommandDef(),
			fusedCompileCommandDef(),
		},
		ExitErrHandler: func(c *cli.Context, err error) {},
	}
	// Every DFLASH_* setting is read here, once, so that a bad value fails before anything
	// is downloaded or loaded: a typo would otherwise run the default path while the user
	// believes they chose another.
	if err := resolveSettings(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 2
	}
	// DFLASH_CPUPROFILE=file writes a Go CPU profile of the whole command (for finding host
	// overhead in the engine; `go tool pprof -top bin/dflash-mlx file`).
	if path := resolved.Diagnostics.CPUProfile; path != "" && !helperCommand(args) {
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		if ec, ok := err.(cli.ExitCoder); ok && ec.ExitCode() != 0 {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
}

// helperCommand reports whether args run one of the processes a command starts for itself
// (kernel-check, nvrtc-compile, fused-compile): those leave the profile file to the command
// that started them.
func helperCommand(args []string) bool {
	return len(args) > 1 && (args[1] == "kernel-check" || args[1] == nvrtcCompileCommand || args[1] == fusedCompileCommand)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print versions and the device in use",
		Description: `Prints the dflash-mlx and MLX versions, the MLX backend (cpu, cuda, metal) and
the device generation runs on; include it in bug reports.

Examples:
  dflash-mlx version
  dflash-mlx version --json
  DFLASH_DEVICE=cpu dflash-mlx version               # what forcing the CPU selects`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			var info struct {
				Version      string `json:"version"`
				MLX          string `json:"mlx"`
				MLXHeaders   string `json:"mlx_headers"`
				Backend      string `json:"backend"`
				Device       string `json:"device"`
				DeviceName   string `json:"device_name,omitempty"`
				CUDAKernels  bool   `json:"cuda_kernels"`
				MetalKernels bool   `json:"metal_kernels"`
				// Kernels lists the custom kernels and the backend each runs on here, so a
				// report shows whether a run used them or MLX's ops.
				Kernels []kernels.Entry `json:"kernels"`
				// Settings are the DFLASH_* settings as resolved from the environment.
				Settings settings.Settings `json:"settings"`
				// MLXLibrary is the libmlx the loader picked (Linux only): installed
				// binaries must use their own, not a checkout's.
				MLXLibrary string `json:"mlx_library,omitempty"`
			}
			err := mlxc.Do(func() error {
				info.Version = Version
				info.MLX = mlxc.Version()
				info.MLXHeaders = mlxc.HeaderVersion()
				info.Backend = mlxc.Backend()
				d := mlxc.CurrentDevice()
				info.Device = d.String()
				if d.GPU {
					info.DeviceName = mlxc.DeviceInfo(d)["device_name"]
				}
				info.CUDAKernels = mlxc.CUDAKernelsAvailable()
				info.MetalKernels = mlxc.MetalKernelsAvailable()
				info.Kernels = kernels.ListingFor(info.CUDAKernels && d.GPU, info.MetalKernels && d.GPU)
				info.Settings = resolved
				info.MLXLibrary = loadedLibrary("libmlx.")
				return nil
			})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(info)
			}
			fmt.Printf("dflash-mlx %s\nMLX %s (headers %s), backend %s, device %s", info.Version, info.MLX, info.MLXHeaders, info.Backend, info.Device)
			if info.DeviceName != "" {
				fmt.Printf(" (%s)", info.DeviceName)
			}
			fmt.Println()
			if info.MLXLibrary != "" {
				fmt.Printf("libmlx %s\n", info.MLXLibrary)
			}
			return nil
		},
	}
}
