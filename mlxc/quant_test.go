package mlxc

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// unpackQ reads the affine codes from MLX's packing: each row of k values is stored in
// k·bits/32 uint32 words, value j at bits [(j·bits) mod 32, +bits) of word j·bits/32 (for
// bits that divide 32).
func unpackQ(wq []uint32, rows, k, bits int) []uint32 {
	per := 32 / bits
	words := k / per
	mask := uint32(1)<<bits - 1
	out := make([]uint32, rows*k)
	for r := 0; r < rows; r++ {
		for j := 0; j < k; j++ {
			out[r*k+j] = wq[r*words+j/per] >> (uint(j%per) * uint(bits)) & mask
		}
	}
	return out
}

// quantWeights returns rows×k test weights: mostly uniform in [-2, 2], one row positive only
// (the group does not span zero), one constant row and one zero row.
func quantWeights(g *lcg, rows, k int) []float32 {
	w := g.floats(rows*k, -2, 2)
	for j := 0; j < k; j++ {
		w[1*k+j] = float32(g.float(1, 3))
		w[2*k+j] = 0.75
		w[3*k+j] = 0
	}
	return w
}

// Affine quantization as MLX stores it: per group of groupSize values along the last axis,
// w ≈ q·scale + bias with q in [0, 2^bits − 1]. MLX makes the group's larger-magnitude end
// exact (bias = that end, scale = end / round(end/Δ) with Δ = (max − min)/(2^bits − 1), negative
// when the end is the max). So:
//   - values inside the representable range [bias, bias + (2^bits−1)·scale] are within
//     |scale|/2 (round to nearest);
//   - values outside it (the other end, when the grid falls short) clamp to the range's end;
//   - |scale| ≤ (15/14)·Δ, and the shortfall is at most |scale|, so every error is ≤ |scale|.
//
// The error is therefore not bounded by Δ/2 as for min-max quantization: up to ~2·Δ/2.
func TestQuantizeDequantize(t *testing.T) {
	const rows, k = 8, 256
	g := lcg(21)
	w := quantWeights(&g, rows, k)
	const slack = 1e-5
	onMLX(t, func() {
		wa := f32(w, rows, k)
		for _, bits := range []int{4, 8} {
			for _, gs := range []int{32, 64, 128} {
				name := fmt.Sprintf("bits %d group %d", bits, gs)
				q := Quantize(wa, gs, bits, "")
				ngroups := k / gs
				eqShape(t, name+" wq", q.W.Shape(), []int{rows, k * bits / 32})
				eqShape(t, name+" scales", q.Scales.Shape(), []int{rows, ngroups})
				if q.Biases == nil {
					t.Errorf("%s: no biases", name)
					continue
				}
				eqShape(t, name+" biases", q.Biases.Shape(), []int{rows, ngroups})
				if q.W.Dtype() != Uint32 || q.Scales.Dtype() != Float32 {
					t.Errorf("%s: wq %v scales %v", name, q.W.Dtype(), q.Scales.Dtype())
				}
				deqA := Dequantize(q, -1)
				eqShape(t, name+" dequantized", deqA.Shape(), []int{rows, k})
				deq := deqA.Float32s()
				codes := unpackQ(ToSlice[uint32](q.W), rows, k, bits)
				sc, bi := q.Scales.Float32s(), q.Biases.Float32s()
				levels := float64(int(1)<<bits - 1)
				worst := 0.0
				for r := 0; r < rows; r++ {
					for gi := 0; gi < ngroups; gi++ {
						s, b := float64(sc[r*ngroups+gi]), float64(bi[r*ngroups+gi])
						lo, hi := b, b+levels*s
						if lo > hi {
							lo, hi = hi, lo
						}
						mn, mx := math.Inf(1), math.Inf(-1)
						for j := gi * gs; j < (gi+1)*gs; j++ {
							mn = math.Min(mn, float64(w[r*k+j]))
							mx = math.Max(mx, float64(w[r*k+j]))
						}
						delta := (mx - mn) / levels
						if math.Abs(s) > delta*15/14+slack {
							t.Errorf("%s row %d group %d: |scale| %g > 15/14·Δ (Δ = %g)", name, r, gi, s, delta)
						}
						for j := gi * gs; j < (gi+1)*gs; j++ {
							x, d := float64(w[r*k+j]), float64(deq[r*k+j])
							// The format: dequantized = code·scale + bias.
							if f := float64(codes[r*k+j])*s + b; !near(d, f, 1e-6, 1e-6) {
								t.Errorf("%s [%d,%d]: dequantized %g, code %d·%g + %g = %g", name, r, j, d, codes[r*k+j], s, b, f)
								return
							}
							err := math.Abs(x - d)
							worst = math.Max(worst, err/math.Max(math.Abs(s), 1e-30))
							bound := math.Abs(s)/2 + slack
							if x < lo || x > hi {
								bound = math.Max(lo-x, x-hi) + slack
							}
							if err > bound || err > math.Abs(s)+slack {
								t.Errorf("%s [%d,%d]: w %g dequantized %g, error %g > bound %g (scale %g bias %g)", name, r, j, x, d, err, bound, s, b)
								return
							}
						}
					}
				}
				// The constant and zero rows come back exactly.
				closeTo(t, name+" constant row", deq[2*k:3*k], w[2*k:3*k], 1e-6)
				closeTo(t, name+" zero row", deq[3*k:4*k], w[3*k:4*k], 0)
				t.Logf("%s: worst error %.3f·|scale|", name, worst)
			}
		}
		// bf16 weights: scales and biases in bf16, same format.
		q := Quantize(AsType(wa, BFloat16), 64, 4, "affine")
		if q.Scales.Dtype() != BFloat16 {
			t.Errorf("bf16 scales dtype %v", q.Scales.Dtype())
		}
		d := Dequantize(q, -1)
		if d.Dtype() != BFloat16 {
			t.Errorf("bf16 dequantize dtype %v", d.Dtype())
		}
		codes := unpackQ(ToSlice[uint32](q.W), rows, k, 4)
		sc, bi, dv := q.Scales.Float32s(), q.Biases.Float32s(), d.Float32s()
		for i := range dv {
			qs, b := float64(codes[i])*float64(sc[i/64]), float64(bi[i/64])
			// bf16 arithmetic: each rounding step is within 2^-8 relative.
			if f := qs + b; !near(float64(dv[i]), f, (math.Abs(qs)+math.Abs(b))/128, 0) {
				t.Errorf("bf16 dequantized [%d] = %g, want %g", i, dv[i], f)
				break
			}
		}
		// Dequantize to float32 explicitly.
		if Dequantize(q, Float32).Dtype() != Float32 {
			t.Errorf("dequantize out dtype ignored")
		}
	})
}

func matmulRef(a []float32, m, k int, b []float32, n int, bT bool) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for e := 0; e < k; e++ {
				bv := b[e*n+j]
				if bT {
					bv = b[j*k+e]
				}
				s += float64(a[i*k+e]) * float64(bv)
			}
			out[i*n+j] = s
		}
	}
	return out
}

func TestQuantizedMatmul(t *testing.T) {
	const m, k, n = 5, 256, 48
	g := lcg(33)
	x := g.floats(m*k, -1, 1)
	w := g.floats(n*k, -1, 1)
	onMLX(t, func() {
		for _, bits := range []int{4, 8} {
			for _, gs := range []int{32, 64, 128} {
				q := Quantize(f32(w, n, k), gs, bits, "")
				deq := Dequantize(q, -1).Float32s()
				want := matmulRef(x, m, k, deq, n, true)
				got := QuantizedMatmul(f32(x, m, k), q, true)
				eqShape(t, "qmm", got.Shape(), []int{m, n})
				nearAll(t, fmt.Sprintf("qmm bits %d group %d", bits, gs), got.Float32s(), want, 1e-4, 1e-4)
			}
		}
		// Batched x [2, m, k], and a single row (the decode shape).
		q := Quantize(f32(w, n, k), 64, 4, "")
		deq := Dequantize(q, -1).Float32s()
		x2 := append(append([]float32(nil), x...), x...)
		want := matmulRef(x2, 2*m, k, deq, n, true)
		got := QuantizedMatmul(f32(x2, 2, m, k), q, true)
		eqShape(t, "qmm batched", got.Shape(), []int{2, m, n})
		nearAll(t, "qmm batched", got.Float32s(), want, 1e-4, 1e-4)
		nearAll(t, "qmm one row", QuantizedMatmul(f32(x[:k], 1, k), q, true).Float32s(), want[:n], 1e-4, 1e-4)

		// transpose=false: w is [k, n2], quantized along n2.
		const n2 = 64
		wt := g.floats(k*n2, -1, 1)
		qt := Quantize(f32(wt, k, n2), 32, 4, "")
		deqT := Dequantize(qt, -1).Float32s()
		nearAll(t, "qmm no transpose", QuantizedMatmul(f32(x, m, k), qt, false).Float32s(), matmulRef(x, m, k, deqT, n2, false), 1e-4, 1e-4)
	})
}

func TestGatherMM(t *testing.T) {
	const tokens, k, n, experts = 4, 64, 8, 3
	g := lcg(44)
	x := g.floats(tokens*k, -1, 1)
	b := g.floats(experts*k*n, -1, 1)
	rhs := []uint32{2, 0, 1, 2}
	onMLX(t, func() {
		// gather_mm: out[t] = x[t] @ b[rhs[t]]
		got := GatherMM(f32(x, tokens, 1, k), f32(b, experts, k, n), nil, FromSlice(rhs, tokens), false)
		eqShape(t, "gather_mm", got.Shape(), []int{tokens, 1, n})
		gv := got.Float32s()
		for tk := 0; tk < tokens; tk++ {
			e := int(rhs[tk])
			want := matmulRef(x[tk*k:(tk+1)*k], 1, k, b[e*k*n:(e+1)*k*n], n, false)
			nearAll(t, fmt.Sprintf("gather_mm token %d (expert %d)", tk, e), gv[tk*n:(tk+1)*n], want, 1e-5, 1e-5)
		}
		// With lhs indices: out[i] = a[lhs[i]] @ b[rhs[i]], int32 indices.
		lhs := []int32{1, 1, 0, 3}
		rhs2 := []int32{0, 1, 2, 0}
		got = GatherMM(f32(x, tokens, 1, k), f32(b, experts, k, n), i32(lhs, 4), i32(rhs2, 4), false)
		gv = got.Float32s()
		for i := range lhs {
			a, e := int(lhs[i]), int(rhs2[i])
			want := matmulRef(x[a*k:(a+1)*k], 1, k, b[e*k*n:(e+1)*k*n], n, false)
			nearAll(t, fmt.Sprintf("gather_mm lhs %d rhs %d", a, e), gv[i*n:(i+1)*n], want, 1e-5, 1e-5)
		}

		// gather_qmm: experts [E, n, k] quantized; out[t] = x[t] @ deq(w[rhs[t]])ᵀ.
		wexp := g.floats(experts*n*k, -1, 1)
		for _, bits := range []int{4, 8} {
			q := Quantize(f32(wexp, experts, n, k), 32, bits, "")
			eqShape(t, "batched quantize", q.W.Shape(), []int{experts, n, k * bits / 32})
			deq := Dequantize(q, -1).Float32s()
			for _, sorted := range []bool{false, true} {
				idx := rhs
				if sorted {
					idx = []uint32{0, 0, 1, 2}
				}
				got := GatherQMM(f32(x, tokens, 1, k), q, nil, FromSlice(idx, tokens), true, sorted)
				eqShape(t, "gather_qmm", got.Shape(), []int{tokens, 1, n})
				gv := got.Float32s()
				for tk := 0; tk < tokens; tk++ {
					e := int(idx[tk])
					want := matmulRef(x[tk*k:(tk+1)*k], 1, k, deq[e*n*k:(e+1)*n*k], n, true)
					nearAll(t, fmt.Sprintf("gather_qmm bits %d sorted %v token %d (expert %d)", bits, sorted, tk, e), gv[tk*n:(tk+1)*n], want, 1e-4, 1e-4)
				}
			}
		}
	})
}

// Quantized products at the row counts the engine uses (1: decode, 2..16: verify blocks and
// drafts, 37: a prefill) at small model widths (K of one or two groups) and at a 4B
// model's (q_proj of Qwen3-4B), in float32 and
// in bf16 with bf16 scales as checkpoints store them. The reference multiplies the
// dequantized weights on the host. bf16 kernels may accumulate in bf16 (MLX's CPU one
// does), so each output may be off by a fraction of Σ|x·w| over its terms (1/32 here;
// the CPU shows up to about 1/110); a wrong kernel is off by the output's own
// size, several times that. On CUDA this covers MLX's JIT-compiled quantized kernels (qmv
// for one row, qmm for more), which the CPU run cannot.
func TestQuantizedMatmulRows(t *testing.T) {
	g := lcg(71)
	abs := func(v []float32) []float32 {
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(math.Abs(float64(x)))
		}
		return out
	}
	onMLX(t, func() {
		for _, dt := range []Dtype{BFloat16, Float32} {
			for _, c := range []struct{ n, k, gs, bits int }{{4096, 2560, 64, 4}, {128, 64, 64, 4}, {256, 64, 64, 4}, {64, 128, 64, 4}, {96, 256, 32, 4}, {128, 64, 64, 8}} {
				s := NewScope()
				w := AsType(f32(g.floats(c.n*c.k, -0.3, 0.3), c.n, c.k), dt)
				q := Quantize(w, c.gs, c.bits, "")
				deq := AsType(Dequantize(q, -1), Float32).Float32s()
				for _, m := range []int{1, 2, 3, 8, 16, 37} {
					x := AsType(f32(g.floats(m*c.k, -1, 1), m, c.k), dt)
					xs := AsType(x, Float32).Float32s()
					want := matmulRef(xs, m, c.k, deq, c.n, true)
					got := QuantizedMatmul(x, q, true)
					name := fmt.Sprintf("%s n%d k%d group %d bits %d rows %d", dt, c.n, c.k, c.gs, c.bits, m)
					eqShape(t, name, got.Shape(), []int{m, c.n})
					if hopperQMMSingleGroup(x, q) {
						// The detour promises decode's rounding: each row as its own product.
						all := AsType(got, Float32).Float32s()
						for r := range m {
							one := AsType(QuantizedMatmul(Slice(x, []int{r, 0}, []int{r + 1, c.k}), q, true), Float32).Float32s()
							if !slices.Equal(all[r*c.n:(r+1)*c.n], one) {
								t.Errorf("%s: row %d differs from its one-row product", name, r)
								break
							}
						}
					}
					if dt == Float32 {
						nearAll(t, name, got.Float32s(), want, 1e-4, 1e-4)
						continue
					}
					bound := matmulRef(abs(xs), m, c.k, abs(deq), c.n, true)
					for i, v := range AsType(got, Float32).Float32s() {
						if d := math.Abs(float64(v) - want[i]); d > bound[i]/32+1e-3 || math.IsNaN(float64(v)) {
							t.Errorf("%s[%d] = %g, want %g (off by %g, allowed %g)", name, i, v, want[i], d, bound[i]/32+1e-3)
							break
						}
					}
				}
				s.Close()
			}
		}
	})
}

// singleGroupRows (the detour QuantizedMatmul takes on CUDA for weights within one group)
// gives every row its one-row product, bit for bit, and past 64 rows the float32 product
// of the dequantized weights rounded to bf16; checked on whatever device runs the tests.
func TestSingleGroupRows(t *testing.T) {
	g := lcg(73)
	onMLX(t, func() {
		for _, m := range []int{2, 5, 70} {
			s := NewScope()
			w := AsType(f32(g.floats(96*64, -0.3, 0.3), 96, 64), BFloat16)
			q := Quantize(w, 64, 4, "")
			deq := AsType(Dequantize(q, -1), Float32).Float32s()
			x := AsType(f32(g.floats(m*64, -1, 1), 1, m, 64), BFloat16)
			got := singleGroupRows(x, q)
			eqShape(t, fmt.Sprintf("rows %d", m), got.Shape(), []int{1, m, 96})
			all := AsType(got, Float32).Float32s()
			for r := range m {
				one := AsType(quantizedMatmul(Slice(x, []int{0, r, 0}, []int{1, r + 1, 64}), q, true), Float32).Float32s()
				if m <= 64 && !slices.Equal(all[r*96:(r+1)*96], one) {
					t.Errorf("rows %d: row %d differs from its one-row product", m, r)
				}
				if m > 64 { // float32 products of the dequantized weights, rounded to bf16
					xs := AsType(Slice(x, []int{0, r, 0}, []int{1, r + 1, 64}), Float32).Float32s()
					want := matmulRef(xs, 1, 64, deq, 96, true)
					nearAll(t, fmt.Sprintf("rows %d row %d", m, r), all[r*96:(r+1)*96], want, 1e-2, 1e-2)
				}
			}
			s.Close()
		}
		// QuantizedMatmulRows, over two groups (K = 128), 3-D input: each row its one-row
		// product.
		s := NewScope()
		defer s.Close()
		w := AsType(f32(g.floats(96*128, -0.3, 0.3), 96, 128), BFloat16)
		q := Quantize(w, 64, 4, "")
		x := AsType(f32(g.floats(5*128, -1, 1), 1, 5, 128), BFloat16)
		got := QuantizedMatmulRows(x, q)
		eqShape(t, "rows over two groups", got.Shape(), []int{1, 5, 96})
		all := AsType(got, Float32).Float32s()
		for r := range 5 {
			one := AsType(quantizedMatmul(Slice(x, []int{0, r, 0}, []int{1, r + 1, 128}), q, true), Float32).Float32s()
			if !slices.Equal(all[r*96:(r+1)*96], one) {
				t.Errorf("QuantizedMatmulRows: row %d differs from its one-row product", r)
			}
		}
	})
}
