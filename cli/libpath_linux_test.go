package cli

import (
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
)

// version --json names the libmlx the loader picked: for binaries built in the checkout,
// the checkout's (scripts/test_install.sh checks installed and moved binaries the same way).
func TestVersionReportsLoadedLibrary(t *testing.T) {
	var v struct {
		MLXLibrary string `json:"mlx_library"`
	}
	versionJSON(t, &v)
	want, err := filepath.EvalSymlinks(filepath.Join(reftest.RepoRoot(), "third_party", "mlx", "lib"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := filepath.EvalSymlinks(filepath.Dir(v.MLXLibrary))
	if err != nil || got != want || filepath.Base(v.MLXLibrary) == "" {
		t.Errorf("mlx_library %q (%v), want a libmlx in %s", v.MLXLibrary, err, want)
	}
}
