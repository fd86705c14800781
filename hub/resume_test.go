package hub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

func TestResumeAfterCutConnection(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		origin string // where the content is served from
		cutAt  int64
	}{
		{"LFS file from the CDN", "model.safetensors", "cdn", 100_000},
		{"LFS file cut inside the first chunk", "model.safetensors", "cdn", 1},
		{"regular file from resolve", "tokenizer.json", "hub", 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := hubtest.New(t)
			files := modelFiles(20, 400_000)
			commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
			srv.InjectFault(testRepo, tc.file, hubtest.Fault{Kind: hubtest.Cut, After: tc.cutAt})
			c := newTestClient(t, srv)

			if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
				t.Fatalf("Download: %v", err)
			}
			assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))

			var gets []hubtest.Request
			for _, r := range srv.Requests() {
				if isContentGET(testRepo, tc.file)(r) {
					gets = append(gets, r)
				}
			}
			if len(gets) != 2 {
				t.Fatalf("%d GETs of %s, want 2 (cut, then resumed): %+v", len(gets), tc.file, gets)
			}
			if gets[0].Range != "" || gets[0].Origin != tc.origin {
				t.Errorf("first GET: Range %q from %s, want no Range from %s", gets[0].Range, gets[0].Origin, tc.origin)
			}
			if want := fmt.Sprintf("bytes=%d-", tc.cutAt); gets[1].Range != want || gets[1].Status != 206 {
				t.Errorf("second GET: Range %q status %d, want %q and 206", gets[1].Range, gets[1].Status, want)
			}
			if left := incompleteFiles(t, c.CacheDir, testRepo); len(left) != 0 {
				t.Errorf("partial files left: %v", left)
			}
		})
	}
}

// TestCancelledDownloadResumesLater cancels a download in the middle of the weights. Nothing partial
// may appear in snapshots/, the partial blob stays in blobs/, and the next download (a new client,
// as a new process would be) continues it with a Range request.
func TestCancelledDownloadResumesLater(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(21, 500_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	const sentBeforeStall = 200_000
	srv.InjectFault(testRepo, "model.safetensors", hubtest.Fault{Kind: hubtest.Stall, After: sentBeforeStall})
	c := newTestClient(t, srv)
	weights := fileByPath(t, files, "model.safetensors")
	rc := newRepoCache(c.CacheDir, testRepo)
	partial := rc.incompletePath(expectedETag(weights))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Download(ctx, testRepo, quiet)
		done <- err
	}()
	// Cancel once every byte sent before the stall is on disk.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(partial); err == nil && fi.Size() == sentBeforeStall {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the partial file never reached the stall point")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Download did not return after cancellation")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}

	// Nothing partial is visible in the snapshot: every file there is complete and correct.
	snapDir := rc.snapshotDir(commit)
	for path, data := range readTreeIfExists(t, snapDir) {
		if string(data) != string(fileByPath(t, files, path).Data) {
			t.Errorf("snapshot file %s is not the complete file", path)
		}
	}
	if _, err := os.Lstat(rc.pointerPath(commit, "model.safetensors")); err == nil {
		t.Error("model.safetensors is linked in the snapshot although its download was cancelled")
	}
	if _, err := os.Stat(rc.blobPath(expectedETag(weights))); err == nil {
		t.Error("the blob was placed although its download was cancelled")
	}
	if fi, err := os.Stat(partial); err != nil || fi.Size() != sentBeforeStall {
		t.Fatalf("partial file: %v, %v; want %d bytes kept for resuming", fi, err, sentBeforeStall)
	}

	again := newTestClient(t, srv)
	again.CacheDir = c.CacheDir
	if _, err := again.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatalf("second Download: %v", err)
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))
	last := lastRequest(srv, isContentGET(testRepo, "model.safetensors"))
	if want := fmt.Sprintf("bytes=%d-", sentBeforeStall); last.Range != want || last.Status != 206 {
		t.Errorf("resuming GET had Range %q status %d, want %q 206", last.Range, last.Status, want)
	}
}

func TestStalledTransferIsRetried(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(22, 300_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	srv.InjectFault(testRepo, "model.safetensors", hubtest.Fault{Kind: hubtest.Stall, After: 50_000})
	c := newTestClient(t, srv)
	c.StallTimeout = 200 * time.Millisecond

	if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatalf("Download: %v", err)
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))
	// Look for the resuming request rather than take the last one: on a loaded machine a later
	// pause can exceed the short stall timeout and cause one more (harmless) retry.
	resumed := srv.Count(func(r hubtest.Request) bool {
		return isContentGET(testRepo, "model.safetensors")(r) && r.Range == "bytes=50000-"
	})
	if resumed != 1 {
		t.Errorf("%d requests resumed at the stall point (bytes=50000-), want 1", resumed)
	}
}

func TestOversizedPartialFileIsRestarted(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(23, 100_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)
	weights := fileByPath(t, files, "model.safetensors")
	rc := newRepoCache(c.CacheDir, testRepo)
	// A partial file longer than the blob cannot be a prefix of it: it must be discarded, not
	// resumed from.
	if err := os.MkdirAll(filepath.Dir(rc.incompletePath(expectedETag(weights))), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rc.incompletePath(expectedETag(weights)), make([]byte, len(weights.Data)+10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatalf("Download: %v", err)
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))
	if last := lastRequest(srv, isContentGET(testRepo, "model.safetensors")); last.Range != "" {
		t.Errorf("GET had Range %q; an oversized partial file must be restarted", last.Range)
	}
}

func TestResumeRestartsWhenServerIgnoresRange(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(24, 100_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	srv.InjectFault(testRepo, "model.safetensors", hubtest.Fault{Kind: hubtest.IgnoreRange})
	c := newTestClient(t, srv)
	weights := fileByPath(t, files, "model.safetensors")
	rc := newRepoCache(c.CacheDir, testRepo)
	partial := rc.incompletePath(expectedETag(weights))
	if err := os.MkdirAll(filepath.Dir(partial), 0o755); err != nil {
		t.Fatal(err)
	}
	// A genuine prefix, so the client asks for the rest; the server sends everything instead.
	if err := os.WriteFile(partial, weights.Data[:30_000], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatalf("Download: %v", err)
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))
	last := lastRequest(srv, isContentGET(testRepo, "model.safetensors"))
	if last.Range != "bytes=30000-" || last.Status != 200 {
		t.Errorf("GET had Range %q status %d; the test wants a resume answered with 200", last.Range, last.Status)
	}
}

func lastRequest(srv *hubtest.Server, match func(hubtest.Request) bool) hubtest.Request {
	var last hubtest.Request
	for _, r := range srv.Requests() {
		if match(r) {
			last = r
		}
	}
	return last
}

func readTreeIfExists(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	return readTree(t, dir)
}
