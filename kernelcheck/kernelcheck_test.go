package kernelcheck

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// A test-only kernel value: its "kernel" is x·2+1 computed with ops, and its fallback, the
// contract, is x·2. The gate must find them apart.
var wrongKernel = kernels.Kernel{Name: "dflash_test_wrong", CUDA: kernels.Source{Body: "out[0] = x[0] * 2 + 1;"},
	Contract: kernels.Contract{Inputs: []string{"x"}, Outputs: []string{"out"}}}

// A kernel whose source cannot build: it is launched for real, which fails on this
// machine's backend the way a compile error fails on a GPU (MLX throws at the call).
var brokenKernel = kernels.Kernel{Name: "dflash_test_broken", CUDA: kernels.Source{Body: "this is not CUDA"},
	Contract: kernels.Contract{Inputs: []string{"x"}, Outputs: []string{"out"}}}

// A kernel that keeps its contract (both sides compute x·2).
var goodKernel = kernels.Kernel{Name: "dflash_test_good", CUDA: kernels.Source{Body: "out[0] = x[0] * 2;"},
	Contract: kernels.Contract{Inputs: []string{"x"}, Outputs: []string{"out"}}}

func double(x *mlxc.Array) *mlxc.Array { return mlxc.Multiply(x, mlxc.Scalar(2, mlxc.Float32)) }

// op is a layer operation as the model's are: the kernel where the settings allow it,
// the fallback elsewhere.
func op(k settings.Kernels, name string, kernel func(*mlxc.Array) *mlxc.Array, x *mlxc.Array) *mlxc.Array {
	if k.Allowed(name) {
		return kernel(x)
	}
	return double(x)
}

func wrong(x *mlxc.Array) *mlxc.Array { return mlxc.Add(double(x), mlxc.Scalar(1, mlxc.Float32)) }

func broken(x *mlxc.Array) *mlxc.Array {
	k := mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: brokenKernel.Name, Inputs: []string{"x"}, Outputs: []string{"out"},
		Source: brokenKernel.CUDA.Body})
	defer k.Free()
	return k.Call([]*mlxc.Array{x}, mlxc.KernelCall{OutputShapes: [][]int{x.Shape()}, OutputDtypes: []mlxc.Dtype{x.Dtype()},
		Grid: [3]int{x.Size(), 1, 1}, ThreadGroup: [3]int{32, 1, 1}})[0]
}

// compare is a check's comparison: the kernel's output against the fallback's, exactly.
func compare(kernel func(*mlxc.Array) *mlxc.Array) error {
	return mlxc.Catch(func() {
		s := mlxc.NewScope()
		defer s.Close()
		x := mlxc.Normal([]int{64}, mlxc.Float32, 0, 1, mlxc.RandomKey(1))
		got, want := kernel(x).Float32s(), double(x).Float32s()
		for i := range want {
			if got[i] != want[i] {
				panic(&mlxc.Error{Op: "check", Msg: fmt.Sprintf("out[%d] = %g, want %g", i, got[i], want[i])})
			}
		}
	})
}

type counted struct{ runs map[string]int }

func (c *counted) check(k kernels.Kernel, kernel func(*mlxc.Array) *mlxc.Array) Check {
	return Check{Name: k.Name, Kernels: []kernels.Kernel{k}, Run: func() error {
		c.runs[k.Name]++
		return compare(kernel)
	}}
}

func stateOf(t *testing.T, states []State, name string) State {
	t.Helper()
	for _, s := range states {
		if s.Kernel == name {
			return s
		}
	}
	t.Fatalf("no state for %s in %+v", name, states)
	return State{}
}

// The self-check's machinery, on this machine's backend: a kernel that disagrees with its
// fallback and one that fails to build are disabled with one warning each, the answers
// are still right, the checks are announced while they run, the verdicts are remembered (a
// second process checks nothing and says nothing), and a kernel that agrees is verified. A verdict of another MLX version or of
// a changed source does not count.
func TestGateDisablesWrongAndBrokenKernels(t *testing.T) {
	path := filepath.Join(t.TempDir(), "verdicts.json")
	dev := Device{Backend: kernels.CUDA, Name: "test GPU", MLX: "0.0-test"}
	c := &counted{runs: map[string]int{}}
	checks := []Check{c.check(wrongKernel, wrong), c.check(brokenKernel, broken), c.check(goodKernel, double)}
	err := mlxc.Do(func() error {
		for pass := 0; pass < 2; pass++ {
			var warn bytes.Buffer
			g := Gate{Device: dev, Store: OpenStore(path, &warn), Warn: &warn}
			k, states := g.Apply(settings.Default().Kernels, checks)
			lines := strings.Count(warn.String(), "warning: ")
			if want := []int{2, 0}[pass]; lines != want {
				t.Errorf("pass %d: %d warning lines, want %d:\n%s", pass, lines, want, warn.String())
			}
			// The first pass says it checks the 3 kernels and when that is over; the second
			// (all remembered) says nothing.
			announced := strings.Contains(warn.String(), "first use on test GPU: compiling and checking 3 custom kernels") &&
				strings.Contains(warn.String(), "kernel checks done in ")
			if announced != (pass == 0) || pass == 1 && warn.Len() != 0 {
				t.Errorf("pass %d: progress lines %v, want %v:\n%s", pass, announced, pass == 0, warn.String())
			}
			for name, want := range map[string]string{wrongKernel.Name: "disabled", brokenKernel.Name: "disabled", goodKernel.Name: "verified"} {
				st := stateOf(t, states, name)
				if st.State != want || st.Remembered != (pass == 1) {
					t.Errorf("pass %d: %s: %+v, want %s (remembered %v)", pass, name, st, want, pass == 1)
				}
				if want == "disabled" && (st.Reason == "" || k.Allowed(name)) {
					t.Errorf("pass %d: %s disabled without a reason or still allowed: %+v", pass, name, st)
				}
			}
			if !strings.Contains(stateOf(t, states, wrongKernel.Name).Reason, "want") {
				t.Errorf("the mismatch's reason does not say what differs: %+v", stateOf(t, states, wrongKernel.Name))
			}
			x := mlxc.FromSlice([]float32{1, -2, 3.5}, 3)
			for _, f := range []struct {
				name   string
				kernel func(*mlxc.Array) *mlxc.Array
			}{{wrongKernel.Name, wrong}, {brokenKernel.Name, broken}, {goodKernel.Name, double}} {
				got := op(k, f.name, f.kernel, x).Float32s()
				if got[0] != 2 || got[1] != -4 || got[2] != 7 {
					t.Errorf("pass %d: %s's operation gives %v after the gate", pass, f.name, got)
				}
			}
		}
		for _, n := range []string{wrongKernel.Name, brokenKernel.Name, goodKernel.Name} {
			if c.runs[n] != 1 {
				t.Errorf("%s checked %d times, want once", n, c.runs[n])
			}
		}
		// Another MLX version, or a changed source, is checked again.
		newer := dev
		newer.MLX = "0.0-test2"
		fixed := goodKernel
		fixed.CUDA.Body += " // changed"
		checks2 := []Check{c.check(goodKernel, double), c.check(fixed, double)}
		checks2[1].Name = goodKernel.Name
		Gate{Device: newer, Store: OpenStore(path, nil)}.Apply(settings.Default().Kernels, checks2[:1])
		Gate{Device: dev, Store: OpenStore(path, nil)}.Apply(settings.Default().Kernels, checks2[1:])
		if c.runs[goodKernel.Name] != 3 {
			t.Errorf("good kernel checked %d times after a new MLX version and a new source, want 3", c.runs[goodKernel.Name])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// trust runs no check and admits every kernel, off admits none, a check its setting does
// not want does not run, and where no custom kernel can run every kernel is not
// applicable and nothing runs.
func TestGateModes(t *testing.T) {
	c := &counted{runs: map[string]int{}}
	checks := []Check{c.check(wrongKernel, wrong)}
	cuda := Device{Backend: kernels.CUDA, Name: "test GPU", MLX: "t"}
	notWanted := []Check{checks[0]}
	notWanted[0].Wanted = func(settings.Kernels) bool { return false }
	for _, tc := range []struct {
		name   string
		mode   settings.KernelMode
		dev    Device
		checks []Check
		state  string
	}{
		{"trust", settings.KernelsTrust, cuda, checks, "trusted"},
		{"off", settings.KernelsOff, cuda, checks, "off"},
		{"not wanted", settings.KernelsCheck, cuda, notWanted, "off"},
		{"cpu", settings.KernelsCheck, Device{Name: "cpu", MLX: "t"}, checks, "not applicable"},
	} {
		k := settings.Default().Kernels
		k.Mode = tc.mode
		var warn bytes.Buffer
		k2, states := Gate{Device: tc.dev, Store: OpenStore("", nil), Warn: &warn}.Apply(k, tc.checks)
		if st := stateOf(t, states, wrongKernel.Name); st.State != tc.state {
			t.Errorf("%s: %+v, want %s", tc.name, st, tc.state)
		}
		if warn.Len() != 0 || c.runs[wrongKernel.Name] != 0 {
			t.Errorf("%s: ran the check (%d) or warned %q", tc.name, c.runs[wrongKernel.Name], warn.String())
		}
		if allowed := k2.Allowed(wrongKernel.Name); allowed != (tc.mode != settings.KernelsOff) {
			t.Errorf("%s: Allowed = %v", tc.name, allowed)
		}
		if len(states) < len(kernels.All()) {
			t.Errorf("%s: %d states, fewer than the registry's %d kernels", tc.name, len(states), len(kernels.All()))
		}
	}
}

// A damaged verdicts file is one warning and no verdicts; the next write replaces it
// with a whole file.
func TestStoreDamagedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.json")
	if err := os.WriteFile(path, []byte(`{"format":1,"verdicts":{"k":`), 0o644); err != nil {
		t.Fatal(err)
	}
	var warn bytes.Buffer
	s := OpenStore(path, &warn)
	if _, ok := s.Get("k"); ok || !strings.Contains(warn.String(), "damaged") {
		t.Fatalf("damaged file: verdict found %v, warning %q", ok, warn.String())
	}
	if err := s.Put("k2", Verdict{OK: true, Seconds: math.Pi}); err != nil {
		t.Fatal(err)
	}
	warn.Reset()
	if v, ok := OpenStore(path, &warn).Get("k2"); !ok || !v.OK || v.Seconds != math.Pi || warn.Len() != 0 {
		t.Fatalf("rewritten file: %+v %v, warning %q", v, ok, warn.String())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*.tmp")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// Checks run elsewhere: a passing verdict from elsewhere is kept and the check does not run
// here; a failure seen elsewhere runs here again before the kernel is disabled (a good
// kernel that failed there for another reason stays verified); a check elsewhere gave no
// verdict for runs here; and a single pending check is not sent elsewhere.
func TestGateRunsChecksElsewhere(t *testing.T) {
	dev := Device{Backend: kernels.CUDA, Name: "test GPU", MLX: "0.0-test"}
	err := mlxc.Do(func() error {
		c := &counted{runs: map[string]int{}}
		good2 := goodKernel
		good2.Name += "_2"
		checks := []Check{c.check(wrongKernel, wrong), c.check(brokenKernel, broken), c.check(goodKernel, double), c.check(good2, double)}
		var asked []string
		elsewhere := func(names []string) map[string]Verdict {
			asked = append(asked, names...)
			return map[string]Verdict{
				goodKernel.Name:  {OK: true, Seconds: 1},
				good2.Name:       {OK: false, Reason: "out of memory"},
				wrongKernel.Name: {OK: false, Reason: "mismatch"},
			}
		}
		path := filepath.Join(t.TempDir(), "verdicts.json")
		_, states := Gate{Device: dev, Store: OpenStore(path, nil), Elsewhere: elsewhere}.Apply(settings.Default().Kernels, checks)
		if diff := cmp.Diff([]string{wrongKernel.Name, brokenKernel.Name, goodKernel.Name, good2.Name}, asked); diff != "" {
			t.Errorf("checks sent elsewhere (-want +got):\n%s", diff)
		}
		wantRuns := map[string]int{wrongKernel.Name: 1, brokenKernel.Name: 1, good2.Name: 1}
		if diff := cmp.Diff(wantRuns, c.runs); diff != "" {
			t.Errorf("checks run here (-want +got):\n%s", diff)
		}
		for name, want := range map[string]string{wrongKernel.Name: "disabled", brokenKernel.Name: "disabled", goodKernel.Name: "verified", good2.Name: "verified"} {
			if st := stateOf(t, states, name); st.State != want {
				t.Errorf("%s: %+v, want %s", name, st, want)
			}
		}
		if v, ok := OpenStore(path, nil).Get(Key(dev, checks[2])); !ok || !v.OK || v.Seconds != 1 {
			t.Errorf("the verdict from elsewhere was not kept: %+v %v", v, ok)
		}
		asked = nil
		c2 := &counted{runs: map[string]int{}}
		Gate{Device: dev, Store: OpenStore("", nil), Elsewhere: elsewhere}.Apply(settings.Default().Kernels, []Check{c2.check(goodKernel, double)})
		if len(asked) != 0 || c2.runs[goodKernel.Name] != 1 {
			t.Errorf("one pending check: sent elsewhere %v, run here %d times; want here once", asked, c2.runs[goodKernel.Name])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Where the models hold no quantized weights, a check of kernels for quantized weights does
// not run, its kernels are "not needed" and unused, and the first use announces only the
// others; with quantized weights it runs as any other.
func TestGateSkipsQuantizedKernelsWithoutQuantizedWeights(t *testing.T) {
	dev := Device{Backend: kernels.CUDA, Name: "test GPU", MLX: "0.0-test"}
	err := mlxc.Do(func() error {
		for _, noQuantized := range []bool{true, false} {
			c := &counted{runs: map[string]int{}}
			q := c.check(goodKernel, double)
			q.Quantized = true
			var warn bytes.Buffer
			k, states := Gate{Device: dev, Store: OpenStore("", nil), Warn: &warn, NoQuantized: noQuantized}.Apply(settings.Default().Kernels,
				[]Check{q, c.check(wrongKernel, wrong)})
			st := stateOf(t, states, goodKernel.Name)
			wantState, wantRuns, wantPending := "verified", 1, "checking 2 custom kernels"
			if noQuantized {
				wantState, wantRuns, wantPending = "not needed", 0, "checking 1 custom kernels"
			}
			if st.State != wantState || c.runs[goodKernel.Name] != wantRuns || k.Allowed(goodKernel.Name) != !noQuantized {
				t.Errorf("no quantized weights %v: %+v, checked %d times, allowed %v", noQuantized, st, c.runs[goodKernel.Name], k.Allowed(goodKernel.Name))
			}
			if !strings.Contains(warn.String(), wantPending) || c.runs[wrongKernel.Name] != 1 {
				t.Errorf("no quantized weights %v: the other check ran %d times; announced %q", noQuantized, c.runs[wrongKernel.Name], warn.String())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
