package mlxc

import (
	"math"
	"strings"
	"testing"
)

// gelu-ish elementwise graph: y = x·sigmoid(1.702·x) + exp(-x²)·b
func compiledBody(in []*Array) []*Array {
	x, b := in[0], in[1]
	y := Add(Multiply(x, Sigmoid(Multiply(x, Scalar(1.702, Float32)))), Multiply(Exp(Negative(Square(x))), b))
	return []*Array{y, Sum(y, nil, false)}
}

func compiledRef(x, b []float32) ([]float64, float64) {
	out := make([]float64, len(x))
	var s float64
	for i := range x {
		v := float64(x[i])
		out[i] = v*sigmoid64(1.702*v) + math.Exp(-v*v)*float64(b[i])
		s += out[i]
	}
	return out, s
}

func TestCompile(t *testing.T) {
	g := lcg(9)
	onMLX(t, func() {
		traces := 0
		c := Compile(func(in []*Array) []*Array {
			traces++
			return compiledBody(in)
		}, false)
		defer c.Free()
		for _, n := range []int{7, 7, 13, 7} {
			x, b := g.floats(n, -3, 3), g.floats(n, -1, 1)
			xa, ba := f32(x, n), f32(b, n)
			out := c.Call(xa, ba)
			if len(out) != 2 {
				t.Errorf("compiled call: %d outputs", len(out))
				return
			}
			plain := compiledBody([]*Array{xa, ba})
			want, wantSum := compiledRef(x, b)
			nearAll(t, "compiled vs closed form", out[0].Float32s(), want, 1e-5, 1e-5)
			nearAll(t, "compiled sum", out[1].Float32s(), []float64{wantSum}, 1e-4, 1e-5)
			nearAll(t, "compiled vs uncompiled", out[0].Float32s(), to64(plain[0].Float32s()), 1e-6, 1e-6)
		}
		// Traced once for [7], once more for the new shape [13], then [7] again from the cache.
		if traces != 2 {
			t.Errorf("traced %d times for shapes 7, 7, 13, 7; want 2", traces)
		}

		// Shapeless: one trace for every length.
		shapeless := 0
		cs := Compile(func(in []*Array) []*Array {
			shapeless++
			return []*Array{Add(Multiply(in[0], in[0]), Scalar(1, Float32))}
		}, true)
		defer cs.Free()
		for _, n := range []int{3, 5, 8} {
			x := g.floats(n, -2, 2)
			want := make([]float64, n)
			for i, v := range x {
				want[i] = float64(v)*float64(v) + 1
			}
			nearAll(t, "shapeless", cs.Call(f32(x, n))[0].Float32s(), want, 1e-6, 1e-6)
		}
		if shapeless != 1 {
			t.Errorf("shapeless traced %d times, want 1", shapeless)
		}

		// Outputs may be inputs, and a captured array becomes a constant.
		k := f32([]float32{10, 20}, 2)
		ci := Compile(func(in []*Array) []*Array { return []*Array{in[0], Add(in[0], k), in[0]} }, false)
		defer ci.Free()
		out := ci.Call(f32([]float32{1, 2}, 2))
		if len(out) != 3 {
			t.Errorf("identity outputs: %d", len(out))
			return
		}
		closeTo(t, "identity output", out[0].Float32s(), []float32{1, 2}, 0)
		closeTo(t, "captured constant", out[1].Float32s(), []float32{11, 22}, 0)
		closeTo(t, "identity output twice", out[2].Float32s(), []float32{1, 2}, 0)
	})
}

// Two compiled functions with the same input signature keep separate traces (MLX keys its
// cache on the function object). Single-op graphs: nothing to fuse, so no CPU kernel is
// JIT-compiled (that costs seconds on a cold cache).
func TestCompileSeparateTraces(t *testing.T) {
	onMLX(t, func() {
		n1, n2 := 0, 0
		f1 := Compile(func(in []*Array) []*Array { n1++; return []*Array{Add(in[0], in[1])} }, false)
		f2 := Compile(func(in []*Array) []*Array { n2++; return []*Array{Multiply(in[0], in[1])} }, false)
		defer f1.Free()
		defer f2.Free()
		x, y := f32([]float32{1, 2, 3}, 3), f32([]float32{4, 5, 6}, 3)
		for i := 0; i < 2; i++ {
			closeTo(t, "f1", f1.Call(x, y)[0].Float32s(), []float32{5, 7, 9}, 0)
			closeTo(t, "f2", f2.Call(x, y)[0].Float32s(), []float32{4, 10, 18}, 0)
		}
		if n1 != 1 || n2 != 1 {
			t.Errorf("traces: f1 %d, f2 %d; want 1 each", n1, n2)
		}
		// Another compiled function, freed while the others live on.
		f3 := Compile(func(in []*Array) []*Array { return []*Array{Subtract(in[0], in[1])} }, false)
		closeTo(t, "f3", f3.Call(x, y)[0].Float32s(), []float32{-3, -3, -3}, 0)
		f3.Free()
		closeTo(t, "f1 after freeing f3", f1.Call(x, y)[0].Float32s(), []float32{5, 7, 9}, 0)
		closeTo(t, "f2 after freeing f3", f2.Call(x, y)[0].Float32s(), []float32{4, 10, 18}, 0)
	})
}

// A graph function that panics makes Call fail with an error; nothing crashes, the MLX
// thread is not left inside a trace, and the same compiled function can be called again.
func TestCompileErrors(t *testing.T) {
	base := LiveArrays()
	onMLX(t, func() {
		fail := true
		c := Compile(func(in []*Array) []*Array {
			if fail {
				return []*Array{Add(in[0], f32([]float32{1, 2, 3, 4}, 4))} // shape mismatch -> *Error panic
			}
			return []*Array{Add(in[0], in[0])}
		}, false)
		defer c.Free()
		x := f32([]float32{1, 2, 3}, 3)
		wantErr(t, "shape error inside a compiled function", "broadcast", func() { c.Call(x) })
		fail = false
		closeTo(t, "compiled call after a failed trace", c.Call(x)[0].Float32s(), []float32{2, 4, 6}, 0)

		p := Compile(func(in []*Array) []*Array { panic("boom in graph") }, false)
		defer p.Free()
		wantErr(t, "plain panic inside a compiled function", "boom in graph", func() { p.Call(x) })

		nilOut := Compile(func(in []*Array) []*Array { return []*Array{Exp(in[0]), nil} }, false)
		defer nilOut.Free()
		wantErr(t, "nil output", "nil", func() { nilOut.Call(x) })

		// Evaluating outside a trace still works (MLX is not stuck in tracing mode).
		closeTo(t, "eval after failures", Add(x, x).Float32s(), []float32{2, 4, 6}, 0)
		var freed Compiled
		wantErr(t, "call of a freed compiled function", "freed", func() { freed.Call(x) })

		// Disabling compilation runs the function as traced.
		SetCompileEnabled(false)
		d := Compile(func(in []*Array) []*Array { return []*Array{Multiply(in[0], Scalar(3, Float32))} }, false)
		closeTo(t, "compile disabled", d.Call(x)[0].Float32s(), []float32{3, 6, 9}, 0)
		d.Free()
		SetCompileEnabled(true)
	})
	if err := Do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := LiveArrays(); got != base {
		t.Errorf("live arrays %d after compile errors, want %d", got, base)
	}
	err := Do(func() error {
		c := Compile(func(in []*Array) []*Array { panic("again") }, false)
		defer c.Free()
		c.Call(FromSlice([]float32{1}, 1))
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "again") {
		t.Errorf("Do with a failing compiled call: %v", err)
	}
}
