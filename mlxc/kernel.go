package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import "unsafe"

// KernelBackend selects the custom-kernel API.
type KernelBackend int

const (
	KernelCUDA  KernelBackend = 1
	KernelMetal KernelBackend = 2
)

// CUDAKernelsAvailable reports whether fast::cuda_kernel can run here (CUDA libmlx + a GPU).
func CUDAKernelsAvailable() bool { return C.mlxc_cuda_available() != 0 }

// MetalKernelsAvailable reports whether fast::metal_kernel can run here.
func MetalKernelsAvailable() bool { return C.mlxc_metal_available() != 0 }

// Kernel is a custom GPU kernel built from source (the body of a generated __global__ or
// [[kernel]] function; see MLX.md §3.3-3.4 for the calling conventions).
type Kernel struct {
	k C.mlxc_kernel
}

// KernelSpec describes a custom kernel.
type KernelSpec struct {
	Backend             KernelBackend
	Name                string
	Inputs, Outputs     []string
	Source, Header      string
	EnsureRowContiguous bool
	SharedMemory        int  // CUDA: dynamic shared memory bytes
	AtomicOutputs       bool // Metal
}

// TemplateArg is a compile-time parameter of a kernel: an int, a bool or a Dtype.
type TemplateArg struct {
	Name  string
	Value any // int, bool or Dtype
}

// KernelCall holds the launch of one kernel call.
type KernelCall struct {
	OutputShapes [][]int
	OutputDtypes []Dtype
	Grid         [3]int // total threads per dimension
	ThreadGroup  [3]int
	Template     []TemplateArg
	InitValue    *float32 // fill outputs first when set
}

func cStrings(v []string) ([]*C.char, func()) {
	out := make([]*C.char, len(v))
	for i, s := range v {
		out[i] = C.CString(s)
	}
	return out, func() {
		for _, p := range out {
			C.free(unsafe.Pointer(p))
		}
	}
}

// NewKernel builds a kernel object. Compilation happens at the first call.
func NewKernel(spec KernelSpec) *Kernel {
	ins, freeIns := cStrings(spec.Inputs)
	defer freeIns()
	outs, freeOuts := cStrings(spec.Outputs)
	defer freeOuts()
	name, f1 := cstr(spec.Name)
	defer f1()
	src, f2 := cstr(spec.Source)
	defer f2()
	hdr, f3 := cstr(spec.Header)
	defer f3()
	extra := spec.SharedMemory
	if spec.Backend == KernelMetal && spec.AtomicOutputs {
		extra = 1
	}
	var inp, outp **C.char
	if len(ins) > 0 {
		inp = &ins[0]
	}
	if len(outs) > 0 {
		outp = &outs[0]
	}
	var k C.mlxc_kernel
	check("kernel_new", C.mlxc_kernel_new(&k, C.int(spec.Backend), name, inp, C.int(len(ins)), outp, C.int(len(outs)), src, hdr, C.bool(spec.EnsureRowContiguous), C.int(extra)))
	return &Kernel{k: k}
}

// Free releases the kernel object.
func (k *Kernel) Free() {
	if k != nil && k.k != nil {
		C.mlxc_kernel_free(k.k)
		k.k = nil
	}
}

// Call runs the kernel on the current (GPU) stream and returns its outputs.
func (k *Kernel) Call(inputs []*Array, call KernelCall) []*Array {
	if k == nil || k.k == nil {
		fail("kernel_apply", "use of a freed kernel")
	}
	nout := len(call.OutputShapes)
	if len(call.OutputDtypes) != nout {
		fail("kernel_apply", "%d output shapes but %d dtypes", nout, len(call.OutputDtypes))
	}
	var buf [16]C.mlxc_array
	hs := requiredHandles("kernel_apply", inputs, &buf)
	var shapes []C.int
	ndims := make([]C.int, nout+1)
	dts := make([]C.int, nout+1)
	for i, sh := range call.OutputShapes {
		ndims[i] = C.int(len(sh))
		dts[i] = C.int(call.OutputDtypes[i])
		for _, d := range sh {
			shapes = append(shapes, C.int(d))
		}
	}
	shapes = append(shapes, 0)
	grid := [3]C.int{C.int(call.Grid[0]), C.int(call.Grid[1]), C.int(call.Grid[2])}
	group := [3]C.int{C.int(call.ThreadGroup[0]), C.int(call.ThreadGroup[1]), C.int(call.ThreadGroup[2])}
	names := make([]string, len(call.Template))
	kinds := make([]C.int, len(call.Template)+1)
	vals := make([]C.int, len(call.Template)+1)
	for i, t := range call.Template {
		names[i] = t.Name
		switch v := t.Value.(type) {
		case int:
			kinds[i], vals[i] = 0, C.int(v)
		case bool:
			kinds[i] = 1
			if v {
				vals[i] = 1
			}
		case Dtype:
			kinds[i], vals[i] = 2, C.int(v)
		default:
			fail("kernel_apply", "template arg %s: want int, bool or Dtype, got %T", t.Name, t.Value)
		}
	}
	cnames, freeNames := cStrings(names)
	defer freeNames()
	var namep **C.char
	if len(cnames) > 0 {
		namep = &cnames[0]
	}
	var inp *C.mlxc_array
	if len(hs) > 0 {
		inp = &hs[0]
	}
	init := C.float(0)
	if call.InitValue != nil {
		init = C.float(*call.InitValue)
	}
	outs := make([]C.mlxc_array, nout+1)
	check("kernel_apply", C.mlxc_kernel_apply(&outs[0], k.k, inp, C.int(len(hs)), &shapes[0], &ndims[0], &dts[0], C.int(nout), &grid[0], &group[0], namep, &kinds[0], &vals[0], C.int(len(call.Template)), C.bool(call.InitValue != nil), init, curStream.c))
	res := make([]*Array, nout)
	for i := range res {
		res[i] = newArray(outs[i])
	}
	return res
}
