package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// MLX compiles a custom kernel when it first evaluates a call of it, one kernel at a time,
// and a kernel's first use in a process meets several new ones at once (a model's first
// forward: a dozen; each new block width: a few), each taking seconds with NVRTC. So when a
// call with new template arguments enters a graph, Kernel.Call hands the program MLX will
// build for it to the NVRTC cache (nvrtc_cache.cpp, mlxc_nvrtc_ahead), which compiles it in
// a process of its own (Config.CompileHelper; NVRTC compiles one program at a time in a
// process) with the recipe learned from MLX's first custom-kernel compile; MLX's compile of
// it then waits for that and is answered from the cache. The program text must be MLX's
// byte for byte (mlxProgram): a program built otherwise is counted as a mismatch
// (AheadStats) and costs a wasted compile elsewhere, never a wrong kernel.

// aheadOn is set at the runtime's start: compiles ahead were asked for, the compile cache
// is on and custom CUDA kernels can run.
var aheadOn atomic.Bool

// startCompileAhead turns compiles ahead on where they can help (after startCompileCache).
func startCompileAhead() {
	on := config.CompileAhead && compileCacheDir() != "" && CUDAKernelsAvailable()
	aheadOn.Store(on)
	if !on || len(config.CompileHelper) == 0 {
		return
	}
	args := make([]*C.char, len(config.CompileHelper))
	for i, a := range config.CompileHelper {
		args[i] = C.CString(a)
		defer C.free(unsafe.Pointer(args[i]))
	}
	C.mlxc_nvrtc_ahead_helper(&args[0], C.int(len(args)))
}

// CompileJob runs the compile ahead that the file at path describes and writes its entry
// to the compile cache (the helper process's work; it needs no runtime). It returns the
// process's exit code: 0 done, 1 the compile or the write failed, 2 not a job file.
func CompileJob(path string) int {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	return int(C.mlxc_nvrtc_compile_job(cp))
}

// kernelProgram is what of a CUDA kernel shapes the program MLX builds for a call of it,
// besides the call's types and template arguments.
type kernelProgram struct {
	name            string // the name MLX is given (kernelName)
	source, header  string // as MLX is given them (KernelSources)
	inputs, outputs []string
	// shapeInfo[i] says which of input i's _shape, _strides and _ndim parameters MLX adds:
	// those whose names the source mentions.
	shapeInfo [][3]bool
}

func newKernelProgram(spec KernelSpec, source, header string) *kernelProgram {
	p := &kernelProgram{name: kernelName(spec), source: source, header: header, inputs: spec.Inputs, outputs: spec.Outputs}
	for _, in := range spec.Inputs {
		p.shapeInfo = append(p.shapeInfo, [3]bool{strings.Contains(source, in+"_shape"),
			strings.Contains(source, in+"_strides"), strings.Contains(source, in+"_ndim")})
	}
	return p
}

// cudaTypeNames are MLX's CUDA C++ names of the element types (its dtype_to_cuda_type).
var cudaTypeNames = [...]string{"bool", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "int8_t", "int16_t", "int32_t",
	"int64_t", "__half", "float", "double", "__nv_bfloat16", "mlx::core::cu::complex64_t"}

// templateTypeNames are the names MLX puts in a kernel's name for a type template argument
// (its get_type_string).
var templateTypeNames = [...]string{"bool", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "int8_t", "int16_t", "int32_t",
	"int64_t", "float16_t", "float", "double", "bfloat16_t", "complex64_t"}

func typeName(names []string, d Dtype) (string, bool) {
	if d < 0 || int(d) >= len(names) {
		return "", false
	}
	return names[d], true
}

// mlxProgram is the function name and source MLX's CUDA backend (0.32.4) builds for a call
// of p with inputs of the given types (and whether each has dimensions), outputs of the
// given types and template arguments: its default header, the kernel's header, the
// signature (each input, then its shape, strides and ndim parameters where the source
// names them and the input has dimensions, then the outputs), the template arguments as
// constants, and the body. ok is false for a type MLX has no name for.
func mlxProgram(p *kernelProgram, in []Dtype, inDims []bool, out []Dtype, template []TemplateArg) (fn, src string, ok bool) {
	var name strings.Builder
	name.WriteString("custom_kernel_" + p.name)
	var consts strings.Builder
	for _, t := range template {
		switch v := t.Value.(type) {
		case int:
			name.WriteString("_" + strconv.Itoa(v))
			consts.WriteString("  constexpr int " + t.Name + " = " + strconv.Itoa(v) + ";\n")
		case bool:
			if v {
				name.WriteString("_t")
			} else {
				name.WriteString("_f")
			}
			consts.WriteString("  constexpr bool " + t.Name + " = " + strconv.FormatBool(v) + ";\n")
		case Dtype:
			tn, ok1 := typeName(templateTypeNames[:], v)
			cn, ok2 := typeName(cudaTypeNames[:], v)
			if !ok1 || !ok2 {
				return "", "", false
			}
			name.WriteString("_" + tn)
			consts.WriteString("  using " + t.Name + " = " + cn + ";\n")
		default:
			return "", "", false
		}
	}
	fn = name.String()
	var b strings.Builder
	b.WriteString("\n#include \"mlx/backend/cuda/device/utils.cuh\"\n\n#include <cooperative_groups.h>\n\n")
	b.WriteString(p.header)
	b.WriteString("namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n")
	b.WriteString("__global__ void " + fn + "(\n")
	for i, dt := range in {
		cn, ok := typeName(cudaTypeNames[:], dt)
		if !ok || i >= len(p.inputs) {
			return "", "", false
		}
		b.WriteString("    const " + cn + "* " + p.inputs[i] + ",\n")
		if inDims[i] {
			si := p.shapeInfo[i]
			if si[0] {
				b.WriteString("    const __grid_constant__ Shape " + p.inputs[i] + "_shape,\n")
			}
			if si[1] {
				b.WriteString("    const __grid_constant__ Strides " + p.inputs[i] + "_strides,\n")
			}
			if si[2] {
				b.WriteString("    const __grid_constant__ int " + p.inputs[i] + "_ndim,\n")
			}
		}
	}
	for i, dt := range out {
		cn, ok := typeName(cudaTypeNames[:], dt)
		if !ok || i >= len(p.outputs) {
			return "", "", false
		}
		b.WriteString("    " + cn + "* " + p.outputs[i])
		if i < len(out)-1 {
			b.WriteString(",\n")
		} else {
			b.WriteString(") {\n")
		}
	}
	if len(template) > 0 {
		b.WriteString(consts.String() + "\n")
	}
	b.WriteString(p.source + "\n}\n\n} // namespace mlx::core::cu\n")
	return fn, b.String(), true
}

// noteAhead hands the program of a call seen for the first time (by this kernel: its
// template arguments and types, hashed as h) to the compiles ahead.
func (k *Kernel) noteAhead(h uint64, inputs []*Array, call KernelCall) {
	if k.prog == nil || k.aheadSeen[h] {
		return
	}
	if k.aheadSeen == nil {
		k.aheadSeen = map[uint64]bool{}
	}
	k.aheadSeen[h] = true
	in := make([]Dtype, len(inputs))
	dims := make([]bool, len(inputs))
	for i, a := range inputs {
		in[i], dims[i] = a.Dtype(), a.Ndim() > 0
	}
	fn, src, ok := mlxProgram(k.prog, in, dims, call.OutputDtypes, call.Template)
	if !ok {
		return
	}
	cfn, csrc := C.CString(fn), C.CString(src)
	C.mlxc_nvrtc_ahead(cfn, csrc)
	C.free(unsafe.Pointer(cfn))
	C.free(unsafe.Pointer(csrc))
}

// AheadStats counts the compiles ahead of this process: programs submitted, compiled on
// the cache's threads, found in the cache already, failed; MLX compiles answered by one of
// them, programs MLX built otherwise than submitted (a mismatch: that compile was wasted),
// and the time MLX waited for compiles still running.
type AheadStats struct {
	Submitted  int64         `json:"submitted"`
	Compiled   int64         `json:"compiled"`
	Present    int64         `json:"present"`
	Failed     int64         `json:"failed"`
	Answered   int64         `json:"answered"`
	Mismatched int64         `json:"mismatched"`
	Waited     time.Duration `json:"waited_ns"`
}

// CompileAhead returns the compiles ahead's counts so far.
func CompileAhead() AheadStats {
	var s, c, p, f, a, m, w C.longlong
	C.mlxc_nvrtc_ahead_stats(&s, &c, &p, &f, &a, &m, &w)
	return AheadStats{Submitted: int64(s), Compiled: int64(c), Present: int64(p), Failed: int64(f), Answered: int64(a),
		Mismatched: int64(m), Waited: time.Duration(w)}
}
