package draft

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Targets resolve to their drafter by name prefix, only where this build loads the target's
// family; unserved pairs stay known (Match) and marked; a drafter is never its own target.
func TestRegistryResolve(t *testing.T) {
	r, err := NewRegistry("")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		target string
		pair   string // the matched pair's draft, served or not
		served bool
	}{
		{"mlx-community/Qwen3-4B-bf16", "z-lab/Qwen3-4B-DFlash-b16", true},
		{"mlx-community/Qwen3-4B-4bit", "z-lab/Qwen3-4B-DFlash-b16", true},
		{"mlx-community/Qwen3-4B-8bit", "z-lab/Qwen3-4B-DFlash-b16", true},
		{"Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", true},
		{"Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", true},
		{"/home/me/models/qwen3-4b-bf16/", "z-lab/Qwen3-4B-DFlash-b16", true},
		// The Qwen3.5 dense family (qwen3_5) is served, Qwen3.6 dense shares it.
		{"mlx-community/Qwen3.5-4B-MLX-bf16", "z-lab/Qwen3.5-4B-DFlash", true},
		{"Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", true},
		{"mlx-community/Qwen3.5-9B-4bit", "z-lab/Qwen3.5-9B-DFlash", true},
		{"mlx-community/Qwen3.5-27B-4bit", "z-lab/Qwen3.5-27B-DFlash", true},
		{"mlx-community/Qwen3.6-27B-4bit", "z-lab/Qwen3.6-27B-DFlash", true},
		{"mlx-community/Qwen3.8-27B-4bit", "z-lab/Qwen3.8-27B-DFlash2", true},
		{"Qwen/Qwen3.8-27B", "z-lab/Qwen3.8-27B-DFlash2", true},
		{"mlx-community/Qwen3.8-27B-mxfp8", "z-lab/Qwen3.8-27B-DFlash2", true},
		// The Qwen3.5/3.6 MoE family (qwen3_5_moe) is served too.
		{"mlx-community/Qwen3.5-35B-A3B-4bit", "z-lab/Qwen3.5-35B-A3B-DFlash", true},
		{"Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", true},
		// Drafters, and copies of them, are not targets.
		{"z-lab/Qwen3-4B-DFlash-b16", "", false},
		{"someone/Qwen3-8B-DFlash-b16-4bit", "", false},
		{"/models/qwen3-4b-dflash-b16", "", false},
		{"mlx-community/Llama-3-8B", "", false},
		{"mlx-community/Qwen3-40B", "", false}, // "Qwen3-4" is not a key; "Qwen3-4B" does not prefix "qwen3-40b"
	}
	for _, c := range cases {
		p, ok := r.Match(c.target)
		if p.Draft != c.pair || ok != (c.pair != "") || (ok && p.Served != c.served) {
			t.Errorf("Match(%q) = %+v, %v; want draft %q served %v", c.target, p, ok, c.pair, c.served)
		}
		want := ""
		if c.served {
			want = c.pair
		}
		if got, ok := r.Resolve(c.target); got != want || ok != (want != "") {
			t.Errorf("Resolve(%q) = %q, %v; want %q", c.target, got, ok, want)
		}
	}
	if known := strings.Join(r.Known(), " "); !strings.Contains(known, "Qwen3.5-35B-A3B") || !strings.Contains(known, "Qwen3.6-35B-A3B") {
		t.Errorf("Known() = %s, want the served MoE targets", known)
	}
	if known := strings.Join(r.Known(), " "); !strings.Contains(known, "Qwen3.5-4B") || !strings.Contains(known, "Qwen3.6-27B") {
		t.Errorf("Known() = %s, want the served Qwen3.5 and Qwen3.6 dense targets", known)
	}
	if !r.IsDraft("z-lab/Qwen3-4B-DFlash-b16") || r.IsDraft("mlx-community/Qwen3-4B-bf16") {
		t.Error("IsDraft does not tell drafters from targets")
	}
}

func TestRegistryUserFile(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "list.json")
	os.WriteFile(list, []byte(`[{"target":"my-org/MyModel","draft":"my-org/MyModel-DFlash"},{"target":"Qwen3-4B","draft":"me/better-draft"},{"target":"Qwen3.5-4B","draft":"me/qwen35-draft"}]`), 0o644)
	r, err := NewRegistry(list)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := r.Resolve("my-org/MyModel"); d != "my-org/MyModel-DFlash" {
		t.Errorf("user pair not used: %q", d)
	}
	// A user pair is served whatever its target's family: the target's config decides.
	if d, _ := r.Resolve("my-org/Qwen3.5-4B"); d != "me/qwen35-draft" {
		t.Errorf("user pair not used: %q", d)
	}
	if d, _ := r.Resolve("mlx-community/Qwen3-4B-bf16"); d != "me/better-draft" {
		t.Errorf("user pair does not override the built-in: %q", d)
	}
	obj := filepath.Join(dir, "obj.json")
	os.WriteFile(obj, []byte(`{"a/B":"c/D"}`), 0o644)
	r, err = NewRegistry(obj)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := r.Resolve("a/B"); d != "c/D" {
		t.Errorf("object form: %q", d)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`[{"target":"x"}]`), 0o644)
	if _, err := NewRegistry(bad); err == nil {
		t.Error("entry without draft accepted")
	}
	os.WriteFile(bad, []byte(`{nope`), 0o644)
	if _, err := NewRegistry(bad); err == nil {
		t.Error("malformed file accepted")
	}
	if _, err := NewRegistry(filepath.Join(dir, "absent.json")); err != nil {
		t.Errorf("missing file must be fine: %v", err)
	}
}

func TestFallbackLayerIDs(t *testing.T) {
	cases := []struct {
		n, d int
		want []int
	}{
		{64, 5, []int{1, 16, 31, 46, 61}},
		{40, 5, []int{1, 10, 19, 28, 37}},
		{32, 5, []int{1, 8, 15, 22, 29}},
		{36, 5, []int{1, 9, 17, 25, 33}},
		{36, 1, []int{18}},
	}
	for _, c := range cases {
		got := FallbackLayerIDs(c.n, c.d)
		for i := range c.want {
			if got[i] != c.want[i] {
				t.Errorf("FallbackLayerIDs(%d,%d) = %v, want %v", c.n, c.d, got, c.want)
				break
			}
		}
	}
}
