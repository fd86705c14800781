package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// The small-M quantized product against MLX's quantized_matmul and an exact reference, on a
// GPU with custom CUDA or Metal kernels, for 4 and 8 bits, groups of 32, 64 and 128, rows
// 1..16, a ragged N, K not a power of two, bfloat16 and float16.
//
// Tolerances. Let S' = Σ_k |x_k|·(|q_k·s| + |b|) per output, the size of the terms either
// computation sums. The kernel's products x·q are exact and summed in float32 before one
// rounding to T: against a float64 reference it must agree within half an ulp of T twice
// over (2⁻⁸·|ref| for bfloat16, 2⁻¹⁰ for float16) plus 2⁻¹⁴·S' for the float32 sums (a few
// hundred group folds at 2⁻²⁴ each, with room for the matrix units' accumulation). MLX's
// kernels may round each dequantized weight to T (q·s, then + b: up to 2⁻⁹·(2|q·s| + |b|)
// for bfloat16) and round y once more: against MLX the bound is 2⁻⁷·S' for bfloat16 and
// 2⁻⁹·S' for float16. A wrong index, group or scale shows as an error of the order of |y|
// over one group, far above both. A row's result does not depend on the other rows, so the
// rows of every call equal the first rows of the 16-row call bit for bit; that call is the
// one checked against the reference, and MLX's kernels are compared for 2 and 16 rows (each
// of their launch shapes is JIT-compiled on CUDA, tens of seconds the first time).
func TestSmallMQuantMatmulMatchesQMM(t *testing.T) {
	if !mlxc.CUDAKernelsAvailable() && !mlxc.MetalKernelsAvailable() {
		t.Skip("needs a GPU with MLX's custom CUDA or Metal kernels; elsewhere MLX's quantized_matmul runs")
	}
	k := settings.Default().Kernels
	k.QMMKernel = settings.On
	var op *SmallMQuantMatmul
	if err := mlxc.Do(func() error { op = NewSmallMQuantMatmul(k); return nil }); err != nil {
		t.Fatal(err)
	}
	if op == nil {
		t.Skip("no GPU device selected (DFLASH_DEVICE): MLX's quantized_matmul runs")
	}
	defer func() { _ = mlxc.Do(func() error { op.Free(); return nil }) }()
	// One subtest per dtype, width and group, so that a run can take a part of the matrix
	// (-run 'TestSmallMQuantMatmulMatchesQMM/bfloat16'): MLX's side JIT-compiles two launch
	// shapes per case on CUDA.
	for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16} {
		for _, bits := range []int{4, 8} {
			for _, gs := range []int{32, 64, 128} {
				t.Run(fmt.Sprintf("%v/%dbit/g%d", dt, bits, gs), func(t *testing.T) {
					err := mlxc.Do(func() error {
						for _, nk := range [][2]int{{1003, 1536}, {4096, 2560}, {2560, 9728}} {
							if err := qmmCase(op, dt, bits, gs, nk[0], nk[1]); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

func qmmCase(op *SmallMQuantMatmul, dt mlxc.Dtype, bits, gs, N, K int) error {
	s := mlxc.NewScope()
	defer s.Close()
	name := fmt.Sprintf("%v %d-bit gs %d N=%d K=%d", dt, bits, gs, N, K)
	seed := uint64(N*31 + K*7 + bits*3 + gs)
	q := mlxc.Quantize(mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(seed)), gs, bits, "affine")
	x16 := mlxc.Normal([]int{16, K}, dt, 0, 1, mlxc.RandomKey(seed+1))
	mlxc.Eval(q.W, q.Scales, q.Biases, x16)
	if !op.Fits(x16, q) {
		return fmt.Errorf("%s: 16 rows do not fit", name)
	}
	y16 := op.Apply(x16, q)
	mlxc.Eval(y16)
	if err := qmmReference(name, x16, q, y16, dt); err != nil {
		return err
	}
	relMLX := 1.0 / 128
	if dt == mlxc.Float16 {
		relMLX = 1.0 / 512
	}
	for _, M := range []int{1, 2, 3, 8, 15, 16} {
		sc := mlxc.NewScope()
		x := mlxc.SliceAxis(x16, 0, 0, M)
		got := op.Apply(x, q)
		if err := sameBits(fmt.Sprintf("%s M=%d against the 16-row call", name, M), got, mlxc.SliceAxis(y16, 0, 0, M)); err != nil {
			sc.Close()
			return err
		}
		// With a leading batch axis, as the model's rows come: the shape is kept.
		got3 := op.Apply(mlxc.Reshape(x, 1, M, K), q)
		if sh := got3.Shape(); len(sh) != 3 || sh[0] != 1 || sh[1] != M || sh[2] != N {
			sc.Close()
			return fmt.Errorf("%s M=%d: [1, M, K] gave shape %v", name, M, sh)
		}
		if err := sameBits(fmt.Sprintf("%s M=%d [1, M, K]", name, M), mlxc.Reshape(got3, M, N), got); err != nil {
			sc.Close()
			return err
		}
		if M != 2 && M != 16 {
			sc.Close()
			continue // MLX's kernels (JIT-compiled per launch shape) for a short and a full block
		}
		want := mlxc.QuantizedMatmul(x, q, true)
		if err := qmmNear(fmt.Sprintf("%s M=%d against quantized_matmul", name, M), got, want, qmmMagnitude(x, q), 0, relMLX); err != nil {
			sc.Close()
			return err
		}
		sc.Close()
	}
	return nil
}

// qmmMagnitude is S' = |x|·(|q·s| + |b|)ᵀ per output, in float32 on the device (the
// bound's scale, not a value compared bit for bit).
func qmmMagnitude(x *mlxc.Array, q mlxc.Quantized) *mlxc.Array {
	N, K := q.W.Dim(0), x.Dim(-1)
	G := K / q.GroupSize
	b := mlxc.Reshape(mlxc.AsType(q.Biases, mlxc.Float32), N, G, 1)
	wq := mlxc.Reshape(mlxc.AsType(mlxc.Dequantize(q, mlxc.Float32), mlxc.Float32), N, G, q.GroupSize)
	qs := mlxc.Abs(mlxc.Subtract(wq, b)) // |q·s|
	terms := mlxc.Reshape(mlxc.Add(qs, mlxc.Abs(b)), N, K)
	return mlxc.Matmul(mlxc.Abs(mlxc.AsType(x, mlxc.Float32)), mlxc.Transpose(terms))
}

// qmmNear checks |got − want| ≤ rel·|want| + relS·S' elementwise.
func qmmNear(what string, got, want, mag *mlxc.Array, rel, relS float64) error {
	if g, w := got.Shape(), want.Shape(); fmt.Sprint(g) != fmt.Sprint(w) || got.Dtype() != want.Dtype() {
		return fmt.Errorf("%s: %v %v, want %v %v", what, got.Dtype(), g, want.Dtype(), w)
	}
	gv, wv := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
	mv := mag.Float32s()
	bad, at, worst := 0, 0, 0.0
	for i := range wv {
		d := math.Abs(float64(gv[i]) - float64(wv[i]))
		tol := rel*math.Abs(float64(wv[i])) + relS*float64(mv[i])
		if d > tol || math.IsNaN(float64(gv[i])) {
			if bad++; d/tol > worst || math.IsNaN(d) {
				at, worst = i, d/tol
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%s: %d of %d elements outside the bound, worst %d: %g, want %g (S' %g)", what, bad, len(wv), at, gv[at], wv[at], mv[at])
	}
	return nil
}

// qmmReference checks y [M, N] against x·dequant(q)ᵀ computed on the host in float64 from
// the packed words, scales and biases, and S' with it.
func qmmReference(what string, x *mlxc.Array, q mlxc.Quantized, y *mlxc.Array, dt mlxc.Dtype) error {
	M, K, N := x.Dim(0), x.Dim(1), q.W.Dim(0)
	G, per := K/q.GroupSize, 32/q.Bits
	words := mlxc.ToSlice[uint32](q.W)
	sc := mlxc.AsType(q.Scales, mlxc.Float32).Float32s()
	bi := mlxc.AsType(q.Biases, mlxc.Float32).Float32s()
	xv := mlxc.AsType(x, mlxc.Float32).Float32s()
	ref := make([]float32, M*N)
	mag := make([]float32, M*N)
	mask := uint32(1)<<q.Bits - 1
	wrow := make([]float64, K)
	prow := make([]float64, K) // |q·s| + |b|
	for n := 0; n < N; n++ {
		for k := 0; k < K; k++ {
			qv := float64(words[n*(K/per)+k/per] >> (uint(k%per) * uint(q.Bits)) & mask)
			s, b := float64(sc[n*G+k/q.GroupSize]), float64(bi[n*G+k/q.GroupSize])
			wrow[k], prow[k] = qv*s+b, math.Abs(qv*s)+math.Abs(b)
		}
		for m := 0; m < M; m++ {
			var r, a float64
			for k, xk := range xv[m*K : (m+1)*K] {
				r += float64(xk) * wrow[k]
				a += math.Abs(float64(xk)) * prow[k]
			}
			ref[m*N+n], mag[m*N+n] = float32(r), float32(a)
		}
	}
	rel := 1.0 / 256
	if dt == mlxc.Float16 {
		rel = 1.0 / 1024
	}
	return qmmNear(what+" against the float64 reference", y, mlxc.AsType(mlxc.FromSlice(ref, M, N), dt),
		mlxc.FromSlice(mag, M, N), rel, 1.0/16384)
}

// Fits takes exactly what the kernel serves, and refuses the rest (CPU: no kernel is made,
// an op value suffices).
func TestSmallMQuantMatmulFits(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		op := &SmallMQuantMatmul{}
		const N, K = 24, 256
		mk := func(dt mlxc.Dtype, gs, bits int) mlxc.Quantized {
			return mlxc.Quantize(mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(uint64(gs+bits))), gs, bits, "affine")
		}
		x := func(dt mlxc.Dtype, shape ...int) *mlxc.Array { return mlxc.Zeros(shape, dt) }
		bf, f16 := mlxc.BFloat16, mlxc.Float16
		q4 := mk(bf, 64, 4)
		edit := func(f func(q *mlxc.Quantized)) mlxc.Quantized { c := q4; f(&c); return c }
		for _, c := range []struct {
			what string
			x    *mlxc.Array
			q    mlxc.Quantized
			want bool
		}{
			{"2 rows", x(bf, 2, K), q4, true},
			{"1 row", x(bf, 1, K), q4, true},
			{"16 rows", x(bf, 16, K), q4, true},
			{"a vector", x(bf, K), q4, true},
			{"[1, 3, K]", x(bf, 1, 3, K), q4, true},
			{"8-bit, groups of 32", x(bf, 4, K), mk(bf, 32, 8), true},
			{"groups of 128, float16", x(f16, 4, K), mk(f16, 128, 4), true},
			{"17 rows", x(bf, 17, K), q4, false},
			{"[2, 9, K]", x(bf, 2, 9, K), q4, false},
			{"float32 x", x(mlxc.Float32, 2, K), mk(mlxc.Float32, 64, 4), false},
			{"x bfloat16, scales float16", x(bf, 2, K), mk(f16, 64, 4), false},
			{"K differs", x(bf, 2, K/2), q4, false},
			{"no biases", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.Biases = nil }), false},
			{"mxfp4 mode", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.Mode = "mxfp4" }), false},
			{"2 bits", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.Bits = 2 }), false},
			{"6 bits", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.Bits = 6 }), false},
			{"groups of 16", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.GroupSize = 16 }), false},
			{"groups of 256", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.GroupSize = 256 }), false},
			{"scales of another shape", x(bf, 2, K), edit(func(q *mlxc.Quantized) { q.Scales = mlxc.Zeros([]int{N, 2}, bf) }), false},
		} {
			if got := op.Fits(c.x, c.q); got != c.want {
				return fmt.Errorf("%s: Fits %v, want %v", c.what, got, c.want)
			}
		}
		var none *SmallMQuantMatmul
		if none.Fits(x(bf, 2, K), q4) {
			return fmt.Errorf("a nil op fits")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A nil op, and an op given operands it does not fit, is MLX's quantized_matmul bit for bit;
// and quantizedProduct with a nil op is too.
func TestSmallMQuantMatmulNilFallsBack(t *testing.T) {
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		q := mlxc.Quantize(mlxc.Normal([]int{40, 256}, mlxc.BFloat16, 0, 0.05, mlxc.RandomKey(5)), 64, 4, "affine")
		for _, rows := range []int{1, 3, 16, 17} {
			x := mlxc.Normal([]int{rows, 256}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(rows)))
			want := mlxc.QuantizedMatmul(x, q, true)
			var none *SmallMQuantMatmul
			if err := sameBits(fmt.Sprintf("nil op, %d rows", rows), none.Apply(x, q), want); err != nil {
				return err
			}
			if err := sameBits(fmt.Sprintf("quantizedProduct, %d rows", rows), quantizedProduct(x, q, nil, nil), want); err != nil {
				return err
			}
		}
		x := mlxc.Normal([]int{17, 256}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(17))
		return sameBits("17 rows through an op", (&SmallMQuantMatmul{}).Apply(x, q), mlxc.QuantizedMatmul(x, q, true))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The launch rule: the most tiles per warp that still give qmmMinBlocks blocks, and warps
// that each take whole groups and at least qmmWarpK of K.
func TestQMMLayout(t *testing.T) {
	for _, c := range []struct{ N, K, gs, tiles, warps int }{
		{1024, 2560, 64, 1, 8}, {2560, 9728, 64, 1, 8}, {4096, 2560, 64, 2, 8}, {9728, 2560, 32, 4, 8},
		{19456, 17408, 128, 4, 8}, {1003, 1536, 128, 1, 4}, {24, 256, 64, 1, 1}, {24, 512, 128, 1, 2}, {8192, 128, 128, 4, 1},
	} {
		tiles, warps := qmmLayout(c.N, c.K, c.gs)
		if tiles != c.tiles || warps != c.warps {
			t.Errorf("N=%d K=%d gs=%d: %d tiles, %d warps; want %d, %d", c.N, c.K, c.gs, tiles, warps, c.tiles, c.warps)
		}
		if warps > c.K/c.gs {
			t.Errorf("N=%d K=%d gs=%d: %d warps for %d groups", c.N, c.K, c.gs, warps, c.K/c.gs)
		}
	}
}
