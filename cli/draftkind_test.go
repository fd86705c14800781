package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// mtpCheckpoint writes a tiny Qwen3.5 target with the real vocabulary, with or without a
// multi-token-prediction head.
func mtpCheckpoint(t *testing.T, head bool) string {
	t.Helper()
	tinyPair(t) // the tokenizer for the subprocesses
	s := modelgen.TinyQwen35()
	s.Vocab, s.EOS, s.MTP, s.Seed = qwen3Vocab, []int{qwen3ImEnd, qwen3EndOfText}, head, 3
	root := t.TempDir()
	dir := filepath.Join(root, "target")
	write := func() error { return modelgen.WriteQwen35(dir, s) }
	if err := writePairWith(dir, filepath.Join(root, "draft"), write, s.EOS, modelgen.DrafterForQwen35(s, 1)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// --draft-kind: mtp drafts with the checkpoint's head and gives plain decoding's tokens;
// auto takes the head when no DFlash drafter is known and says so; a checkpoint without
// a head, a family without one, a bad kind and contradicting options are refused with
// the reason.
func TestDraftKind(t *testing.T) {
	withHead, without := mtpCheckpoint(t, true), mtpCheckpoint(t, false)
	qwen3Target, _ := tinyPair(t)
	type runJSON struct {
		Tokens    []int32 `json:"tokens"`
		DraftKind string  `json:"draft_kind"`
		Stats     struct {
			Mode string `json:"mode"`
		} `json:"stats"`
	}
	runOut := func(args ...string) (runJSON, string) {
		t.Helper()
		base := []string{"run", "--prompt", "hello there", "-n", "24", "--ignore-eos", "--no-chat-template", "--json", "--drafts-file", filepath.Join(t.TempDir(), "none.json")}
		out, errOut, code := runCLI(t, append(base, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var r runJSON
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: not JSON: %v\n%s", args, err, out)
		}
		return r, errOut
	}
	plain, _ := runOut("--target-model", withHead, "--draft-kind", "none")
	if plain.DraftKind != "" || len(plain.Tokens) != 24 {
		t.Fatalf("none: %+v", plain)
	}
	for _, args := range [][]string{
		{"--target-model", withHead, "--draft-kind", "mtp"},
		{"--target-model", withHead, "--draft-kind", "mtp", "--block-size", "3"},
		{"--target-model", withHead}, // auto
	} {
		got, _ := runOut(args...)
		if got.DraftKind != "mtp" || got.Stats.Mode != "dflash" {
			t.Errorf("%v: draft kind %q, mode %q, want mtp speculation", args, got.DraftKind, got.Stats.Mode)
		}
		if i, ok := sameTokens(got.Tokens, plain.Tokens); !ok {
			t.Errorf("%v: tokens differ from plain decoding at %d:\n %v\n %v", args, i, got.Tokens, plain.Tokens)
		}
	}
	// auto says what it chose on stderr (not under --json, which says it in draft_kind).
	_, errOut, code := runCLI(t, "run", "--target-model", withHead, "--prompt", "hi", "-n", "2", "--drafts-file", filepath.Join(t.TempDir(), "none.json"))
	if code != 0 || !strings.Contains(errOut, "drafting with its multi-token-prediction head") {
		t.Errorf("auto with a head: exit %d, stderr:\n%s", code, errOut)
	}
	autoPlain, errOut := runOut("--target-model", without)
	if autoPlain.DraftKind != "" {
		t.Errorf("auto without a head drafts with %q", autoPlain.DraftKind)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--target-model", without, "--draft-kind", "mtp"}, "no multi-token-prediction head"},
		{[]string{"--target-model", qwen3Target, "--draft-kind", "mtp"}, "the qwen3 family has none"},
		{[]string{"--target-model", withHead, "--draft-kind", "eagle"}, `--draft-kind "eagle": want auto, dflash, mtp or none`},
		{[]string{"--target-model", withHead, "--draft-kind", "mtp", "--no-draft"}, "contradict"},
		{[]string{"--target-model", withHead, "--draft-kind", "mtp", "--draft-model", withHead}, "--draft-model is a DFlash drafter"},
		{[]string{"--target-model", withHead, "--draft-kind", "dflash"}, "no DFlash draft is known"},
	} {
		args := append([]string{"run", "--prompt", "hi", "-n", "2", "--drafts-file", filepath.Join(t.TempDir(), "none.json")}, c.args...)
		_, errOut, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want an error saying %q:\n%s", c.args, code, c.want, errOut)
		}
	}
}

// bench --mtp-compare runs plain decoding, the DFlash drafter and the MTP head in one
// process: all three greedy outputs agree, and the step costs are measured.
func TestBenchMTPCompare(t *testing.T) {
	target := mtpCheckpoint(t, true)
	out, errOut, code := runCLI(t, "bench", "--target-model", target, "--draft-model", filepath.Join(filepath.Dir(target), "draft"),
		"--mtp-compare", "-n", "12", "--repeats", "1", "--warmup", "0", "--num-prompts", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r mtpReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(r.Rows) != 2 || r.MTPExactGreedy == nil || !*r.MTPExactGreedy || r.DFlashExactGreedy == nil || !*r.DFlashExactGreedy {
		t.Errorf("report: %+v", r)
	}
	for _, row := range r.Rows {
		if row.PlainTPS <= 0 || row.DFlashTPS <= 0 || row.MTPTPS <= 0 || row.MTPTau < 1 {
			t.Errorf("row %+v: a speed missing", row)
		}
	}
	if r.MTPStepMS <= 0 || r.TargetStepMS <= 0 || r.MTPBlock != 4 {
		t.Errorf("step costs %.3f / %.3f ms, block %d", r.MTPStepMS, r.TargetStepMS, r.MTPBlock)
	}
	// Without a head the comparison is refused with the reason.
	_, errOut, code = runCLI(t, "bench", "--target-model", mtpCheckpoint(t, false), "--draft-model", filepath.Join(filepath.Dir(target), "draft"), "--mtp-compare", "-n", "4")
	if code == 0 || !strings.Contains(errOut, "no multi-token-prediction head") {
		t.Errorf("without a head: exit %d:\n%s", code, errOut)
	}
}
