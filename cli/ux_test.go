package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A --block-size the engine cannot use as given is reported on stderr, not changed silently.
func TestBlockSizeNotices(t *testing.T) {
	td, dd := tinyPair(t) // the tiny drafter's block is 16
	for _, tc := range []struct {
		name string
		args []string
		want string // "" = no notice
	}{
		{"above the drafter's", []string{"--draft-model", dd, "--block-size", "32"}, "--block-size 32 is larger than the drafter's block (16); using 16"},
		{"one", []string{"--draft-model", dd, "--block-size", "1"}, "--block-size 1 leaves no room for drafts"},
		{"without a drafter", []string{"--no-draft", "--block-size", "4"}, "--block-size 4 has no effect without a drafter"},
		{"within the drafter's", []string{"--draft-model", dd, "--block-size", "4"}, ""},
		{"the drafter's", []string{"--draft-model", dd}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--target-model", td, "--prompt", "hi", "-n", "2", "--json"}, tc.args...)
			_, errOut, code := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if tc.want == "" {
				if strings.Contains(errOut, "--block-size") {
					t.Errorf("unexpected notice: %s", errOut)
				}
				return
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q lacks %q", errOut, tc.want)
			}
		})
	}
}

// serve --log-json logs only JSON lines, the start-up included.
func TestServeLogJSONOnly(t *testing.T) {
	base, _, logs := startServe(t, "--log-json")
	if code, _ := postJSON(t, base+"/v1/completions", map[string]any{"model": "tiny-qwen3", "prompt": "hi", "max_tokens": 2}); code != 200 {
		t.Fatalf("completion: status %d", code)
	}
	time.Sleep(200 * time.Millisecond)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var serving bool
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("not a JSON line: %q", l)
			continue
		}
		serving = serving || rec["msg"] == "serving"
	}
	if !serving {
		t.Errorf("no \"serving\" record among %d lines:\n%s", len(lines), logs.String())
	}
}
