package mlxc

import (
	"math"
	"testing"
)

func TestRandomKeySplit(t *testing.T) {
	onMLX(t, func() {
		// A key is the seed's high and low 32-bit words.
		for _, c := range []struct {
			seed uint64
			want []uint32
		}{{0, []uint32{0, 0}}, {42, []uint32{0, 42}}, {1<<32 + 7, []uint32{1, 7}}, {math.MaxUint64, []uint32{0xFFFFFFFF, 0xFFFFFFFF}}} {
			k := RandomKey(c.seed)
			eqShape(t, "key", k.Shape(), []int{2})
			eqSlice(t, "key", ToSlice[uint32](k), c.want)
		}
		k := RandomKey(7)
		s := RandomSplit(k, 3)
		eqShape(t, "split", s.Shape(), []int{3, 2})
		if s.Dtype() != Uint32 {
			t.Errorf("split dtype %v", s.Dtype())
		}
		v := ToSlice[uint32](s)
		eqSlice(t, "split is reproducible", ToSlice[uint32](RandomSplit(RandomKey(7), 3)), v)
		for i := 0; i < 3; i++ {
			if v[2*i] == 7 && v[2*i+1] == 0 {
				t.Errorf("split key %d equals the parent", i)
			}
			for j := 0; j < i; j++ {
				if v[2*i] == v[2*j] && v[2*i+1] == v[2*j+1] {
					t.Errorf("split keys %d and %d are equal: %v", i, j, v)
				}
			}
		}
		other := ToSlice[uint32](RandomSplit(RandomKey(8), 3))
		same := true
		for i := range v {
			same = same && v[i] == other[i]
		}
		if same {
			t.Errorf("keys 7 and 8 split the same")
		}
	})
}

func TestCategorical(t *testing.T) {
	onMLX(t, func() {
		// One logit dominates: always that index, whatever the key.
		logits := make([]float32, 8)
		logits[5] = 100
		lg := BroadcastTo(f32(logits, 1, 8), 1000, 8)
		for seed := uint64(0); seed < 3; seed++ {
			idx := ToSlice[uint32](Categorical(lg, -1, RandomKey(seed)))
			if len(idx) != 1000 {
				t.Errorf("categorical: %d samples", len(idx))
				return
			}
			for i, v := range idx {
				if v != 5 {
					t.Errorf("seed %d sample %d = %d, want 5", seed, i, v)
					break
				}
			}
		}
		// -inf logits are never drawn.
		ninf := float32(math.Inf(-1))
		m := BroadcastTo(f32([]float32{ninf, 0, ninf, 0}, 1, 4), 2000, 4)
		for _, v := range ToSlice[uint32](Categorical(m, 1, RandomKey(3))) {
			if v != 1 && v != 3 {
				t.Errorf("drew a -inf logit: %d", v)
				break
			}
		}

		// Fixed key: reproducible; another key: different draws.
		flat := Zeros([]int{512, 16}, Float32)
		a := ToSlice[uint32](Categorical(flat, -1, RandomKey(11)))
		b := ToSlice[uint32](Categorical(flat, -1, RandomKey(11)))
		c := ToSlice[uint32](Categorical(flat, -1, RandomKey(12)))
		eqSlice(t, "categorical with the same key", b, a)
		diff := 0
		for i := range a {
			if a[i] != c[i] {
				diff++
			}
		}
		if diff < 400 { // independent uniform draws over 16 values agree ~1/16 of the time
			t.Errorf("keys 11 and 12 give %d/512 different draws", diff)
		}

		// Frequencies follow softmax(logits) within 5 standard errors.
		p := []float64{0.1, 0.2, 0.3, 0.4}
		lp := make([]float32, 4)
		for i := range p {
			lp[i] = float32(math.Log(p[i]) + 3) // unnormalised
		}
		const n = 10000
		draws := ToSlice[uint32](Categorical(BroadcastTo(f32(lp, 1, 4), n, 4), 1, RandomKey(99)))
		counts := make([]float64, 4)
		for _, v := range draws {
			counts[v]++
		}
		for i := range p {
			se := math.Sqrt(p[i] * (1 - p[i]) / n)
			if f := counts[i] / n; math.Abs(f-p[i]) > 5*se {
				t.Errorf("category %d frequency %.4f, want %.2f ± %.4f", i, f, p[i], 5*se)
			}
		}
	})
}

func meanStd(v []float32) (float64, float64) {
	var s, s2 float64
	for _, x := range v {
		s += float64(x)
	}
	m := s / float64(len(v))
	for _, x := range v {
		s2 += (float64(x) - m) * (float64(x) - m)
	}
	return m, math.Sqrt(s2 / float64(len(v)-1))
}

func TestUniformNormal(t *testing.T) {
	const n = 10000
	onMLX(t, func() {
		u := Uniform(2, 5, []int{n}, Float32, RandomKey(1))
		eqShape(t, "uniform", u.Shape(), []int{n})
		if u.Dtype() != Float32 {
			t.Errorf("uniform dtype %v", u.Dtype())
		}
		v := u.Float32s()
		for i, x := range v {
			if x < 2 || x >= 5 {
				t.Errorf("uniform[%d] = %v outside [2, 5)", i, x)
				break
			}
		}
		// U(2,5): mean 3.5, sd 3/sqrt(12); the sample mean's standard error is sd/sqrt(n).
		mean, sd := meanStd(v)
		wantSD := 3 / math.Sqrt(12)
		if se := wantSD / math.Sqrt(n); math.Abs(mean-3.5) > 5*se {
			t.Errorf("uniform mean %.4f, want 3.5 ± %.4f", mean, 5*se)
		}
		if math.Abs(sd-wantSD) > 0.03 {
			t.Errorf("uniform sd %.4f, want %.4f", sd, wantSD)
		}
		eqSlice(t, "uniform with the same key", Uniform(2, 5, []int{n}, Float32, RandomKey(1)).Float32s(), v)
		w := Uniform(2, 5, []int{n}, Float32, RandomKey(2)).Float32s()
		same := 0
		for i := range v {
			if v[i] == w[i] {
				same++
			}
		}
		if same > n/100 {
			t.Errorf("keys 1 and 2 give %d equal uniform samples", same)
		}
		// bf16 uniform stays in range too.
		for _, x := range Uniform(-1, 1, []int{1000}, BFloat16, RandomKey(3)).Float32s() {
			if x < -1 || x > 1 {
				t.Errorf("bf16 uniform %v outside [-1, 1]", x)
				break
			}
		}

		// N(1, 2²): sample mean within 5 standard errors, sample sd within 5 of its
		// standard error (≈ σ/sqrt(2n)).
		z := Normal([]int{n}, Float32, 1, 2, RandomKey(4))
		eqShape(t, "normal", z.Shape(), []int{n})
		zm, zs := meanStd(z.Float32s())
		if se := 2 / math.Sqrt(n); math.Abs(zm-1) > 5*se {
			t.Errorf("normal mean %.4f, want 1 ± %.4f", zm, 5*se)
		}
		if se := 2 / math.Sqrt(2*n); math.Abs(zs-2) > 5*se {
			t.Errorf("normal sd %.4f, want 2 ± %.4f", zs, 5*se)
		}
		eqSlice(t, "normal with the same key", Normal([]int{n}, Float32, 1, 2, RandomKey(4)).Float32s(), z.Float32s())
		// Roughly 68% within one sd.
		in1 := 0
		for _, x := range z.Float32s() {
			if math.Abs(float64(x)-1) < 2 {
				in1++
			}
		}
		if f := float64(in1) / n; math.Abs(f-0.6827) > 0.025 {
			t.Errorf("normal: %.3f within one sd, want 0.683", f)
		}
	})
}
