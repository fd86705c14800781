package mlxc

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// rand32 is an array of n uniform values in [lo, hi) of shape, in dtype dt.
func rand32(g *lcg, dt Dtype, lo, hi float64, shape ...int) *Array {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return AsType(FromSlice(g.floats(n, lo, hi), shape...), dt)
}

// fusedCases are compiled functions of the kinds the models compile: element-wise chains
// with scalar constants (whose values MLX hashes into a kernel's name), inputs broadcast
// against each other, several outputs, a scalar input, and a function traced at fixed shapes
// with a reduction between its fused parts.
func fusedCases(g *lcg) []struct {
	name      string
	shapeless bool
	fn        GraphFunc
	inputs    []*Array
} {
	return []struct {
		name      string
		shapeless bool
		fn        GraphFunc
		inputs    []*Array
	}{
		{"scale by a constant, in float32", true, func(in []*Array) []*Array {
			return []*Array{AsType(Multiply(AsType(in[0], Float32), Scalar(0.125, Float32)), in[0].Dtype())}
		}, []*Array{rand32(g, BFloat16, -2, 2, 2, 3, 4, 8)}},
		{"gates of per-head vectors", true, func(in []*Array) []*Array {
			a := Exp(AsType(in[1], Float32))
			g := Multiply(Negative(a), Add(AsType(in[0], Float32), AsType(in[2], Float32)))
			return []*Array{Exp(g), Sigmoid(in[0])}
		}, []*Array{rand32(g, BFloat16, -1, 1, 1, 5, 8), rand32(g, Float32, -1, 1, 8), rand32(g, BFloat16, -1, 1, 8)}},
		{"silu times up", true, func(in []*Array) []*Array {
			return []*Array{Multiply(Multiply(in[0], Sigmoid(in[0])), in[1])}
		}, []*Array{rand32(g, Float16, -3, 3, 3, 16), rand32(g, Float16, -3, 3, 3, 16)}},
		{"a scalar input", true, func(in []*Array) []*Array {
			return []*Array{Divide(in[0], in[1])}
		}, []*Array{rand32(g, Float32, -3, 3, 4, 6), Scalar(0.7, Float32)}},
		{"fixed shapes, a reduction between", false, compiledBody,
			[]*Array{rand32(g, Float32, -3, 3, 13), rand32(g, Float32, -1, 1, 13)}},
	}
}

// TestFusedJobsMeetTheCallsKernels: a job written for a call compiles the fused kernels of
// that very call, named as MLX names them in the caller (the names are what the compile
// cache's programs are made of). Without the job's first plain run, the constant cases'
// kernels come out named otherwise (their constants would be read as scalar inputs).
func TestFusedJobsMeetTheCallsKernels(t *testing.T) {
	g := lcg(41)
	onMLX(t, func() {
		for _, tc := range fusedCases(&g) {
			c := Compile(tc.fn, tc.shapeless)
			call, job, err := FusedJobRoundTrip(c, filepath.Join(t.TempDir(), "job.mlxfn"), tc.inputs...)
			c.Free()
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			if diff := cmp.Diff(call, job); diff != "" {
				t.Errorf("%s: the job's kernels differ from the call's (-call +job):\n%s", tc.name, diff)
			}
		}

		// A job that names a kernel its function does not have fails, as does a file that is no job.
		c := Compile(func(in []*Array) []*Array { return []*Array{Exp(Negative(in[0]))} }, true)
		defer c.Free()
		x := rand32(&g, Float32, -1, 1, 4)
		path := filepath.Join(t.TempDir(), "wrong.mlxfn")
		if err := c.Export(path, []string{"NotThisFunctionsKernel"}, x); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckFusedJob(path); err == nil || !strings.Contains(err.Error(), "did not come out") {
			t.Errorf("a job naming another kernel: error %v", err)
		}
		junk := filepath.Join(t.TempDir(), "junk.mlxfn")
		if err := os.WriteFile(junk, []byte("not an export"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckFusedJob(junk); err == nil {
			t.Error("a file that is no job ran")
		}
	})
}

// TestFusedWatchNamesEachKernelOnce: with the watch on, a call reports the fused kernels no
// call of the process met before: once for a signature, not again for the same function or
// another compile of it, again for new dtypes; nothing with the watch off, nor from a call
// inside another function's trace.
func TestFusedWatchNamesEachKernelOnce(t *testing.T) {
	g := lcg(43)
	onMLX(t, func() {
		setFusedWatch(true, false)
		defer setFusedWatch(false, false)
		// A constant of its own keeps this function's kernels apart from other tests'.
		body := func(in []*Array) []*Array {
			return []*Array{Multiply(Sigmoid(Multiply(in[0], Scalar(0.4375, Float32))), in[1])}
		}
		c1 := Compile(body, true)
		defer c1.Free()
		x, y := rand32(&g, BFloat16, -1, 1, 2, 8), rand32(&g, BFloat16, -1, 1, 2, 8)
		out, fresh := c1.call([]*Array{x, y})
		if want := FusedNames(out...); len(want) != 1 || !cmp.Equal(fresh, want) {
			t.Fatalf("first call: new kernels %q, want the call's %q", fresh, want)
		}
		first := fresh[0]
		if _, fresh = c1.call([]*Array{x, y}); len(fresh) != 0 {
			t.Errorf("the same call again: new kernels %q", fresh)
		}
		if _, fresh = c1.call([]*Array{rand32(&g, BFloat16, -1, 1, 5, 8), rand32(&g, BFloat16, -1, 1, 5, 8)}); len(fresh) != 0 {
			t.Errorf("other shapes of a shapeless function: new kernels %q", fresh)
		}
		c2 := Compile(body, true)
		defer c2.Free()
		if _, fresh = c2.call([]*Array{x, y}); len(fresh) != 0 {
			t.Errorf("another compile of the same function: new kernels %q", fresh)
		}
		if _, fresh = c1.call([]*Array{AsType(x, Float16), AsType(y, Float16)}); len(fresh) != 1 || fresh[0] == first {
			t.Errorf("float16 inputs: new kernels %q, want one other than %q", fresh, first)
		}

		var inner []string
		c3 := Compile(func(in []*Array) []*Array { return []*Array{Exp(Multiply(in[0], Scalar(0.3125, Float32)))} }, true)
		defer c3.Free()
		outer := Compile(func(in []*Array) []*Array {
			var o []*Array
			o, inner = c3.call(in)
			return []*Array{Negative(o[0])}
		}, true)
		defer outer.Free()
		if _, fresh = outer.call([]*Array{x}); len(inner) != 0 || len(fresh) != 1 {
			t.Errorf("a call inside a trace: new kernels %q inside, %q outside (want none, one)", inner, fresh)
		}

		setFusedWatch(false, false)
		c4 := Compile(func(in []*Array) []*Array { return []*Array{Exp(Multiply(in[0], Scalar(0.1875, Float32)))} }, true)
		defer c4.Free()
		if _, fresh = c4.call([]*Array{x}); len(fresh) != 0 {
			t.Errorf("watch off: new kernels %q", fresh)
		}
	})
}

// fusedJobEnv names the job file TestRunFusedJobProcess's helper run runs.
const fusedJobEnv = "MLXC_TEST_FUSED_JOB"

// TestRunFusedJobProcess: a job runs in a process of its own (RunFusedJob, as the helper
// command does) and meets the caller's kernels; its MLX module cache is a folder of its own,
// gone afterwards.
func TestRunFusedJobProcess(t *testing.T) {
	if path := os.Getenv(fusedJobEnv); path != "" { // the helper process
		found, err := RunFusedJob(path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(map[string]any{"found": found, "ptx": os.Getenv("MLX_PTX_CACHE_DIR")})
		os.Stdout.Write(append([]byte("RESULT "), append(b, '\n')...))
		return
	}
	g := lcg(47)
	path := filepath.Join(t.TempDir(), "job.mlxfn")
	var call []string
	onMLX(t, func() {
		tc := fusedCases(&g)[1]
		c := Compile(tc.fn, tc.shapeless)
		defer c.Free()
		out := c.Call(tc.inputs...)
		call = FusedNames(out...)
		if err := c.Export(path, call, tc.inputs...); err != nil {
			t.Fatal(err)
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunFusedJobProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fusedJobEnv+"="+path, "TMPDIR="+t.TempDir())
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper process: %v\n%s", err, b)
	}
	var res struct {
		Found []string `json:"found"`
		PTX   string   `json:"ptx"`
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				t.Fatal(err)
			}
		}
	}
	if diff := cmp.Diff(call, res.Found); diff != "" {
		t.Errorf("helper's kernels (-call +helper):\n%s\n%s", diff, b)
	}
	if !strings.Contains(res.PTX, "dflash-fused-ptx-") {
		t.Errorf("helper's MLX module cache %q, want a private folder", res.PTX)
	}
	if _, err := os.Stat(res.PTX); !os.IsNotExist(err) {
		t.Errorf("helper's MLX module cache %s is still there (%v)", res.PTX, err)
	}
}

// fusedHelperEnv marks TestFusedAheadRunsJobsInHelpers's helper processes (this test
// binary, the job's file last on its command line).
const fusedHelperEnv = "MLXC_TEST_FUSED_HELPER"

// TestFusedAheadRunsJobsInHelpers: with fused-kernel jobs on, a compiled call that meets a
// new kernel writes a job into the compile cache's folder and a helper process runs it (here
// this test binary, as RunFusedJob); the job's file is gone afterwards, a second call of the
// same kernel starts none, and the call's values are the function's.
func TestFusedAheadRunsJobsInHelpers(t *testing.T) {
	if os.Getenv(fusedHelperEnv) == "1" { // the helper process
		if _, err := RunFusedJob(os.Args[len(os.Args)-1]); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Setenv(fusedHelperEnv, "1")
	dir := t.TempDir()
	configMu.Lock()
	old := config
	config.CompileCache = dir
	config.FusedHelper = []string{os.Args[0], "-test.run=^TestFusedAheadRunsJobsInHelpers$", "-test.count=1", "--"}
	configMu.Unlock()
	wasOn := aheadOn.Load()
	defer func() {
		configMu.Lock()
		config = old
		configMu.Unlock()
		aheadOn.Store(wasOn)
		startCompileCache()
		startFusedAhead()
	}()
	g := lcg(53)
	onMLX(t, func() {
		startCompileCache()
		aheadOn.Store(true)
		startFusedAhead()
		before := FusedAhead()
		// A constant of its own keeps this function's kernel apart from other tests'.
		c := Compile(func(in []*Array) []*Array {
			return []*Array{Multiply(Exp(Multiply(in[0], Scalar(0.0703125, Float32))), in[1])}
		}, true)
		defer c.Free()
		x, y := rand32(&g, Float32, -1, 1, 3, 8), rand32(&g, Float32, -1, 1, 3, 8)
		out := c.Call(x, y)
		for i := 0; i < 600; i++ { // the helper compiles with the system's compiler on a CPU
			if s := FusedAhead(); s.Compiled+s.Failed > before.Compiled+before.Failed {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		st := FusedAhead()
		if st.Submitted-before.Submitted != 1 || st.Compiled-before.Compiled != 1 || st.Failed != before.Failed {
			t.Errorf("jobs: %+v, before %+v; want one submitted and compiled", st, before)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, ".fused-*")); len(left) != 0 {
			t.Errorf("job files left: %v", left)
		}
		c.Call(x, y)
		if s := FusedAhead(); s.Submitted != st.Submitted {
			t.Errorf("the same kernel again started a job: %+v", s)
		}
		want := Multiply(Exp(Multiply(x, Scalar(0.0703125, Float32))), y)
		Eval(out[0], want)
		if g, w := out[0].Float32s(), want.Float32s(); !cmp.Equal(g, w) {
			t.Errorf("values %v, want %v", g, w)
		}
	})
}
