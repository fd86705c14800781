package model

import (
	"strconv"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// OnDevice returns a copy of a small array that a GPU op made, padded to at least 4
// elements (16 bytes for 32-bit types), for our CUDA kernels to read; elsewhere (no CUDA
// kernels) a itself. Why: MLX's CUDA allocator keeps every array of 8 bytes or less,
// and every array made from host data, in unified memory, the small ones packed together
// in a shared pool. While the host writes new scalars into that pool (each cycle makes a
// few) the pages move between host and GPU, and a kernel that reads a scalar there can
// stall on a page migration and take several times as long as its work (see
// docs/perf/device-memory.md). A GPU op's output of more than 8 bytes lives in device
// memory. Only element 0 (or the first n of an n-element constant) carries meaning; the
// kernels never read the padding.
func OnDevice(a *mlxc.Array) *mlxc.Array {
	if a == nil || !mlxc.CUDAKernelsAvailable() || !mlxc.CurrentDevice().GPU {
		return a
	}
	return padForDevice(a)
}

// padForDevice is OnDevice's copy. A one-element array (a position: several each cycle) is
// repeated four times by one Concatenate node (after a Reshape when it is not 1-D); a fresh zero pad would be two nodes more
// (Reshape, Full), and every node costs host time each cycle. Larger arrays (constants,
// made once) get zeros after their elements.
func padForDevice(a *mlxc.Array) *mlxc.Array {
	if a.Size() == 1 {
		if a.Ndim() != 1 {
			a = mlxc.Reshape(a, 1)
		}
		return mlxc.Concatenate([]*mlxc.Array{a, a, a, a}, 0)
	}
	return mlxc.Concatenate([]*mlxc.Array{mlxc.Reshape(a, -1), mlxc.Zeros([]int{4}, a.Dtype())}, 0)
}

// OnDeviceConst is OnDevice for a constant a (just made) kept for the model's lifetime: it
// returns it evaluated and detached (the caller frees it); a host-made original is freed.
func OnDeviceConst(a *mlxc.Array) *mlxc.Array {
	d := OnDevice(a).Detach()
	mlxc.Eval(d)
	if d != a {
		a.Free()
	}
	return d
}

// deviceTotalMemory is the current GPU's memory in bytes as MLX reports it (device_info's
// total_memory on CUDA), 0 when unknown.
func deviceTotalMemory() uint64 {
	n, err := strconv.ParseUint(strings.TrimSpace(mlxc.DeviceInfo(mlxc.CurrentDevice())["total_memory"]), 10, 64)
	if err != nil {
		return 0
	}
	return n
}
