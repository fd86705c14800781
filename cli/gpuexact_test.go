package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// An unset --gpu-exact is settled by the device and the target's quantization; a given
// one is kept. On this machine's backend (no CUDA) the unset case is off.
func TestDecideGPUExact(t *testing.T) {
	dir := t.TempDir()
	write := func(name, config string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if config != "" {
			if err := os.WriteFile(filepath.Join(d, "config.json"), []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	bf16 := write("bf16", `{"model_type":"qwen3","torch_dtype":"bfloat16"}`)
	q4 := write("q4", `{"model_type":"qwen3","quantization":{"group_size":64,"bits":4}}`)
	qnull := write("qnull", `{"model_type":"qwen3","quantization":null}`)
	hfq := write("hfq", `{"model_type":"qwen3","quantization_config":{"quant_method":"fp8"}}`)
	none := write("none", "")
	for _, c := range []struct {
		dir       string
		quantized bool
	}{{bf16, false}, {q4, true}, {qnull, false}, {hfq, true}, {none, true}} {
		if got := quantizedCheckpoint(c.dir); got != c.quantized {
			t.Errorf("quantizedCheckpoint(%s) = %v, want %v", filepath.Base(c.dir), got, c.quantized)
		}
	}
	cuda := false
	_ = mlxc.Do(func() error { cuda = mlxc.Backend() == "cuda" && mlxc.CUDAKernelsAvailable(); return nil })
	for _, c := range []struct {
		name       string
		given, set bool
		dir        string
		want       bool
	}{
		{name: "given on", given: true, set: true, dir: q4, want: true},
		{name: "given off", given: false, set: true, dir: bf16, want: false},
		{name: "unset, unquantized", dir: bf16, want: cuda},
		{name: "unset, quantized", dir: q4, want: false},
	} {
		st := settings.Default()
		st.Loop.GPUExact, st.Loop.GPUExactAuto = c.given, !c.set
		_ = mlxc.Do(func() error { decideGPUExact(&st, c.dir); return nil })
		if st.Loop.GPUExact != c.want || st.Loop.GPUExactAuto {
			t.Errorf("%s: GPUExact %v (auto left %v), want %v", c.name, st.Loop.GPUExact, st.Loop.GPUExactAuto, c.want)
		}
	}
}
