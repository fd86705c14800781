package deltanet

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// KernelCheck is the first-use self-check of the recurrence and replay kernels: a block
// of 4 steps with its tape and a replay of 2 of them, against the ops path. The inputs are
// float32, so the kernels and the ops differ only in the order of the recurrence's two
// row sums; the bound, 10⁻⁴ of each output's largest magnitude, is far above that and far
// below a wrong index or step.
func KernelCheck() kernelcheck.Check {
	return kernelcheck.Check{Name: "gated delta recurrence and replay",
		Kernels: []kernels.Kernel{kernels.GatedDeltaTape, kernels.GatedDeltaReplay},
		Wanted:  func(k settings.Kernels) bool { return k.DeltaNetKernel }, Run: checkKernels}
}

func checkKernels() (err error) {
	s := mlxc.NewScope()
	defer s.Close()
	if cerr := mlxc.Catch(func() { err = runCheck() }); cerr != nil {
		return cerr
	}
	return err
}

func runCheck() error {
	kn := NewKernels(settings.Kernels{DeltaNetKernel: true, Mode: settings.KernelsTrust})
	if kn == nil {
		return fmt.Errorf("no kernel backend here")
	}
	defer kn.Free()
	const B, T, Hk, Dk, Hv, Dv = 1, 4, 2, 64, 4, 32
	f32 := mlxc.Float32
	unit := func(shape []int, seed uint64) *mlxc.Array {
		x := mlxc.Normal(shape, f32, 0, 1, mlxc.RandomKey(seed))
		return mlxc.Divide(x, mlxc.Sqrt(mlxc.Sum(mlxc.Square(x), []int{-1}, true)))
	}
	q, k := unit([]int{B, T, Hk, Dk}, 41), unit([]int{B, T, Hk, Dk}, 42)
	v := mlxc.Normal([]int{B, T, Hv, Dv}, f32, 0, 1, mlxc.RandomKey(43))
	g := mlxc.Uniform(0.5, 1, []int{B, T, Hv}, f32, mlxc.RandomKey(44))
	beta := mlxc.Uniform(0.1, 0.9, []int{B, T, Hv}, f32, mlxc.RandomKey(45))
	state := mlxc.Normal([]int{B, Hv, Dv, Dk}, f32, 0, 0.1, mlxc.RandomKey(46))
	if !kn.RecurrenceFits(q, k, v, g, beta, state) {
		return fmt.Errorf("the recurrence kernel refuses its check's shape")
	}
	y, st, tape := kn.RecurrenceTape(q, k, v, g, beta, state)
	wy, wst, wtape := RecurrenceTape(q, k, v, g, beta, state)
	if !kn.ReplayFits(state, wtape) {
		return fmt.Errorf("the replay kernel refuses its check's shape")
	}
	for _, c := range []struct {
		what      string
		got, want *mlxc.Array
	}{{"y", y, wy}, {"state", st, wst}, {"tape δ", tape.Delta, wtape.Delta},
		{"replayed state", kn.Replay(state, wtape, 2), Replay(state, wtape, 2)}} {
		g, w := c.got.Float32s(), c.want.Float32s()
		peak := 0.0
		for _, x := range w {
			peak = math.Max(peak, math.Abs(float64(x)))
		}
		for i := range w {
			if d := math.Abs(float64(g[i] - w[i])); d > 1e-4*peak || math.IsNaN(float64(g[i])) {
				return fmt.Errorf("%s: element %d = %g, want %g", c.what, i, g[i], w[i])
			}
		}
	}
	return nil
}
