package cli

import (
	"strings"
	"testing"
)

// Every command's --help teaches by example: an "Examples:" section with at least one
// invocation of that very command.
func TestHelpHasExamples(t *testing.T) {
	for _, cmd := range []string{"run", "chat", "serve", "bench", "download", "models", "demo", "version"} {
		t.Run(cmd, func(t *testing.T) {
			out, errOut, code := runCLI(t, cmd, "--help")
			if code != 0 {
				t.Fatalf("%s --help: exit %d: %s", cmd, code, errOut)
			}
			_, examples, ok := strings.Cut(out, "Examples:\n")
			if !ok {
				t.Fatalf("%s --help has no Examples section:\n%s", cmd, out)
			}
			if !strings.Contains(examples, "  dflash-mlx "+cmd) {
				t.Errorf("%s --help examples never run %q:\n%s", cmd, "dflash-mlx "+cmd, examples)
			}
		})
	}
}
