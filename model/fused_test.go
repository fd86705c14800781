package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// On CUDA, rotary embeddings the head-prep kernel does not implement keep the op path.
func TestFusedRefusesUnsupportedRope(t *testing.T) {
	onCUDA(t, func() error {
		for _, r := range []*Rope{{Dims: 128, Base: 1e6, Scale: 1, MScale: 1.2}, {Dims: 64, Base: 1e6, Scale: 1, MScale: 1},
			{Dims: 128, Base: 1e6, Scale: 1, MScale: 1, freqs: make([]float32, 64)}} {
			if g := newFused(r, 128, 1e-6); g != nil {
				g.Free()
				return fmt.Errorf("fused kernels for an unsupported rope %+v", *r)
			}
		}
		return nil
	})
}

// On CUDA: HeadPrep equals the op path (reshape, per-head RMSNorm, transpose, RoPE) up to
// bf16 rounding, from one merged product and from three; every row of a block equals the
// same row prepared alone at its position bit for bit (decode steps and verify blocks
// agree); KVPrep of the k|v columns gives HeadPrep's keys and values bit for bit, and
// HeadPrepInto its q while writing them into a cache's rows (KVPrepInto too, returning a
// copy of the q norm weight); GatedAct equals silu(gate)·up.
func TestFusedMatchesOps(t *testing.T) {
	const hq, hk, D, eps = 32, 8, 128, float32(1e-6)
	onCUDA(t, func() error {
		r := &Rope{Dims: D, Base: 1e6, Scale: 1, MScale: 1}
		f := newFused(r, D, eps)
		if f == nil {
			return fmt.Errorf("no fused kernels on a CUDA machine")
		}
		defer f.Free()
		qn := mlxc.Normal([]int{D}, mlxc.BFloat16, 1, 0.2, mlxc.RandomKey(1))
		kn := mlxc.Normal([]int{D}, mlxc.BFloat16, 1, 0.2, mlxc.RandomKey(2))
		for _, c := range []struct{ L, off int }{{1, 0}, {1, 4000}, {5, 17}, {16, 300}} {
			s := mlxc.NewScope()
			y := mlxc.Normal([]int{c.L, (hq + 2*hk) * D}, mlxc.BFloat16, 0, 2, mlxc.RandomKey(uint64(c.L*31+c.off)))
			q := mlxc.SliceAxis(y, 1, 0, hq*D)
			k := mlxc.SliceAxis(y, 1, hq*D, (hq+hk)*D)
			v := mlxc.SliceAxis(y, 1, (hq+hk)*D, (hq+2*hk)*D)
			pos := Visible(c.off)
			gq, gk, gv := f.HeadPrepMerged(y, hq, hk, D, qn, kn, pos)
			sq, sk, sv := f.HeadPrep(mlxc.Copy(q), mlxc.Copy(k), mlxc.Copy(v), 0, 0, 0, hq, hk, D, qn, kn, pos)
			wq := r.Apply(SplitHeads(q, 1, c.L, hq, qn, eps), c.off)
			wk := r.Apply(SplitHeads(k, 1, c.L, hk, kn, eps), c.off)
			wv := SplitHeads(v, 1, c.L, hk, nil, 0)
			for _, p := range []struct {
				name            string
				got, same, want *mlxc.Array
			}{{"q", gq, sq, wq}, {"k", gk, sk, wk}, {"v", gv, sv, wv}} {
				// Tolerance: two bf16 steps of the normalised values (~1–4), which MLX rounds at
				// other points; a wrong rotation, position or head is off by O(1).
				if err := near(fmt.Sprintf("L=%d off=%d %s", c.L, c.off, p.name), p.got, p.want, 1.0/64, 1.0/16); err != nil {
					s.Close()
					return err
				}
				if err := sameBits(fmt.Sprintf("L=%d %s merged vs separate", c.L, p.name), p.got, p.same); err != nil {
					s.Close()
					return err
				}
			}
			// The k|v columns alone (KVPrep, the drafter's context rows), with more rows too.
			ck, cv := f.KVPrep(mlxc.Copy(mlxc.SliceAxis(y, 1, hq*D, (hq+2*hk)*D)), hk, D, kn, pos)
			if err := sameBits(fmt.Sprintf("L=%d KVPrep k", c.L), ck, gk); err != nil {
				s.Close()
				return err
			}
			if err := sameBits(fmt.Sprintf("L=%d KVPrep v", c.L), cv, gv); err != nil {
				s.Close()
				return err
			}
			// HeadPrepInto: the same q; the keys and values land in the cache's buffers at rows
			// off.. (those past the buffer's end are dropped), every other row untouched. The
			// same for KVPrepInto of the k|v columns, which returns a copy of qn.
			R := c.off + c.L + 2
			if c.L == 16 {
				R = c.off + c.L - 2
			}
			kept := min(c.L, R-c.off)
			inCache := func(what string, cache, want *mlxc.Array) error {
				if err := sameBits(what, mlxc.SliceAxis(cache, 2, c.off, c.off+kept), mlxc.SliceAxis(want, 2, 0, kept)); err != nil {
					return err
				}
				rest := mlxc.Sum(mlxc.Abs(mlxc.AsType(mlxc.SliceAxis(cache, 2, 0, c.off), mlxc.Float32)), nil, false).Float32s()[0]
				if c.off+kept < R {
					rest += mlxc.Sum(mlxc.Abs(mlxc.AsType(mlxc.SliceAxis(cache, 2, c.off+kept, R), mlxc.Float32)), nil, false).Float32s()[0]
				}
				if rest != 0 {
					return fmt.Errorf("%s: rows outside %d..%d changed (|sum| %g)", what, c.off, c.off+kept, rest)
				}
				return nil
			}
			kc, vc := mlxc.Zeros([]int{1, hk, R, D}, mlxc.BFloat16), mlxc.Zeros([]int{1, hk, R, D}, mlxc.BFloat16)
			kc2, vc2 := mlxc.Zeros([]int{1, hk, R, D}, mlxc.BFloat16), mlxc.Zeros([]int{1, hk, R, D}, mlxc.BFloat16)
			mlxc.Eval(kc, vc, kc2, vc2)
			iq := f.HeadPrepInto(y, hq, hk, D, qn, kn, OnDevice(pos), kc, vc)
			// (Contiguous: the kernel reads rows of a product's output, no strided views.)
			qc := f.KVPrepInto(mlxc.Contiguous(mlxc.SliceAxis(y, 1, hq*D, (hq+2*hk)*D)), hk, D, qn, kn, OnDevice(pos), kc2, vc2)
			mlxc.Eval(iq, qc)
			for _, p := range []struct {
				name      string
				got, want *mlxc.Array
				cached    bool
			}{{"HeadPrepInto q", iq, gq, false}, {"HeadPrepInto k", kc, gk, true}, {"HeadPrepInto v", vc, gv, true},
				{"KVPrepInto's q norm", qc, qn, false}, {"KVPrepInto k", kc2, gk, true}, {"KVPrepInto v", vc2, gv, true}} {
				name := fmt.Sprintf("L=%d %s", c.L, p.name)
				check := sameBits
				if p.cached {
					check = inCache
				}
				err := check(name, p.got, p.want)
				if err != nil {
					s.Close()
					return err
				}
			}
			// Row i of the block alone, at position off+i.
			for i := 0; i < c.L; i += max(1, c.L/3) {
				row := mlxc.SliceAxis(y, 0, i, i+1)
				oq, ok, _ := f.HeadPrepMerged(row, hq, hk, D, qn, kn, Visible(c.off+i))
				if err := sameBits(fmt.Sprintf("L=%d row %d q", c.L, i), oq, mlxc.SliceAxis(gq, 2, i, i+1)); err != nil {
					s.Close()
					return err
				}
				if err := sameBits(fmt.Sprintf("L=%d row %d k", c.L, i), ok, mlxc.SliceAxis(gk, 2, i, i+1)); err != nil {
					s.Close()
					return err
				}
			}
			gu := mlxc.Normal([]int{c.L, 2 * 96}, mlxc.BFloat16, 0, 2, mlxc.RandomKey(uint64(c.L)))
			want := mlxc.Multiply(mlxc.SiLU(mlxc.SliceAxis(gu, 1, 0, 96)), mlxc.SliceAxis(gu, 1, 96, 192))
			if err := near(fmt.Sprintf("gated act L=%d", c.L), f.GatedAct(gu), want, 1.0/64, 1.0/128); err != nil {
				s.Close()
				return err
			}
			s.Close()
		}
		return nil
	})
}

// near compares two arrays of the same shape elementwise: |got − want| ≤ rel·|want| + abs.
func near(what string, got, want *mlxc.Array, rel, abs float64) error {
	if g, w := got.Shape(), want.Shape(); fmt.Sprint(g) != fmt.Sprint(w) {
		return fmt.Errorf("%s: shape %v, want %v", what, g, w)
	}
	gv, wv := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
	for i := range wv {
		d := math.Abs(float64(gv[i] - wv[i]))
		if d > rel*math.Abs(float64(wv[i]))+abs || math.IsNaN(float64(gv[i])) {
			return fmt.Errorf("%s: element %d = %g, want %g", what, i, gv[i], wv[i])
		}
	}
	return nil
}

// sameBits reports whether two arrays hold the same values bit for bit.
func sameBits(what string, a, b *mlxc.Array) error {
	if g, w := a.Shape(), b.Shape(); fmt.Sprint(g) != fmt.Sprint(w) {
		return fmt.Errorf("%s: shape %v vs %v", what, g, w)
	}
	av, bv := mlxc.AsType(a, mlxc.Float32).Float32s(), mlxc.AsType(b, mlxc.Float32).Float32s()
	for i := range av {
		if math.Float32bits(av[i]) != math.Float32bits(bv[i]) {
			return fmt.Errorf("%s: element %d differs: %g vs %g", what, i, av[i], bv[i])
		}
	}
	return nil
}

// On CUDA: PrepAttention equals HeadPrepInto followed by the
// few-query attention kernel bit for bit — the attention rows and every row of the cache
// buffers — causal (verify blocks) and not (drafts), for blocks of 1..16 rows at positions
// from 0 to past a cache step, the cache filled exactly or with rows to spare.
func TestPrepAttentionMatchesSeparate(t *testing.T) {
	const hq, hk, D, eps = 32, 8, 128, float32(1e-6)
	onCUDA(t, func() error {
		r := &Rope{Dims: D, Base: 1e6, Scale: 1, MScale: 1}
		f := newFused(r, D, eps)
		if f == nil || f.prepAttn == nil {
			return fmt.Errorf("no fused head-prep attention kernel on a CUDA machine")
		}
		defer f.Free()
		a := newFewQueryAttention()
		if a == nil {
			return fmt.Errorf("no few-query attention kernel on a CUDA machine")
		}
		defer a.Free()
		scale := OnDeviceConst(mlxc.Scalar(1/math.Sqrt(D), mlxc.Float32))
		defer scale.Free()
		qn := mlxc.Normal([]int{D}, mlxc.BFloat16, 1, 0.2, mlxc.RandomKey(1))
		kn := mlxc.Normal([]int{D}, mlxc.BFloat16, 1, 0.2, mlxc.RandomKey(2))
		for i, c := range []struct {
			L, pos, R int
			causal    bool
		}{{1, 0, 8, true}, {16, 0, 32, true}, {5, 37, 64, true}, {16, 300, 316, true}, {16, 57, 80, false}, {3, 9, 16, false}, {16, 0, 16, false}} {
			s := mlxc.NewScope()
			name := fmt.Sprintf("L=%d pos=%d R=%d causal=%v", c.L, c.pos, c.R, c.causal)
			y := mlxc.Normal([]int{c.L, (hq + 2*hk) * D}, mlxc.BFloat16, 0, 2, mlxc.RandomKey(uint64(10+i)))
			ck := mlxc.Normal([]int{1, hk, c.R, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(30+i)))
			cv := mlxc.Normal([]int{1, hk, c.R, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(50+i)))
			k1, v1, k2, v2 := mlxc.Copy(ck), mlxc.Copy(cv), mlxc.Copy(ck), mlxc.Copy(cv)
			mlxc.Eval(k1, v1, k2, v2)
			pos := OnDevice(Visible(c.pos))
			visible := pos // causal: the block's first row; otherwise the keys every row sees
			if !c.causal {
				visible = OnDevice(Visible(c.pos + c.L))
			}
			want := a.Apply(f.HeadPrepInto(y, hq, hk, D, qn, kn, pos, k1, v1), k1, v1, scale, visible, c.causal, 0)
			mlxc.Eval(want)
			got := f.PrepAttention(y, hq, hk, D, qn, kn, pos, k2, v2, scale, c.causal)
			mlxc.Eval(got)
			for _, p := range []struct {
				what      string
				got, want *mlxc.Array
			}{{"attention", got, want}, {"keys cache", k2, k1}, {"values cache", v2, v1}} {
				if err := sameBits(name+" "+p.what, p.got, p.want); err != nil {
					s.Close()
					return err
				}
			}
			s.Close()
		}
		return nil
	})
}

// On CUDA: Fused.OnDevice pads a position to four copies in device memory in one launch,
// from a host-made array and from a GPU op's output alike, as OnDevice's Concatenate does;
// other arrays, and a nil Fused, take OnDevice's path.
func TestFusedOnDevicePads(t *testing.T) {
	onCUDA(t, func() error {
		f := newFused(&Rope{Dims: 128, Base: 1e6, Scale: 1, MScale: 1}, 128, 1e-6)
		if f == nil {
			return fmt.Errorf("no fused kernels on CUDA")
		}
		defer f.Free()
		for _, c := range []struct {
			name string
			a    *mlxc.Array
			want int32
		}{
			{"host-made", Visible(123), 123},
			{"a GPU op's", mlxc.Add(Visible(40000), mlxc.FromSlice([]int32{7}, 1)), 40007},
			{"negative", Visible(-5), -5},
		} {
			for _, fu := range []*Fused{f, nil} {
				got := fu.OnDevice(c.a)
				v := mlxc.ToSlice[int32](got)
				if fu != nil && got.Location() != "device" {
					return fmt.Errorf("%s: padded position in %s memory", c.name, got.Location())
				}
				if len(v) != 4 {
					return fmt.Errorf("%s (fused %v): %d elements, want 4", c.name, fu != nil, len(v))
				}
				for i, x := range v {
					if x != c.want {
						return fmt.Errorf("%s (fused %v): element %d is %d, want %d", c.name, fu != nil, i, x, c.want)
					}
				}
			}
		}
		wide := mlxc.FromSlice([]int32{1, 2, 3}, 3)
		if v := mlxc.ToSlice[int32](f.OnDevice(wide)); len(v) != 7 || v[2] != 3 || v[3] != 0 {
			return fmt.Errorf("a 3-element array padded to %v, want OnDevice's [1 2 3 0 0 0 0]", v)
		}
		return nil
	})
}
