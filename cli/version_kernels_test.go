package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/kernels"
)

// version --json lists every registered kernel with the backend it runs on: cuda exactly
// where the custom CUDA kernels can run (cuda_kernels on a GPU device), metal for the
// kernels with a Metal twin where Metal kernels can, the ops otherwise.
func TestVersionListsKernels(t *testing.T) {
	var v struct {
		Device       string          `json:"device"`
		CUDAKernels  bool            `json:"cuda_kernels"`
		MetalKernels bool            `json:"metal_kernels"`
		Kernels      []kernels.Entry `json:"kernels"`
	}
	versionJSON(t, &v)
	gpu := strings.HasPrefix(v.Device, "gpu")
	all := kernels.All()
	if len(v.Kernels) != len(all) {
		t.Fatalf("%d kernels listed, %d registered", len(v.Kernels), len(all))
	}
	for i, e := range v.Kernels {
		want := kernels.FallbackBackend
		switch {
		case v.CUDAKernels && gpu:
			want = string(kernels.CUDA)
		case v.MetalKernels && gpu && all[i].Metal.Body != "":
			want = string(kernels.Metal)
		}
		if e.Name != all[i].Name || e.Backend != want {
			t.Errorf("kernel %d: %+v, want %s on %s (device %s)", i, e, all[i].Name, want, v.Device)
		}
	}
}

// versionJSON runs `version --json` and decodes its output into v.
func versionJSON(t *testing.T, v any) {
	t.Helper()
	out, errOut, code := runCLI(t, "version", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
}
