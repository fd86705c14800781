package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// doctor --json parses and lists every registered kernel once with a known state: every
// one "not applicable" where no custom kernel can run (the CPU), with exit code 0 and no
// problems; the text report names every kernel too.
func TestDoctorReport(t *testing.T) {
	out, errOut, code := runCLI(t, "doctor", "--json")
	var r doctorReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON (exit %d): %v\n%s\n%s", code, err, out, errOut)
	}
	if r.Version == "" || r.MLX == "" || r.Backend == "" || r.Device == "" || r.Tokenizers == "" || r.HFCache == "" {
		t.Errorf("missing fields: %+v", r)
	}
	if len(r.KnownPairs) == 0 {
		t.Errorf("no known pairs listed")
	}
	states := map[string]string{}
	for _, k := range r.Kernels {
		if _, twice := states[k.Kernel]; twice {
			t.Errorf("%s listed twice", k.Kernel)
		}
		states[k.Kernel] = k.State
		switch k.State {
		case "verified", "disabled", "trusted", "off", "not applicable":
		default:
			t.Errorf("%s: unknown state %q", k.Kernel, k.State)
		}
		if r.KernelBackend == "" && k.State != "not applicable" {
			t.Errorf("%s: %q without a kernel backend, want not applicable", k.Kernel, k.State)
		}
	}
	for _, k := range kernels.All() {
		if _, ok := states[k.Name]; !ok {
			t.Errorf("%s not in the report", k.Name)
		}
	}
	if (code != 0) != (len(r.Problems) > 0) {
		t.Errorf("exit %d with problems %v", code, r.Problems)
	}
	if r.KernelBackend == "" && code != 0 {
		t.Errorf("exit %d without custom kernels: %v", code, r.Problems)
	}
	text, _, _ := runCLI(t, "doctor")
	for _, k := range kernels.All() {
		if !strings.Contains(text, k.Name) {
			t.Errorf("the text report does not name %s:\n%s", k.Name, text)
		}
	}
}

// Every kernel with a Metal twin has a self-check (the kernels users on Apple Silicon run
// first), no kernel is in two checks, and where no custom kernel can run each check
// reports an error instead of passing or panicking.
func TestKernelChecksCoverTheTwins(t *testing.T) {
	in := map[string]string{}
	for _, c := range kernelChecks() {
		for _, k := range c.Kernels {
			if prev, ok := in[k.Name]; ok {
				t.Errorf("%s in checks %q and %q", k.Name, prev, c.Name)
			}
			in[k.Name] = c.Name
		}
	}
	for _, k := range kernels.All() {
		if k.Metal.Body != "" && in[k.Name] == "" {
			t.Errorf("%s has a Metal twin but no self-check", k.Name)
		}
	}
	var here kernelcheck.Device
	if err := mlxc.Do(func() error { here = kernelcheck.Here(); return nil }); err != nil {
		t.Fatal(err)
	}
	if here.Backend != "" {
		t.Skip("custom kernels run here: the checks are the GPU tests' business")
	}
	err := mlxc.Do(func() error {
		for _, c := range kernelChecks() {
			if err := c.Run(); err == nil {
				t.Errorf("check %q passed without a kernel backend", c.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// kernel-check runs the named checks and prints one verdict line each, in order (on this
// machine's CPU every check says it has no kernel backend); an unknown name fails.
func TestKernelCheckCommand(t *testing.T) {
	names := []string{"greedy verdict argmax", "few-query attention"}
	out, errOut, code := runCLI(t, append([]string{"kernel-check"}, names...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(names) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(names), out)
	}
	for i, l := range lines {
		var v checkVerdict
		if err := json.Unmarshal([]byte(l), &v); err != nil || v.Name != names[i] || v.Checked.IsZero() {
			t.Errorf("line %d: %q (%v), want the verdict of %q", i, l, err, names[i])
		}
		if v.OK && !mlxc.CUDAKernelsAvailable() {
			t.Errorf("line %d: a check passed with no kernel backend: %q", i, l)
		}
	}
	if _, errOut, code := runCLI(t, "kernel-check", "no such check"); code == 0 || !strings.Contains(errOut, `no kernel check named "no such check"`) {
		t.Errorf("unknown check: exit %d, %q", code, errOut)
	}
}

// nvrtc-compile (a compile ahead's process) refuses a missing or foreign job file with exit
// code 2 and a line naming it, and writes nothing.
func TestNvrtcCompileRefusesBadJob(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "job")
	if err := os.WriteFile(bad, []byte("not a job"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(t.TempDir(), "missing")} {
		_, errOut, code := runCLI(t, "nvrtc-compile", path)
		if code != 2 || !strings.Contains(errOut, "nvrtc-compile: job "+path+" failed") {
			t.Errorf("%s: exit %d, %q; want 2 and the job named", path, code, errOut)
		}
	}
}

// fused-compile runs a fused-kernel job (the trace of a compiled call) and reports the
// fused kernels it met, the call's; a file that is no job, or none, fails with the job named.
func TestFusedCompileCommand(t *testing.T) {
	job := filepath.Join(t.TempDir(), "job.mlxfn")
	var call []string
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			c := mlxc.Compile(func(in []*mlxc.Array) []*mlxc.Array {
				return []*mlxc.Array{mlxc.Multiply(mlxc.SiLU(in[0]), in[1])}
			}, true)
			defer c.Free()
			x := mlxc.AsType(mlxc.FromSlice([]float32{-1, 0.5, 2, 3, -2, 1}, 2, 3), mlxc.BFloat16)
			call = mlxc.FusedNames(c.Call(x, x)...)
			if err := c.Export(job, call, x, x); err != nil {
				t.Error(err)
			}
		})
	})
	if err != nil || len(call) == 0 {
		t.Fatalf("writing the job: %v (kernels %q)", err, call)
	}
	out, errOut, code := runCLI(t, "fused-compile", "--json", job)
	var res struct {
		Found []string `json:"found"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("exit %d, %q: %s", code, out, errOut)
	}
	if diff := cmp.Diff(call, res.Found); diff != "" {
		t.Errorf("kernels met (-call +job):\n%s", diff)
	}

	bad := filepath.Join(t.TempDir(), "bad.mlxfn")
	if err := os.WriteFile(bad, []byte("not a job"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(t.TempDir(), "missing.mlxfn")} {
		_, errOut, code := runCLI(t, "fused-compile", path)
		if code != 1 || !strings.Contains(errOut, "fused job "+path) {
			t.Errorf("%s: exit %d, %q; want 1 and the job named", path, code, errOut)
		}
	}
	if _, _, code := runCLI(t, "fused-compile"); code != 2 {
		t.Errorf("no job: exit %d, want 2", code)
	}
}
