package mlxc

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHostProfileRecordsLabelledStacks runs MLX work under the host profiler with two
// labels and a pause between them, and reads the file back: every sample carries a label
// that was set while it ran, stacks reach into libmlx, and nothing is kept while paused.
func TestHostProfileRecordsLabelledStacks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the host profiler is Linux only")
	}
	path := filepath.Join(t.TempDir(), "hp.txt")
	work := func(d time.Duration) {
		onMLX(t, func() {
			a := Zeros([]int{256, 256}, Float32)
			for end := time.Now().Add(d); time.Now().Before(end); {
				s := NewScope()
				Eval(Matmul(a, a))
				s.Close()
			}
		})
	}
	if err := StartHostProfile(200, 100_000); err != nil {
		t.Fatal(err)
	}
	if err := StartHostProfile(200, 100_000); err == nil {
		t.Fatal("a second start while running succeeded")
	}
	work(50 * time.Millisecond) // label 0: not recorded
	HostProfileLabel(1)
	work(200 * time.Millisecond)
	HostProfileLabel(0)
	work(50 * time.Millisecond)
	HostProfileLabel(7)
	work(200 * time.Millisecond)
	HostProfileLabel(0)
	if err := StopHostProfile(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	counts := map[int]int{}
	mlxFrames, goFrames := 0, 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 4 {
			t.Fatalf("short line %q", line)
		}
		label, err1 := strconv.Atoi(fields[0])
		n, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || n < 1 {
			t.Fatalf("bad line %q", line)
		}
		counts[label] += n
		if strings.Contains(line, "libmlx") {
			mlxFrames += n
		}
		if strings.Contains(line, ":go:") {
			goFrames += n
		}
	}
	if counts[1] < 50 || counts[7] < 50 || len(counts) != 2 {
		t.Fatalf("samples per label %v, want only labels 1 and 7, 50 or more each (~1000 expected)", counts)
	}
	if mlxFrames == 0 {
		t.Fatal("no stack reached into libmlx")
	}
	// Every stack ends in Go code (the cgo call, or the interrupted Go function), named by
	// the runtime.
	if total := counts[1] + counts[7]; goFrames < total/2 {
		t.Fatalf("%d of %d samples have a named Go frame", goFrames, total)
	}
	if err := StopHostProfile(path); err == nil {
		t.Fatal("a second stop succeeded")
	}
}
