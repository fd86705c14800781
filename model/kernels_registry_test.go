package model

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/kernels"
)

// Every kernel of the registry is among the instantiations the compile check hands NVRTC
// (same header and body), so a kernel added to kernels.All() cannot skip the check.
func TestCUDAKernelChecksCoverRegistry(t *testing.T) {
	checked := map[[2]string]bool{}
	for _, k := range kernelChecks(t, t.TempDir()) {
		checked[[2]string{k.Header, k.Body}] = true
	}
	for _, k := range kernels.All() {
		if !checked[[2]string{k.CUDA.Header, k.CUDA.Body}] {
			t.Errorf("%s: not in the compile check's list", k.Name)
		}
	}
}
