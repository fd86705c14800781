package cli

import (
	"github.com/urfave/cli/v2"

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
	if err := mlxc.Configure(mlxc.Config{Device: s.Runtime.Device, KernelDir: s.Runtime.KernelDir, CompileCache: s.Runtime.CompileCache}); err != nil {
		return err
	}
	resolved = s
	return nil
}

// gpuExactFlag is run's, bench's and serve's --gpu-exact: a choice of what the output
// equals, so an option of the command rather than a tuning variable.
func gpuExactFlag() cli.Flag {
	return &cli.BoolFlag{Name: "gpu-exact", Usage: "on a GPU, verify blocks round every row as a one-token step does, so DFlash output equals plain decoding bit for bit there too (the CPU backend always does); plain decoding gets ~25% slower"}
}

// commandSettings are the resolved settings with the command's --gpu-exact.
func commandSettings(c *cli.Context) *settings.Settings {
	s := resolved
	s.Loop.GPUExact = c.Bool("gpu-exact")
	return &s
}
