package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run --json always prints a list of tokens, empty when none were generated.
func TestRunJSONNoTokens(t *testing.T) {
	td, dd := tinyPair(t)
	out, errOut, code := runCLI(t, "run", "--target-model", td, "--draft-model", dd, "--prompt", "hi", "-n", "0", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if got := string(res["tokens"]); got != "[]" {
		t.Errorf(`"tokens": %s, want []`, got)
	}
}

// A load that fails does not first report the load as done.
func TestFailedLoadIsNotDone(t *testing.T) {
	td, _ := tinyPair(t)
	broken := t.TempDir()
	entries, err := os.ReadDir(td)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(td, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(e.Name(), ".safetensors") {
			b = b[:len(b)/2] // the header promises more bytes than there are
		}
		if err := os.WriteFile(filepath.Join(broken, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, errOut, code := runCLI(t, "run", "--target-model", broken, "--no-draft", "--prompt", "hi", "-n", "1")
	if code == 0 {
		t.Fatal("a truncated checkpoint loaded")
	}
	if strings.Contains(errOut, "done") {
		t.Errorf("stderr reports the failed load as done:\n%s", errOut)
	}
	if !strings.Contains(errOut, "error:") {
		t.Errorf("stderr has no error line:\n%s", errOut)
	}
}
