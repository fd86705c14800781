package mlxc

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unsafe"
)

// out[i] = a[i]·2 + b[i]. The grid is in threads and the last block may hold surplus
// threads, so the body checks its index (N comes in as a template argument).
const axpbSource = `
  auto i = cg::this_grid().thread_rank();
  if (i < N) {
    out[i] = a[i] * static_cast<T>(2.0f) + b[i];
  }
`

func axpbKernel() *Kernel {
	return NewKernel(KernelSpec{
		Backend: KernelCUDA,
		Name:    "dflash_test_axpb",
		Inputs:  []string{"a", "b"},
		Outputs: []string{"out"},
		Source:  axpbSource,
	})
}

func TestCUDAKernelUnavailableOnCPU(t *testing.T) {
	if CUDAKernelsAvailable() {
		t.Skip("CUDA kernels are available here; TestCUDAKernel covers them")
	}
	if Backend() == "cuda" && GPUCount() > 0 {
		t.Errorf("CUDAKernelsAvailable false with a CUDA backend and %d GPUs", GPUCount())
	}
	onMLX(t, func() {
		// Building or calling a CUDA kernel without the CUDA backend is an error, not a crash.
		err := Catch(func() {
			k := axpbKernel()
			defer k.Free()
			a := f32(seq(8), 8)
			out := k.Call([]*Array{a, a}, KernelCall{
				OutputShapes: [][]int{{8}},
				OutputDtypes: []Dtype{Float32},
				Grid:         [3]int{8, 1, 1},
				ThreadGroup:  [3]int{32, 1, 1},
				Template:     []TemplateArg{{"N", 8}, {"T", Float32}},
			})
			Eval(out...)
		})
		if err == nil {
			t.Errorf("a CUDA kernel ran without the CUDA backend")
		} else {
			t.Logf("CUDA kernel on %s: %v", Backend(), err)
		}
		var freed Kernel
		wantErr(t, "call of a freed kernel", "freed", func() { freed.Call(nil, KernelCall{}) })
		wantErr(t, "unknown kernel backend", "backend", func() { NewKernel(KernelSpec{Backend: 7, Name: "x"}) })
		for _, bad := range []KernelSpec{
			{Backend: KernelCUDA, Name: "has-hyphen", Outputs: []string{"out"}},
			{Backend: KernelCUDA, Name: "", Outputs: []string{"out"}},
			{Backend: KernelCUDA, Name: "k", Inputs: []string{"1a"}, Outputs: []string{"out"}},
			{Backend: KernelCUDA, Name: "k", Outputs: []string{"o ut"}},
		} {
			wantErr(t, "kernel name "+bad.Name, "not an identifier", func() { NewKernel(bad) })
		}
		// The runtime keeps working.
		closeTo(t, "after kernel errors", Add(f32([]float32{1}, 1), f32([]float32{2}, 1)).Float32s(), []float32{3}, 0)
	})
}

// TestCUDAKernel runs a real fast::cuda_kernel on a GPU stream (H200 runs).
func TestCUDAKernel(t *testing.T) {
	if !CUDAKernelsAvailable() {
		t.Skipf("no CUDA kernels here (backend %s, %d GPUs): run on a CUDA machine", Backend(), GPUCount())
	}
	const n = 1000 // not a multiple of the block size: 24 surplus threads in the last block
	g := lcg(55)
	av, bv := g.floats(n, -4, 4), g.floats(n, -4, 4)
	onMLX(t, func() {
		prev := DefaultStream()
		defer SetStream(prev)
		SetStream(NewStream(Device{GPU: true}))
		k := axpbKernel()
		defer k.Free()
		call := func(a, b *Array, dt Dtype, cnt int) *Array {
			return k.Call([]*Array{a, b}, KernelCall{
				OutputShapes: [][]int{{cnt}},
				OutputDtypes: []Dtype{dt},
				Grid:         [3]int{cnt, 1, 1},
				ThreadGroup:  [3]int{256, 1, 1},
				Template:     []TemplateArg{{"N", cnt}, {"T", dt}},
			})[0]
		}
		a, b := f32(av, n), f32(bv, n)
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(av[i])*2 + float64(bv[i])
		}
		out := call(a, b, Float32, n)
		eqShape(t, "cuda kernel", out.Shape(), []int{n})
		nearAll(t, "cuda kernel f32", out.Float32s(), want, 1e-6, 1e-6)
		// Same kernel, another template instantiation (bf16).
		ob := call(AsType(a, BFloat16), AsType(b, BFloat16), BFloat16, n)
		if ob.Dtype() != BFloat16 {
			t.Errorf("bf16 kernel output %v", ob.Dtype())
		}
		nearAll(t, "cuda kernel bf16", ob.Float32s(), want, 0.07, 0.01)
		// Repeated launches reuse the first call's primitive (the shim caches it per launch):
		// each still reads its own inputs, and interleaved launches keep theirs apart.
		for rep := range 3 {
			a2, b2 := Add(a, f32([]float32{float32(rep + 1)}, 1)), Multiply(b, f32([]float32{float32(rep + 2)}, 1))
			w2 := make([]float64, n)
			for i := range w2 {
				w2[i] = (float64(av[i])+float64(rep+1))*2 + float64(bv[i])*float64(rep+2)
			}
			nearAll(t, "cuda kernel, repeated launch", call(a2, b2, Float32, n).Float32s(), w2, 1e-5, 1e-5)
			nearAll(t, "cuda kernel, interleaved n=7", call(SliceAxis(a, 0, 0, 7), SliceAxis(b, 0, 0, 7), Float32, 7).Float32s(), want[:7], 1e-6, 1e-6)
		}
		// Two launches sharing one primitive are still two graph nodes.
		r1, r2 := call(a, b, Float32, n), call(b, a, Float32, n)
		if got := GraphNodes(r1, r2); got != 2 {
			t.Errorf("two launches of one kernel: GraphNodes = %d, want 2", got)
		}
		// A small call: the grid is smaller than one block.
		nearAll(t, "cuda kernel n=5", call(SliceAxis(a, 0, 0, 5), SliceAxis(b, 0, 0, 5), Float32, 5).Float32s(), want[:5], 1e-6, 1e-6)
		// InitValue fills the output first: a kernel that writes nothing leaves it.
		noop := NewKernel(KernelSpec{Backend: KernelCUDA, Name: "dflash_test_noop", Inputs: []string{"a"}, Outputs: []string{"out"},
			Source: "  if (cg::this_grid().thread_rank() == 0) { out[0] = a[0]; }\n"})
		defer noop.Free()
		init := float32(-3)
		r := noop.Call([]*Array{a}, KernelCall{OutputShapes: [][]int{{4}}, OutputDtypes: []Dtype{Float32},
			Grid: [3]int{1, 1, 1}, ThreadGroup: [3]int{1, 1, 1}, InitValue: &init})[0]
		closeTo(t, "init value", r.Float32s(), []float32{av[0], -3, -3, -3}, 0)
	})
}

// A kernel's name carries a hash of its code, so that MLX's on-disk cache of compiled
// kernels (keyed by name) never serves the code of an older source under the same name.
func TestKernelNameFollowsSource(t *testing.T) {
	base := KernelSpec{Backend: KernelCUDA, Name: "dflash_x", Inputs: []string{"a"}, Outputs: []string{"out"}, Source: "out[0] = a[0];"}
	name := kernelName(base)
	if !regexp.MustCompile(`^dflash_x_[0-9a-f]+$`).MatchString(name) {
		t.Fatalf("name %q is not the spec's name and a hex hash", name)
	}
	if again := kernelName(base); again != name {
		t.Errorf("same spec, names %q and %q", name, again)
	}
	for what, change := range map[string]func(*KernelSpec){
		"source":   func(s *KernelSpec) { s.Source = "out[0] = 2 * a[0];" },
		"header":   func(s *KernelSpec) { s.Header = "#define X 1" },
		"inputs":   func(s *KernelSpec) { s.Inputs = []string{"b"} },
		"outputs":  func(s *KernelSpec) { s.Outputs = []string{"y"} },
		"backend":  func(s *KernelSpec) { s.Backend = KernelMetal },
		"contig":   func(s *KernelSpec) { s.EnsureRowContiguous = true },
		"split":    func(s *KernelSpec) { s.Source, s.Header = "out[0] = a[0]", ";" }, // same bytes, other split
		"sharedmm": func(s *KernelSpec) { s.SharedMemory = 1024 },
	} {
		s := base
		change(&s)
		if kernelName(s) == name {
			t.Errorf("changing the %s kept the name %q", what, name)
		}
	}
}

// TestReadKeepsDeviceMemory: on CUDA, reading a GPU op's result on the host copies it out
// and leaves its buffer in device memory (data<T>() would move it to unified memory for
// good, where a later GPU op that reuses it page-faults); the values read are right, also
// for a view at an offset and a transposed (non-contiguous) array. Elsewhere Location is
// "" and the read is the plain one.
func TestReadKeepsDeviceMemory(t *testing.T) {
	onMLX(t, func() {
		if !CUDAKernelsAvailable() {
			a := Add(f32([]float32{1, 2}, 2), f32([]float32{3, 4}, 2))
			closeTo(t, "cpu read", a.Float32s(), []float32{4, 6}, 0)
			if loc := a.Location(); loc != "" {
				t.Errorf("Location off CUDA = %q, want \"\"", loc)
			}
			return
		}
		prev := DefaultStream()
		defer SetStream(prev)
		SetStream(NewStream(Device{GPU: true}))
		vals := make([]float32, 24)
		for i := range vals {
			vals[i] = float32(i)
		}
		host := f32(vals, 4, 6) // made from host data: unified memory
		gpu := Add(host, Scalar(0.5, Float32))
		Eval(gpu)
		if loc := gpu.Location(); loc != "device" {
			t.Fatalf("a GPU op's [4,6] float32 result is in %q memory, want device", loc)
		}
		want := make([]float32, 24)
		for i := range want {
			want[i] = float32(i) + 0.5
		}
		closeTo(t, "device read", ToSlice[float32](gpu), want, 0)
		if loc := gpu.Location(); loc != "device" {
			t.Errorf("after the host read the buffer is in %q memory, want device (not moved)", loc)
		}
		row := Slice(gpu, []int{2, 0}, []int{3, 6}) // a view 48 bytes into the buffer
		closeTo(t, "view at an offset", ToSlice[float32](row), want[12:18], 0)
		tr := Transpose(gpu, 1, 0)
		got := ToSlice[float32](tr)
		for i := 0; i < 6; i++ {
			for j := 0; j < 4; j++ {
				if got[i*4+j] != want[j*6+i] {
					t.Fatalf("transposed read [%d,%d] = %v, want %v", i, j, got[i*4+j], want[j*6+i])
				}
			}
		}
		if loc := host.Location(); loc != "unified" {
			t.Errorf("host-made array is in %q memory, want unified", loc)
		}
	})
}

// The SM count comes from the driver on CUDA (132 on an H200) and is 0 elsewhere.
func TestCUDAMultiprocessors(t *testing.T) {
	onMLX(t, func() {
		n := CUDAMultiprocessors()
		switch {
		case CUDAKernelsAvailable() && n <= 0:
			t.Errorf("CUDAMultiprocessors = %d on a CUDA GPU", n)
		case !CUDAKernelsAvailable() && n != 0:
			t.Errorf("CUDAMultiprocessors = %d without CUDA kernels", n)
		}
		t.Logf("%d multiprocessors", n)
	})
}

// Template names reach C once per kernel: the same text gives the same C string whether it
// is the same Go string or a copy, different names different ones, also past the short
// list of recent names (the map behind it); the argument memory grows when a call needs
// more and keeps its size otherwise.
func TestKernelArgsMarshaling(t *testing.T) {
	var k Kernel
	defer k.freeArgs()
	seen := map[unsafe.Pointer]string{}
	for round := range 2 {
		for i := range 40 {
			s := fmt.Sprintf("P%d", i)
			p := unsafe.Pointer(k.name(s))
			if p == nil {
				t.Fatalf("name(%q) = nil", s)
			}
			if q := unsafe.Pointer(k.name(strings.Clone(s))); q != p {
				t.Errorf("round %d: a copy of %q got another C string", round, s)
			}
			if prev, ok := seen[p]; ok && prev != s {
				t.Errorf("%q and %q share a C string", prev, s)
			}
			seen[p] = s
		}
	}
	if len(seen) != 40 {
		t.Errorf("%d C strings for 40 names", len(seen))
	}
	a := k.args.reserve(100)
	if a == nil || k.args.size < 100 {
		t.Fatalf("reserve(100): %p, size %d", a, k.args.size)
	}
	if b := k.args.reserve(50); b != a {
		t.Errorf("a smaller reserve moved the memory")
	}
	if b := k.args.reserve(k.args.size + 1); b == nil || k.args.size < 1025 {
		t.Errorf("a larger reserve: %p, size %d", b, k.args.size)
	}
}
