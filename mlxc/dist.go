package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

// Distributed backends of MLX (mlx::core::distributed): "ring" (TCP, Linux and macOS),
// "jaccl" (RDMA over Thunderbolt 5), "mpi", "nccl" (CUDA), and "any" (the first of NCCL,
// ring, MPI, JACCL that starts). Their gaps (MLX 0.32.4): NCCL has no send/recv; ring and
// JACCL have no Split; ring and MPI have no SumScatter; ring sends to neighbours only.
const (
	BackendAny   = "any"
	BackendRing  = "ring"
	BackendJACCL = "jaccl"
	BackendMPI   = "mpi"
	BackendNCCL  = "nccl"
)

// Group is a group of ranks that run collectives together (MLX thread only). Close frees
// it; the ranks' connections stay open for the process (MLX keeps its backends).
type Group struct {
	h          C.mlxc_group
	rank, size int
}

// DistributedAvailable reports whether backend is compiled into the MLX library.
func DistributedAvailable(backend string) (bool, error) {
	var ok C.bool
	var err error
	if e := Catch(func() {
		cs := C.CString(backend)
		defer C.free(unsafe.Pointer(cs))
		check("distributed available", C.mlxc_dist_is_available(cs, &ok))
	}); e != nil {
		err = e
	}
	return bool(ok), err
}

// InitDistributed joins the ranks of backend, configured the way MLX's launcher
// configures them (the ring reads MLX_RANK and MLX_HOSTFILE; NCCL MLX_WORLD_SIZE,
// NCCL_HOST_IP and NCCL_PORT; JACCL MLX_JACCL_COORDINATOR and MLX_IBV_DEVICES). strict:
// a backend that cannot start is an error; otherwise the result is a group of one rank,
// on which collectives return their input. MLX thread.
func InitDistributed(backend string, strict bool) (*Group, error) {
	if backend == BackendRing {
		if err := checkRingEnv(); err != nil {
			return nil, err
		}
	}
	return newGroup(func(h *C.mlxc_group) {
		cs := C.CString(backend)
		defer C.free(unsafe.Pointer(cs))
		check("distributed init", C.mlxc_dist_init(h, C.bool(strict), cs))
	})
}

// newGroup makes a group with create (which fills its handle or panics with *Error) and
// reads its rank and size; on failure the handle, if any, is freed.
func newGroup(create func(*C.mlxc_group)) (*Group, error) {
	g := &Group{}
	err := Catch(func() {
		create(&g.h)
		g.readRankSize()
	})
	if err != nil {
		if g.h != nil {
			C.mlxc_dist_group_free(g.h)
		}
		return nil, err
	}
	return g, nil
}

func (g *Group) readRankSize() {
	var r, n C.int
	check("distributed rank", C.mlxc_dist_rank(g.h, &r))
	check("distributed size", C.mlxc_dist_size(g.h, &n))
	g.rank, g.size = int(r), int(n)
}

// Rank is this process's index in the group, 0 ≤ Rank < Size.
func (g *Group) Rank() int { return g.rank }

// Size is the number of ranks in the group.
func (g *Group) Size() int { return g.size }

// Split makes the sub-group of the ranks that pass the same color, ordered by key (a
// negative key: by rank). Ring and JACCL refuse it. MLX thread.
func (g *Group) Split(color, key int) (*Group, error) {
	return newGroup(func(h *C.mlxc_group) {
		check("distributed split", C.mlxc_dist_split(h, g.handle("distributed split"), C.int(color), C.int(key)))
	})
}

// Close frees the group's handle (idempotent).
func (g *Group) Close() {
	if g != nil && g.h != nil {
		C.mlxc_dist_group_free(g.h)
		g.h = nil
	}
}

func (g *Group) handle(op string) C.mlxc_group {
	if g == nil {
		return nil // MLX's default group
	}
	if g.h == nil {
		fail(op, "use of a closed group")
	}
	return g.h
}

func collective(op string, code C.int, x *Array, g *Group) *Array {
	var h C.mlxc_array
	check(op, C.mlxc_dist_collective(&h, code, x.handle(op), g.handle(op)))
	return newArray(h)
}

// AllSum is x summed over the group's ranks, on every rank (nil g: the default group).
func AllSum(x *Array, g *Group) *Array { return collective("all_sum", C.MLXC_D_ALL_SUM, x, g) }

// AllMax is the elementwise maximum of x over the ranks.
func AllMax(x *Array, g *Group) *Array { return collective("all_max", C.MLXC_D_ALL_MAX, x, g) }

// AllMin is the elementwise minimum of x over the ranks.
func AllMin(x *Array, g *Group) *Array { return collective("all_min", C.MLXC_D_ALL_MIN, x, g) }

// AllGather concatenates the ranks' x along axis 0 in rank order (a scalar becomes [size]).
func AllGather(x *Array, g *Group) *Array {
	return collective("all_gather", C.MLXC_D_ALL_GATHER, x, g)
}

// SumScatter sums x over the ranks and gives rank r the r-th of size equal parts along
// axis 0. Ring and MPI refuse it.
func SumScatter(x *Array, g *Group) *Array {
	return collective("sum_scatter", C.MLXC_D_SUM_SCATTER, x, g)
}

// Send sends x to rank dst when the returned array is evaluated (evaluate it, or make it
// a dependency of something that is). The ring sends to neighbours only (rank ± 1).
func Send(x *Array, dst int, g *Group) *Array {
	var h C.mlxc_array
	check("send", C.mlxc_dist_send(&h, x.handle("send"), C.int(dst), g.handle("send")))
	return newArray(h)
}

// Recv receives an array of shape and dtype from rank src (the sender's must match).
func Recv(shape []int, dtype Dtype, src int, g *Group) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("recv", C.mlxc_dist_recv(&h, cInts(shape, &buf), C.int(len(shape)), C.int(dtype), C.int(src), g.handle("recv")))
	return newArray(h)
}

// checkRingEnv refuses launcher variables the ring would misread: MLX parses whatever
// MLX_HOSTFILE names as JSON and reports a parser's error for an empty or missing file.
func checkRingEnv() error {
	if v, ok := os.LookupEnv("MLX_RANK"); ok && v != "" {
		if r, err := strconv.Atoi(v); err != nil || r < 0 {
			return fmt.Errorf("distributed init: MLX_RANK=%q is not a rank (0, 1, …)", v)
		}
	}
	path, ok := os.LookupEnv("MLX_HOSTFILE")
	if !ok {
		return nil
	}
	if path == "" {
		return fmt.Errorf("distributed init: MLX_HOSTFILE is empty; give the ring's hostfile (a JSON list of [\"ip:port\", …] per rank)")
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("distributed init: MLX_HOSTFILE: %w", err)
	}
	return nil
}
