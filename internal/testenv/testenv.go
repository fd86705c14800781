// Package testenv tells tests what the machine under them guarantees: whether MLX computes
// on a GPU, and whether a row's result is the same bit for bit whatever the shape of the
// computation it is part of. Tests assert bit-identical results where that holds and a
// documented tolerance (or skip, saying what they need) where it does not.
package testenv

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// GPU reports whether MLX ops run on a GPU (Metal or CUDA) in this process. It starts the
// MLX runtime, which picks the device (DFLASH_DEVICE overrides); it may be called inside
// mlxc.Do as well as outside. A runtime that fails to start counts as the CPU, so the test
// goes on to assert the strict CPU results and reports the start-up error there.
func GPU() bool {
	if err := mlxc.Init(); err != nil {
		return false
	}
	return mlxc.CurrentDevice().GPU
}

// ShapeExact reports whether a row computes the same bits alone and within a larger
// computation: a verify block's rows and one-token decode steps, a long prefill and steps, a
// block placed by a device position and one at the cache's offset. Then DFlash output equals
// plain greedy decoding token for token. It holds on the CPU backend, whose reductions do not
// depend on the row count, and on CUDA in GPU-exact mode with our CUDA kernels (which
// DFLASH_GPU_EXACT=1 asks for in tests, see settings.ForTests). On Metal, and on CUDA by
// default, a multi-row product or attention reduces in another order than a one-row one:
// values differ by bf16 rounding and greedy tokens can flip on near-ties (`dflash-mlx bench
// --flips` measures it).
func ShapeExact() bool {
	if !GPU() {
		return true
	}
	return mlxc.Backend() == "cuda" && mlxc.CUDAKernelsAvailable() && settings.ForTests().Loop.GPUExact
}

// RequireShapeExact skips t where ShapeExact does not hold, naming what the test needs.
func RequireShapeExact(t testing.TB) {
	t.Helper()
	if !ShapeExact() {
		t.Skipf("needs bit-identical rounding across computation shapes (the CPU backend, or DFLASH_GPU_EXACT=1 on CUDA): on this %s GPU verify blocks and decode steps round differently and greedy tokens may flip on near-ties", mlxc.Backend())
	}
}
