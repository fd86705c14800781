package mlxc

import (
	"fmt"
	"math"
	"testing"
)

func TestRMSNorm(t *testing.T) {
	g := lcg(3)
	const rows, d = 3, 16
	x := g.floats(rows*d, -2, 2)
	w := g.floats(d, 0.5, 1.5)
	ref := func(eps float64, weight bool) []float64 {
		out := make([]float64, rows*d)
		for r := 0; r < rows; r++ {
			var ss float64
			for i := 0; i < d; i++ {
				v := float64(x[r*d+i])
				ss += v * v
			}
			inv := 1 / math.Sqrt(ss/d+eps)
			for i := 0; i < d; i++ {
				out[r*d+i] = float64(x[r*d+i]) * inv
				if weight {
					out[r*d+i] *= float64(w[i])
				}
			}
		}
		return out
	}
	onMLX(t, func() {
		xa := f32(x, rows, d)
		nearAll(t, "rms_norm", RMSNorm(xa, f32(w, d), 1e-6).Float32s(), ref(1e-6, true), 1e-6, 1e-5)
		nearAll(t, "rms_norm large eps", RMSNorm(xa, f32(w, d), 0.5).Float32s(), ref(0.5, true), 1e-6, 1e-5)
		nearAll(t, "rms_norm no weight", RMSNorm(xa, nil, 1e-6).Float32s(), ref(1e-6, false), 1e-6, 1e-5)
		// A zero row stays zero (eps keeps it finite).
		closeTo(t, "rms_norm zeros", RMSNorm(Zeros([]int{1, 8}, Float32), nil, 1e-6).Float32s(), make([]float32, 8), 0)
		// bf16 input with bf16 weight stays bf16.
		r := RMSNorm(AsType(xa, BFloat16), AsType(f32(w, d), BFloat16), 1e-6)
		if r.Dtype() != BFloat16 {
			t.Errorf("rms_norm bf16 dtype %v", r.Dtype())
		}
		nearAll(t, "rms_norm bf16", r.Float32s(), ref(1e-6, true), 0.02, 0.02)

		// layer_norm: (x - mean)/sqrt(var + eps)·w + b
		b := g.floats(d, -1, 1)
		want := make([]float64, rows*d)
		for rr := 0; rr < rows; rr++ {
			var m, v float64
			for i := 0; i < d; i++ {
				m += float64(x[rr*d+i])
			}
			m /= d
			for i := 0; i < d; i++ {
				dv := float64(x[rr*d+i]) - m
				v += dv * dv
			}
			v /= d
			for i := 0; i < d; i++ {
				want[rr*d+i] = (float64(x[rr*d+i])-m)/math.Sqrt(v+1e-5)*float64(w[i]) + float64(b[i])
			}
		}
		nearAll(t, "layer_norm", LayerNorm(xa, f32(w, d), f32(b, d), 1e-5).Float32s(), want, 1e-5, 1e-5)
	})
}

// ropeRef rotates x [B, H, L, D] at positions offset[b] + l. Non-traditional pairs feature i
// with i + dims/2; traditional pairs 2i with 2i+1. theta = scale·pos·invFreq[i]; features
// from dims on pass through.
func ropeRef(x []float32, b, h, l, d, dims int, traditional bool, scale float64, offset []int, invFreq []float64) []float64 {
	out := make([]float64, len(x))
	half := dims / 2
	for bi := 0; bi < b; bi++ {
		for hi := 0; hi < h; hi++ {
			for li := 0; li < l; li++ {
				base := ((bi*h+hi)*l + li) * d
				pos := float64(offset[bi] + li)
				for i := 0; i < d; i++ {
					out[base+i] = float64(x[base+i])
				}
				for i := 0; i < half; i++ {
					th := scale * pos * invFreq[i]
					c, s := math.Cos(th), math.Sin(th)
					i1, i2 := i, i+half
					if traditional {
						i1, i2 = 2*i, 2*i+1
					}
					x1, x2 := float64(x[base+i1]), float64(x[base+i2])
					out[base+i1] = x1*c - x2*s
					out[base+i2] = x1*s + x2*c
				}
			}
		}
	}
	return out
}

func invFreqs(dims int, base float64) []float64 {
	f := make([]float64, dims/2)
	for i := range f {
		f[i] = math.Pow(base, -float64(2*i)/float64(dims))
	}
	return f
}

func TestRoPE(t *testing.T) {
	g := lcg(5)
	const b, h, l, d = 2, 3, 5, 16
	x := g.floats(b*h*l*d, -1, 1)
	onMLX(t, func() {
		xa := f32(x, b, h, l, d)
		cases := []struct {
			name        string
			dims        int
			traditional bool
			base, scale float64
			offset      int
		}{
			{"base 10000", d, false, 10000, 1, 0},
			{"offset 7", d, false, 10000, 1, 7},
			{"base 1e6 offset 1000", d, false, 1e6, 1, 1000},
			{"partial dims", 8, false, 10000, 1, 3},
			{"scale 0.5", d, false, 10000, 0.5, 4},
			{"traditional", d, true, 10000, 1, 2},
		}
		for _, c := range cases {
			want := ropeRef(x, b, h, l, d, c.dims, c.traditional, c.scale, []int{c.offset, c.offset}, invFreqs(c.dims, c.base))
			got := RoPE(xa, c.dims, c.traditional, float32(c.base), float32(c.scale), c.offset, nil)
			eqShape(t, c.name, got.Shape(), []int{b, h, l, d})
			nearAll(t, "rope "+c.name, got.Float32s(), want, 2e-5, 2e-5)
		}

		// The offset as a device array: a scalar, and one per batch row.
		off := Add(ScalarInt(6, Int32), ScalarInt(1, Int32))
		want := ropeRef(x, b, h, l, d, d, false, 1, []int{7, 7}, invFreqs(d, 10000))
		nearAll(t, "rope offset array scalar", RoPEDynamic(xa, d, false, 10000, 1, off, nil).Float32s(), want, 2e-5, 2e-5)
		offs := Add(Multiply(Arange(0, 2, 1, Int32), ScalarInt(10, Int32)), ScalarInt(3, Int32)) // [3, 13]
		want = ropeRef(x, b, h, l, d, d, false, 1, []int{3, 13}, invFreqs(d, 10000))
		nearAll(t, "rope offset array per row", RoPEDynamic(xa, d, false, 10000, 1, offs, nil).Float32s(), want, 2e-5, 2e-5)

		// Custom frequencies: MLX's freqs are the reciprocals of the inverse frequencies
		// (theta = pos / freqs[i]), as mlx-lm's Llama-3 and YaRN scalings pass them.
		inv := invFreqs(d, 10000)
		freqs := make([]float32, d/2)
		for i := range inv {
			inv[i] *= 1 + float64(i%3) // some non-uniform scaling
			freqs[i] = float32(1 / inv[i])
		}
		for i := range inv {
			inv[i] = 1 / float64(freqs[i])
		}
		want = ropeRef(x, b, h, l, d, d, false, 1, []int{5, 5}, inv)
		nearAll(t, "rope freqs", RoPE(xa, d, false, 0, 1, 5, f32(freqs, d/2)).Float32s(), want, 2e-5, 2e-5)
		want = ropeRef(x, b, h, l, d, d, false, 1, []int{3, 13}, inv)
		nearAll(t, "rope freqs offset array", RoPEDynamic(xa, d, false, 0, 1, offs, f32(freqs, d/2)).Float32s(), want, 2e-5, 2e-5)

		// Position 0 is the identity.
		nearAll(t, "rope at 0", RoPE(SliceAxis(xa, 2, 0, 1), d, false, 10000, 1, 0, nil).Float32s(), to64(SliceAxis(xa, 2, 0, 1).Float32s()), 1e-7, 0)
	})
}

// sdpaRef is softmax(scale·QKᵀ + mask)·V in float64 over [B, H, L, D] inputs with GQA
// (query head h uses kv head h / (Hq/Hkv)). keep(b, h, i, j) masks out logits (nil keeps
// all); add(b, h, i, j) adds to them (nil adds nothing); sink, when not nil, adds a per-head
// logit with no value row.
func sdpaRef(q, k, v []float32, b, hq, hkv, lq, lk, d int, scale float64,
	keep func(b, h, i, j int) bool, add func(b, h, i, j int) float64, sink []float64) []float64 {
	out := make([]float64, b*hq*lq*d)
	rep := hq / hkv
	s := make([]float64, lk)
	for bi := 0; bi < b; bi++ {
		for h := 0; h < hq; h++ {
			kh := h / rep
			for i := 0; i < lq; i++ {
				qo := ((bi*hq+h)*lq + i) * d
				m := math.Inf(-1)
				if sink != nil {
					m = sink[h]
				}
				for j := 0; j < lk; j++ {
					ko := ((bi*hkv+kh)*lk + j) * d
					var dot float64
					for e := 0; e < d; e++ {
						dot += float64(q[qo+e]) * float64(k[ko+e])
					}
					s[j] = dot * scale
					if add != nil {
						s[j] += add(bi, h, i, j)
					}
					if keep != nil && !keep(bi, h, i, j) {
						s[j] = math.Inf(-1)
					}
					m = math.Max(m, s[j])
				}
				var z float64
				if sink != nil {
					z = math.Exp(sink[h] - m)
				}
				for j := range s {
					s[j] = math.Exp(s[j] - m)
					z += s[j]
				}
				for j := 0; j < lk; j++ {
					vo := ((bi*hkv+kh)*lk + j) * d
					p := s[j] / z
					for e := 0; e < d; e++ {
						out[qo+e] += p * float64(v[vo+e])
					}
				}
			}
		}
	}
	return out
}

func TestSDPA(t *testing.T) {
	type tc struct {
		name               string
		b, hq, hkv, lq, lk int
		d                  int
		mode               string
		boolMask, addMask  bool
		sinks              bool
		dtype              Dtype
		tol                float64
	}
	cases := []tc{
		{name: "no mask", b: 1, hq: 2, hkv: 2, lq: 3, lk: 5, d: 8},
		{name: "no mask batch 2 d64", b: 2, hq: 4, hkv: 4, lq: 6, lk: 6, d: 64},
		{name: "causal square", b: 1, hq: 2, hkv: 2, lq: 5, lk: 5, d: 16, mode: MaskCausal},
		{name: "causal block Lq=4 at offset 6 in Lk=10", b: 1, hq: 2, hkv: 2, lq: 4, lk: 10, d: 64, mode: MaskCausal},
		{name: "causal decode Lq=1", b: 2, hq: 4, hkv: 4, lq: 1, lk: 7, d: 64, mode: MaskCausal},
		{name: "bool mask", b: 1, hq: 2, hkv: 2, lq: 4, lk: 6, d: 16, mode: MaskArray, boolMask: true},
		{name: "additive mask", b: 2, hq: 2, hkv: 2, lq: 3, lk: 5, d: 16, mode: MaskArray, addMask: true},
		{name: "GQA 8/2", b: 1, hq: 8, hkv: 2, lq: 5, lk: 9, d: 64},
		{name: "GQA 8/2 causal", b: 2, hq: 8, hkv: 2, lq: 4, lk: 10, d: 128, mode: MaskCausal},
		{name: "GQA 8/2 decode", b: 1, hq: 8, hkv: 2, lq: 1, lk: 33, d: 128, mode: MaskCausal},
		{name: "GQA bool mask", b: 1, hq: 8, hkv: 2, lq: 3, lk: 7, d: 64, mode: MaskArray, boolMask: true},
		{name: "sinks", b: 1, hq: 4, hkv: 2, lq: 3, lk: 6, d: 64, mode: MaskCausal, sinks: true},
		{name: "bf16 causal GQA", b: 1, hq: 8, hkv: 2, lq: 4, lk: 12, d: 128, mode: MaskCausal, dtype: BFloat16, tol: 0.03},
	}
	g := lcg(17)
	onMLX(t, func() {
		for _, c := range cases {
			q := g.floats(c.b*c.hq*c.lq*c.d, -1, 1)
			k := g.floats(c.b*c.hkv*c.lk*c.d, -1, 1)
			v := g.floats(c.b*c.hkv*c.lk*c.d, -1, 1)
			scale := 1 / math.Sqrt(float64(c.d))
			if c.d == 8 {
				scale = 0.7 // not the default, to catch a scale that is ignored
			}
			var keep func(b, h, i, j int) bool
			var add func(b, h, i, j int) float64
			var mask *Array
			switch {
			case c.mode == MaskCausal:
				keep = func(_, _, i, j int) bool { return j <= i+c.lk-c.lq }
			case c.boolMask:
				// [Lq, Lk], broadcast over batch and heads; keep the diagonal so no row is empty.
				mb := make([]bool, c.lq*c.lk)
				for i := range mb {
					mb[i] = g.next()%3 != 0 || i/c.lk == i%c.lk
				}
				keep = func(_, _, i, j int) bool { return mb[i*c.lk+j] }
				mask = FromSlice(mb, c.lq, c.lk)
			case c.addMask:
				// [B, 1, Lq, Lk] additive, broadcast over heads, with some large negatives.
				ma := g.floats(c.b*c.lq*c.lk, -2, 2)
				for i := range ma {
					if g.next()%4 == 0 && i%c.lk != 0 {
						ma[i] = -1e9
					}
				}
				add = func(b, _, i, j int) float64 { return float64(ma[(b*c.lq+i)*c.lk+j]) }
				mask = f32(ma, c.b, 1, c.lq, c.lk)
			}
			var sinks []float64
			var sinkArr *Array
			if c.sinks {
				sf := g.floats(c.hq, -1, 2)
				sinks = to64(sf)
				sinkArr = f32(sf, c.hq)
			}
			dt, tol := c.dtype, c.tol
			if dt == 0 {
				dt, tol = Float32, 2e-5
			}
			if dt != Float32 {
				// The reference sees the rounded inputs.
				for _, s := range [][]float32{q, k, v} {
					for i := range s {
						s[i] = BF16ToFloat32(Float32ToBF16(s[i]))
					}
				}
			}
			want := sdpaRef(q, k, v, c.b, c.hq, c.hkv, c.lq, c.lk, c.d, scale, keep, add, sinks)
			qa := AsType(f32(q, c.b, c.hq, c.lq, c.d), dt)
			ka := AsType(f32(k, c.b, c.hkv, c.lk, c.d), dt)
			va := AsType(f32(v, c.b, c.hkv, c.lk, c.d), dt)
			if sinkArr != nil {
				sinkArr = AsType(sinkArr, dt)
			}
			out := ScaledDotProductAttention(qa, ka, va, float32(scale), c.mode, mask, sinkArr)
			eqShape(t, c.name, out.Shape(), []int{c.b, c.hq, c.lq, c.d})
			if out.Dtype() != dt {
				t.Errorf("%s: dtype %v, want %v", c.name, out.Dtype(), dt)
			}
			nearAll(t, fmt.Sprintf("sdpa %s", c.name), out.Float32s(), want, tol, tol)
		}
	})
}

// AttentionShapes counts a multi-query attention's shape once, whatever its values; a new
// key length or mask mode is a new shape, one-query attentions are not counted.
func TestAttentionShapes(t *testing.T) {
	onMLX(t, func() {
		s := NewScope()
		defer s.Close()
		attend := func(L, K int, mode string) {
			q := Zeros([]int{1, 2, L, 8}, Float32)
			kv := Zeros([]int{1, 2, K, 8}, Float32)
			Eval(ScaledDotProductAttention(q, kv, kv, 0.35, mode, nil, nil))
		}
		// Shapes no other test in this package attends.
		n0 := AttentionShapes()
		attend(3, 37, MaskCausal)
		attend(3, 37, MaskCausal)
		if n := AttentionShapes() - n0; n != 1 {
			t.Fatalf("one shape twice: %d new shapes, want 1", n)
		}
		attend(3, 38, MaskCausal)
		attend(3, 37, MaskNone)
		attend(1, 39, MaskNone)
		if n := AttentionShapes() - n0; n != 3 {
			t.Fatalf("a new key length and a new mode: %d new shapes, want 3 (a one-query attention not counted)", n)
		}
	})
}
