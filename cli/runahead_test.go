package cli

import (
	"strings"
	"testing"
)

// DFLASH_RUN_AHEAD takes 0 or 1; anything else fails with the variable and the accepted
// values, as DFLASH_TC_TILED does, instead of being ignored.
func TestRunAheadSetting(t *testing.T) {
	td, dd := tinyPair(t)
	for _, tc := range []struct {
		value, want string // want "" = runs
	}{
		{"maybe", `DFLASH_RUN_AHEAD="maybe": want 0`},
		{"true", `DFLASH_RUN_AHEAD="true": want 0`},
		{"0", ""},
		{"1", ""},
	} {
		t.Run(tc.value, func(t *testing.T) {
			cmd := cliCmd(t, "run", "--target-model", td, "--draft-model", dd, "--prompt", "hi", "-n", "2", "--block-size", "4", "--json")
			cmd.Env = append(cmd.Env, "DFLASH_RUN_AHEAD="+tc.value)
			var e strings.Builder
			cmd.Stderr = &e
			err := cmd.Run()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("DFLASH_RUN_AHEAD=%s: %v\n%s", tc.value, err, e.String())
			case tc.want != "" && (err == nil || !strings.Contains(e.String(), tc.want) || !strings.Contains(e.String(), "1 (")):
				t.Fatalf("DFLASH_RUN_AHEAD=%s: %v, stderr %q, want an error with %q and the accepted values", tc.value, err, e.String(), tc.want)
			}
		})
	}
}
