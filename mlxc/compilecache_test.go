//go:build linux

package mlxc

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// nvrtcRig is the NVRTC cache built into a small program (testdata/nvrtcfake/driver.c)
// that compiles through a shared library calling NVRTC as libmlx does (caller.c, its
// references versioned against libnvrtc.so.13), with the cache's entry points exported by
// the program as our binaries export them.
type nvrtcRig struct {
	driver string
	// ahead is testdata/nvrtcfake/ahead_driver.c built the same way.
	ahead string
	env   []string
}

func buildNVRTCRig(t *testing.T, nvrtcLib string) nvrtcRig {
	t.Helper()
	for _, tool := range []string{"cc", "c++"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	src, err := filepath.Abs("testdata/nvrtcfake")
	if err != nil {
		t.Fatal(err)
	}
	csrc, _ := filepath.Abs("csrc")
	dir := t.TempDir()
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	libDir := nvrtcLib
	if libDir == "" { // the stand-in NVRTC
		libDir = dir
		run("cc", "-shared", "-fPIC", "-Wl,--version-script="+filepath.Join(src, "fake_nvrtc.map"),
			"-Wl,-soname,libnvrtc.so.13", "-o", "libnvrtc.so.13", filepath.Join(src, "fake_nvrtc.c"))
	}
	run("cc", "-shared", "-fPIC", "-o", "libcaller.so", filepath.Join(src, "caller.c"),
		filepath.Join(libDir, "libnvrtc.so.13"), "-Wl,-rpath,"+libDir)
	run("cc", "-c", "-o", "driver.o", filepath.Join(src, "driver.c"))
	run("c++", "-std=c++20", "-O1", "-c", "-I"+csrc, "-o", "nvrtc_cache.o", filepath.Join(csrc, "nvrtc_cache.cpp"))
	run("c++", "-o", "driver", "driver.o", "nvrtc_cache.o", "-L"+dir, "-lcaller", "-ldl",
		"-Wl,--export-dynamic-symbol=nvrtc*", "-Wl,-rpath,"+dir+":"+libDir)
	run("cc", "-c", "-o", "ahead_driver.o", filepath.Join(src, "ahead_driver.c"))
	run("c++", "-o", "ahead_driver", "ahead_driver.o", "nvrtc_cache.o", "-L"+dir, "-lcaller", "-ldl", "-lpthread",
		"-Wl,--export-dynamic-symbol=nvrtc*", "-Wl,-rpath,"+dir+":"+libDir)
	// NVRTC opens its builtins library by name: LD_LIBRARY_PATH finds it.
	env := append(os.Environ(), "FAKE_NVRTC_COUNT="+filepath.Join(dir, "compiles"), "LD_LIBRARY_PATH="+libDir)
	return nvrtcRig{driver: filepath.Join(dir, "driver"), ahead: filepath.Join(dir, "ahead_driver"), env: env}
}

// runAhead runs the ahead driver on the cache folder with steps and returns its output
// lines.
func (r nvrtcRig) runAhead(t *testing.T, cache string, steps ...string) []string {
	t.Helper()
	cmd := exec.Command(r.ahead, append([]string{cache}, steps...)...)
	cmd.Env = r.env
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ahead driver: %v\n%s", err, b)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

type jitResult struct {
	out                              string // the caller's line: lowered name and code, or the error
	active                           bool
	hits, compiles, writes, failures int
	compileNS                        int // time counted in NVRTC's compile
	realCompiles                     int // compiles the stand-in NVRTC counted over the whole test
}

var statsLine = regexp.MustCompile(`active=(\d) hits=(\d+) compiles=(\d+) writes=(\d+) failures=(\d+) compile_ns=(\d+)`)

func (r nvrtcRig) jit(t *testing.T, cacheDir, source, header, option, kind string) jitResult {
	t.Helper()
	cmd := exec.Command(r.driver, cacheDir, source, header, option, kind)
	cmd.Env = r.env
	b, _ := cmd.Output()
	lines := strings.SplitN(strings.TrimSpace(string(b)), "\n", 2)
	if len(lines) != 2 {
		t.Fatalf("driver printed %q", b)
	}
	m := statsLine.FindStringSubmatch(lines[1])
	if m == nil {
		t.Fatalf("driver's counts: %q", lines[1])
	}
	n := func(s string) int {
		v := 0
		for _, c := range s {
			v = v*10 + int(c-'0')
		}
		return v
	}
	res := jitResult{out: lines[0], active: m[1] == "1", hits: n(m[2]), compiles: n(m[3]), writes: n(m[4]), failures: n(m[5]), compileNS: n(m[6])}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(r.driver), "compiles")); err == nil {
		res.realCompiles = strings.Count(string(b), "compile\n")
	}
	return res
}

// TestCompileCacheAnswersTheNextProcess: a program compiled once is answered from the
// folder by the next process, with the same lowered name and code; anything that shapes the
// code (option, header, an included file, the source) compiles anew; damaged entries, a
// failed compile and an unset folder never answer.
func TestCompileCacheAnswersTheNextProcess(t *testing.T) {
	rig := buildNVRTCRig(t, "")
	work := t.TempDir()
	body := filepath.Join(work, "body.cuh")
	if err := os.WriteFile(body, []byte("int body = 1;"), 0o600); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(work, "cache")
	src := "#include \"" + body + "\" kernel A" // one line: the driver prints it on one
	first := rig.jit(t, cache, src, "h1", "-arch=sm_90", "cubin")
	wantOut := "lowered=_Z10ns::kernel code=cubin:code(" + src + "|-arch=sm_90)"
	if first.out != wantOut || !first.active || first.compiles != 1 || first.hits != 0 || first.writes != 1 || first.compileNS <= 0 {
		t.Fatalf("first process: %+v, want out %q, one compile (timed) and one write", first, wantOut)
	}
	steps := []struct {
		name                     string
		prepare                  func()
		dir, src, header, option string
		kind                     string
		wantHits, wantCompiles   int
	}{
		{name: "same program: answered", dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantHits: 1},
		{name: "other option", dir: cache, src: src, header: "h1", option: "-arch=sm_80", kind: "cubin", wantCompiles: 1},
		{name: "other header", dir: cache, src: src, header: "h2", option: "-arch=sm_90", kind: "cubin", wantCompiles: 1},
		{name: "other source", dir: cache, src: src + " ", header: "h1", option: "-arch=sm_90", kind: "cubin", wantCompiles: 1},
		{name: "PTX where the entry has CUBIN only: compiled then", dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "ptx", wantHits: 1, wantCompiles: 1},
		{name: "both kinds now", dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "ptx", wantHits: 1},
		{name: "included file edited in place", prepare: func() { must(t, os.WriteFile(body, []byte("int body = 2;"), 0o600)) },
			dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantCompiles: 1},
		{name: "edited file's entry answers", dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantHits: 1},
		{name: "damaged keys: compiled", prepare: func() { damageEntries(t, cache, func(n int) int { return n / 2 }) },
			dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantCompiles: 1},
		{name: "rewritten after damage", dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantHits: 1},
		{name: "damaged code: compiled", prepare: func() { damageEntries(t, cache, func(n int) int { return n - 12 }) },
			dir: cache, src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantCompiles: 1},
		{name: "no folder: no cache", dir: "", src: src, header: "h1", option: "-arch=sm_90", kind: "cubin", wantCompiles: 0},
	}
	for _, s := range steps {
		if s.prepare != nil {
			s.prepare()
		}
		before := rig.jit(t, "", "probe", "", "", "cubin").realCompiles // counts every compile so far
		got := rig.jit(t, s.dir, s.src, s.header, s.option, s.kind)
		real := got.realCompiles - before
		if !strings.HasPrefix(got.out, "lowered=_Z10ns::kernel code="+s.kind+":code("+s.src+"|"+s.option+")") {
			t.Errorf("%s: output %q", s.name, got.out)
		}
		if got.hits != s.wantHits || got.compiles != s.wantCompiles {
			t.Errorf("%s: hits %d compiles %d, want %d and %d", s.name, got.hits, got.compiles, s.wantHits, s.wantCompiles)
		}
		wantReal := s.wantCompiles
		if s.dir == "" {
			wantReal = 1 // compiled by NVRTC, not counted by a cache that is off
		}
		if real != wantReal {
			t.Errorf("%s: NVRTC compiled %d times, want %d", s.name, real, wantReal)
		}
		if (got.compileNS > 0) != (real > 0) {
			t.Errorf("%s: %d ns counted in NVRTC's compile for %d compiles", s.name, got.compileNS, real)
		}
	}
	failed := rig.jit(t, cache, "#error broken", "h1", "-arch=sm_90", "cubin")
	if failed.out != "error=compile 6 log=error" || failed.writes != 0 {
		t.Errorf("failed compile: %+v", failed)
	}
	again := rig.jit(t, cache, "#error broken", "h1", "-arch=sm_90", "cubin")
	if again.hits != 0 || again.out != failed.out {
		t.Errorf("a failed compile was answered from the cache: %+v", again)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// damageEntries flips the byte at(len) of every entry: in the key (the middle) or in the
// code (just before the checksum).
func damageEntries(t *testing.T, dir string, at func(int) int) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.bin"))
	if len(files) == 0 {
		t.Fatal("no entries to damage")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		must(t, err)
		b[at(len(b))] ^= 0x5a
		must(t, os.WriteFile(f, b, 0o600))
	}
}

// TestCompileCacheWithNVRTC runs the cache in front of the real NVRTC (make check-kernels
// installs it): a kernel's CUBIN for the H200 is answered by the next process byte for
// byte, without a compile.
func TestCompileCacheWithNVRTC(t *testing.T) {
	dir := os.Getenv("DFLASH_NVRTC_DIR")
	if dir == "" {
		t.Skip("DFLASH_NVRTC_DIR not set (make check-kernels)")
	}
	rig := buildNVRTCRig(t, filepath.Join(dir, "lib"))
	cache := t.TempDir()
	src := "namespace ns { __global__ void kernel(float* x) { x[threadIdx.x] *= 2.0f; } }"
	first := rig.jit(t, cache, src, "// unused header", "--gpu-architecture=sm_90", "cubin")
	if !strings.HasPrefix(first.out, "lowered=_ZN2ns6kernelEPf code=") || first.compiles != 1 || first.writes != 1 {
		t.Fatalf("first process: %+v", first)
	}
	second := rig.jit(t, cache, src, "// unused header", "--gpu-architecture=sm_90", "cubin")
	if second.out != first.out || second.hits != 1 || second.compiles != 0 {
		t.Fatalf("second process: %+v\nfirst: %.80q", second, first.out)
	}
}

// TestCompileCacheExported: this test binary, linked as the Makefile links ours, exports
// the cache's NVRTC entry points, so a libmlx loaded with it would call them.
func TestCompileCacheExported(t *testing.T) {
	if !strings.Contains(os.Getenv("CGO_LDFLAGS"), "--export-dynamic-symbol=nvrtc") {
		t.Skip("built without the Makefile's CGO_LDFLAGS (make test exports the entry points)")
	}
	if st := CompileCache(); !st.Active {
		t.Fatalf("NVRTC entry points not exported: %+v", st)
	}
}

// TestAheadCompilesAnswerMLX: custom kernels submitted ahead compile on threads of their own
// with the recipe learned from MLX's first custom-kernel compile (file name, headers,
// options, name expressions, outputs), and MLX's later compile of each is answered from the
// cache with the same lowered name and code a compile of its own gives; one submitted
// before the recipe is known waits for it; one whose source MLX builds differently counts
// as a mismatch and compiles as usual; the next process finds the entries present. File
// names as MLX 0.32.4 makes them (the source's hash in them) and plain ones both work.
func TestAheadCompilesAnswerMLX(t *testing.T) {
	for _, c := range []struct{ mode, helper string }{{"mlx", ""}, {"plain", ""}, {"mlx", "helper"}} {
		t.Run(c.mode+c.helper, func(t *testing.T) { testAheadCompiles(t, c.mode, c.helper != "") })
	}
}

// testAheadCompiles: mode names MLX's compiles (mlx: hashed file names, plain: not);
// helper: compiles ahead run as processes of their own.
func testAheadCompiles(t *testing.T, mode string, helper bool) {
	rig := buildNVRTCRig(t, "")
	src := func(fn string) string { return "__global__ void " + fn + "(int* x) { x[0] = 1; }" }
	cache := filepath.Join(t.TempDir(), "cache")
	run := func(steps ...string) []string {
		t.Helper()
		if helper {
			steps = append([]string{"helper::"}, steps...)
		}
		return rig.runAhead(t, cache, steps...)
	}
	want := func(fn, source string) string {
		return "lowered=_Z" + strconv.Itoa(len("ns::"+fn)) + "ns::" + fn + " code=cubin:code(" + source + "|-arch=sm_90)"
	}
	got := run(
		"ahead:custom_kernel_d:"+src("custom_kernel_d"), // before the recipe: kept until it is known
		mode+":custom_kernel_a:"+src("custom_kernel_a"), // MLX's first: compiled, recipe learned
		"ahead:custom_kernel_b:"+src("custom_kernel_b"),
		mode+":custom_kernel_b:"+src("custom_kernel_b"),
		mode+":custom_kernel_d:"+src("custom_kernel_d"),
		"ahead:custom_kernel_c:"+src("custom_kernel_c"),
		mode+":custom_kernel_c:"+src("custom_kernel_c")+" ", // MLX's source differs from the submitted one
	)
	wantLines := []string{
		want("custom_kernel_a", src("custom_kernel_a")),
		want("custom_kernel_b", src("custom_kernel_b")),
		want("custom_kernel_d", src("custom_kernel_d")),
		want("custom_kernel_c", src("custom_kernel_c")+" "),
		"hits=2 compiles=2 submitted=3 ahead=3 present=0 failed=0 answered=2 mismatched=1",
	}
	if diff := cmp.Diff(wantLines, got); diff != "" {
		t.Errorf("first process (-want +got):\n%s", diff)
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(rig.driver), "compiles"))
	if n := strings.Count(string(b), "compile\n"); n != 5 {
		t.Errorf("NVRTC compiled %d times, want 5 (a and the changed c by MLX, b, c and d ahead)", n)
	}
	got = run(mode+":custom_kernel_a:"+src("custom_kernel_a"), "ahead:custom_kernel_b:"+src("custom_kernel_b"),
		mode+":custom_kernel_b:"+src("custom_kernel_b"))
	wantLines = []string{
		want("custom_kernel_a", src("custom_kernel_a")),
		want("custom_kernel_b", src("custom_kernel_b")),
		"hits=2 compiles=0 submitted=1 ahead=0 present=1 failed=0 answered=1 mismatched=0",
	}
	if diff := cmp.Diff(wantLines, got); diff != "" {
		t.Errorf("next process (-want +got):\n%s", diff)
	}
}

// TestFusedJobsAnswerMLX: MLX's compile of a fused module that a fused-kernel job is
// compiling waits for the job and is answered from the cache (NVRTC compiles it once, in the
// helper); a failed job leaves the compile to MLX, after the job ended; a module no job
// compiles compiles at once; the next process finds the job's entry and does not wait for
// a job of the same module.
func TestFusedJobsAnswerMLX(t *testing.T) {
	rig := buildNVRTCRig(t, "")
	src := func(m string) string { return "__global__ void " + m + "_contiguous(int* x) { x[0] = 2; }" }
	cache := filepath.Join(t.TempDir(), "cache")
	run := func(steps ...string) []string {
		t.Helper()
		return rig.runAhead(t, cache, steps...)
	}
	want := func(m string) string {
		expr := "mlx::core::cu::" + m + "_contiguous<uint32_t, 4>"
		return "lowered=_Z" + strconv.Itoa(len(expr)) + expr + " code=cubin:code(" + src(m) + "|-arch=sm_90)"
	}
	got := run("fused:modA:"+src("modA"), "mlxf:modA:"+src("modA"),
		"fused:failB:"+src("failB"), "mlxf:failB:"+src("failB"),
		"mlxf:modC:"+src("modC"))
	wantLines := []string{want("modA"), want("failB"), want("modC"),
		"hits=1 compiles=2 submitted=0 ahead=0 present=0 failed=0 answered=0 mismatched=0",
		"fused: submitted=2 compiled=1 failed=1 answered=1 waited=yes"}
	if diff := cmp.Diff(wantLines, got); diff != "" {
		t.Errorf("first process (-want +got):\n%s", diff)
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(rig.driver), "compiles"))
	if n := strings.Count(string(b), "compile\n"); n != 3 {
		t.Errorf("NVRTC compiled %d times, want 3 (modA in the job, failB and modC by MLX)", n)
	}
	if left, _ := filepath.Glob(filepath.Join(cache, ".fused-*")); len(left) != 0 {
		t.Errorf("job files left behind: %v", left)
	}
	// The next process: the entry is there, so MLX's compile does not wait for a job.
	got = run("fused:modA:"+src("modA"), "mlxf:modA:"+src("modA"))
	wantLines = []string{want("modA"), "hits=1 compiles=0 submitted=0 ahead=0 present=0 failed=0 answered=0 mismatched=0",
		"fused: submitted=1 compiled=1 failed=0 answered=0 waited=no"}
	if diff := cmp.Diff(wantLines, got); diff != "" {
		t.Errorf("next process (-want +got):\n%s", diff)
	}
}

// Where MLX builds the first two programs otherwise than submitted (another MLX's
// generator), no further compile ahead starts: each would be wasted work beside MLX's own.
func TestAheadCompilesStopAfterMismatches(t *testing.T) {
	rig := buildNVRTCRig(t, "")
	src := func(fn string) string { return "__global__ void " + fn + "(int* x) { x[0] = 1; }" }
	cmd := exec.Command(rig.ahead, filepath.Join(t.TempDir(), "cache"),
		"mlx:custom_kernel_a:"+src("custom_kernel_a"),
		"ahead:custom_kernel_b:"+src("custom_kernel_b"), "ahead:custom_kernel_c:"+src("custom_kernel_c"), "wait::",
		"mlx:custom_kernel_b:"+src("custom_kernel_b")+" ", "mlx:custom_kernel_c:"+src("custom_kernel_c")+" ",
		"ahead:custom_kernel_d:"+src("custom_kernel_d"), "mlx:custom_kernel_d:"+src("custom_kernel_d"))
	cmd.Env = rig.env
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ahead driver: %v\n%s", err, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := "hits=0 compiles=4 submitted=3 ahead=2 present=0 failed=0 answered=0 mismatched=2"
	if got := lines[len(lines)-1]; got != want {
		t.Errorf("counts %q, want %q", got, want)
	}
}

// A job file a day old (left by a process that ended while its compile ahead ran) is
// removed when the cache opens its folder; a fresh one (a live compile's) is kept.
func TestCompileCacheRemovesStaleJobs(t *testing.T) {
	rig := buildNVRTCRig(t, "")
	cache := filepath.Join(t.TempDir(), "cache")
	must(t, os.MkdirAll(cache, 0o700))
	stale, fresh := filepath.Join(cache, ".job-1-0"), filepath.Join(cache, ".job-2-0")
	must(t, os.WriteFile(stale, []byte("x"), 0o600))
	must(t, os.WriteFile(fresh, []byte("x"), 0o600))
	old := time.Now().Add(-25 * time.Hour)
	must(t, os.Chtimes(stale, old, old))
	cmd := exec.Command(rig.ahead, cache, "wait::")
	cmd.Env = rig.env
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ahead driver: %v\n%s", err, b)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale job file still there (%v)", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh job file removed: %v", err)
	}
}
