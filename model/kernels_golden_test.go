package model

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var updateKernelHashes = flag.Bool("update-kernel-hashes", false, "rewrite testdata/cuda_kernel_sources.sha256 from the current sources")

const kernelHashFile = "testdata/cuda_kernel_sources.sha256"

// kernelSourceHashes is the SHA-256 of every assembled kernel instantiation (its header,
// template constants, signature and body, as NVRTC gets them), by name; the include
// folder's path is replaced by a fixed word so that the hash depends on the sources alone.
func kernelSourceHashes(t *testing.T) map[string]string {
	inc := t.TempDir()
	out := map[string]string{}
	for _, k := range kernelChecks(t, inc) {
		k.Header = strings.ReplaceAll(k.Header, inc, "INCLUDE")
		k.Body = strings.ReplaceAll(k.Body, inc, "INCLUDE")
		js, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(js)
		h := hex.EncodeToString(sum[:])
		// The compile list names some launch shapes alike (the name leaves fields out);
		// identical sources count once, different ones get a numbered name.
		name := k.Name
		for n := 2; out[name] != "" && out[name] != h; n++ {
			name = fmt.Sprintf("%s~%d", k.Name, n)
		}
		out[name] = h
	}
	// The included forms name their files by content; hash those files too.
	files, err := filepath.Glob(filepath.Join(inc, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		out["file:"+filepath.Base(f)] = hex.EncodeToString(sum[:])
	}
	return out
}

// The assembled CUDA kernel sources are pinned by hash: a change of any instantiation's
// text shows here (regenerate with -update-kernel-hashes when the change is meant), so a
// refactoring that moves kernels around can show that the compiled sources, and with them
// the measured GPU speeds, are unchanged.
func TestCUDAKernelSourceHashes(t *testing.T) {
	got := kernelSourceHashes(t)
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	if *updateKernelHashes {
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, "%s  %s\n", got[n], n)
		}
		if err := os.WriteFile(kernelHashFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(kernelHashFile)
	if err != nil {
		t.Fatalf("%v (write it with go test -run TestCUDAKernelSourceHashes ./model -args -update-kernel-hashes)", err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		hash, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("%s: malformed line %q", kernelHashFile, sc.Text())
		}
		want[name] = hash
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		switch w, ok := want[n]; {
		case !ok:
			t.Errorf("%s: new kernel instantiation, not in %s", n, kernelHashFile)
		case w != got[n]:
			t.Errorf("%s: source changed (hash %s, pinned %s)", n, got[n][:12], w[:12])
		}
	}
	for n := range want {
		if _, ok := got[n]; !ok {
			t.Errorf("%s: pinned instantiation no longer exists", n)
		}
	}
}
