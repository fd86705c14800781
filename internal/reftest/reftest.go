// Package reftest finds and runs the Python reference environment (third_party/pyref,
// built by `make deps`) for parity tests. Without it a test is skipped, except when
// DFLASH_REQUIRE_REFERENCE=1 (as in CI), where it fails.
package reftest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// RepoRoot is the repository root (found from this file's location).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Python returns the reference interpreter, or skips/fails the test when it is missing.
func Python(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("DFLASH_PYREF"); p != "" {
		return p
	}
	p := filepath.Join(RepoRoot(), "third_party", "pyref", "bin", "python")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	Missing(t, "reference interpreter "+p)
	return ""
}

// Missing skips (or under DFLASH_REQUIRE_REFERENCE=1 fails) for a missing reference asset.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("DFLASH_REQUIRE_REFERENCE") == "1" {
		t.Fatalf("%s is missing (run `make deps`)", what)
	}
	t.Skipf("%s is missing; run `make deps` (DFLASH_REQUIRE_REFERENCE=1 makes this a failure)", what)
}

// Run runs a Python script with args and returns its combined output; failure fails the test.
func Run(t testing.TB, py, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command(py, append([]string{script}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reference %s %v: %v\n%s", filepath.Base(script), args, err, out)
	}
	return string(out)
}
