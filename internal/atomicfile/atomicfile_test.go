package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.txt")
	for _, c := range []struct {
		data string
		perm os.FileMode
	}{{"first", 0o600}, {"second, longer", 0o644}, {"", 0o640}} {
		if err := Write(path, []byte(c.data), c.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != c.data {
			t.Fatalf("file holds %q (%v), want %q", got, err, c.data)
		}
		if info, _ := os.Stat(path); info.Mode().Perm() != c.perm {
			t.Fatalf("mode %v, want %v", info.Mode().Perm(), c.perm)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("folder holds %d entries, want only the file", len(entries))
	}
	// A target that cannot be replaced (a non-empty folder) fails and leaves nothing behind.
	blocked := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(blocked, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(blocked, []byte("data"), 0o644); err == nil {
		t.Fatal("replacing a non-empty folder succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Fatalf("after the failure the folder holds %d entries, want the file and the folder", len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, 0o644); err == nil {
		t.Fatal("writing into a missing folder succeeded")
	}
}
