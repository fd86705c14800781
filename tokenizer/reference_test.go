package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Reference-dependent tests compare against the Python packages in the
// reference interpreter (<repo>/third_party/pyref/bin/python, or
// $DFLASH_PYREF) and use the real Qwen3 tokenizer installed by
// scripts/deps_testdata.sh. Without them the tests skip, unless
// DFLASH_REQUIRE_REFERENCE=1 (CI), where they fail.

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatalf("repo root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repo root %s has no go.mod: %v", root, err)
	}
	return root
}

// missingReference skips the test, or fails it when the reference is
// required.
func missingReference(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("DFLASH_REQUIRE_REFERENCE") == "1" {
		t.Fatalf("reference required (DFLASH_REQUIRE_REFERENCE=1) but missing: %s", msg)
	}
	t.Skipf("reference missing, skipping: %s", msg)
}

// qwen3Dir returns the directory of the real Qwen3 tokenizer files.
func qwen3Dir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "third_party", "testdata", "qwen3")
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			missingReference(t, "%s (run scripts/deps_testdata.sh)", filepath.Join(dir, f))
		}
	}
	return dir
}

// pythonReference returns the reference interpreter.
func pythonReference(t testing.TB) string {
	t.Helper()
	py := os.Getenv("DFLASH_PYREF")
	if py == "" {
		py = filepath.Join(repoRoot(t), "third_party", "pyref", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		missingReference(t, "Python reference interpreter %s (make deps, or set DFLASH_PYREF)", py)
	}
	return py
}

// runPythonReference runs testdata/<script> with args, sending request as
// JSON on stdin and decoding its JSON stdout into response.
func runPythonReference(t testing.TB, script string, args []string, request, response any) {
	t.Helper()
	py := pythonReference(t)
	in, err := json.Marshal(request)
	if err != nil {
		t.Fatalf("marshal request: %v", err)
	}
	cmd := exec.Command(py, append([]string{filepath.Join("testdata", script)}, args...)...)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", py, script, err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), response); err != nil {
		t.Fatalf("%s output: %v\n%s", script, err, stderr.String())
	}
}

var (
	qwen3Once sync.Once
	qwen3Tok  *Tokenizer
	qwen3Err  error
)

// loadQwen3 loads the real Qwen3 tokenizer once for the whole test binary.
func loadQwen3(t testing.TB) *Tokenizer {
	t.Helper()
	dir := qwen3Dir(t)
	qwen3Once.Do(func() { qwen3Tok, qwen3Err = Load(dir) })
	if qwen3Err != nil {
		t.Fatalf("Load(%s): %v", dir, qwen3Err)
	}
	return qwen3Tok
}
