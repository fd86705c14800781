package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// KernelBackend selects the custom-kernel API.
type KernelBackend int

const (
	KernelCUDA  KernelBackend = 1
	KernelMetal KernelBackend = 2
)

// CUDAKernelsAvailable reports whether fast::cuda_kernel can run here (CUDA libmlx + a GPU).
func CUDAKernelsAvailable() bool { return C.mlxc_cuda_available() != 0 }

// CUDAMultiprocessors is the number of streaming multiprocessors of the default GPU, 0
// when it cannot be read (no CUDA backend or driver).
func CUDAMultiprocessors() int { return int(C.mlxc_cuda_multiprocessors()) }

// MetalKernelsAvailable reports whether fast::metal_kernel can run here.
func MetalKernelsAvailable() bool { return C.mlxc_metal_available() != 0 }

// Kernel is a custom GPU kernel built from source (the body of a generated __global__ or
// [[kernel]] function; see MLX.md §3.3-3.4 for the calling conventions).
type Kernel struct {
	k     C.mlxc_kernel
	names map[string]*C.char // template argument names, converted once (freed with the kernel)
	// recent holds a few names without hashing: template names are string constants, and
	// comparing a string with the same one (same address) is a length and pointer check (a
	// call looks up ~15). Holding the strings keeps their memory from being reused.
	recent [24]struct {
		s string
		c *C.char
	}
	args  cArgs // C memory for a call's arguments, reused (Call is MLX-thread only)
	calls *atomic.Int64
	// prog is what shapes a CUDA kernel's programs (nil for Metal); aheadSeen the calls'
	// hashes whose programs were handed to the compiles ahead (ahead.go).
	prog      *kernelProgram
	aheadSeen map[uint64]bool
}

// kernelCalls counts the calls of every kernel by its spec's name, over the process: the
// runtime's record of which custom kernels a generation used (KernelCalls).
var kernelCalls sync.Map // string → *atomic.Int64

// KernelCalls returns how many times each custom kernel (by KernelSpec.Name) has been
// called in this process; kernels never called are absent.
func KernelCalls() map[string]int64 {
	out := map[string]int64{}
	kernelCalls.Range(func(k, v any) bool {
		if n := v.(*atomic.Int64).Load(); n > 0 {
			out[k.(string)] = n
		}
		return true
	})
	return out
}

// cArgs is C memory a call's argument arrays are written to. cgo checks every Go pointer
// handed to C (arrays of pointers element by element) and Go buffers whose address C sees
// escape to the heap; at ~270 kernel calls a DFlash cycle both showed in host profiles.
// C memory is neither checked nor collected.
type cArgs struct {
	mem  unsafe.Pointer
	size uintptr
}

// reserve returns at least n bytes of the memory, reallocated (contents dropped) when short.
func (a *cArgs) reserve(n uintptr) unsafe.Pointer {
	if n > a.size {
		C.free(a.mem)
		a.size = max(n, 1024)
		a.mem = C.malloc(C.size_t(a.size))
		if a.mem == nil {
			panic("mlxc: out of memory for kernel call arguments")
		}
	}
	return a.mem
}

func (a *cArgs) free() {
	C.free(a.mem)
	a.mem, a.size = nil, 0
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

// kernelName is the name MLX gets for a kernel: spec.Name and a hash of everything that
// shapes its code. MLX's CUDA backend keeps compiled kernels on disk between processes
// (by default under the temporary directory, mlx/<version>/ptx) keyed by the kernel's name
// and template arguments only, so a kernel whose source changed under the same name would
// run its old code after an upgrade.
func kernelName(spec KernelSpec) string {
	h := fnv.New64a()
	for _, part := range [][]string{{spec.Source, spec.Header}, spec.Inputs, spec.Outputs} {
		for _, s := range part {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
		h.Write([]byte{1})
	}
	fmt.Fprintf(h, "%d/%v/%d/%v", spec.Backend, spec.EnsureRowContiguous, spec.SharedMemory, spec.AtomicOutputs)
	return fmt.Sprintf("%s_%x", spec.Name, h.Sum64())
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

// identifier reports whether s can name a C++ function or parameter.
func identifier(s string) bool {
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

// NewKernel builds a kernel object. Compilation happens at the first call. The name and
// the input and output names must be C++ identifiers: they become the kernel's function
// and parameter names (a bad one would surface only as a compile error at the first call).
func NewKernel(spec KernelSpec) *Kernel {
	for _, n := range append(append([]string{spec.Name}, spec.Inputs...), spec.Outputs...) {
		if !identifier(n) {
			fail("kernel_new", "%q is not an identifier (letters, digits and _, not starting with a digit)", n)
		}
	}
	ins, freeIns := cStrings(spec.Inputs)
	defer freeIns()
	outs, freeOuts := cStrings(spec.Outputs)
	defer freeOuts()
	name, f1 := cstr(kernelName(spec))
	defer f1()
	source, header := KernelSources(spec, kernelFileDir())
	src, f2 := cstr(source)
	defer f2()
	hdr, f3 := cstr(header)
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
	c, _ := kernelCalls.LoadOrStore(spec.Name, new(atomic.Int64))
	kn := &Kernel{k: k, calls: c.(*atomic.Int64)}
	if spec.Backend == KernelCUDA {
		kn.prog = newKernelProgram(spec, source, header)
	}
	return kn
}

// Free releases the kernel object.
func (k *Kernel) Free() {
	if k != nil && k.k != nil {
		C.mlxc_kernel_free(k.k)
		k.k = nil
		k.freeArgs()
	}
}

// freeArgs releases the C copies of template names and the argument memory.
func (k *Kernel) freeArgs() {
	for _, p := range k.names {
		C.free(unsafe.Pointer(p))
	}
	k.names = nil
	k.recent = [len(k.recent)]struct {
		s string
		c *C.char
	}{}
	k.args.free()
}

// Call runs the kernel on the current (GPU) stream and returns its outputs. A launch seen
// before (same template arguments, grid, output shapes and input types) reuses its
// primitive, so a repeated call costs about as much as an MLX op. Call sits on the decode
// path: its arguments go to C through the kernel's reusable C memory (cArgs).
func (k *Kernel) Call(inputs []*Array, call KernelCall) []*Array {
	if k == nil || k.k == nil {
		fail("kernel_apply", "use of a freed kernel")
	}
	k.calls.Add(1)
	nout := len(call.OutputShapes)
	if len(call.OutputDtypes) != nout {
		fail("kernel_apply", "%d output shapes but %d dtypes", nout, len(call.OutputDtypes))
	}
	nshape := 0
	for _, sh := range call.OutputShapes {
		nshape += len(sh)
	}
	nt := len(call.Template)
	// Layout: input handles, output handles (nout+1), template names (nt+1), then ints:
	// shapes (+1), ndims, dtypes (nout+1 each), grid, group, template kinds and values (nt+1 each).
	const ptr = unsafe.Sizeof(uintptr(0))
	const cint = unsafe.Sizeof(C.int(0))
	nptr := uintptr(len(inputs) + nout + 1 + nt + 1)
	nint := uintptr(nshape + 1 + 2*(nout+1) + 6 + 2*(nt+1))
	mem := k.args.reserve(nptr*ptr + nint*cint)
	hs := unsafe.Slice((*C.mlxc_array)(mem), len(inputs))
	outs := unsafe.Slice((*C.mlxc_array)(unsafe.Add(mem, uintptr(len(inputs))*ptr)), nout+1)
	names := unsafe.Slice((**C.char)(unsafe.Add(mem, uintptr(len(inputs)+nout+1)*ptr)), nt+1)
	ints := unsafe.Slice((*C.int)(unsafe.Add(mem, nptr*ptr)), nint)
	for i, a := range inputs {
		if a == nil {
			fail("kernel_apply", "operand %d is nil", i)
		}
		hs[i] = a.handle("kernel_apply")
	}
	shapes, ndims, dts := ints[:nshape+1], ints[nshape+1:nshape+2+nout], ints[nshape+2+nout:nshape+3+2*nout]
	rest := ints[nshape+3+2*nout:]
	grid, group, kinds, vals := rest[0:3], rest[3:6], rest[6:7+nt], rest[7+nt:8+2*nt]
	j := 0
	for i, sh := range call.OutputShapes {
		ndims[i], dts[i] = C.int(len(sh)), C.int(call.OutputDtypes[i])
		for _, d := range sh {
			shapes[j] = C.int(d)
			j++
		}
		outs[i] = nil
	}
	shapes[j], ndims[nout], dts[nout], outs[nout] = 0, 0, 0, nil
	for i := range 3 {
		grid[i], group[i] = C.int(call.Grid[i]), C.int(call.ThreadGroup[i])
	}
	ahead := aheadOn.Load()
	h := uint64(14695981039346656037) // FNV-1a over the call's program-shaping values, when ahead
	mix := func(v int) { h = (h ^ uint64(v)) * 1099511628211 }
	for i, t := range call.Template {
		var kind, val C.int
		switch v := t.Value.(type) {
		case int:
			val = C.int(v)
		case bool:
			kind = 1
			if v {
				val = 1
			}
		case Dtype:
			kind, val = 2, C.int(v)
		default:
			fail("kernel_apply", "template arg %s: want int, bool or Dtype, got %T", t.Name, t.Value)
		}
		names[i], kinds[i], vals[i] = k.name(t.Name), kind, val
		if ahead {
			mix(int(kind)<<32 | int(uint32(val)))
		}
	}
	if ahead {
		for _, a := range inputs {
			mix(int(a.Dtype())<<1 | min(a.Ndim(), 1))
		}
		for _, d := range call.OutputDtypes {
			mix(int(d))
		}
		k.noteAhead(h, inputs, call)
	}
	names[nt], kinds[nt], vals[nt] = nil, 0, 0
	var inp *C.mlxc_array
	if len(hs) > 0 {
		inp = &hs[0]
	}
	init := C.float(0)
	if call.InitValue != nil {
		init = C.float(*call.InitValue)
	}
	check("kernel_apply", C.mlxc_kernel_apply(&outs[0], k.k, inp, C.int(len(hs)), &shapes[0], &ndims[0], &dts[0], C.int(nout), &grid[0], &group[0], &names[0], &kinds[0], &vals[0], C.int(nt), C.bool(call.InitValue != nil), init, curStream.c))
	res := make([]*Array, nout)
	for i := range res {
		res[i] = newArray(outs[i])
	}
	return res
}

// name returns the C copy of a template argument name, made at its first use.
func (k *Kernel) name(s string) *C.char {
	for i := range k.recent {
		r := &k.recent[i]
		if r.c == nil {
			break
		}
		if r.s == s {
			return r.c
		}
	}
	p, ok := k.names[s]
	if !ok {
		if k.names == nil {
			k.names = map[string]*C.char{}
		}
		p = C.CString(s)
		k.names[s] = p
	}
	for i := range k.recent {
		if r := &k.recent[i]; r.c == nil {
			r.s, r.c = s, p
			break
		}
	}
	return p
}
