package mlxc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// includedPath is the file an #include line names.
func includedPath(t *testing.T, line string) string {
	t.Helper()
	first := strings.SplitN(line, "\n", 2)[0]
	if !strings.HasPrefix(first, `#include "`) || !strings.HasSuffix(first, `"`) {
		t.Fatalf("not an include line: %q", first)
	}
	return strings.TrimSuffix(strings.TrimPrefix(first, `#include "`), `"`)
}

func TestKernelSourcesMovesCUDAText(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "k")
	spec := KernelSpec{Backend: KernelCUDA, Name: "k", Inputs: []string{"x", "xx", "w"}, Outputs: []string{"y"},
		Source: "y[0] = x[xx_strides[0]] + w_ndim;", Header: "__device__ int f();"}
	body, hdr := KernelSources(spec, dir)
	for _, c := range []struct{ line, want string }{{body, spec.Source + "\n"}, {hdr, spec.Header + "\n"}} {
		got, err := os.ReadFile(includedPath(t, c.line))
		if err != nil || string(got) != c.want {
			t.Fatalf("file holds %q (%v), want %q", got, err, c.want)
		}
	}
	// MLX passes <input>_shape/_strides/_ndim by searching the text it gets: the same
	// substring search must find the same names (x_strides is found inside xx_strides).
	for _, in := range spec.Inputs {
		for _, suf := range []string{"_shape", "_strides", "_ndim"} {
			if strings.Contains(spec.Source, in+suf) != strings.Contains(body, in+suf) {
				t.Errorf("%s%s: in the body %v, in what MLX sees %v", in, suf, strings.Contains(spec.Source, in+suf), strings.Contains(body, in+suf))
			}
		}
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("kernel dir mode %v (%v), want 0700", info.Mode().Perm(), err)
	}
	// Same text, same file; a damaged file is rewritten whole.
	path := includedPath(t, body)
	if err := os.WriteFile(path, []byte("y[0] = 1;"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, _ := KernelSources(spec, dir)
	if again != body {
		t.Fatalf("same source, different include: %q vs %q", again, body)
	}
	if got, _ := os.ReadFile(path); string(got) != spec.Source+"\n" {
		t.Fatalf("damaged kernel file not replaced: %q", got)
	}
	// Different text, different file (MLX caches compiled modules by the text it sees).
	other := spec
	other.Source = "y[0] = 2;"
	if b, _ := KernelSources(other, dir); b == body {
		t.Fatal("two bodies share one file")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".cuh") || strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestKernelSourcesKeepsTextInline(t *testing.T) {
	cuda := KernelSpec{Backend: KernelCUDA, Name: "k", Inputs: []string{"x"}, Outputs: []string{"y"}, Source: "y[0] = x[0];", Header: "// h"}
	metal := cuda
	metal.Backend = KernelMetal
	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		spec KernelSpec
		dir  string
	}{
		{"no dir", cuda, ""},
		{"metal", metal, t.TempDir()},
		{"dir is a file", cuda, filepath.Join(blocked, "sub")},
		{"quote in path", cuda, filepath.Join(t.TempDir(), `a"b`)},
		{"relative dir", cuda, "relative/dir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, hdr := KernelSources(c.spec, c.dir)
			if body != c.spec.Source || hdr != c.spec.Header {
				t.Fatalf("got %q / %q, want the spec's own text", body, hdr)
			}
		})
	}
}

func TestKernelFileDir(t *testing.T) {
	defer func(c Config) { config = c }(config)
	config.KernelDir = "off"
	if d := kernelFileDir(); d != "" {
		t.Fatalf("off: %q", d)
	}
	config.KernelDir = "/some/where"
	if d := kernelFileDir(); d != "/some/where" {
		t.Fatalf("explicit dir: %q", d)
	}
}
