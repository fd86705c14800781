package model

import (
	"fmt"
	"math"
	"time"

	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// KernelChecks are the first-use self-checks of the kernels this package launches on both
// backends (CUDA and the Metal twins): each runs its layer operation on small random
// inputs against the operation's MLX ops and reports a disagreement beyond the contract's
// bound, or a failure to build or run, as an error. kernelcheck.Gate runs them (MLX
// thread) before a model is loaded; the GPU tests run the same operations over many more
// shapes.
func KernelChecks() []kernelcheck.Check {
	return []kernelcheck.Check{
		{Name: "few-query attention", Kernels: []kernels.Kernel{kernels.FewQueryAttention},
			Wanted: func(k settings.Kernels) bool { return k.FQA }, Run: func() error { return checkAttention(false, false) },
			Speed: func() (float64, float64, error) { return attentionSpeed(false, false) }},
		{Name: "split-key attention", Kernels: []kernels.Kernel{kernels.SplitKeys, kernels.SplitKeysMerge},
			Wanted: func(k settings.Kernels) bool { return k.FQA && k.SplitKeysFrom > 0 }, Run: func() error { return checkAttention(true, false) },
			Speed: func() (float64, float64, error) { return attentionSpeed(true, false) }},
		{Name: "split-key attention on tensor cores", Kernels: []kernels.Kernel{kernels.SplitKeysMMA},
			Wanted: func(k settings.Kernels) bool { return k.FQA && k.SplitKeysFrom > 0 && k.SplitKeysMMA },
			Run:    func() error { return checkAttention(true, true) },
			Speed:  func() (float64, float64, error) { return attentionSpeed(true, true) }},
		{Name: "greedy verdict argmax", Kernels: []kernels.Kernel{kernels.RowArgmax, kernels.RowLead},
			Wanted: func(k settings.Kernels) bool { return k.ArgmaxKernel }, Run: checkArgmax, Speed: argmaxSpeed},
		{Name: "small-M quantized product", Kernels: []kernels.Kernel{kernels.QuantMatmulSmallM},
			Wanted: qmmWanted, Run: checkQMM, Speed: qmmSpeed, Quantized: true},
	}
}

// caught runs f in a scope and turns MLX's exceptions (a kernel that does not compile
// throws at its first call) into an error.
func caught(f func() error) (err error) {
	s := mlxc.NewScope()
	defer s.Close()
	if cerr := mlxc.Catch(func() { err = f() }); cerr != nil {
		return cerr
	}
	return err
}

// near reports the first element where got and want differ by more than abs + rel·|want|
// (NaN in got counts as a difference).
func nearAll(what string, got, want *mlxc.Array, abs, rel float64) error {
	g, w := mlxc.AsType(got, mlxc.Float32).Float32s(), mlxc.AsType(want, mlxc.Float32).Float32s()
	if len(g) != len(w) {
		return fmt.Errorf("%s: %d elements, want %d", what, len(g), len(w))
	}
	for i := range w {
		if d := math.Abs(float64(g[i] - w[i])); d > abs+rel*math.Abs(float64(w[i])) || math.IsNaN(float64(g[i])) {
			return fmt.Errorf("%s: element %d = %g, want %g", what, i, g[i], w[i])
		}
	}
	return nil
}

// checkAttention runs a causal verify block and a draft block of the few-query (or, with
// split, the split-key kernels; with mma too, pass 1 on tensor cores) over 300 keys
// against MLX's attention, within the bound
// TestFewQueryAttentionMatchesSDPA states for bfloat16 attention.
func checkAttention(split, mma bool) error {
	return caught(func() error {
		a := newFewQueryAttention()
		if a == nil {
			return fmt.Errorf("no kernel backend here")
		}
		defer a.Free()
		if split {
			a.splitFrom = 1
		}
		if mma {
			a.useSplitMMA()
		}
		const H, Hkv, L, n, D = 8, 2, 5, 300, 64
		scale := float32(1 / math.Sqrt(D))
		q := mlxc.Normal([]int{1, H, L, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(11))
		k := mlxc.Normal([]int{1, Hkv, n, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(12))
		v := mlxc.Normal([]int{1, Hkv, n, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(13))
		sa := mlxc.Scalar(float64(scale), mlxc.Float32)
		for _, causal := range []bool{true, false} {
			visible, mode := n, mlxc.MaskNone
			if causal {
				visible, mode = n-L, mlxc.MaskCausal
			}
			got := mlxc.Reshape(a.Apply(q, k, v, sa, Visible(visible), causal, 0), 1, L, H, D)
			want := mlxc.Transpose(mlxc.ScaledDotProductAttention(q, k, v, scale, mode, nil, nil), 0, 2, 1, 3)
			if err := nearAll(fmt.Sprintf("attention (causal %v)", causal), got, want, 0.02, 0.02); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkArgmax: each row's argmax (with a planted tie and a NaN-free row of equal
// maxima), with and without the log-softmax subtraction, the drafts' matches and the
// leading count, exactly as MLX's ops give them.
func checkArgmax() error {
	return caught(func() error {
		a := NewRowArgmax(settings.Kernels{ArgmaxKernel: true, Mode: settings.KernelsTrust})
		if a == nil {
			return fmt.Errorf("no kernel backend here")
		}
		defer a.Free()
		const R, V = 5, 3001
		logits := mlxc.Normal([]int{R, V}, mlxc.BFloat16, 0, 3, mlxc.RandomKey(21))
		lse := mlxc.LogSumExp(logits, []int{1}, true)
		want := mlxc.AsType(mlxc.Argmax(logits, 1, false), mlxc.Int32).Int32s()
		wantSub := mlxc.AsType(mlxc.Argmax(mlxc.Subtract(logits, lse), 1, false), mlxc.Int32).Int32s()
		drafts := mlxc.FromSlice([]int32{want[0], want[1], want[2] + 1, want[3]}, R-1)
		next, match := a.Of(logits, nil, drafts)
		nextSub, _ := a.Of(logits, lse, nil)
		accepted, tok := a.Leading(next, match)
		g, gs := next.Int32s(), nextSub.Int32s()
		mi := mlxc.AsType(match, mlxc.Int32).Int32s()
		m := []bool{mi[0] != 0, mi[1] != 0, mi[2] != 0, mi[3] != 0}
		for i := range want {
			if g[i] != want[i] || gs[i] != wantSub[i] {
				return fmt.Errorf("row %d: argmax %d and %d (after the subtraction), want %d and %d", i, g[i], gs[i], want[i], wantSub[i])
			}
		}
		if !m[0] || !m[1] || m[2] || !m[3] {
			return fmt.Errorf("draft matches %v, want [true true false true]", m)
		}
		if acc, tk := accepted.Int32s()[0], tok.Int32s()[0]; acc != 2 || tk != want[2] {
			return fmt.Errorf("leading: %d accepted, token %d; want 2 and %d", acc, tk, want[2])
		}
		return nil
	})
}

// checkQMM runs 4-bit and 8-bit products of 3 and 16 rows against MLX's quantized_matmul,
// within 2⁻⁶ of the output's largest magnitude plus 2⁻⁶ relative (bfloat16 rounding of
// both sides; a wrong group, scale or index is off by the size of a whole term).
func checkQMM() error {
	return caught(func() error {
		o := NewSmallMQuantMatmul(settings.Kernels{QMMKernel: settings.On, Mode: settings.KernelsTrust})
		if o == nil {
			return fmt.Errorf("no kernel backend here")
		}
		defer o.Free()
		const N, K = 264, 512
		w := mlxc.Normal([]int{N, K}, mlxc.BFloat16, 0, 0.05, mlxc.RandomKey(31))
		for _, bits := range []int{4, 8} {
			q := mlxc.Quantize(w, 64, bits, "affine")
			for _, M := range []int{3, 16} {
				x := mlxc.Normal([]int{M, K}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(32+M)))
				if !o.Fits(x, q) {
					return fmt.Errorf("%d-bit, %d rows: the kernel refuses its check's shape", bits, M)
				}
				got, want := o.Apply(x, q), mlxc.QuantizedMatmul(x, q, true)
				peak := 0.0
				for _, v := range mlxc.AsType(want, mlxc.Float32).Float32s() {
					peak = math.Max(peak, math.Abs(float64(v)))
				}
				if err := nearAll(fmt.Sprintf("%d-bit product of %d rows", bits, M), got, want, peak/64, 1.0/64); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// timePerCall is the seconds one evaluation of f takes: the mean of 20 calls
// after 3 warm-ups (the first builds the kernel), each evaluated on its own.
func timePerCall(f func() *mlxc.Array) float64 {
	for i := 0; i < 3; i++ {
		s := mlxc.NewScope()
		mlxc.Eval(f())
		s.Close()
	}
	const n = 20
	start := time.Now()
	for i := 0; i < n; i++ {
		s := mlxc.NewScope()
		mlxc.Eval(f())
		s.Close()
	}
	return time.Since(start).Seconds() / n
}

// speedPair times kernel and fallback on inputs made once, in a scope, MLX's exceptions
// as an error.
func speedPair(setup func() (kernel, fallback func() *mlxc.Array, free func())) (k, f float64, err error) {
	err = caught(func() error {
		kern, fb, free := setup()
		if free != nil {
			defer free()
		}
		k, f = timePerCall(kern), timePerCall(fb)
		return nil
	})
	return k, f, err
}

// attentionSpeed: a 16-query verify block of the 4B shape's heads over 2 048 keys (with
// split, 8 192 through the split-key kernels, pass 1 on tensor cores with mma) against
// MLX's attention.
func attentionSpeed(split, mma bool) (float64, float64, error) {
	return speedPair(func() (func() *mlxc.Array, func() *mlxc.Array, func()) {
		a := newFewQueryAttention()
		if a == nil {
			panic(&mlxc.Error{Op: "speed", Msg: "no kernel backend here"})
		}
		n := 2048
		if split {
			a.splitFrom, n = 1, 8192
		}
		if mma {
			a.useSplitMMA()
		}
		const H, Hkv, L, D = 32, 8, 16, 128
		scale := float32(1 / math.Sqrt(D))
		q := mlxc.Normal([]int{1, H, L, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(51))
		k := mlxc.Normal([]int{1, Hkv, n, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(52))
		v := mlxc.Normal([]int{1, Hkv, n, D}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(53))
		sa, vis := mlxc.Scalar(float64(scale), mlxc.Float32), Visible(n-L)
		mlxc.Eval(q, k, v, sa, vis)
		return func() *mlxc.Array { return a.Apply(q, k, v, sa, vis, true, 0) },
			func() *mlxc.Array { return mlxc.ScaledDotProductAttention(q, k, v, scale, mlxc.MaskCausal, nil, nil) },
			a.Free
	})
}

// argmaxSpeed: the greedy verdict of a 16-row block over Qwen3's vocabulary.
func argmaxSpeed() (float64, float64, error) {
	return speedPair(func() (func() *mlxc.Array, func() *mlxc.Array, func()) {
		a := NewRowArgmax(settings.Kernels{ArgmaxKernel: true, Mode: settings.KernelsTrust})
		if a == nil {
			panic(&mlxc.Error{Op: "speed", Msg: "no kernel backend here"})
		}
		logits := mlxc.Normal([]int{16, 151936}, mlxc.BFloat16, 0, 3, mlxc.RandomKey(61))
		mlxc.Eval(logits)
		return func() *mlxc.Array { next, _ := a.Of(logits, nil, nil); return next },
			func() *mlxc.Array { return mlxc.AsType(mlxc.Argmax(logits, 1, false), mlxc.Int32) },
			a.Free
	})
}

// qmmSpeed: a 16-row 4-bit product of the 4B shape's MLP (2 560 → 9 728, groups of 64).
func qmmSpeed() (float64, float64, error) {
	return speedPair(func() (func() *mlxc.Array, func() *mlxc.Array, func()) {
		o := NewSmallMQuantMatmul(settings.Kernels{QMMKernel: settings.On, Mode: settings.KernelsTrust})
		if o == nil {
			panic(&mlxc.Error{Op: "speed", Msg: "no kernel backend here"})
		}
		q := mlxc.Quantize(mlxc.Normal([]int{9728, 2560}, mlxc.BFloat16, 0, 0.02, mlxc.RandomKey(71)), 64, 4, "affine")
		x := mlxc.Normal([]int{16, 2560}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(72))
		mlxc.Eval(q.W, q.Scales, q.Biases, x)
		return func() *mlxc.Array { return o.Apply(x, q) },
			func() *mlxc.Array { return mlxc.QuantizedMatmul(x, q, true) },
			o.Free
	})
}
