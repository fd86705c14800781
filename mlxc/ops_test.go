package mlxc

import (
	"math"
	"sort"
	"testing"
)

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func TestUnary(t *testing.T) {
	general := []float32{-6, -2.5, -1, -0.25, 0, 0.5, 1, 3, 7.75}
	positive := []float32{1e-3, 0.25, 0.5, 1, 2, 10, 1234.5}
	cases := []struct {
		name string
		op   func(*Array) *Array
		in   []float32
		ref  func(float64) float64
		rel  float64
	}{
		{"negative", Negative, general, func(x float64) float64 { return -x }, 0},
		{"abs", Abs, general, math.Abs, 0},
		{"square", Square, general, func(x float64) float64 { return x * x }, 1e-7},
		{"exp", Exp, general, math.Exp, 2e-6},
		{"log", Log, positive, math.Log, 2e-6},
		{"log1p", Log1p, []float32{-0.5, -1e-6, 0, 1e-7, 1e-3, 1, 100}, math.Log1p, 2e-6},
		{"sigmoid", Sigmoid, general, sigmoid64, 2e-6},
		{"tanh", Tanh, general, math.Tanh, 2e-6},
		{"sqrt", Sqrt, positive, math.Sqrt, 1e-7},
		{"rsqrt", Rsqrt, positive, func(x float64) float64 { return 1 / math.Sqrt(x) }, 2e-6},
		{"reciprocal", Reciprocal, positive, func(x float64) float64 { return 1 / x }, 1e-7},
		{"sin", Sin, general, math.Sin, 2e-6},
		{"cos", Cos, general, math.Cos, 2e-6},
		{"floor", Floor, general, math.Floor, 0},
		{"ceil", Ceil, general, math.Ceil, 0},
		{"erf", Erf, general, math.Erf, 2e-6},
		{"silu", SiLU, general, func(x float64) float64 { return x * sigmoid64(x) }, 2e-6},
		{"softplus", Softplus, append([]float32{-30, 30}, general...), func(x float64) float64 { return math.Log1p(math.Exp(x)) }, 2e-6},
		{"copy", Copy, general, func(x float64) float64 { return x }, 0},
		{"stop_gradient", StopGradient, general, func(x float64) float64 { return x }, 0},
	}
	onMLX(t, func() {
		for _, c := range cases {
			want := make([]float64, len(c.in))
			for i, x := range c.in {
				want[i] = c.ref(float64(x))
			}
			out := c.op(f32(c.in, len(c.in)))
			if out.Dtype() != Float32 {
				t.Errorf("%s: dtype %v", c.name, out.Dtype())
			}
			nearAll(t, c.name, out.Float32s(), want, 1e-7, c.rel)
		}
		// isnan and logical_not give bools.
		nan := float32(math.NaN())
		eqSlice(t, "isnan", ToSlice[bool](IsNaN(f32([]float32{1, nan, float32(math.Inf(1)), 0}, 4))), []bool{false, true, false, false})
		eqSlice(t, "logical_not", ToSlice[bool](LogicalNot(FromSlice([]bool{true, false}, 2))), []bool{false, true})
		// exp/log edge values.
		got := Exp(f32([]float32{-200, 200}, 2)).Float32s()
		if got[0] != 0 || !math.IsInf(float64(got[1]), 1) {
			t.Errorf("exp(-200, 200) = %v, want [0 +Inf]", got)
		}
		got = Log(f32([]float32{0, -1}, 2)).Float32s()
		if !math.IsInf(float64(got[0]), -1) || !math.IsNaN(float64(got[1])) {
			t.Errorf("log(0, -1) = %v, want [-Inf NaN]", got)
		}
	})
}

func TestBinary(t *testing.T) {
	a := []float32{7, -7, 7, 5.5, 0.5, 2, 3, -1.25}
	b := []float32{3, 3, -3, 2, 4, 10, 0.5, 2}
	pyMod := func(x, y float64) float64 {
		r := math.Mod(x, y)
		if r != 0 && (r < 0) != (y < 0) {
			r += y
		}
		return r
	}
	cases := []struct {
		name string
		op   func(x, y *Array) *Array
		ref  func(x, y float64) float64
		rel  float64
	}{
		{"add", Add, func(x, y float64) float64 { return x + y }, 0},
		{"subtract", Subtract, func(x, y float64) float64 { return x - y }, 0},
		{"multiply", Multiply, func(x, y float64) float64 { return x * y }, 0},
		{"divide", Divide, func(x, y float64) float64 { return x / y }, 1e-7},
		{"maximum", Maximum, math.Max, 0},
		{"minimum", Minimum, math.Min, 0},
		{"remainder", Remainder, pyMod, 1e-7},
		{"logaddexp", LogAddExp, func(x, y float64) float64 { return math.Max(x, y) + math.Log1p(math.Exp(-math.Abs(x-y))) }, 2e-6},
	}
	onMLX(t, func() {
		x, y := f32(a, len(a)), f32(b, len(b))
		for _, c := range cases {
			want := make([]float64, len(a))
			for i := range a {
				want[i] = c.ref(float64(a[i]), float64(b[i]))
			}
			nearAll(t, c.name, c.op(x, y).Float32s(), want, 1e-6, c.rel)
		}
		// power with positive bases (and an integer exponent on a negative base).
		pa := []float32{2, 9, 0.5, 10, -2}
		pb := []float32{10, 0.5, 3, -2, 3}
		want := []float64{1024, 3, 0.125, 0.01, -8}
		nearAll(t, "power", Power(f32(pa, 5), f32(pb, 5)).Float32s(), want, 1e-7, 2e-6)

		// broadcasting: [2,3] + [3] and [2,1] * [3].
		m := f32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
		r := Add(m, f32([]float32{10, 20, 30}, 3))
		eqShape(t, "broadcast add", r.Shape(), []int{2, 3})
		closeTo(t, "broadcast add", r.Float32s(), []float32{11, 22, 33, 14, 25, 36}, 0)
		r = Multiply(f32([]float32{1, 2}, 2, 1), f32([]float32{1, 10, 100}, 3))
		closeTo(t, "outer product by broadcasting", r.Float32s(), []float32{1, 10, 100, 2, 20, 200}, 0)
		// A scalar operand.
		closeTo(t, "scalar sub", Subtract(m, Scalar(1, Float32)).Float32s(), []float32{0, 1, 2, 3, 4, 5}, 0)

		// integer arithmetic stays integer.
		ia, ib := i32([]int32{7, -9, 100}, 3), i32([]int32{2, 4, -3}, 3)
		s := Add(ia, ib)
		if s.Dtype() != Int32 {
			t.Errorf("int32 + int32 is %v", s.Dtype())
		}
		eqSlice(t, "int add", ToSlice[int32](s), []int32{9, -5, 97})
		eqSlice(t, "int mul", ToSlice[int32](Multiply(ia, ib)), []int32{14, -36, -300})
		eqSlice(t, "int remainder", ToSlice[int32](Remainder(ia, ib)), []int32{1, 3, -2})
	})
}

func TestCompareLogicalWhere(t *testing.T) {
	onMLX(t, func() {
		a := f32([]float32{1, 2, 3, 4}, 4)
		b := f32([]float32{4, 2, 1, 4}, 4)
		cases := []struct {
			name string
			op   func(x, y *Array) *Array
			want []bool
		}{
			{"equal", Equal, []bool{false, true, false, true}},
			{"not_equal", NotEqual, []bool{true, false, true, false}},
			{"greater", Greater, []bool{false, false, true, false}},
			{"greater_equal", GreaterEqual, []bool{false, true, true, true}},
			{"less", Less, []bool{true, false, false, false}},
			{"less_equal", LessEqual, []bool{true, true, false, true}},
		}
		for _, c := range cases {
			r := c.op(a, b)
			if r.Dtype() != Bool {
				t.Errorf("%s dtype %v", c.name, r.Dtype())
			}
			eqSlice(t, c.name, ToSlice[bool](r), c.want)
		}
		p := FromSlice([]bool{true, true, false, false}, 4)
		q := FromSlice([]bool{true, false, true, false}, 4)
		eqSlice(t, "logical_and", ToSlice[bool](LogicalAnd(p, q)), []bool{true, false, false, false})
		eqSlice(t, "logical_or", ToSlice[bool](LogicalOr(p, q)), []bool{true, true, true, false})

		closeTo(t, "where", Where(p, a, b).Float32s(), []float32{1, 2, 1, 4}, 0)
		// Broadcast: a [2,2] condition with scalar branches.
		c2 := FromSlice([]bool{true, false, false, true}, 2, 2)
		w := Where(c2, Scalar(1, Float32), Scalar(-1, Float32))
		eqShape(t, "where broadcast", w.Shape(), []int{2, 2})
		closeTo(t, "where broadcast", w.Float32s(), []float32{1, -1, -1, 1}, 0)
		// Masking with -inf, the attention idiom.
		ninf := float32(math.Inf(-1))
		closeTo(t, "where -inf", Where(Greater(a, Scalar(2, Float32)), Scalar(math.Inf(-1), Float32), a).Float32s(), []float32{1, 2, ninf, ninf}, 0)
	})
}

func TestReductions(t *testing.T) {
	onMLX(t, func() {
		m := f32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
		cases := []struct {
			name  string
			op    func(*Array, []int, bool) *Array
			axes  []int
			keep  bool
			shape []int
			want  []float32
		}{
			{"sum all", Sum, nil, false, []int{}, []float32{21}},
			{"sum 0", Sum, []int{0}, false, []int{3}, []float32{5, 7, 9}},
			{"sum 1 keepdims", Sum, []int{1}, true, []int{2, 1}, []float32{6, 15}},
			{"sum -1", Sum, []int{-1}, false, []int{2}, []float32{6, 15}},
			{"sum all keepdims", Sum, nil, true, []int{1, 1}, []float32{21}},
			{"mean 1", Mean, []int{1}, false, []int{2}, []float32{2, 5}},
			{"mean all", Mean, nil, false, []int{}, []float32{3.5}},
			{"max 0", Max, []int{0}, false, []int{3}, []float32{4, 5, 6}},
			{"min 1", Min, []int{1}, false, []int{2}, []float32{1, 4}},
			{"prod all", Prod, nil, false, []int{}, []float32{720}},
			{"prod 0", Prod, []int{0}, false, []int{3}, []float32{4, 10, 18}},
		}
		for _, c := range cases {
			r := c.op(m, c.axes, c.keep)
			eqShape(t, c.name, r.Shape(), c.shape)
			closeTo(t, c.name, r.Float32s(), c.want, 1e-6)
		}
		b := FromSlice([]bool{true, false, true, true, true, true}, 2, 3)
		eqSlice(t, "all 1", ToSlice[bool](All(b, []int{1}, false)), []bool{false, true})
		eqSlice(t, "any 0", ToSlice[bool](Any(b, []int{0}, false)), []bool{true, true, true})
		eqSlice(t, "all", ToSlice[bool](All(b, nil, false)), []bool{false})
		if v := Sum(m, nil, false).Float(); v != 21 {
			t.Errorf("sum item = %v", v)
		}
	})
}

func TestMatmul(t *testing.T) {
	onMLX(t, func() {
		a := f32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
		b := f32([]float32{7, 8, 9, 10, 11, 12}, 3, 2)
		// [1 2 3]·[7 9 11] = 58, [1 2 3]·[8 10 12] = 64, [4 5 6]·[7 9 11] = 139, [4 5 6]·[8 10 12] = 154
		r := Matmul(a, b)
		eqShape(t, "matmul", r.Shape(), []int{2, 2})
		closeTo(t, "matmul", r.Float32s(), []float32{58, 64, 139, 154}, 0)
		// Batched with broadcasting: [2,1,3] @ [3,2] -> [2,1,2].
		r = Matmul(f32([]float32{1, 0, 0, 0, 0, 1}, 2, 1, 3), b)
		eqShape(t, "batched matmul", r.Shape(), []int{2, 1, 2})
		closeTo(t, "batched matmul", r.Float32s(), []float32{7, 8, 11, 12}, 0)
		// Vector-matrix products.
		r = Matmul(f32([]float32{1, 1, 1}, 3), b)
		eqShape(t, "vecmat", r.Shape(), []int{2})
		closeTo(t, "vecmat", r.Float32s(), []float32{27, 30}, 0)

		// addmm: beta·c + alpha·(a@b).
		c := f32([]float32{1, 2, 3, 4}, 2, 2)
		cases := []struct{ alpha, beta float32 }{{1, 1}, {2, 0.5}, {0.5, 0}, {0, 3}, {-1, 2}}
		ab := []float32{58, 64, 139, 154}
		cv := []float32{1, 2, 3, 4}
		for _, k := range cases {
			want := make([]float32, 4)
			for i := range want {
				want[i] = k.beta*cv[i] + k.alpha*ab[i]
			}
			closeTo(t, "addmm", AddMM(c, a, b, k.alpha, k.beta).Float32s(), want, 1e-4)
		}
		// c broadcasts (a bias row).
		closeTo(t, "addmm bias row", AddMM(f32([]float32{100, 200}, 2), a, b, 1, 1).Float32s(), []float32{158, 264, 239, 354}, 0)
	})
}

func TestShapeOps(t *testing.T) {
	onMLX(t, func() {
		x := f32(seq(24), 2, 3, 4) // x[i][j][k] = 12i + 4j + k
		m := f32(seq(6), 2, 3)

		r := Reshape(m, 3, 2)
		eqShape(t, "reshape", r.Shape(), []int{3, 2})
		closeTo(t, "reshape", r.Float32s(), seq(6), 0)
		eqShape(t, "reshape -1", Reshape(x, -1, 4).Shape(), []int{6, 4})

		r = Transpose(m)
		eqShape(t, "transpose", r.Shape(), []int{3, 2})
		closeTo(t, "transpose", r.Float32s(), []float32{0, 3, 1, 4, 2, 5}, 0)

		r = Transpose(x, 2, 0, 1) // r[k][i][j] = x[i][j][k]
		eqShape(t, "transpose perm", r.Shape(), []int{4, 2, 3})
		got := r.Float32s()
		r2 := SwapAxes(x, 0, 2) // r2[k][j][i] = x[i][j][k]
		eqShape(t, "swapaxes", r2.Shape(), []int{4, 3, 2})
		got2 := r2.Float32s()
		for i := 0; i < 2; i++ {
			for j := 0; j < 3; j++ {
				for k := 0; k < 4; k++ {
					v := float32(12*i + 4*j + k)
					if g := got[k*6+i*3+j]; g != v {
						t.Errorf("transpose[%d][%d][%d] = %v, want %v", k, i, j, g, v)
					}
					if g := got2[k*6+j*2+i]; g != v {
						t.Errorf("swapaxes[%d][%d][%d] = %v, want %v", k, j, i, g, v)
					}
				}
			}
		}

		e := ExpandDims(m, 0, 2)
		eqShape(t, "expand_dims", e.Shape(), []int{1, 2, 1, 3})
		eqShape(t, "expand_dims -1", ExpandDims(m, -1).Shape(), []int{2, 3, 1})
		eqShape(t, "squeeze all", Squeeze(e).Shape(), []int{2, 3})
		eqShape(t, "squeeze one", Squeeze(e, 2).Shape(), []int{1, 2, 3})
		closeTo(t, "squeeze values", Squeeze(e).Float32s(), seq(6), 0)

		b := BroadcastTo(f32([]float32{1, 2, 3}, 3), 2, 3)
		eqShape(t, "broadcast_to", b.Shape(), []int{2, 3})
		closeTo(t, "broadcast_to", b.Float32s(), []float32{1, 2, 3, 1, 2, 3}, 0)
		b = BroadcastTo(f32([]float32{1, 2}, 2, 1), 2, 3)
		closeTo(t, "broadcast_to column", b.Float32s(), []float32{1, 1, 1, 2, 2, 2}, 0)

		eqShape(t, "flatten 1..2", Flatten(x, 1, 2).Shape(), []int{2, 12})
		eqShape(t, "flatten all", Flatten(x, 0, -1).Shape(), []int{24})
		eqShape(t, "flatten 0..1", Flatten(x, 0, 1).Shape(), []int{6, 4})
		closeTo(t, "flatten values", Flatten(Transpose(m), 0, -1).Float32s(), []float32{0, 3, 1, 4, 2, 5}, 0)

		// Contiguous keeps values, and a view reads back in logical order.
		closeTo(t, "contiguous", Contiguous(Transpose(m)).Float32s(), []float32{0, 3, 1, 4, 2, 5}, 0)

		// Metadata.
		if x.Ndim() != 3 || x.Size() != 24 || x.NBytes() != 96 || x.Dim(-1) != 4 || x.Dim(1) != 3 {
			t.Errorf("metadata: ndim %d size %d nbytes %d dims %d %d", x.Ndim(), x.Size(), x.NBytes(), x.Dim(-1), x.Dim(1))
		}
	})
}

func TestConcatStackSplit(t *testing.T) {
	onMLX(t, func() {
		a := f32([]float32{1, 2, 3, 4}, 2, 2)
		b := f32([]float32{5, 6}, 2, 1)
		r := Concatenate([]*Array{a, b}, 1)
		eqShape(t, "concat 1", r.Shape(), []int{2, 3})
		closeTo(t, "concat 1", r.Float32s(), []float32{1, 2, 5, 3, 4, 6}, 0)
		r = Concatenate([]*Array{a, Reshape(b, 1, 2)}, 0)
		eqShape(t, "concat 0", r.Shape(), []int{3, 2})
		closeTo(t, "concat 0", r.Float32s(), []float32{1, 2, 3, 4, 5, 6}, 0)
		r = Concatenate([]*Array{a, b, b}, -1)
		closeTo(t, "concat -1 three", r.Float32s(), []float32{1, 2, 5, 5, 3, 4, 6, 6}, 0)

		u, v := f32([]float32{1, 2, 3}, 3), f32([]float32{4, 5, 6}, 3)
		s := Stack([]*Array{u, v}, 0)
		eqShape(t, "stack 0", s.Shape(), []int{2, 3})
		closeTo(t, "stack 0", s.Float32s(), []float32{1, 2, 3, 4, 5, 6}, 0)
		s = Stack([]*Array{u, v}, 1)
		eqShape(t, "stack 1", s.Shape(), []int{3, 2})
		closeTo(t, "stack 1", s.Float32s(), []float32{1, 4, 2, 5, 3, 6}, 0)

		parts := Split(f32(seq(6), 6), []int{2, 5}, 0)
		if len(parts) != 3 {
			t.Errorf("split: %d parts", len(parts))
			return
		}
		closeTo(t, "split 0", parts[0].Float32s(), []float32{0, 1}, 0)
		closeTo(t, "split 1", parts[1].Float32s(), []float32{2, 3, 4}, 0)
		closeTo(t, "split 2", parts[2].Float32s(), []float32{5}, 0)
		parts = Split(f32(seq(12), 3, 4), []int{1}, 1)
		eqShape(t, "split axis 1 a", parts[0].Shape(), []int{3, 1})
		eqShape(t, "split axis 1 b", parts[1].Shape(), []int{3, 3})
		closeTo(t, "split axis 1 b", parts[1].Float32s(), []float32{1, 2, 3, 5, 6, 7, 9, 10, 11}, 0)
	})
}

func TestSlice(t *testing.T) {
	onMLX(t, func() {
		a := f32(seq(20), 4, 5) // a[i][j] = 5i + j
		cases := []struct {
			name  string
			got   *Array
			shape []int
			want  []float32
		}{
			{"slice", Slice(a, []int{1, 2}, []int{3, 5}), []int{2, 3}, []float32{7, 8, 9, 12, 13, 14}},
			{"slice full", Slice(a, []int{0, 0}, []int{4, 5}), []int{4, 5}, seq(20)},
			{"slice empty", Slice(a, []int{2, 0}, []int{2, 5}), []int{0, 5}, []float32{}},
			{"strided", SliceStrided(a, []int{0, 0}, []int{4, 5}, []int{2, 2}), []int{2, 3}, []float32{0, 2, 4, 10, 12, 14}},
			{"strided offset", SliceStrided(a, []int{1, 1}, []int{4, 5}, []int{2, 3}), []int{2, 2}, []float32{6, 9, 16, 19}},
			{"slice axis 1", SliceAxis(a, 1, 1, 3), []int{4, 2}, []float32{1, 2, 6, 7, 11, 12, 16, 17}},
			{"slice axis -2", SliceAxis(a, -2, 2, 4), []int{2, 5}, []float32{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}},
			{"slice axis 0 one row", SliceAxis(a, 0, 3, 4), []int{1, 5}, []float32{15, 16, 17, 18, 19}},
		}
		for _, c := range cases {
			eqShape(t, c.name, c.got.Shape(), c.shape)
			closeTo(t, c.name, c.got.Float32s(), c.want, 0)
		}
	})
}

func TestSliceUpdate(t *testing.T) {
	onMLX(t, func() {
		src := Zeros([]int{3, 4}, Float32)
		upd := f32([]float32{1, 2, 3, 4}, 2, 2)
		r := SliceUpdate(src, upd, []int{1, 1}, []int{3, 3})
		closeTo(t, "slice_update", r.Float32s(), []float32{
			0, 0, 0, 0,
			0, 1, 2, 0,
			0, 3, 4, 0}, 0)
		// The source is unchanged (functional update).
		closeTo(t, "slice_update source", src.Float32s(), make([]float32, 12), 0)
		// A broadcast update into a column.
		r = SliceUpdate(src, Scalar(9, Float32), []int{0, 3}, []int{3, 4})
		closeTo(t, "slice_update broadcast", r.Float32s(), []float32{0, 0, 0, 9, 0, 0, 0, 9, 0, 0, 0, 9}, 0)
	})
}

// Offsets computed on the device (arange + a scalar): the slice position is never known on
// the host while the graph is built.
func TestSliceDynamic(t *testing.T) {
	onMLX(t, func() {
		a := f32(seq(20), 4, 5) // a[i][j] = 5i + j
		one := ScalarInt(1, Int32)

		// One axis, 0-d offset 1+1 = 2: a[:, 2:4].
		start := Add(one, one)
		r := SliceDynamic(a, start, []int{1}, []int{4, 2})
		eqShape(t, "dynamic slice axis 1", r.Shape(), []int{4, 2})
		closeTo(t, "dynamic slice axis 1", r.Float32s(), []float32{2, 3, 7, 8, 12, 13, 17, 18}, 0)

		// Two axes, offsets arange(2) + 1 = [1, 2]: a[1:3, 2:5].
		start2 := Add(Arange(0, 2, 1, Int32), one)
		r = SliceDynamic(a, start2, []int{0, 1}, []int{2, 3})
		eqShape(t, "dynamic slice 2 axes", r.Shape(), []int{2, 3})
		closeTo(t, "dynamic slice 2 axes", r.Float32s(), []float32{7, 8, 9, 12, 13, 14}, 0)

		// Update at [1, 2] from the same device offsets.
		upd := f32([]float32{-1, -2, -3, -4, -5, -6}, 2, 3)
		r = SliceUpdateDynamic(Zeros([]int{4, 5}, Float32), upd, start2, []int{0, 1})
		closeTo(t, "dynamic slice_update", r.Float32s(), []float32{
			0, 0, 0, 0, 0,
			0, 0, -1, -2, -3,
			0, 0, -4, -5, -6,
			0, 0, 0, 0, 0}, 0)

		// The KV-cache idiom: cache [B=1, H=2, L=8, D=3]; write 2 new steps at offset 5 (a
		// device scalar), then read back the window [0, 7).
		cache := Zeros([]int{1, 2, 8, 3}, Float32)
		step := Add(Reshape(f32(seq(12), 1, 2, 2, 3), 1, 2, 2, 3), Scalar(1, Float32)) // values 1..12
		off := Add(ScalarInt(4, Int32), one)
		cache = SliceUpdateDynamic(cache, step, off, []int{2})
		got := cache.Float32s()
		for h := 0; h < 2; h++ {
			for l := 0; l < 8; l++ {
				for d := 0; d < 3; d++ {
					want := float32(0)
					if l == 5 || l == 6 {
						want = float32(h*6+(l-5)*3+d) + 1
					}
					if g := got[h*24+l*3+d]; g != want {
						t.Errorf("kv cache [0,%d,%d,%d] = %v, want %v", h, l, d, g, want)
					}
				}
			}
		}
		win := SliceDynamic(cache, Arange(5, 6, 1, Int32), []int{2}, []int{1, 2, 2, 3})
		closeTo(t, "kv window", win.Float32s(), Add(f32(seq(12), 12), Scalar(1, Float32)).Float32s(), 0)
	})
}

func TestTakeAndPut(t *testing.T) {
	onMLX(t, func() {
		a := f32(seq(20), 4, 5) // a[i][j] = 5i + j
		r := Take(a, i32([]int32{2, 0}, 2), 0)
		eqShape(t, "take rows", r.Shape(), []int{2, 5})
		closeTo(t, "take rows", r.Float32s(), []float32{10, 11, 12, 13, 14, 0, 1, 2, 3, 4}, 0)
		r = Take(a, i32([]int32{4, 1}, 2), 1)
		closeTo(t, "take cols", r.Float32s(), []float32{4, 1, 9, 6, 14, 11, 19, 16}, 0)
		r = Take(a, i32([]int32{3, 3, 1, 0}, 2, 2), 0) // embedding lookup with a [2,2] index
		eqShape(t, "take 2-d index", r.Shape(), []int{2, 2, 5})
		closeTo(t, "take 2-d index", SliceAxis(r, 2, 0, 1).Float32s(), []float32{15, 15, 5, 0}, 0)
		r = Take(a, FromSlice([]uint32{1}, 1), -1)
		closeTo(t, "take uint32 index, axis -1", r.Float32s(), []float32{1, 6, 11, 16}, 0)
		r = TakeFlat(a, i32([]int32{0, 7, 19}, 3))
		closeTo(t, "take flat", r.Float32s(), []float32{0, 7, 19}, 0)

		v := f32([]float32{10, 30, 20, 60, 40, 50}, 2, 3)
		r = TakeAlongAxis(v, i32([]int32{1, 0}, 2, 1), 1)
		eqShape(t, "take_along_axis", r.Shape(), []int{2, 1})
		closeTo(t, "take_along_axis", r.Float32s(), []float32{30, 60}, 0)
		r = TakeAlongAxis(v, i32([]int32{2, 0, 1, 1}, 2, 2), 1)
		closeTo(t, "take_along_axis 2", r.Float32s(), []float32{20, 10, 40, 40}, 0)

		r = PutAlongAxis(Zeros([]int{2, 3}, Float32), i32([]int32{2, 0}, 2, 1), f32([]float32{7, 8}, 2, 1), 1)
		closeTo(t, "put_along_axis", r.Float32s(), []float32{0, 0, 7, 8, 0, 0}, 0)
		r = PutAlongAxis(Zeros([]int{2, 3}, Float32), i32([]int32{1, 0, 1}, 1, 3), f32([]float32{5, 6, 7}, 1, 3), 0)
		closeTo(t, "put_along_axis axis 0", r.Float32s(), []float32{0, 6, 0, 5, 0, 7}, 0)
	})
}

func TestArgmaxSort(t *testing.T) {
	onMLX(t, func() {
		m := f32([]float32{1, 5, 3, 9, 2, 8}, 2, 3)
		r := Argmax(m, 1, false)
		if r.Dtype() != Uint32 {
			t.Errorf("argmax dtype %v, want uint32", r.Dtype())
		}
		eqSlice(t, "argmax 1", ToSlice[uint32](r), []uint32{1, 0})
		eqSlice(t, "argmax 0", ToSlice[uint32](Argmax(m, 0, false)), []uint32{1, 0, 1})
		eqShape(t, "argmax keepdims", Argmax(m, -1, true).Shape(), []int{2, 1})
		if v := Argmax(f32([]float32{-3, -1, -2}, 3), 0, false).Int(); v != 1 {
			t.Errorf("argmax of negatives = %d", v)
		}

		vals := []float32{5, 1, 4, 2, 3, 9, 0, 7}
		sorted := append([]float32(nil), vals...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		x := f32(vals, len(vals))
		for _, kth := range []int{0, 3, 7, -2} {
			idx := ToSlice[uint32](Argpartition(x, kth, 0))
			k := kth
			if k < 0 {
				k += len(vals)
			}
			seen := map[uint32]bool{}
			for _, i := range idx {
				seen[i] = true
			}
			if len(idx) != len(vals) || len(seen) != len(vals) {
				t.Errorf("argpartition kth=%d: %v is not a permutation", kth, idx)
				continue
			}
			pivot := vals[idx[k]]
			if pivot != sorted[k] {
				t.Errorf("argpartition kth=%d: position holds %v, want %v", kth, pivot, sorted[k])
			}
			for p, i := range idx {
				if (p < k && vals[i] > pivot) || (p > k && vals[i] < pivot) {
					t.Errorf("argpartition kth=%d: %v not partitioned around %v", kth, idx, pivot)
					break
				}
			}
		}

		top := TopK(x, 3, 0).Float32s()
		sort.Slice(top, func(i, j int) bool { return top[i] > top[j] })
		closeTo(t, "topk set", top, []float32{9, 7, 5}, 0)
		// Top-k per row, with the indices from argpartition(-k) as samplers do.
		rows := f32([]float32{0.1, 0.9, 0.3, 0.7, 5, 4, 3, 2}, 2, 4)
		tk := TopK(rows, 2, 1)
		eqShape(t, "topk rows", tk.Shape(), []int{2, 2})
		g := tk.Float32s()
		for r, want := range [][2]float32{{0.9, 0.7}, {5, 4}} {
			s := []float32{g[2*r], g[2*r+1]}
			sort.Slice(s, func(i, j int) bool { return s[i] > s[j] })
			closeTo(t, "topk row", s, want[:], 0)
		}
		ip := SliceAxis(Argpartition(rows, -2, 1), 1, 2, 4)
		gi := ToSlice[uint32](ip)
		if !((gi[0] == 1 && gi[1] == 3) || (gi[0] == 3 && gi[1] == 1)) || !((gi[2] == 0 && gi[3] == 1) || (gi[2] == 1 && gi[3] == 0)) {
			t.Errorf("top-2 indices per row = %v, want {1,3} and {0,1}", gi)
		}

		closeTo(t, "sort", Sort(x, 0).Float32s(), sorted, 0)
		as := ToSlice[uint32](Argsort(f32([]float32{3, 1, 2}, 3), 0))
		eqSlice(t, "argsort", as, []uint32{1, 2, 0})
		s2 := Sort(f32([]float32{3, 1, 2, 0, 5, 4}, 3, 2), 0)
		closeTo(t, "sort axis 0", s2.Float32s(), []float32{2, 0, 3, 1, 5, 4}, 0)
		closeTo(t, "sort axis -1", Sort(f32([]float32{3, 1, 2, 0, 5, 4}, 3, 2), -1).Float32s(), []float32{1, 3, 0, 2, 4, 5}, 0)
	})
}

func softmax64(x []float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, v)
	}
	var s float64
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = math.Exp(v - m)
		s += out[i]
	}
	for i := range out {
		out[i] /= s
	}
	return out
}

func TestSoftmaxLogSumExp(t *testing.T) {
	onMLX(t, func() {
		e1, e2, e3 := math.E, math.E*math.E, math.E*math.E*math.E
		s := e1 + e2 + e3
		nearAll(t, "softmax", Softmax(f32([]float32{1, 2, 3}, 3), []int{0}, false).Float32s(), []float64{e1 / s, e2 / s, e3 / s}, 1e-7, 1e-6)

		rows := []float32{0, 0, 0, 0, 1000, 1001, 1002, 1003, -5, 2, float32(math.Inf(-1)), 0.5}
		got := Softmax(f32(rows, 3, 4), []int{-1}, false).Float32s()
		var want []float64
		for r := 0; r < 3; r++ {
			want = append(want, softmax64(to64(rows[4*r:4*r+4]))...)
		}
		nearAll(t, "softmax rows (large, -inf)", got, want, 1e-7, 1e-6)
		nearAll(t, "softmax all axes", Softmax(f32([]float32{1, 2, 3, 4}, 2, 2), []int{0, 1}, false).Float32s(), softmax64([]float64{1, 2, 3, 4}), 1e-7, 1e-6)
		// precise on bf16 stays bf16 and is close to the float result.
		bf := AsType(f32([]float32{1, 2, 3}, 3), BFloat16)
		r := Softmax(bf, []int{0}, true)
		if r.Dtype() != BFloat16 {
			t.Errorf("precise softmax dtype %v", r.Dtype())
		}
		nearAll(t, "softmax bf16 precise", r.Float32s(), []float64{e1 / s, e2 / s, e3 / s}, 0, 1.0/128)

		nearAll(t, "logsumexp", LogSumExp(f32([]float32{1, 2, 3}, 3), nil, false).Float32s(), []float64{math.Log(s)}, 0, 1e-6)
		l := LogSumExp(f32([]float32{1000, 1000, -1000, -1000}, 2, 2), []int{1}, true)
		eqShape(t, "logsumexp keepdims", l.Shape(), []int{2, 1})
		nearAll(t, "logsumexp stable", l.Float32s(), []float64{1000 + math.Ln2, -1000 + math.Ln2}, 0, 1e-6)
	})
}

func TestCumsumArangeFull(t *testing.T) {
	onMLX(t, func() {
		x := f32([]float32{1, 2, 3, 4}, 4)
		cases := []struct {
			reverse, inclusive bool
			want               []float32
		}{
			{false, true, []float32{1, 3, 6, 10}},
			{false, false, []float32{0, 1, 3, 6}},
			{true, true, []float32{10, 9, 7, 4}},
			{true, false, []float32{9, 7, 4, 0}},
		}
		for _, c := range cases {
			closeTo(t, "cumsum", Cumsum(x, 0, c.reverse, c.inclusive).Float32s(), c.want, 0)
		}
		closeTo(t, "cumsum axis 1", Cumsum(f32(seq(6), 2, 3), 1, false, true).Float32s(), []float32{0, 1, 3, 3, 7, 12}, 0)
		eqSlice(t, "cumsum int", ToSlice[int32](Cumsum(i32([]int32{5, -2, 7}, 3), 0, false, true)), []int32{5, 3, 10})

		ar := Arange(0, 5, 1, Int32)
		if ar.Dtype() != Int32 {
			t.Errorf("arange dtype %v", ar.Dtype())
		}
		eqSlice(t, "arange int", ToSlice[int32](ar), []int32{0, 1, 2, 3, 4})
		closeTo(t, "arange float", Arange(0, 1, 0.25, Float32).Float32s(), []float32{0, 0.25, 0.5, 0.75}, 0)
		closeTo(t, "arange down", Arange(5, 0, -2, Float32).Float32s(), []float32{5, 3, 1}, 0)
		eqShape(t, "arange empty", Arange(3, 3, 1, Int32).Shape(), []int{0})
		eqSlice(t, "arange uint32", ToSlice[uint32](Arange(2, 5, 1, Uint32)), []uint32{2, 3, 4})

		f := Full([]int{2, 2}, Scalar(3.5, Float32), Float32)
		eqShape(t, "full", f.Shape(), []int{2, 2})
		closeTo(t, "full", f.Float32s(), []float32{3.5, 3.5, 3.5, 3.5}, 0)
		eqSlice(t, "full int", ToSlice[int32](Full([]int{3}, ScalarInt(-7, Int32), Int32)), []int32{-7, -7, -7})
		z := Zeros([]int{2, 3}, BFloat16)
		if z.Dtype() != BFloat16 || z.NBytes() != 12 {
			t.Errorf("zeros bf16: %v, %d bytes", z.Dtype(), z.NBytes())
		}
		eqSlice(t, "zeros bf16 bytes", z.Bytes(), make([]byte, 12))
	})
}

func TestAsTypeAndView(t *testing.T) {
	onMLX(t, func() {
		// float -> int truncates toward zero.
		in := []float32{1.7, -1.7, 2.5, -0.5, 3.999, -3.999, 0, 100.2}
		eqSlice(t, "f32->i32", ToSlice[int32](AsType(f32(in, len(in)), Int32)), []int32{1, -1, 2, 0, 3, -3, 0, 100})
		eqSlice(t, "f32->i64", ToSlice[int64](AsType(f32(in, len(in)), Int64)), []int64{1, -1, 2, 0, 3, -3, 0, 100})
		eqSlice(t, "f32->u8", ToSlice[uint8](AsType(f32([]float32{0, 1.9, 255}, 3), Uint8)), []uint8{0, 1, 255})
		// int -> float, and to bool (nonzero is true).
		closeTo(t, "i32->f32", AsType(i32([]int32{-3, 0, 16777216}, 3), Float32).Float32s(), []float32{-3, 0, 16777216}, 0)
		eqSlice(t, "f32->bool", ToSlice[bool](AsType(f32([]float32{0, -0.5, 2}, 3), Bool)), []bool{false, true, true})
		eqSlice(t, "bool->i32", ToSlice[int32](AsType(FromSlice([]bool{true, false}, 2), Int32)), []int32{1, 0})

		// bf16 rounding: 7 stored mantissa bits, so 1 + 2^-7 is the next value after 1.
		// 1+2^-8 is a tie -> even (1.0); 1+3·2^-8 is a tie -> even (1+2^-6); above a tie rounds up.
		p := math.Pow
		vals := []float32{1, float32(1 + p(2, -8)), float32(1 + 3*p(2, -8)), float32(1 + p(2, -8) + p(2, -16)), -2, float32(p(2, -130))}
		bf := AsType(f32(vals, len(vals)), BFloat16)
		if bf.Dtype() != BFloat16 {
			t.Errorf("astype bf16 dtype %v", bf.Dtype())
		}
		eqSlice(t, "f32->bf16 bits", ToSlice[uint16](View(bf, Uint16)), []uint16{0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000, 0x0008})
		nearAll(t, "bf16->f32", bf.Float32s(), []float64{1, 1, 1 + p(2, -6), 1 + p(2, -7), -2, p(2, -130)}, 0, 0)
		// f16 rounding: 10 mantissa bits.
		hf := AsType(f32([]float32{1, float32(1 + p(2, -11)), float32(1 + 3*p(2, -11)), 65504, 65520, float32(p(2, -24))}, 6), Float16)
		eqSlice(t, "f32->f16 bits", ToSlice[uint16](View(hf, Uint16)), []uint16{0x3C00, 0x3C00, 0x3C02, 0x7BFF, 0x7C00, 0x0001})

		// View reinterprets bits.
		eqSlice(t, "view f32 as u32", ToSlice[uint32](View(f32([]float32{1, -2}, 2), Uint32)), []uint32{0x3F800000, 0xC0000000})
		closeTo(t, "view u32 as f32", View(FromSlice([]uint32{0x40490FDB}, 1), Float32).Float32s(), []float32{math.Pi}, 0)
	})
}

// conv1dRef is a direct channels-last conv1d (cross-correlation, as MLX computes it):
// in [N, L, Cin], w [Cout, K, Cin/groups].
func conv1dRef(in []float32, n, l, cin int, w []float32, cout, k, stride, pad, dil, groups int) ([]float64, int) {
	cpg, opg := cin/groups, cout/groups
	lout := (l+2*pad-dil*(k-1)-1)/stride + 1
	out := make([]float64, n*lout*cout)
	for b := 0; b < n; b++ {
		for t := 0; t < lout; t++ {
			for o := 0; o < cout; o++ {
				g := o / opg
				var s float64
				for kk := 0; kk < k; kk++ {
					pos := t*stride - pad + kk*dil
					if pos < 0 || pos >= l {
						continue
					}
					for c := 0; c < cpg; c++ {
						s += float64(in[(b*l+pos)*cin+g*cpg+c]) * float64(w[(o*k+kk)*cpg+c])
					}
				}
				out[(b*lout+t)*cout+o] = s
			}
		}
	}
	return out, lout
}

func TestConv1D(t *testing.T) {
	onMLX(t, func() {
		x := f32([]float32{1, 2, 3, 4, 5}, 1, 5, 1)
		w := f32([]float32{1, 0, -1}, 1, 3, 1)
		// out[i] = x[i] - x[i+2]
		r := Conv1D(x, w, 1, 0, 1, 1)
		eqShape(t, "conv1d", r.Shape(), []int{1, 3, 1})
		closeTo(t, "conv1d", r.Float32s(), []float32{-2, -2, -2}, 0)
		// padding 1: [0 1 2 3 4 5 0]
		closeTo(t, "conv1d pad", Conv1D(x, w, 1, 1, 1, 1).Float32s(), []float32{-2, -2, -2, -2, 4}, 0)
		closeTo(t, "conv1d pad stride 2", Conv1D(x, w, 2, 1, 1, 1).Float32s(), []float32{-2, -2, 4}, 0)
		// dilation 2: out[i] = x[i] - x[i+4]
		closeTo(t, "conv1d dilation", Conv1D(x, w, 1, 0, 2, 1).Float32s(), []float32{-4}, 0)
		// Two input channels summed: channels-last [1, 3, 2] = rows (1,10) (2,20) (3,30);
		// weight [1, 2, 2] = [[1, 0], [0, 1]]: out[i] = x[i].c0 + x[i+1].c1
		x2 := f32([]float32{1, 10, 2, 20, 3, 30}, 1, 3, 2)
		closeTo(t, "conv1d 2 channels", Conv1D(x2, f32([]float32{1, 0, 0, 1}, 1, 2, 2), 1, 0, 1, 1).Float32s(), []float32{21, 32}, 0)
		// Depthwise (groups = channels), the Qwen3.5 short conv: weight [C, K, 1].
		// channel 0 kernel [1, 1], channel 1 kernel [1, -1]
		dw := Conv1D(x2, f32([]float32{1, 1, 1, -1}, 2, 2, 1), 1, 0, 1, 2)
		eqShape(t, "depthwise", dw.Shape(), []int{1, 2, 2})
		closeTo(t, "depthwise", dw.Float32s(), []float32{3, -10, 5, -10}, 0)

		// Random cases against the direct loop.
		g := lcg(7)
		for _, c := range []struct{ n, l, cin, cout, k, stride, pad, dil, groups int }{
			{2, 9, 4, 6, 3, 1, 0, 1, 1},
			{1, 11, 6, 6, 4, 1, 3, 1, 6},
			{2, 10, 4, 8, 3, 2, 1, 1, 2},
			{1, 12, 3, 2, 2, 1, 2, 3, 1},
		} {
			in := g.floats(c.n*c.l*c.cin, -1, 1)
			wt := g.floats(c.cout*c.k*c.cin/c.groups, -1, 1)
			want, lout := conv1dRef(in, c.n, c.l, c.cin, wt, c.cout, c.k, c.stride, c.pad, c.dil, c.groups)
			r := Conv1D(f32(in, c.n, c.l, c.cin), f32(wt, c.cout, c.k, c.cin/c.groups), c.stride, c.pad, c.dil, c.groups)
			eqShape(t, "conv1d random", r.Shape(), []int{c.n, lout, c.cout})
			nearAll(t, "conv1d random", r.Float32s(), want, 1e-5, 1e-5)
		}
	})
}

func TestTril(t *testing.T) {
	onMLX(t, func() {
		ones := Full([]int{3, 3}, Scalar(1, Float32), Float32)
		closeTo(t, "tril 0", Tril(ones, 0).Float32s(), []float32{1, 0, 0, 1, 1, 0, 1, 1, 1}, 0)
		closeTo(t, "tril -1", Tril(ones, -1).Float32s(), []float32{0, 0, 0, 1, 0, 0, 1, 1, 0}, 0)
		closeTo(t, "tril 1", Tril(ones, 1).Float32s(), []float32{1, 1, 0, 1, 1, 1, 1, 1, 1}, 0)
		closeTo(t, "tril rect", Tril(Full([]int{2, 4}, Scalar(1, Float32), Float32), 2).Float32s(), []float32{1, 1, 1, 0, 1, 1, 1, 1}, 0)
	})
}

func TestScalarsAndItems(t *testing.T) {
	onMLX(t, func() {
		if v := Scalar(2.5, Float32).Float(); v != 2.5 {
			t.Errorf("Scalar(2.5).Float() = %v", v)
		}
		if v := Scalar(3.7, Int32).Int(); v != 3 {
			t.Errorf("Scalar(3.7, int32).Int() = %v", v)
		}
		if v := Scalar(0.1, Float64).Float(); v != 0.1 {
			t.Errorf("Scalar(0.1, float64).Float() = %v, want exactly 0.1", v)
		}
		big := int64(1)<<40 + 1
		if v := ScalarInt(big, Int64).Int(); v != big {
			t.Errorf("ScalarInt(2^40+1, int64).Int() = %v", v)
		}
		if v := ScalarInt(big, Int64).Float(); v != float64(big) {
			t.Errorf("ScalarInt(2^40+1, int64).Float() = %v, want %v", v, float64(big))
		}
		if v := ScalarInt(0xFFFFFFFF, Uint32).Int(); v != 0xFFFFFFFF {
			t.Errorf("ScalarInt(0xFFFFFFFF, uint32).Int() = %v", v)
		}
		if v := ScalarInt(-5, Int8); v.Dtype() != Int8 || v.Int() != -5 {
			t.Errorf("ScalarInt(-5, int8) = %v %v", v, v.Int())
		}
		if v := Scalar(1.5, BFloat16); v.Dtype() != BFloat16 || v.Float() != 1.5 {
			t.Errorf("Scalar(1.5, bf16) = %v %v", v, v.Float())
		}
		wantErr(t, "item of a vector", "elements", func() { f32([]float32{1, 2}, 2).Float() })
		wantErr(t, "ToSlice with the wrong type", "asked for", func() { ToSlice[int32](f32([]float32{1}, 1)) })
	})
}
