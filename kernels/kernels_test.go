package kernels

import "testing"

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
	for _, k := range []Kernel{GatedDeltaTape, GatedDeltaReplay, SplitKeys, SplitKeysMerge} {
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
