package cli

import (
	"io"

	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
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
// line to warn.
func gateKernels(st settings.Settings, warn io.Writer) (settings.Settings, []kernelcheck.State) {
	path, err := kernelcheck.DefaultPath()
	if err != nil {
		path = ""
	}
	g := kernelcheck.Gate{Device: kernelcheck.Here(), Store: kernelcheck.OpenStore(path, warn), Warn: warn}
	var states []kernelcheck.State
	st.Kernels, states = g.Apply(st.Kernels, kernelChecks())
	return st, states
}
