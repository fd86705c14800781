package hub

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

// slowWeights makes every transfer of the weights take a while, so concurrent downloaders overlap.
func slowWeights(srv *hubtest.Server) {
	srv.InjectFault(testRepo, "model.safetensors", hubtest.Fault{Kind: hubtest.Slow, ChunkDelay: 15 * time.Millisecond, Times: 100})
}

func TestConcurrentDownloadersInOneProcess(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(30, 1<<20)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	slowWeights(srv)
	cacheDir := filepath.Join(t.TempDir(), "hub")

	const downloaders = 4
	errs := make([]error, downloaders)
	var wg sync.WaitGroup
	for i := range downloaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Separate clients, as separate parts of a program would have.
			c := newTestClient(t, srv)
			c.CacheDir = cacheDir
			_, errs[i] = c.Download(context.Background(), testRepo, quiet)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("downloader %d: %v", i, err)
		}
	}
	assertSnapshot(t, cacheDir, testRepo, commit, files, wantedFiles(files))
	if n := srv.Count(isContentGET(testRepo, "model.safetensors")); n != 1 {
		t.Errorf("the weights were transferred %d times; the blob lock should make it once", n)
	}
	if left := incompleteFiles(t, cacheDir, testRepo); len(left) != 0 {
		t.Errorf("partial files left: %v", left)
	}
}

const helperEnv = "DFLASH_HUB_TEST_HELPER"

// TestHelperProcessDownload is not a test: TestConcurrentDownloadersInTwoProcesses runs the test
// binary again with this function selected, to get a second downloading process.
func TestHelperProcessDownload(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	env, err := LoadEnv()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := NewClient(env).Download(ctx, testRepo, quiet); err != nil {
		t.Fatalf("helper download: %v", err)
	}
}

func TestConcurrentDownloadersInTwoProcesses(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(31, 1<<20)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	slowWeights(srv)
	tmp := t.TempDir()
	cacheDir := filepath.Join(tmp, "hub")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcessDownload$", "-test.count=1")
	cmd.Env = append(os.Environ(), srv.Env(cacheDir, filepath.Join(tmp, "home"))...)
	cmd.Env = append(cmd.Env, helperEnv+"=1", "HF_TOKEN=", "HF_HUB_OFFLINE=")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting helper process: %v", err)
	}
	childDone := make(chan error, 1)
	go func() { childDone <- cmd.Wait() }()

	// Start our downloads once the other process is transferring the weights under its lock.
	if err := srv.WaitFor(ctx, isContentGET(testRepo, "model.safetensors")); err != nil {
		t.Fatalf("the helper process never started downloading: %v\n%s", err, out)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newTestClient(t, srv)
			c.CacheDir = cacheDir
			_, errs[i] = c.Download(ctx, testRepo, quiet)
		}()
	}
	wg.Wait()
	if err := <-childDone; err != nil {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("in-process downloader %d: %v", i, err)
		}
	}
	assertSnapshot(t, cacheDir, testRepo, commit, files, wantedFiles(files))
	if n := srv.Count(isContentGET(testRepo, "model.safetensors")); n != 1 {
		t.Errorf("the weights were transferred %d times; the flock should make it once across processes", n)
	}
	if left := incompleteFiles(t, cacheDir, testRepo); len(left) != 0 {
		t.Errorf("partial files left: %v", left)
	}
}

// lockedBuffer collects a child's output from two pipes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
