package deltanet

import (
	"fmt"
	"math"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// The kernels against the ops path. Tolerance: the recurrence kernel sums S·k and S·q over
// Dk in its own fixed order (per lane, then a butterfly), MLX's reductions in theirs, so
// each sum may differ by float32 rounding (≲ Dk·2⁻²⁴·Σ|terms|, about 1e-6 here). δ carries
// that into the state, where the delta rule (|g| ≤ 1, β < 1, |k| ≈ 1) does not amplify it
// over a block: state and δ must agree within 1e-4·(1 + |want|), a hundred times the
// expected error and far below what a wrong index or rounding point gives (O(|want|)). y
// is rounded to the input type at the end of each step, so a value near a rounding
// boundary may land one unit apart: y must agree within one ulp of its type (2⁻⁷ relative
// for bfloat16, 2⁻¹⁰ for float16) plus the float32 bound. The replay has no sums and
// rounds every element where the ops do: on CUDA it gives the ops path's bits (the Metal
// twin relies on the compiler's contraction switch, so there the float32 bound applies).

// onKernels runs fn on the MLX thread in a scope with the GPU kernels, and skips the test
// where there are none (the CPU backend, or MLX without custom CUDA or Metal kernels: the
// ops path runs there, which the other tests cover).
func onKernels(t *testing.T, fn func(kn *Kernels)) {
	t.Helper()
	if !mlxc.CUDAKernelsAvailable() && !mlxc.MetalKernelsAvailable() {
		t.Skip("needs a GPU with MLX's custom CUDA or Metal kernels; elsewhere the ops path runs")
	}
	var kn *Kernels
	if err := mlxc.Do(func() error { kn = NewKernels(settings.Default().Kernels); return nil }); err != nil {
		t.Fatal(err)
	}
	if kn == nil {
		t.Skip("no GPU device selected (DFLASH_DEVICE): the ops path runs")
	}
	do(t, func() {
		defer kn.Free()
		fn(kn)
	})
}

// ulp is the relative spacing of dt's values: the rounding of y to dt.
func ulp(dt mlxc.Dtype) float64 {
	switch dt {
	case mlxc.BFloat16:
		return 1.0 / 128
	case mlxc.Float16:
		return 1.0 / 1024
	}
	return 0
}

// near fails the test when some element of got is farther than rel·|want| + 1e-4·(1 +
// |want|) from want, or dtypes or shapes differ.
func near(t *testing.T, what string, got, want *mlxc.Array, rel float64) {
	t.Helper()
	if got.Dtype() != want.Dtype() || fmt.Sprint(got.Shape()) != fmt.Sprint(want.Shape()) {
		t.Errorf("%s: got %v %v, want %v %v", what, got.Dtype(), got.Shape(), want.Dtype(), want.Shape())
		return
	}
	g := mlxc.AsType(got, mlxc.Float32).Float32s()
	w := mlxc.AsType(want, mlxc.Float32).Float32s()
	bad, worst, at := 0, 0.0, 0
	for i := range g {
		d, wi := math.Abs(float64(g[i])-float64(w[i])), math.Abs(float64(w[i]))
		if tol := rel*wi + 1e-4*(1+wi); d > tol || math.IsNaN(float64(g[i])) != math.IsNaN(float64(w[i])) {
			bad++
			if d/tol > worst || math.IsNaN(d) {
				worst, at = d/tol, i
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d elements outside the tolerance, worst at %d (%g vs %g)", what, bad, len(g), at, g[at], w[at])
	}
}

// kernelGeometries are the shapes the GPU tests run: the Qwen3.5 layer's (Dk = Dv = 128,
// Hv = 2·Hk) for one token and a verify block, two batch rows, Dv not a multiple of the
// 4 rows per block, the smallest and largest Dk, and five rows (per-row replay counts).
var kernelGeometries = []geometry{
	{1, 1, 2, 4, 128, 128, 4},
	{1, 16, 2, 4, 128, 128, 4},
	{2, 16, 1, 2, 64, 32, 4},
	{5, 7, 1, 2, 32, 32, 4},
	{1, 5, 3, 3, 32, 7, 4},
	{1, 16, 2, 4, 256, 64, 4},
}

// recurrenceInputs draws recurrence operands of geometry g in dt (g and the state float32),
// with the gates from Gates as the layer computes them.
func recurrenceInputs(r *rng, g geometry, dt mlxc.Dtype) (q, k, v, gt, beta, state *mlxc.Array) {
	x := inputs(r, g)
	q, k = NormalizeQK(mlxc.AsType(x["q"], dt), mlxc.AsType(x["k"], dt))
	gt, beta = Gates(mlxc.AsType(x["a"], dt), mlxc.AsType(x["b"], dt), x["A_log"], mlxc.AsType(x["dt_bias"], dt))
	v = mlxc.AsType(x["v"], dt)
	mlxc.Eval(q, k, v, gt, beta)
	return q, k, v, gt, beta, x["state"]
}

// TestKernelRecurrenceMatchesOps: the recurrence kernel's y, state and tape against the ops
// path within the stated tolerance, for every input type and the test shapes; without the
// tape it gives the same bits as with it, and its tape's keys and decays are the inputs.
func TestKernelRecurrenceMatchesOps(t *testing.T) {
	onKernels(t, func(kn *Kernels) {
		r := newRNG(901)
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16, mlxc.Float32} {
			for _, g := range kernelGeometries {
				what := fmt.Sprintf("%v %v", dt, g)
				q, k, v, gt, beta, s0 := recurrenceInputs(r, g, dt)
				if !kn.RecurrenceFits(q, k, v, gt, beta, s0) {
					t.Errorf("%s: the kernel does not fit", what)
					continue
				}
				y, s, tape := kn.RecurrenceTape(q, k, v, gt, beta, s0)
				wy, ws, wtape := RecurrenceTape(q, k, v, gt, beta, s0)
				near(t, what+": y", y, wy, ulp(dt))
				near(t, what+": state", s, ws, 0)
				near(t, what+": tape δ", tape.Delta, wtape.Delta, 0)
				same(t, what+": tape k", tape.K, wtape.K)
				same(t, what+": tape g", tape.G, wtape.G)
				y2, s2 := kn.Recurrence(q, k, v, gt, beta, s0)
				same(t, what+": y without the tape", y2, y)
				same(t, what+": state without the tape", s2, s)
			}
		}
	})
}

// TestKernelReplayMatchesOps: the replay kernel for every host count 0..T and device counts
// −1..T+3 against the ops path's replay of the same tape (bit for bit on CUDA); and the
// replay of the kernel's own tape over all its steps is the recurrence kernel's state, bit
// for bit (the same element steps).
func TestKernelReplayMatchesOps(t *testing.T) {
	onKernels(t, func(kn *Kernels) {
		r := newRNG(902)
		check := func(what string, got, want *mlxc.Array) {
			if kn.Backend() == mlxc.KernelCUDA {
				same(t, what, got, want)
			} else {
				near(t, what, got, want, 0)
			}
		}
		for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16, mlxc.Float32} {
			for _, g := range kernelGeometries {
				what := fmt.Sprintf("%v %v", dt, g)
				q, k, v, gt, beta, s0 := recurrenceInputs(r, g, dt)
				_, s, tape := kn.RecurrenceTape(q, k, v, gt, beta, s0)
				if !kn.ReplayFits(s0, tape) {
					t.Errorf("%s: the replay kernel does not fit", what)
					continue
				}
				same(t, what+": replay of all steps against the recurrence", kn.Replay(s0, tape, g.T), s)
				for n := 0; n <= g.T; n++ {
					check(fmt.Sprintf("%s: replay %d", what, n), kn.Replay(s0, tape, n), Replay(s0, tape, n))
				}
				for n := -1; n <= g.T+3; n++ {
					c := mlxc.FromSlice([]int32{int32(n)}, 1)
					check(fmt.Sprintf("%s: replay at %d", what, n), kn.ReplayAt(s0, tape, c), ReplayAt(s0, tape, c))
				}
				// One count per row (a batched verify's accepted prefixes): row b reads
				// count[b], clamped.
				for _, shift := range []int{0, 3} {
					counts := make([]int32, g.B)
					for b := range counts {
						counts[b] = int32((b*5+shift)%(g.T+4) - 1)
					}
					c := mlxc.FromSlice(counts, g.B)
					check(fmt.Sprintf("%s: replay at %v per row", what, counts), kn.ReplayAt(s0, tape, c), ReplayAt(s0, tape, c))
				}
			}
		}
	})
}

// TestKernelCommitMatchesFresh: a mixer with the kernels, speculating a block of 16 rows
// and committing any prefix n (a host-count replay), and placing blocks at device
// positions (device-count replays), leaves the same state as a fresh cache that took only
// the kept rows through the same kernels, bit for bit: the kernel's steps do not depend on
// the block's length and its replay reproduces its state.
func TestKernelCommitMatchesFresh(t *testing.T) {
	onKernels(t, func(kn *Kernels) {
		g := geometry{1, 16, 2, 4, 128, 128, 4}
		for n := 0; n <= g.T; n++ {
			func() {
				sc := mlxc.NewScope()
				defer sc.Close()
				r := newRNG(903)
				m := mixerFor(r, g)
				m.Kernels = kn
				prefill := newStream(r, g, 5)
				block := newStream(r, g, g.T)
				next := newStream(r, g, g.T)
				spec, fresh, placed := NewCache(), NewCache(), NewCache()
				defer spec.Free()
				defer fresh.Free()
				defer placed.Free()
				for _, c := range []*Cache{spec, fresh, placed} {
					m.apply(prefill, c, nil)
				}
				spec.Speculate()
				m.apply(block, spec, nil)
				if err := spec.Commit(cache.Prefix(n)); err != nil {
					t.Errorf("commit %d: %v", n, err)
					return
				}
				if n > 0 {
					m.apply(block.rows(0, n), fresh, nil)
				}
				sameCache(t, fmt.Sprintf("commit %d", n), spec, fresh)
				// A block placed at the committed end, then one placed where the first
				// keeps n rows: the second starts from a device-count replay of the first.
				m.apply(block, placed, mlxc.FromSlice([]int32{5}, 1))
				m.apply(next, placed, mlxc.FromSlice([]int32{int32(5 + n)}, 1))
				if err := placed.SetOffset(5 + n); err != nil {
					t.Errorf("set offset %d: %v", 5+n, err)
					return
				}
				sameCache(t, fmt.Sprintf("placed, first block keeping %d", n), placed, fresh)
			}()
		}
	})
}

// TestKernelsFitAndFallback runs everywhere. A nil Kernels (what NewKernels gives off a GPU)
// fits nothing and its methods are the ops functions, bit for bit; and the fit tests refuse
// what the kernels cannot serve (Dk not a multiple of 32 or above 256, mixed or integer
// types, g or the state not float32, no steps, too many rows), which then runs the ops
// path: the Kernels value used here has no kernels built, so a launch would fail.
func TestKernelsFitAndFallback(t *testing.T) {
	do(t, func() {
		gpu := mlxc.CurrentDevice().GPU && (mlxc.CUDAKernelsAvailable() || mlxc.MetalKernelsAvailable())
		made := NewKernels(settings.Default().Kernels)
		if (made != nil) != gpu {
			t.Errorf("NewKernels made kernels %v on a GPU with custom kernels %v", made != nil, gpu)
		}
		made.Free()
		off := settings.Default().Kernels
		off.DeltaNetKernel = false
		if NewKernels(off) != nil {
			t.Errorf("NewKernels made kernels with DFLASH_DELTANET_KERNEL off")
		}

		r := newRNG(904)
		base := geometry{1, 4, 2, 4, 64, 16, 4}
		q, k, v, gt, beta, s0 := recurrenceInputs(r, base, mlxc.BFloat16)
		var none *Kernels
		if none.RecurrenceFits(q, k, v, gt, beta, s0) {
			t.Errorf("a nil Kernels fits")
		}
		wy, ws, wtape := RecurrenceTape(q, k, v, gt, beta, s0)
		y, s, tape := none.RecurrenceTape(q, k, v, gt, beta, s0)
		same(t, "nil: y", y, wy)
		same(t, "nil: state", s, ws)
		same(t, "nil: tape δ", tape.Delta, wtape.Delta)
		y, s = none.Recurrence(q, k, v, gt, beta, s0)
		same(t, "nil: y without tape", y, wy)
		same(t, "nil: state without tape", s, ws)
		if none.ReplayFits(s0, wtape) {
			t.Errorf("a nil Kernels fits a replay")
		}
		for n := 0; n <= base.T; n++ {
			same(t, fmt.Sprintf("nil: replay %d", n), none.Replay(s0, wtape, n), Replay(s0, wtape, n))
			c := mlxc.FromSlice([]int32{int32(n)}, 1)
			same(t, fmt.Sprintf("nil: replay at %d", n), none.ReplayAt(s0, wtape, c), ReplayAt(s0, wtape, c))
		}

		stub := &Kernels{} // fits like the real kernels, launches nothing
		if !stub.RecurrenceFits(q, k, v, gt, beta, s0) || !stub.ReplayFits(s0, wtape) {
			t.Errorf("the base shape %v should fit", base)
			return
		}
		type operands struct{ q, k, v, g, beta, state *mlxc.Array }
		refused := map[string]func() operands{
			"Dk 48": func() operands {
				a, b, c, d, e, f := recurrenceInputs(r, geometry{1, 4, 2, 4, 48, 16, 4}, mlxc.BFloat16)
				return operands{a, b, c, d, e, f}
			},
			"Dk 288": func() operands {
				a, b, c, d, e, f := recurrenceInputs(r, geometry{1, 2, 1, 1, 288, 4, 4}, mlxc.BFloat16)
				return operands{a, b, c, d, e, f}
			},
			"T 0": func() operands {
				a, b, c, d, e, f := recurrenceInputs(r, geometry{1, 0, 2, 4, 64, 16, 4}, mlxc.BFloat16)
				return operands{a, b, c, d, e, f}
			},
			"B·Hv 65 536": func() operands {
				a, b, c, d, e, f := recurrenceInputs(r, geometry{4096, 1, 16, 16, 32, 1, 4}, mlxc.BFloat16)
				return operands{a, b, c, d, e, f}
			},
			"v float32": func() operands { return operands{q, k, mlxc.AsType(v, mlxc.Float32), gt, beta, s0} },
			"beta float16": func() operands {
				return operands{q, k, v, gt, mlxc.AsType(beta, mlxc.Float16), s0}
			},
			"g bfloat16":     func() operands { return operands{q, k, v, mlxc.AsType(gt, mlxc.BFloat16), beta, s0} },
			"state bfloat16": func() operands { return operands{q, k, v, gt, beta, mlxc.AsType(s0, mlxc.BFloat16)} },
			"int32 inputs": func() operands {
				i := func(x *mlxc.Array) *mlxc.Array { return mlxc.AsType(x, mlxc.Int32) }
				return operands{i(q), i(k), i(v), gt, i(beta), s0}
			},
			"bad shapes": func() operands { return operands{q, k, mlxc.SliceAxis(v, 1, 0, 2), gt, beta, s0} },
		}
		for name, mk := range refused {
			if gpu && name == "T 0" {
				// Its inputs are evaluated empty, and MLX's CUDA graphs refuse zero-sized
				// launches (cudaGraphAddKernelNode: invalid argument); no forward has 0 rows.
				continue
			}
			o := mk()
			if stub.RecurrenceFits(o.q, o.k, o.v, o.g, o.beta, o.state) {
				t.Errorf("%s: the recurrence kernel fits", name)
				continue
			}
			if name == "bad shapes" || name == "int32 inputs" || name == "B·Hv 65 536" {
				continue // the ops refuse the first too; the others are slow or meaningless on the CPU
			}
			wy, ws, wtape := RecurrenceTape(o.q, o.k, o.v, o.g, o.beta, o.state)
			y, s, tape := stub.RecurrenceTape(o.q, o.k, o.v, o.g, o.beta, o.state)
			same(t, name+": y", y, wy)
			same(t, name+": state", s, ws)
			same(t, name+": tape δ", tape.Delta, wtape.Delta)
			if tape.Steps() == 0 || o.state.Dtype() != mlxc.Float32 {
				continue
			}
			if name != "g bfloat16" && stub.ReplayFits(o.state, tape) != (o.k.Dim(3)%32 == 0 && o.k.Dim(3) <= 256) {
				t.Errorf("%s: replay fits %v", name, stub.ReplayFits(o.state, tape))
			}
			if !stub.ReplayFits(o.state, tape) {
				same(t, name+": replay", stub.Replay(o.state, tape, 1), Replay(o.state, tape, 1))
				c := mlxc.FromSlice([]int32{1}, 1)
				same(t, name+": replay at", stub.ReplayAt(o.state, tape, c), ReplayAt(o.state, tape, c))
			}
		}
		// Replay refusals: a float16 δ, an empty tape, and the replay of 0 steps (no launch).
		if stub.ReplayFits(s0, Tape{Delta: mlxc.AsType(wtape.Delta, mlxc.Float16), K: wtape.K, G: wtape.G}) {
			t.Errorf("a float16 δ fits the replay")
		}
		empty := Tape{Delta: mlxc.SliceAxis(wtape.Delta, 1, 0, 0), K: mlxc.SliceAxis(wtape.K, 1, 0, 0), G: mlxc.SliceAxis(wtape.G, 1, 0, 0)}
		if stub.ReplayFits(s0, empty) {
			t.Errorf("an empty tape fits the replay")
		}
		same(t, "stub: replay 0", stub.Replay(s0, wtape, 0), s0)
		if !gpu { // zero-sized launches (see "T 0")
			same(t, "stub: replay at of an empty tape", stub.ReplayAt(s0, empty, mlxc.FromSlice([]int32{3}, 1)), s0)
		}
	})
}
