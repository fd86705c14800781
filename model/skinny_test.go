package model

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// On CUDA: the kernel equals a float32 product of the same inputs up to the output's
// rounding, for row counts across the MMAX buckets, odd N and K tails; and every row is
// reduced the same way whatever the row count (the first two rows of every call equal a
// 2-row call bit for bit; for the tensor-core kernel, one row alone too), which is what
// lets verify rows match each other and, in GPU-exact mode, decode steps.
func TestSkinnyGEMMMatchesMatmul(t *testing.T) {
	if !mlxc.CUDAKernelsAvailable() {
		t.Skip("needs the CUDA backend and a GPU")
	}
	err := mlxc.Do(func() error {
		s := newSkinnyGEMM()
		if s == nil {
			return fmt.Errorf("no kernel on a CUDA machine")
		}
		s.minRows = 1 // as in GPU-exact mode: one-row calls must agree with the rest
		defer s.Free()
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16} {
			for _, nk := range [][2]int{{4, 8}, {5, 16}, {1003, 264}, {32, 16}, {96, 272}, {32, 32}, {64, 96}, {96, 1056}, {1024, 2560}, {2560, 9728}, {9728, 2560}, {4096, 2560}, {8448, 4096}, {19456, 2560}} {
				if !s.configFor(nk[0], nk[1]).fits(nk[0], nk[1]) {
					continue // whole tiles only: Linear keeps cuBLAS for these
				}
				if err := skinnyCase(s, dt, nk[0], nk[1]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func skinnyCase(s *SkinnyGEMM, dt mlxc.Dtype, N, K int) error {
	so := mlxc.NewScope()
	defer so.Close()
	w := mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(uint64(N*7+K)))
	x16 := mlxc.Normal([]int{16, K}, dt, 0, 1, mlxc.RandomKey(uint64(K)))
	y2 := s.Apply(mlxc.SliceAxis(x16, 0, 0, 2), w)
	for _, M := range []int{1, 2, 3, 4, 5, 8, 9, 16} {
		if M < s.minRows {
			continue
		}
		sc := mlxc.NewScope()
		x := mlxc.SliceAxis(x16, 0, 0, M)
		if !s.Fits(x, w) {
			return fmt.Errorf("%v M=%d N=%d K=%d does not fit", dt, M, N, K)
		}
		y := s.Apply(x, w)
		ref := mlxc.Matmul(mlxc.AsType(x, mlxc.Float32), mlxc.Transpose(mlxc.AsType(w, mlxc.Float32)))
		got, want := mlxc.AsType(y, mlxc.Float32).Float32s(), ref.Float32s()
		for i := range want {
			tol := math.Abs(float64(want[i]))/128 + 1e-3
			if d := math.Abs(float64(got[i] - want[i])); d > tol || math.IsNaN(float64(got[i])) {
				sc.Close()
				return fmt.Errorf("%v M=%d N=%d K=%d: y[%d] = %g, want %g", dt, M, N, K, i, got[i], want[i])
			}
		}
		{
			// The tensor-core layout (DFLASH_TC_TILED=1) reads the same terms in the same
			// order: bit for bit the row-major result, for the pipelined loop too.
			var st TCState
			s.tiled = true
			yt := s.ApplyOwned(x, w, &st)
			c := s.configFor(N, K).resolve(N, K)
			c.Pipe, c.Tiled = !c.Pipe, true
			yp := s.applyTC(x, st.tiled, tcFusion{}, c, N, &st)[0]
			s.tiled = false
			err := sameBits(fmt.Sprintf("%v M=%d N=%d K=%d tiled", dt, M, N, K), yt, y)
			if err == nil {
				err = sameBits(fmt.Sprintf("%v M=%d N=%d K=%d tiled, pipelined %v", dt, M, N, K, c.Pipe), yp, y)
			}
			st.Free()
			if err != nil {
				sc.Close()
				return err
			}
		}
		r := min(M, 2)
		first := mlxc.AsType(mlxc.SliceAxis(y, 0, 0, r), mlxc.Float32).Float32s()
		two := mlxc.AsType(mlxc.SliceAxis(y2, 0, 0, r), mlxc.Float32).Float32s()
		for i := range two {
			if math.Float32bits(first[i]) != math.Float32bits(two[i]) {
				sc.Close()
				return fmt.Errorf("%v M=%d N=%d K=%d: row %d col %d differs from the 2-row call", dt, M, N, K, i/N, i%N)
			}
		}
		sc.Close()
	}
	return nil
}

// On CUDA: the split launch (K cut over blocks, the chunks summed by the last block of each
// column tile) equals a float32 product up to the output's rounding, for automatic and
// explicit splits, uneven chunks, the pipelined loop and the tensor-core layout; its rows
// do not depend on the row count (1, 2, 5 and 16 rows agree bit for bit); and calling it
// again gives the same bits, so the per-tile counts are back at zero after every call.
func TestSkinnySplitMatchesMatmul(t *testing.T) {
	if !mlxc.CUDAKernelsAvailable() {
		t.Skip("needs the CUDA backend and a GPU")
	}
	err := mlxc.Do(func() error {
		s := newSkinnyGEMM()
		if s == nil {
			return fmt.Errorf("no kernel on a CUDA machine")
		}
		defer s.Free()
		for _, nk := range [][2]int{{2560, 4096}, {1024, 2560}, {4096, 2560}, {2560, 9728}, {96, 1056}, {64, 96}} {
			N, K := nk[0], nk[1]
			for _, c := range []tcConfig{{Tiles: 2, Warps: 4, Unroll: 4, Split: tcSplitAuto}, {Tiles: 4, Warps: 4, Unroll: 4, Pipe: true, Split: tcSplitAuto},
				{Tiles: 1, Warps: 4, Unroll: 2, Split: 3}, {Tiles: 2, Warps: 8, Unroll: 2, Split: 7}, {Tiles: 2, Warps: 4, Unroll: 4, Split: 5, Tiled: true}} {
				if c = c.resolve(N, K); !c.fits(N, K) || c.Split < 2 {
					continue
				}
				if err := splitCase(s, c, mlxc.BFloat16, N, K); err != nil {
					return err
				}
			}
		}
		return splitCase(s, tcConfig{Tiles: 2, Warps: 4, Unroll: 4, Split: 8}, mlxc.Float16, 2560, 4096)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func splitCase(s *SkinnyGEMM, c tcConfig, dt mlxc.Dtype, N, K int) error {
	so := mlxc.NewScope()
	defer so.Close()
	name := fmt.Sprintf("%v N=%d K=%d %+v", dt, N, K, c)
	w := mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(uint64(N*7+K)))
	if c.Tiled {
		w = tcTile(w)
	}
	x16 := mlxc.Normal([]int{16, K}, dt, 0, 1, mlxc.RandomKey(uint64(K)))
	var st TCState
	defer st.Free()
	y16 := s.applyTC(x16, w, tcFusion{}, c, N, &st)[0]
	again := s.applyTC(x16, w, tcFusion{}, c, N, &st)[0]
	var ref *mlxc.Array
	if c.Tiled {
		ref = mlxc.Matmul(mlxc.AsType(x16, mlxc.Float32), mlxc.AsType(untile(w, N, K), mlxc.Float32))
	} else {
		ref = mlxc.Matmul(mlxc.AsType(x16, mlxc.Float32), mlxc.Transpose(mlxc.AsType(w, mlxc.Float32)))
	}
	got, want := mlxc.AsType(y16, mlxc.Float32).Float32s(), ref.Float32s()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > math.Abs(float64(want[i]))/128+1e-3 || math.IsNaN(float64(got[i])) {
			return fmt.Errorf("%s: y[%d] = %g, want %g", name, i, got[i], want[i])
		}
	}
	if err := sameBits(name+" called again", again, y16); err != nil {
		return err
	}
	for _, M := range []int{1, 2, 5} {
		y := s.applyTC(mlxc.SliceAxis(x16, 0, 0, M), w, tcFusion{}, c, N, &st)[0]
		if err := sameBits(fmt.Sprintf("%s rows %d", name, M), y, mlxc.SliceAxis(y16, 0, 0, M)); err != nil {
			return err
		}
	}
	// Two products of the weight with no data path between them, evaluated in one graph
	// (MLX may run such kernels at the same time): each must still be right.
	xb := mlxc.Normal([]int{16, K}, dt, 0, 1, mlxc.RandomKey(uint64(K+1)))
	ya, yb := s.applyTC(x16, w, tcFusion{}, c, N, &st)[0], s.applyTC(xb, w, tcFusion{}, c, N, &st)[0]
	mlxc.Eval(ya, yb)
	if err := sameBits(name+" beside another product", ya, y16); err != nil {
		return err
	}
	if err := sameBits(name+" the other product", yb, s.applyTC(xb, w, tcFusion{}, c, N, &st)[0]); err != nil {
		return err
	}
	return nil
}

// untile turns tcTile's layout back into Wᵀ [K, N] (for a reference product).
func untile(t *mlxc.Array, N, K int) *mlxc.Array {
	w := mlxc.Reshape(t, N/8, K/32, 8, 4, 8) // [nt, s, g, t, e]: lane 4g+t (tcTile)
	w = mlxc.Transpose(w, 0, 2, 1, 3, 4)     // [nt, g, s, t, e]: row 8nt+g, k = 32s+8t+e
	return mlxc.Transpose(mlxc.Reshape(w, N, K))
}

// TestSkinnyTCSweep measures the tensor-core kernel's launch shapes on the Qwen3-4B
// products (DFLASH_TC_SWEEP=1 on a CUDA GPU; a tuning aid): effective weight bandwidth in
// GB/s, the median of 3 passes of 40 back-to-back products over 4 weight copies (more than
// L2 holds), for 1 and 16 rows, next to MLX's own matmul, and the best shape per line
// (tiles/warps/unroll, "p" for the software-pipelined loop, "sNkM" for N stages of
// M-column tiles through shared memory). Each
// shape's values are checked against a float32 product first ("bad" if off), so a shape
// picked from here is one whose results were seen right.
func TestSkinnyTCSweep(t *testing.T) {
	if os.Getenv("DFLASH_TC_SWEEP") != "1" {
		t.Skip("DFLASH_TC_SWEEP=1 on a CUDA GPU")
	}
	const reps, copies, passes = 40, 4, 3
	onCUDA(t, func() error {
		s := newSkinnyGEMM()
		defer s.Free()
		s.minRows = 1
		for _, nk := range [][2]int{{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}} {
			N, K := nk[0], nk[1]
			sc := mlxc.NewScope()
			ws := make([]*mlxc.Array, copies)
			for i := range ws {
				ws[i] = mlxc.Normal([]int{N, K}, mlxc.BFloat16, 0, 0.05, mlxc.RandomKey(uint64(i)))
			}
			mlxc.Eval(ws...)
			bytes := float64(reps) * float64(N) * float64(K) * 2
			for _, M := range []int{1, 16} {
				x := mlxc.Normal([]int{M, K}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(9))
				want := mlxc.Matmul(mlxc.AsType(x, mlxc.Float32), mlxc.Transpose(mlxc.AsType(ws[0], mlxc.Float32)))
				mlxc.Eval(x, want)
				run := func(f func(w *mlxc.Array) *mlxc.Array) (float64, error) {
					var gbs []float64
					err := mlxc.Catch(func() {
						for pass := range passes + 1 { // the first pass compiles
							ps := mlxc.NewScope()
							ys := make([]*mlxc.Array, reps)
							start := time.Now()
							for i := range ys {
								ys[i] = f(ws[i%copies])
							}
							mlxc.Eval(ys...)
							mlxc.Synchronize(mlxc.DefaultStream())
							if pass > 0 {
								gbs = append(gbs, bytes/time.Since(start).Seconds()/1e9)
							}
							ps.Close()
						}
					})
					slices.Sort(gbs)
					if len(gbs) == 0 {
						return 0, err
					}
					return gbs[len(gbs)/2], err
				}
				line := fmt.Sprintf("N=%d K=%d M=%d:", N, K, M)
				ref, _ := run(func(w *mlxc.Array) *mlxc.Array { return mlxc.Matmul(x, mlxc.Transpose(w)) })
				line += fmt.Sprintf(" mlx %.0f |", ref)
				best, bestName := 0.0, ""
				for _, tiles := range []int{1, 2, 4} {
					for _, warps := range []int{4, 8, 16} {
						for _, v := range []struct {
							u          int
							pipe       bool
							stages, kt int
						}{{2, false, 0, 0}, {4, false, 0, 0}, {2, true, 0, 0}, {4, true, 0, 0},
							{0, false, 3, 512 / tiles}, {0, false, 4, 512 / tiles}, {0, false, 3, 1024 / tiles}} {
							c := tcConfig{Tiles: tiles, Warps: warps, Unroll: v.u, Pipe: v.pipe, Stages: v.stages, KT: v.kt}
							if !c.fits(N, K) || (v.stages == 0 && (K/32)/v.u < warps/2) || (v.pipe && tiles*v.u > 8 && warps > 8) {
								continue // does not fit, warps left without work, or more registers than a block may hold
							}
							name := fmt.Sprintf("%d/%d/%d", tiles, warps, v.u)
							switch {
							case v.stages > 0:
								name = fmt.Sprintf("%d/%d/s%dk%d", tiles, warps, v.stages, v.kt)
							case v.pipe:
								name += "p"
							}
							var bad bool
							err := mlxc.Catch(func() {
								got := mlxc.AsType(s.applyTC(x, ws[0], tcFusion{}, c, N, nil)[0], mlxc.Float32).Float32s()
								w := want.Float32s()
								for i := range w {
									if d := math.Abs(float64(got[i] - w[i])); d > math.Abs(float64(w[i]))/128+1e-3 || math.IsNaN(float64(got[i])) {
										bad = true
										break
									}
								}
							})
							if err != nil || bad {
								line += " " + name + " bad"
								continue
							}
							g, err := run(func(w *mlxc.Array) *mlxc.Array { return s.applyTC(x, w, tcFusion{}, c, N, nil)[0] })
							if err != nil {
								line += " " + name + " err"
								continue
							}
							line += fmt.Sprintf(" %s %.0f", name, g)
							if g > best {
								best, bestName = g, name
							}
						}
					}
				}
				t.Logf("%s | best %s %.0f", line, bestName, best)
			}
			sc.Close()
		}
		return nil
	})
}

// On CUDA: the fused product (ApplyFused) gives the separate nodes' values bit for bit —
// r + x·Wᵀ as MLX's Add of the product — on the Qwen3-4B shapes of o, down, q/k/v and the
// drafter's k/v (split, pipelined and one-tile launches), with 1, 3 and 16 rows, in bf16
// and f16; and Linear's ApplyAdd uses it.
func TestFusedProductsMatchSeparate(t *testing.T) {
	onFusionKernels(t, func(s *SkinnyGEMM, f *Fused) error {
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16} {
			for _, nk := range [][2]int{{2560, 4096}, {2560, 9728}, {6144, 2560}, {1024, 2560}, {96, 1056}} {
				for _, M := range []int{1, 3, 16} {
					if err := fusedCase(s, dt, nk[0], nk[1], M); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// onFusionKernels runs test on the MLX thread (skipped off CUDA, see onCUDA) with the
// tensor-core product kernel, serving one-row products too (as in GPU-exact mode), and
// the fused layer kernels (GatedAct) for a 128-wide head; it frees them after.
func onFusionKernels(t *testing.T, test func(s *SkinnyGEMM, f *Fused) error) {
	t.Helper()
	onCUDA(t, func() error {
		s := newSkinnyGEMM()
		f := newFused(&Rope{Dims: 128, Base: 1e6, Scale: 1, MScale: 1}, 128, 1e-6)
		defer s.Free()
		defer f.Free()
		if s == nil || f == nil {
			return fmt.Errorf("no kernels on a CUDA machine")
		}
		s.minRows = 1
		return test(s, f)
	})
}

func fusedCase(s *SkinnyGEMM, dt mlxc.Dtype, N, K, M int) error {
	so := mlxc.NewScope()
	defer so.Close()
	name := fmt.Sprintf("%v N=%d K=%d rows %d", dt, N, K, M)
	seed := uint64(N*31 + K*7 + M)
	w := mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(seed))
	x := mlxc.Normal([]int{M, K}, dt, 0, 1, mlxc.RandomKey(seed+1))
	r := mlxc.Normal([]int{M, N}, dt, 0, 4, mlxc.RandomKey(seed+3))
	var st TCState
	defer st.Free()
	if !s.FitsFused(x, w, r) {
		return fmt.Errorf("%s: FitsFused disagrees with the shapes", name)
	}
	lin := &Linear{W: w, skinny: s}
	defer lin.tc.Free()
	cases := []struct {
		what      string
		got, want *mlxc.Array
	}{
		{"residual add", s.ApplyFused(x, w, r, &st), mlxc.Add(r, s.ApplyOwned(x, w, &st))},
		{"Linear.ApplyAdd", lin.ApplyAdd(x, r), mlxc.Add(r, s.ApplyOwned(x, w, &st))},
	}
	for _, c := range cases {
		if err := sameBits(name+" "+c.what, c.got, c.want); err != nil {
			return err
		}
	}
	return nil
}

// On CUDA: the gate/up product with the activation applied as it writes (ApplyAct) gives
// GatedAct of the plain product bit for bit, on the 4B shape's merged gate/up weight and a
// narrower one, with 1, 3 and 16 rows, bf16 and f16, from the row-major weight and from
// its tiled copy (tcTile: gate and up tiles far apart in it too); a weight whose launch
// splits K does not fit.
func TestActProductMatchesSeparate(t *testing.T) {
	onFusionKernels(t, func(s *SkinnyGEMM, f *Fused) error {
		so := mlxc.NewScope()
		defer so.Close()
		if w, x := mlxc.Zeros([]int{2048, 2560}, mlxc.BFloat16), mlxc.Zeros([]int{4, 2560}, mlxc.BFloat16); s.FitsAct(x, w) {
			return fmt.Errorf("FitsAct takes a weight whose launch splits K (%+v)", s.configFor(2048, 2560))
		}
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16} {
			for _, nk := range [][2]int{{19456, 2560}, {9728, 2560}} {
				N, K := nk[0], nk[1]
				w := mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(uint64(N+K)))
				for _, M := range []int{1, 3, 16} {
					x := mlxc.Normal([]int{M, K}, dt, 0, 1, mlxc.RandomKey(uint64(N+M)))
					if !s.FitsAct(x, w) {
						return fmt.Errorf("%v N=%d K=%d rows %d: FitsAct false", dt, N, K, M)
					}
					var st, tst TCState
					got := s.ApplyAct(x, w, &st)
					want := f.GatedAct(s.ApplyOwned(x, w, &st))
					s.tiled = true
					tiled := s.ApplyAct(x, w, &tst)
					s.tiled = false
					err := sameBits(fmt.Sprintf("%v N=%d K=%d rows %d", dt, N, K, M), got, want)
					if err == nil && tst.tiled == nil {
						err = fmt.Errorf("%v N=%d K=%d rows %d: no tiled copy made", dt, N, K, M)
					}
					if err == nil {
						err = sameBits(fmt.Sprintf("%v N=%d K=%d rows %d, tiled", dt, N, K, M), tiled, want)
					}
					st.Free()
					tst.Free()
					if err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// On CUDA: the norm fusion. The o and down projections' split launches write h = r + x·Wᵀ
// bit for bit as ApplyFused does; each row's RMSNorm scale within float32 rounding of
// rsqrt(mean(h²) + eps) computed in float64; and the norm xn bit for bit as MLX's ops with
// MLX's RMSNorm's roundings make it from those scales, within one rounding of MLX's
// RMSNorm itself (its sum of squares runs in another order) and nearly always equal. A
// row's h, scale and norm do not depend on the other rows (1, 3 and 16 rows of one block),
// and repeated launches on one weight (the barrier's counts reused) give the same values.
func TestNormFusion(t *testing.T) {
	onFusionKernels(t, func(s *SkinnyGEMM, _ *Fused) error {
		const eps = 1e-6
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16} {
			for _, nk := range [][2]int{{2560, 4096}, {2560, 9728}} {
				if err := normFusionCase(s, dt, nk[0], nk[1], eps); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func normFusionCase(s *SkinnyGEMM, dt mlxc.Dtype, N, K int, eps float32) error {
	so := mlxc.NewScope()
	defer so.Close()
	seed := uint64(N*13 + K)
	w := mlxc.Normal([]int{N, K}, dt, 0, 0.05, mlxc.RandomKey(seed))
	x16 := mlxc.Normal([]int{16, K}, dt, 0, 1, mlxc.RandomKey(seed+1))
	r16 := mlxc.Normal([]int{16, N}, dt, 0, 4, mlxc.RandomKey(seed+2))
	nw := mlxc.Normal([]int{N}, dt, 1, 0.2, mlxc.RandomKey(seed+3))
	var st TCState
	defer st.Free()
	var h16, xn16 *mlxc.Array
	var ys16 []float32
	ulp := float32(1.0 / 64) // two roundings apart at most
	if dt == mlxc.Float16 {
		ulp = 1.0 / 512
	}
	// Rows 16, 3, 1, then 16 again: the launches share the weight's counts, so the
	// barrier's reset between launches is exercised too.
	for i, M := range []int{16, 3, 1, 16} {
		name := fmt.Sprintf("%v N=%d K=%d rows %d (call %d)", dt, N, K, M, i)
		x, r := mlxc.SliceAxis(x16, 0, 0, M), mlxc.SliceAxis(r16, 0, 0, M)
		if !s.FitsNormOut(x, w, r, nw) || s.FitsNormOut(x, w, nil, nw) || s.FitsNormOut(x, w, r, nil) {
			return fmt.Errorf("%s: FitsNormOut disagrees (launch %+v)", name, s.configFor(N, K))
		}
		h, xn := s.ApplyAddNorm(x, w, r, nw, eps, &st)
		mlxc.Eval(h, xn)
		sv := st.scales(s.configFor(N, K), N, M) // before the next launch on st overwrites them
		if err := sameBits(name+" h", h, s.ApplyFused(x, w, r, &st)); err != nil {
			return err
		}
		if h16 == nil {
			h16, xn16, ys16 = h, xn, sv
		} else {
			for _, c := range []struct {
				what      string
				got, want *mlxc.Array
			}{{"h", h, h16}, {"norm", xn, xn16}} {
				if err := sameBits(name+" "+c.what+" of the first rows", c.got, mlxc.SliceAxis(c.want, 0, 0, M)); err != nil {
					return err
				}
			}
			for m := range M {
				if math.Float32bits(sv[m]) != math.Float32bits(ys16[m]) {
					return fmt.Errorf("%s: row %d scale %g, %g with 16 rows", name, m, sv[m], ys16[m])
				}
			}
		}
		hv := mlxc.AsType(h, mlxc.Float32).Float32s()
		for m := 0; m < M; m++ {
			var ss float64
			for _, v := range hv[m*N : (m+1)*N] {
				ss += float64(v) * float64(v)
			}
			want := 1 / math.Sqrt(ss/float64(N)+float64(eps))
			if d := math.Abs(float64(sv[m]) - want); d > 2e-6*want {
				return fmt.Errorf("%s: row %d scale %g, want %g", name, m, sv[m], want)
			}
		}
		// The norm from those scales with MLX's ops and MLX's RMSNorm's roundings: T(h·s),
		// then T(nw·that), bit for bit.
		hs := mlxc.AsType(mlxc.Multiply(mlxc.AsType(h, mlxc.Float32), mlxc.FromSlice(sv, M, 1)), dt)
		want := mlxc.AsType(mlxc.Multiply(mlxc.AsType(hs, mlxc.Float32), mlxc.AsType(nw, mlxc.Float32)), dt)
		if err := sameBits(name+" norm", xn, want); err != nil {
			return err
		}
		lin := &Linear{W: w, skinny: s}
		lh, normed := lin.ApplyAddNorm(x, r, nw, eps)
		err := sameBits(name+" Linear.ApplyAddNorm", lh, h)
		if err == nil {
			err = sameBits(name+" Linear.ApplyAddNorm's norm", normed.X(), xn)
		}
		lin.tc.Free()
		if err != nil {
			return err
		}
		// Against MLX's RMSNorm: within one rounding, and nearly always equal.
		got, ref := mlxc.AsType(xn, mlxc.Float32).Float32s(), mlxc.AsType(mlxc.RMSNorm(h, nw, eps), mlxc.Float32).Float32s()
		differ := 0
		for i := range got {
			if got[i] == ref[i] {
				continue
			}
			differ++
			if d := got[i] - ref[i]; d > ulp*abs32(ref[i]) || -d > ulp*abs32(ref[i]) {
				return fmt.Errorf("%s: normed element %d %g, MLX's RMSNorm %g", name, i, got[i], ref[i])
			}
		}
		if differ > len(got)/50 {
			return fmt.Errorf("%s: %d of %d normed elements differ from MLX's RMSNorm", name, differ, len(got))
		}
	}
	return nil
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}
