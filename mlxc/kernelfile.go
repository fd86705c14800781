package mlxc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/internal/atomicfile"
)

// MLX's CUDA custom kernel hashes its whole generated source (the header, the wrapper and
// the body) on every launch, to name the compiled module it looks up. Our kernels' sources
// are 3–12 KB, a DFlash cycle launches about 250 of them, and on the H200 that hashing was
// about a tenth of the host's time per cycle (scripts/hostprof.py). So a CUDA kernel's body
// and header go into content-addressed files that the source MLX sees only #includes
// (NVRTC reads absolute includes from the file system): the name changes with the content,
// so MLX's on-disk cache of compiled modules can never pair a source with stale code.

// kernelFileDir is where the kernel files go: the configured folder (Config.KernelDir),
// else the user's cache folder (per user, so no other account can plant a file there). ""
// keeps sources inline.
func kernelFileDir() string { return cacheFolder(config.KernelDir, "cuda-kernels") }

// cacheFolder is a configured folder ("off": none), else name in the user's cache
// folder ("" where there is none).
func cacheFolder(configured, name string) string {
	if configured != "" {
		if configured == "off" {
			return ""
		}
		return configured
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(base, "dflash-mlx", name)
}

// shapeTokens lists the <input>_shape, _strides and _ndim names that body mentions: MLX
// decides which of them to pass by searching the source text it is given, which will only
// hold the #include, so the names go into a comment beside it (same search, same result).
func shapeTokens(body string, inputs []string) []string {
	var out []string
	for _, in := range inputs {
		for _, suffix := range []string{"_shape", "_strides", "_ndim"} {
			if strings.Contains(body, in+suffix) {
				out = append(out, in+suffix)
			}
		}
	}
	return out
}

// writeKernelFile stores text in dir under a name made from its SHA-256 and returns the
// path. An existing file is reused only when its bytes are text (a damaged or edited one is
// replaced); a new one is written atomically, so a reader never sees a partial file.
func writeKernelFile(dir, text string) (string, error) {
	sum := sha256.Sum256([]byte(text))
	path := filepath.Join(dir, hex.EncodeToString(sum[:12])+".cuh")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, []byte(text)) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("kernel file dir %s: %w", dir, err)
	}
	if err := atomicfile.Write(path, []byte(text), 0o600); err != nil {
		return "", fmt.Errorf("kernel file %s: %w", path, err)
	}
	return path, nil
}

// includable reports whether files in dir can be named by a quoted #include: an absolute
// path (NVRTC's current folder is not ours) without quotes, backslashes or line breaks.
func includable(dir string) bool {
	return filepath.IsAbs(dir) && !strings.ContainsAny(dir, "\"\\\n\r")
}

func includeLine(path string) string { return "#include \"" + path + "\"\n" }

// KernelSources returns the body and header NewKernel hands MLX for spec with kernel files
// in dir: for a CUDA kernel, #include lines of files in dir holding spec's body and header;
// spec's own text for a Metal kernel, when dir is "" or when a file cannot be written (the
// kernel then works the same, only its launches cost more host time).
func KernelSources(spec KernelSpec, dir string) (source, header string) {
	if spec.Backend != KernelCUDA || !includable(dir) {
		return spec.Source, spec.Header
	}
	bodyPath, err := writeKernelFile(dir, spec.Source+"\n")
	if err != nil {
		return spec.Source, spec.Header
	}
	body := includeLine(bodyPath)
	if toks := shapeTokens(spec.Source, spec.Inputs); len(toks) > 0 {
		body += "// uses " + strings.Join(toks, " ") + "\n"
	}
	if spec.Header == "" {
		return body, ""
	}
	hdrPath, err := writeKernelFile(dir, spec.Header+"\n")
	if err != nil {
		return spec.Source, spec.Header
	}
	return body, includeLine(hdrPath)
}
