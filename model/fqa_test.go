package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// onKernelGPU runs f on the MLX thread where the kernels with Metal twins run: on a GPU
// with custom CUDA kernels, or Metal's. It skips elsewhere (the CPU).
func onKernelGPU(t *testing.T, f func() error) {
	t.Helper()
	if !mlxc.CUDAKernelsAvailable() && !mlxc.MetalKernelsAvailable() {
		t.Skip("needs a GPU with MLX's custom CUDA or Metal kernels")
	}
	gpu := false
	if err := mlxc.Do(func() error { gpu = mlxc.CurrentDevice().GPU; return nil }); err != nil {
		t.Fatal(err)
	}
	if !gpu {
		t.Skip("no GPU device selected (DFLASH_DEVICE)")
	}
	if err := mlxc.Do(f); err != nil {
		t.Fatal(err)
	}
}

// On a GPU (the CUDA kernel or its Metal twin): causal blocks (verify) and full blocks
// (drafts), GQA, a key count that is not a multiple of the 32-key tile, queries given as a
// transposed view and keys as a view into a larger cache buffer, all against MLX's
// attention.
func TestFewQueryAttentionMatchesSDPA(t *testing.T) {
	onKernelGPU(t, func() error {
		a := newFewQueryAttention()
		if a == nil {
			return fmt.Errorf("newFewQueryAttention: nil on a GPU with custom kernels")
		}
		defer a.Free()
		for _, c := range []struct{ H, Hkv, L, n, D int }{
			{4, 4, 2, 2, 32}, {32, 8, 16, 16, 128}, {32, 8, 16, 100, 128}, {32, 8, 7, 1000, 128}, {16, 2, 16, 4099, 64},
		} {
			for _, causal := range []bool{true, false} {
				s := mlxc.NewScope()
				D := c.D
				scale := float32(1 / math.Sqrt(float64(D)))
				// q as [1, L, H, D] transposed to [1, H, L, D], like the model's.
				q := mlxc.Transpose(mlxc.Normal([]int{1, c.L, c.H, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(c.n))), 0, 2, 1, 3)
				buf := mlxc.Normal([]int{1, c.Hkv, c.n + 300, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(c.n+1)))
				vbuf := mlxc.Normal([]int{1, c.Hkv, c.n + 300, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(c.n+2)))
				mlxc.Eval(q, buf, vbuf)
				k, v := mlxc.SliceAxis(buf, 2, 0, c.n), mlxc.SliceAxis(vbuf, 2, 0, c.n)
				visible := c.n
				if causal {
					visible = c.n - c.L // the block is the last L keys
				}
				sa := mlxc.Scalar(float64(scale), mlxc.Float32)
				got := mlxc.Reshape(a.Apply(q, k, v, sa, Visible(visible), causal, 0), 1, c.L, -1, q.Dim(3)) // [1, L, H, D]
				mode := mlxc.MaskNone
				if causal {
					mode = mlxc.MaskCausal
				}
				want := mlxc.Transpose(mlxc.ScaledDotProductAttention(q, k, v, scale, mode, nil, nil), 0, 2, 1, 3)
				if causal && c.L > 1 {
					// GPU-exact mode: each row of the block equals a one-query call at its
					// position (the decode step there), bit for bit.
					a.minQueries = 1
					for i := 0; i < c.L; i += max(1, c.L/3) {
						one := mlxc.Reshape(a.Apply(mlxc.SliceAxis(q, 2, i, i+1), k, v, sa, Visible(visible+i), true, 0), 1, 1, -1, q.Dim(3))
						if err := sameBits(fmt.Sprintf("%+v row %d alone", c, i), one, mlxc.SliceAxis(got, 1, i, i+1)); err != nil {
							s.Close()
							return err
						}
					}
					a.minQueries = 2
				}
				g, w := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
				s.Close()
				for i := range w {
					if d := math.Abs(float64(g[i] - w[i])); d > 0.02+0.02*math.Abs(float64(w[i])) || math.IsNaN(float64(g[i])) {
						return fmt.Errorf("%+v causal %v: out[%d] = %g, want %g", c, causal, i, g[i], w[i])
					}
				}
			}
		}
		return nil
	})
}

// On a GPU (CUDA or the Metal twins): the split-key kernels against MLX's attention for
// key counts from 1 to 64k (chunk edges included), GQA ratios 1–8, head sizes 64/128/256,
// 1–64 queries, causal (verify) and not (drafts), with keys as views into a larger buffer;
// and each row of a causal block equals, bit for bit, a one-query call at its position
// (GPU-exact mode's promise), and so does the same block with more chunks than its keys
// need. On CUDA both forms of pass 1 run: the scalar one and the tensor-core one.
func TestSplitKeysMatchesSDPA(t *testing.T) {
	for _, mma := range []bool{false, true} {
		name := "scalar"
		if mma {
			name = "tensor cores"
		}
		t.Run(name, func(t *testing.T) {
			if mma && !mlxc.CUDAKernelsAvailable() {
				t.Skip("the tensor-core pass 1 is CUDA's")
			}
			onKernelGPU(t, func() error { return splitKeysCases(mma) })
		})
	}
}

// splitKeysCases runs checkSplitKeys over the shapes, with pass 1 on tensor cores if mma.
func splitKeysCases(mma bool) error {
	a := newFewQueryAttention()
	if a == nil {
		return fmt.Errorf("newFewQueryAttention: nil on a GPU with custom kernels")
	}
	defer a.Free()
	a.splitFrom, a.minQueries = 1, 1
	if mma {
		if a.useSplitMMA(); a.splitMMA == nil {
			return fmt.Errorf("useSplitMMA made no kernel on CUDA")
		}
	}
	type shape struct{ Hkv, G, L, n, D int }
	var cases []shape
	for _, n := range []int{1, 31, 256, 257, 1000, 4099, 32768} {
		for _, g := range []int{1, 2, 4, 8} {
			for _, D := range []int{64, 128, 256} {
				for _, L := range []int{1, 5, 16} {
					if n >= L && (n < 32768 || (D == 128 && g == 4)) {
						cases = append(cases, shape{8 / min(g, 4), g, L, n, D})
					}
				}
			}
		}
	}
	// And blocks of more rows than a launch's warps hold at once (G·L past 64).
	cases = append(cases, shape{8, 4, 16, 65536, 128}, shape{2, 8, 16, 65536, 256}, shape{2, 4, 64, 1000, 128}, shape{1, 8, 40, 4099, 64})
	for _, c := range cases {
		for _, causal := range []bool{true, false} {
			if err := checkSplitKeys(a, c.Hkv, c.G, c.L, c.n, c.D, causal); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSplitKeys compares one split-key launch with SDPA and, causal, its rows with
// one-query launches.
func checkSplitKeys(a *FewQueryAttention, Hkv, G, L, n, D int, causal bool) error {
	s := mlxc.NewScope()
	defer s.Close()
	H := Hkv * G
	name := fmt.Sprintf("Hkv %d G %d L %d keys %d D %d causal %v", Hkv, G, L, n, D, causal)
	scale := float32(1 / math.Sqrt(float64(D)))
	seed := uint64(n*31 + G*7 + L*3 + D)
	q := mlxc.Transpose(mlxc.Normal([]int{1, L, H, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(seed)), 0, 2, 1, 3)
	buf := mlxc.Normal([]int{1, Hkv, n + 77, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(seed+1))
	vbuf := mlxc.Normal([]int{1, Hkv, n + 77, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(seed+2))
	mlxc.Eval(q, buf, vbuf)
	k, v := mlxc.SliceAxis(buf, 2, 0, n), mlxc.SliceAxis(vbuf, 2, 0, n)
	visible := n
	if causal {
		visible = n - L
	}
	sa := mlxc.Scalar(float64(scale), mlxc.Float32)
	got := mlxc.Reshape(a.Apply(q, buf, vbuf, sa, Visible(visible), causal, n), 1, L, -1, D)
	mode := mlxc.MaskNone
	if causal && L > 1 {
		mode = mlxc.MaskCausal
	}
	want := mlxc.Transpose(mlxc.ScaledDotProductAttention(q, k, v, scale, mode, nil, nil), 0, 2, 1, 3)
	if causal {
		// More chunks than the keys need (a placed block's window): the same bits.
		wide := mlxc.Reshape(a.Apply(q, buf, vbuf, sa, Visible(visible), causal, n+77), 1, L, -1, D)
		if err := sameBits(name+" with a wider window", wide, got); err != nil {
			return err
		}
		for i := 0; i < L; i += max(1, L/3) {
			one := mlxc.Reshape(a.Apply(mlxc.SliceAxis(q, 2, i, i+1), buf, vbuf, sa, Visible(visible+i), true, visible+i+1), 1, 1, -1, D)
			if err := sameBits(fmt.Sprintf("%s row %d alone", name, i), one, mlxc.SliceAxis(got, 1, i, i+1)); err != nil {
				return err
			}
		}
	}
	g, w := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
	for i := range w {
		// bf16 outputs: a rounding of each, plus float32 sums in another order.
		if d := math.Abs(float64(g[i] - w[i])); d > 0.02+0.02*math.Abs(float64(w[i])) || math.IsNaN(float64(g[i])) {
			return fmt.Errorf("%s: out[%d] = %g, want %g", name, i, g[i], w[i])
		}
	}
	return nil
}

// BenchmarkAttentionKernels times the few-query and the split-key kernels on a Qwen3-4B
// layer's attention (32 query heads over 8 kv heads of 128) per key count, for a decode
// step (L = 1) and a verify block (L = 16): ten launches per evaluation. On CUDA only;
// DFLASH_SPLIT_KEYS_FROM's default comes from it (docs/perf/attention.md).
func BenchmarkAttentionKernels(b *testing.B) {
	if !mlxc.CUDAKernelsAvailable() {
		b.Skip("needs the CUDA backend and a GPU")
	}
	const H, Hkv, D, calls = 32, 8, 128, 10
	for _, n := range []int{256, 512, 1024, 2048, 4096, 8192, 16384, 32768} {
		for _, L := range []int{1, 16} {
			for _, kind := range []string{"fqa", "split", "split-mma"} {
				split := kind != "fqa"
				b.Run(fmt.Sprintf("keys%d/L%d/%s", n, L, kind), func(b *testing.B) {
					err := mlxc.Do(func() error {
						a := newFewQueryAttention()
						defer a.Free()
						a.minQueries = 1
						if split {
							a.splitFrom = 1
						}
						if kind == "split-mma" {
							a.useSplitMMA()
						}
						s := mlxc.NewScope()
						defer s.Close()
						q := mlxc.Normal([]int{1, H, L, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(1))
						k := mlxc.Normal([]int{1, Hkv, n, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(2))
						v := mlxc.Normal([]int{1, Hkv, n, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(3))
						vis := OnDevice(Visible(n - L))
						sa := OnDeviceConst(mlxc.Scalar(1/math.Sqrt(D), mlxc.Float32))
						mlxc.Eval(q, k, v, vis, sa)
						run := func() {
							it := mlxc.NewScope()
							outs := make([]*mlxc.Array, calls)
							for i := range outs {
								outs[i] = a.Apply(q, k, v, sa, vis, true, n)
							}
							mlxc.Eval(outs...)
							it.Close()
						}
						run()
						b.ResetTimer()
						for range b.N {
							run()
						}
						b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*calls), "us/launch")
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}
