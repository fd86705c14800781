package mlxc

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMLXProgram: the program text MLX 0.32.4's CUDA backend builds for a custom kernel
// call (fast::cuda_kernel's generator; on an H200 this form matched every program MLX
// compiled, where a form with another default header matched none), written out by hand
// for one call: the default header,
// the kernel's header, inputs with the shape parameters the body names (none for an input
// without dimensions), outputs, template constants of each kind, the body.
func TestMLXProgram(t *testing.T) {
	spec := KernelSpec{Backend: KernelCUDA, Name: "demo", Inputs: []string{"x", "n", "w"}, Outputs: []string{"y", "s"},
		Source: "y[0] = x[0] + x_shape[0] + w_ndim;", Header: "// header\n"}
	p := newKernelProgram(spec, spec.Source, spec.Header)
	fn, src, ok := mlxProgram(p, []Dtype{BFloat16, Int32, Float16}, []bool{true, false, true}, []Dtype{BFloat16, Float32},
		[]TemplateArg{{"T", BFloat16}, {"D", 128}, {"CAUSAL", true}, {"SPLIT", false}, {"U", Uint32}})
	if !ok {
		t.Fatal("no program")
	}
	wantFn := "custom_kernel_" + kernelName(spec) + "_bfloat16_t_128_t_f_uint32_t"
	want := "\n#include \"mlx/backend/cuda/device/utils.cuh\"\n\n#include <cooperative_groups.h>\n\n" +
		"// header\n" +
		"namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n" +
		"__global__ void " + wantFn + "(\n" +
		"    const __nv_bfloat16* x,\n" +
		"    const __grid_constant__ Shape x_shape,\n" +
		"    const int32_t* n,\n" +
		"    const __half* w,\n" +
		"    const __grid_constant__ int w_ndim,\n" +
		"    __nv_bfloat16* y,\n" +
		"    float* s) {\n" +
		"  using T = __nv_bfloat16;\n" +
		"  constexpr int D = 128;\n" +
		"  constexpr bool CAUSAL = true;\n" +
		"  constexpr bool SPLIT = false;\n" +
		"  using U = uint32_t;\n" +
		"\n" +
		"y[0] = x[0] + x_shape[0] + w_ndim;\n}\n\n} // namespace mlx::core::cu\n"
	if fn != wantFn {
		t.Errorf("function %q, want %q", fn, wantFn)
	}
	if diff := cmp.Diff(want, src); diff != "" {
		t.Errorf("program (-want +got):\n%s", diff)
	}
	if _, _, ok := mlxProgram(p, []Dtype{Dtype(99), Int32, Float16}, []bool{true, false, true}, []Dtype{BFloat16, Float32}, nil); ok {
		t.Error("a type MLX has no name for made a program")
	}
	// No template arguments: no constants and no blank line before the body.
	_, src, _ = mlxProgram(p, []Dtype{Float32, Int32, Float32}, []bool{false, false, false}, []Dtype{Float32, Float32}, nil)
	if want := "    float* s) {\ny[0]"; !strings.Contains(src, want) {
		t.Errorf("program without template arguments lacks %q:\n%s", want, src)
	}
}
