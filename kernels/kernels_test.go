package kernels

import "testing"

// The registry names each kernel once (MLX caches kernels by name, so two alike would share
// one build) and every kernel has a CUDA body.
func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range All() {
		if k.Name == "" || seen[k.Name] {
			t.Errorf("kernel name %q empty or listed twice", k.Name)
		}
		seen[k.Name] = true
		if len(k.Backends()) != 1 || k.Backends()[0] != CUDA || k.CUDA.Body == "" {
			t.Errorf("%s: backends %v, want a CUDA body", k.Name, k.Backends())
		}
	}
}

// Listing says cuda where CUDA kernels run and the fallback elsewhere, for every kernel.
func TestListing(t *testing.T) {
	for _, cuda := range []bool{true, false} {
		want := FallbackBackend
		if cuda {
			want = string(CUDA)
		}
		l := Listing(cuda)
		if len(l) != len(All()) {
			t.Fatalf("listing has %d kernels, the registry %d", len(l), len(All()))
		}
		for i, e := range l {
			if e.Name != All()[i].Name || e.Backend != want {
				t.Errorf("cuda %v: %+v, want %s on %s", cuda, e, All()[i].Name, want)
			}
		}
	}
}
