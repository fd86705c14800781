// Package scripts holds tests of the shell scripts beside them.
package scripts

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// stubTool records its call (its name and arguments, one line) in $STUB_LOG and prints an
// empty JSON object: it stands for every binary gpu_run.sh runs.
const stubTool = `#!/bin/sh
echo "$(basename "$0") $*" >> "$STUB_LOG"
echo '{}'
`

// stageCalls is, per stage of gpu_run.sh, a tool each dry run must call beyond the
// version line every stage prints: a stage that lost its body calls none.
var stageCalls = map[string]string{
	"all":       "mlxc.test",
	"tests":     "mlxc.test",
	"cmd":       "dflash-mlx cmd-ran",
	"mlxcbench": "mlxc.test",
	"engine":    "engine.test",
	"bench":     "dflash-mlx bench",
	"graphs":    "dflash-mlx run",
	"ab":        "dflash-mlx bench",
	"abbin":     "dflash-base bench",
	"diag":      "engine.test",
	"inmodel":   "model.test",
	"tune":      "model.test",
	"prof":      "ncu",
	"sweep":     "model.test",
	"mlxlm":     "dflash-mlx run",
}

// gpu_run.sh's stage list, the stages it has a body for and the stages tested here are the
// same, and a dry run of each stage calls its tools without a shell error.
func TestGPURunStages(t *testing.T) {
	src, err := os.ReadFile("gpu_run.sh")
	if err != nil {
		t.Fatal(err)
	}
	listed := regexp.MustCompile(`(?m)^STAGES="([a-z ]+)"$`).FindSubmatch(src)
	if listed == nil {
		t.Fatal("gpu_run.sh has no STAGES list")
	}
	stages := strings.Fields(string(listed[1]))
	var bodies []string
	for _, m := range regexp.MustCompile(`"\$STAGE" = ([a-z]+) \]`).FindAllSubmatch(src, -1) {
		if name := string(m[1]); !slices.Contains(bodies, name) {
			bodies = append(bodies, name)
		}
	}
	slices.Sort(bodies)
	want := slices.Clone(stages)
	slices.Sort(want)
	if diff := cmp.Diff(want, bodies); diff != "" {
		t.Errorf("listed stages vs stages with a body (-listed +bodies):\n%s", diff)
	}
	tested := []string{"setup"}
	for s := range stageCalls {
		tested = append(tested, s)
	}
	slices.Sort(tested)
	if diff := cmp.Diff(want, tested); diff != "" {
		t.Errorf("listed stages vs stages this test runs (-listed +tested):\n%s", diff)
	}

	script, err := filepath.Abs("gpu_run.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range stages {
		t.Run(stage, func(t *testing.T) {
			out, calls := dryRun(t, script, stage)
			for _, bad := range []string{"command not found", "syntax error", "unbound variable", "No such file or directory: '$"} {
				if strings.Contains(out, bad) {
					t.Errorf("output has %q:\n%s", bad, out)
				}
			}
			if stage == "setup" {
				return
			}
			if !strings.Contains(calls, "dflash-mlx version") {
				t.Errorf("no version line; calls:\n%s", calls)
			}
			if !strings.Contains(calls, stageCalls[stage]) {
				t.Errorf("stage %s never called %q; calls:\n%s\noutput:\n%s", stage, stageCalls[stage], calls, out)
			}
		})
	}
	t.Run("unknown stage", func(t *testing.T) {
		cmd := exec.Command("bash", script, "no-such-stage")
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "GPU_RUN_DRY=1", "GPU_RUN_ROOT="+t.TempDir(), "GPU_STAGE_DIR="+t.TempDir(), "OUT="+t.TempDir())
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "unknown stage") {
			t.Errorf("an unknown stage gave %v: %s", err, out)
		}
	})
}

// dryRun runs one stage of script with stub tools in a scratch tree and returns its output
// and the stubs' calls.
func dryRun(t *testing.T, script, stage string) (output, calls string) {
	t.Helper()
	root, stg, work, out, cwd := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	stubDir := t.TempDir()
	writeStub := func(path string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(stubTool), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeStub(filepath.Join(root, "bin", "dflash-mlx"))
	for _, pkg := range []string{"mlxc", "model", "model/deltanet", "model/qwen35", "draft", "engine", "verify"} {
		writeStub(filepath.Join(root, "bin", pkg+".test"))
		if err := os.MkdirAll(filepath.Join(cwd, pkg), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeStub(filepath.Join(stubDir, "ncu"))
	// abbin and prof unpack the base build from the stage folder, as on the GPU machine.
	base := t.TempDir()
	writeStub(filepath.Join(base, "bin", "dflash-base"))
	if b, err := exec.Command("tar", "-cJf", filepath.Join(stg, "base.tar.xz"), "-C", base, "bin").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, b)
	}
	pylib := t.TempDir()
	if err := os.MkdirAll(filepath.Join(pylib, "mlx_lm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stg, "pywheels.tar"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "calls")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script, stage)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(),
		"GPU_RUN_DRY=1", "GPU_RUN_ROOT="+root, "GPU_STAGE_DIR="+stg, "GPU_WORK="+work, "GPU_PYLIB="+pylib,
		"OUT="+out, "STUB_LOG="+log, "PATH="+stubDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		`CMD="$B/dflash-mlx" cmd-ran`, "DIAG=engine|TestA,TestB|", "TUNE_RULES=r1;r2", "PROF_VARIANTS=-;nodraft",
		"MLXC_BENCHTIME=1x", "PYTHONPATH=")
	b, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("stage %s did not finish: %s", stage, b)
	}
	_ = err // a stage's status is its last command's; the stubs' empty answers fail some summaries
	c, _ := os.ReadFile(log)
	return string(b), string(c)
}
