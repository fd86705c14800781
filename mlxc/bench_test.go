package mlxc

import (
	"fmt"
	"strings"
	"testing"
)

// chainLen is the number of adds built per scope; mlxc/bench/cpp_overhead.cpp and
// py_overhead.py build the same chains.
const chainLen = 1000

// BenchmarkAddOverhead measures what one tiny graph node costs through Go → C → MLX: one op
// is one Add on [1] float32 arrays, y = y + x, chained chainLen deep in a scope that is
// closed after each chain (so freeing the handles is included). ns/op is per Add.
//
//   - build: graph construction only.
//   - build+eval: the chain is also evaluated once at its end (the 1000 nodes run on the
//     default stream), so ns/op includes MLX's scheduling and execution per node.
//
// The whole loop runs inside one Do: it measures the binding, not the MLX thread's queue
// (BenchmarkDo measures that).
func BenchmarkAddOverhead(b *testing.B) {
	for _, v := range []struct {
		name string
		eval bool
	}{{"build", false}, {"build+eval", true}} {
		b.Run(v.name, func(b *testing.B) {
			benchChains(b, v.eval, func() (func(y, x *Array) *Array, func()) { return Add, func() {} })
		})
	}
}

// benchChains times chains of chainLen nodes y = node(y, x) on a [1] float32 x, built in
// a scope closed after each chain (freeing included) and evaluated at the end when eval is
// set; ns/op is per node. prepare runs on the MLX thread first and returns the node and
// what to release afterwards. One chain warms up (and compiles) before the clock starts.
func benchChains(b *testing.B, eval bool, prepare func() (node func(y, x *Array) *Array, release func())) {
	err := Do(func() error {
		node, release := prepare()
		defer release()
		x := FromSlice([]float32{1}, 1)
		defer x.Free()
		chain := func(n int) {
			s := NewScope()
			y := x
			for j := 0; j < n; j++ {
				y = node(y, x)
			}
			if eval {
				Eval(y)
			}
			s.Close()
		}
		chain(chainLen)
		b.ResetTimer()
		for done := 0; done < b.N; done += chainLen {
			chain(min(chainLen, b.N-done))
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDo is the round trip of an empty job through the MLX thread.
func BenchmarkDo(b *testing.B) {
	if err := Init(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKernelOverhead is BenchmarkAddOverhead for custom CUDA kernels (a CUDA GPU only):
// ns/op per node of a chain y = k(y, x) on [1] float32 arrays, next to the same chain of
// MLX Adds in the same run. Kernel.Call reuses a launch's primitive, but a node still
// carries the kernel's source and its template arguments, so the kernels are timed with the
// test's short body and 2 template arguments ("small"), with a body padded to 12 KB
// ("large_2args"), with 10 template arguments ("small_10args") and with both ("large", the
// size of the model's tensor-core product kernel); and with the inputs and outputs of the
// model's products ("small_8in": 6 more inputs the body does not read, "small_4out": 3 more
// outputs it does not write), which tells what each array a launch carries costs.
func BenchmarkKernelOverhead(b *testing.B) {
	if !CUDAKernelsAvailable() {
		b.Skip("needs a CUDA GPU")
	}
	pad := "\n" + strings.Repeat("  // padding: a kernel body of the model's size, comments and all.\n", 180)
	large := make([]TemplateArg, 0, 10)
	for i := 0; i < 8; i++ {
		large = append(large, TemplateArg{Name: fmt.Sprintf("P%d", i), Value: i + 1})
	}
	cases := []struct {
		name     string
		source   string
		template []TemplateArg
		extraIn  int
		extraOut int
	}{
		{"add", "", nil, 0, 0},
		{"small", axpbSource, nil, 0, 0},
		{"small_10args", axpbSource, large, 0, 0},
		{"large_2args", axpbSource + pad, nil, 0, 0},
		{"large", axpbSource + pad, large, 0, 0},
		{"small_8in", axpbSource, nil, 6, 0},
		{"small_4out", axpbSource, nil, 0, 3},
	}
	for _, c := range cases {
		prepare := func() (func(y, x *Array) *Array, func()) {
			if c.source == "" {
				return Add, func() {}
			}
			ins, outs := []string{"a", "b"}, []string{"out"}
			call := KernelCall{OutputShapes: [][]int{{1}}, OutputDtypes: []Dtype{Float32}, Grid: [3]int{32, 1, 1}, ThreadGroup: [3]int{32, 1, 1},
				Template: append([]TemplateArg{{"N", 1}, {"T", Float32}}, c.template...)}
			for i := range c.extraIn {
				ins = append(ins, fmt.Sprintf("unread%d", i))
			}
			for i := range c.extraOut {
				outs = append(outs, fmt.Sprintf("unwritten%d", i))
				call.OutputShapes = append(call.OutputShapes, []int{1})
				call.OutputDtypes = append(call.OutputDtypes, Float32)
			}
			k := NewKernel(KernelSpec{Backend: KernelCUDA, Name: "dflash_bench_" + c.name, Inputs: ins, Outputs: outs, Source: c.source})
			return func(y, x *Array) *Array {
				args := []*Array{y, x}
				for range c.extraIn {
					args = append(args, x)
				}
				return k.Call(args, call)[0]
			}, k.Free
		}
		for _, eval := range []bool{false, true} {
			name := c.name + "/build"
			if eval {
				name += "+eval"
			}
			b.Run(name, func(b *testing.B) { benchChains(b, eval, prepare) })
		}
	}
}
