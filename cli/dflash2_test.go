package cli

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
)

// run picks the DFlash2 proposer from a drafter's config: --json names the drafter's
// kind, and greedy output equals --no-draft's token for token.
func TestRunDFlash2Drafter(t *testing.T) {
	tinyPair(t) // the tokenizer asset and its environment
	dir := t.TempDir()
	tspec, dspec, _ := pairShape("demo")
	dspec = dspec.DFlash2For()
	dspec.MaskTokenID = qwen3MaskToken
	td, dd := filepath.Join(dir, "target"), filepath.Join(dir, "draft")
	if err := writePair(td, dd, tspec, dspec); err != nil {
		t.Fatal(err)
	}
	type result struct {
		Tokens    []int32 `json:"tokens"`
		DraftKind string  `json:"draft_kind"`
		Stats     struct {
			Mode string `json:"mode"`
		} `json:"stats"`
	}
	get := func(args ...string) result {
		t.Helper()
		out, errOut, code := runCLI(t, append([]string{"run", "--target-model", td, "--prompt", "Write a haiku about Go.", "-n", "24", "--ignore-eos", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var r result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		return r
	}
	plain := get("--no-draft")
	d2 := get("--draft-model", dd)
	if d2.DraftKind != "dflash2" || d2.Stats.Mode != "dflash" {
		t.Fatalf("draft_kind %q, mode %q: want dflash2 through the DFlash loop", d2.DraftKind, d2.Stats.Mode)
	}
	if len(plain.Tokens) != 24 || !slices.Equal(plain.Tokens, d2.Tokens) {
		t.Fatalf("DFlash2 tokens %v, plain %v", d2.Tokens, plain.Tokens)
	}
}
