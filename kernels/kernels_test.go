package kernels

import (
	"fmt"
	"strings"
	"testing"
)

// The registry names each kernel once (MLX caches kernels by name, so two alike would share
// one build), every kernel has a CUDA body, and a Metal source, where there is one, has a
// body.
func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range All() {
		if k.Name == "" || seen[k.Name] {
			t.Errorf("kernel name %q empty or listed twice", k.Name)
		}
		seen[k.Name] = true
		b := k.Backends()
		if len(b) == 0 || b[0] != CUDA || k.CUDA.Body == "" {
			t.Errorf("%s: backends %v, want a CUDA body first", k.Name, b)
		}
		if k.Metal.Header != "" && k.Metal.Body == "" {
			t.Errorf("%s: a Metal header without a body", k.Name)
		}
		if want := k.Metal.Body != ""; (len(b) == 2 && b[1] == Metal) != want || len(b) > 2 {
			t.Errorf("%s: backends %v, Metal body %v", k.Name, b, want)
		}
	}
	for _, k := range []Kernel{GatedDeltaTape, GatedDeltaReplay, SplitKeys, SplitKeysMerge, FewQueryAttention, RowArgmax, RowLead} {
		if len(k.Backends()) != 2 {
			t.Errorf("%s: backends %v, want cuda and its metal twin", k.Name, k.Backends())
		}
	}
}

// Listing says cuda where CUDA kernels run and the fallback elsewhere, for every kernel;
// ListingFor says metal where Metal kernels run for the kernels with a Metal twin.
func TestListing(t *testing.T) {
	for _, c := range []struct{ cuda, metal bool }{{true, false}, {false, false}, {false, true}, {true, true}} {
		l := ListingFor(c.cuda, c.metal)
		if !c.metal {
			if old := Listing(c.cuda); len(old) != len(l) {
				t.Fatalf("Listing(%v) has %d kernels, ListingFor %d", c.cuda, len(old), len(l))
			}
		}
		if len(l) != len(All()) {
			t.Fatalf("listing has %d kernels, the registry %d", len(l), len(All()))
		}
		for i, e := range l {
			k := All()[i]
			want := FallbackBackend
			switch {
			case c.cuda:
				want = string(CUDA)
			case c.metal && k.Metal.Body != "":
				want = string(Metal)
			}
			if e.Name != k.Name || e.Backend != want {
				t.Errorf("cuda %v metal %v: %+v, want %s on %s", c.cuda, c.metal, e, k.Name, want)
			}
		}
	}
}

// Every kernel with a Metal twin states its contract, and both sources keep to it as far as
// reading them can tell: each names every input and output of the contract and every
// template argument but element types a twin need not name, uses no intrinsic of the other
// backend, and has balanced brackets (the macOS workflow compiles and runs the twins
// against their fallbacks).
func TestMetalTwinsKeepTheContract(t *testing.T) {
	cudaOnly := []string{"__shfl", "__syncthreads", "__syncwarp", "threadIdx", "blockIdx", "blockDim", "gridDim", "__int_as_float", "expf(", "fmaf(", "fmaxf(", "uint4"}
	metalOnly := []string{"simd_", "threadgroup_position_in_grid", "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroups_per_grid", "threadgroup float", "simdgroup_barrier", "[["}
	for _, k := range All() {
		if k.Metal.Body == "" {
			continue
		}
		c := k.Contract
		if len(c.Inputs) == 0 || len(c.Outputs) == 0 {
			t.Errorf("%s: a Metal twin without a contract", k.Name)
			continue
		}
		for _, src := range []struct {
			backend string
			text    string
			foreign []string
		}{{"cuda", k.CUDA.Header + k.CUDA.Body, metalOnly}, {"metal", k.Metal.Header + k.Metal.Body, cudaOnly}} {
			for _, name := range append(append(append([]string(nil), c.Inputs...), c.Outputs...), c.Template...) {
				if src.backend == "metal" && (name == "T" || strings.HasSuffix(name, "T")) && !hasIdentifier(src.text, name) {
					continue // an element type the twin converts through float
				}
				if !hasIdentifier(src.text, name) {
					t.Errorf("%s (%s): does not use %q of its contract", k.Name, src.backend, name)
				}
			}
			for _, f := range src.foreign {
				if strings.Contains(src.text, f) {
					t.Errorf("%s (%s): uses %q, which the other backend has", k.Name, src.backend, f)
				}
			}
			if err := balanced(src.text); err != nil {
				t.Errorf("%s (%s): %v", k.Name, src.backend, err)
			}
		}
	}
}

// hasIdentifier reports whether name occurs in src as a whole identifier.
func hasIdentifier(src, name string) bool {
	isID := func(b byte) bool {
		return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
	}
	for i := 0; ; {
		j := strings.Index(src[i:], name)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(name)
		if (j == 0 || !isID(src[j-1])) && (end == len(src) || !isID(src[end])) {
			return true
		}
		i = j + 1
	}
}

// balanced checks the source's (), [] and {} pairs, outside comments.
func balanced(src string) error {
	var stack []byte
	pairs := map[byte]byte{')': '(', ']': '[', '}': '{'}
	for _, line := range strings.Split(src, "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		for i := 0; i < len(line); i++ {
			switch ch := line[i]; ch {
			case '(', '[', '{':
				stack = append(stack, ch)
			case ')', ']', '}':
				if len(stack) == 0 || stack[len(stack)-1] != pairs[ch] {
					return fmt.Errorf("unmatched %q", ch)
				}
				stack = stack[:len(stack)-1]
			}
		}
	}
	if len(stack) > 0 {
		return fmt.Errorf("%d brackets left open", len(stack))
	}
	return nil
}
