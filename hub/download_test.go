package hub

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

func TestDownloadFreshSnapshot(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(1, 300_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)

	snap, err := c.Download(context.Background(), testRepo, quiet)
	if err != nil {
		t.Fatalf("Download: %v", err)
	}
	want := wantedFiles(files)
	if snap.Commit != commit || snap.Revision != "main" || snap.RepoID != testRepo {
		t.Errorf("snapshot = %+v, want commit %s of %s@main", snap, commit, testRepo)
	}
	if wantDir := filepath.Join(c.CacheDir, "models--test-org--tiny-model", "snapshots", commit); snap.Dir != wantDir {
		t.Errorf("Dir = %s, want %s", snap.Dir, wantDir)
	}
	if strings.Join(snap.Files, ",") != strings.Join(keys(want), ",") {
		t.Errorf("Files = %v, want %v", snap.Files, keys(want))
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, want)

	ref, err := os.ReadFile(filepath.Join(c.CacheDir, RepoFolderName(testRepo), "refs", "main"))
	if err != nil || string(ref) != commit {
		t.Errorf("refs/main = %q, %v; want %q without newline", ref, err, commit)
	}
	if left := incompleteFiles(t, c.CacheDir, testRepo); len(left) != 0 {
		t.Errorf("partial files left: %v", left)
	}
	weights := fileByPath(t, files, "model.safetensors")
	if _, err := os.Stat(filepath.Join(c.CacheDir, ".locks", RepoFolderName(testRepo), expectedETag(weights)+".lock")); err != nil {
		t.Errorf("lock file not where huggingface_hub puts it: %v", err)
	}
	if tag, err := os.ReadFile(filepath.Join(c.CacheDir, "CACHEDIR.TAG")); err != nil || !bytes.HasPrefix(tag, []byte("Signature: 8a477f597d28d172789f06886806bc55")) {
		t.Errorf("CACHEDIR.TAG = %q, %v", tag, err)
	}
	// LFS content must come from the CDN, the rest from the resolve endpoint.
	if n := srv.Count(func(r hubtest.Request) bool {
		return r.Origin == "cdn" && r.Method == "GET" && r.File == "model.safetensors"
	}); n != 1 {
		t.Errorf("CDN GETs of model.safetensors = %d, want 1", n)
	}
}

func TestDownloadAgainUsesTheCache(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(2, 100_000)
	srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)
	ctx := context.Background()
	if _, err := c.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	before := len(srv.Requests())
	if _, err := c.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	for _, r := range srv.Requests()[before:] {
		if r.Origin == "cdn" || strings.Contains(r.Path, "/resolve/") {
			t.Errorf("second download fetched %s %s; every file was cached", r.Method, r.Path)
		}
	}
}

func TestTokenGoesToTheHubOnly(t *testing.T) {
	srv := hubtest.New(t)
	srv.AddToken("hf_good")
	repo := srv.AddRepo(testRepo, hubtest.Private)
	repo.Grant("hf_good")
	files := modelFiles(3, 50_000)
	repo.Commit("main", files...)
	c := newTestClient(t, srv)
	c.Token = "hf_good"
	if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatalf("Download of a private repo with a granted token: %v", err)
	}
	for _, r := range srv.Requests() {
		switch r.Origin {
		case "hub":
			if r.Authorization != "Bearer hf_good" {
				t.Errorf("hub request %s %s carried Authorization %q", r.Method, r.Path, r.Authorization)
			}
		case "cdn":
			if r.Authorization != "" {
				t.Errorf("the token leaked to the CDN: %s %s", r.Method, r.Path)
			}
		}
		if !strings.HasPrefix(r.UserAgent, "dflash-mlx") {
			t.Errorf("User-Agent = %q", r.UserAgent)
		}
	}
}

func TestDownloadFile(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(4, 80_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)
	ctx := context.Background()

	for _, name := range []string{"config.json", "model.safetensors", "extra/notes v1#2.txt", "README.md"} {
		path, err := c.DownloadFile(ctx, testRepo, name, quiet)
		if err != nil {
			t.Fatalf("DownloadFile(%s): %v", name, err)
		}
		if want := filepath.Join(c.CacheDir, RepoFolderName(testRepo), "snapshots", commit, filepath.FromSlash(name)); path != want {
			t.Errorf("path = %s, want %s", path, want)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, fileByPath(t, files, name).Data) {
			t.Errorf("%s: content differs (%v)", name, err)
		}
	}
	ref, _ := os.ReadFile(filepath.Join(c.CacheDir, RepoFolderName(testRepo), "refs", "main"))
	if string(ref) != commit {
		t.Errorf("refs/main = %q, want %q", ref, commit)
	}

	// Pinned to the commit, a cached file needs no request at all.
	before := len(srv.Requests())
	if _, err := c.DownloadFile(ctx, testRepo, "config.json", DownloadOptions{Revision: commit, Quiet: true}); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.Requests()) - before; n != 0 {
		t.Errorf("cached file at a pinned commit made %d requests", n)
	}

	_, err := c.DownloadFile(ctx, testRepo, "missing.json", quiet)
	if !errors.Is(err, ErrEntryNotFound) || !errors.Is(err, ErrNotFound) {
		t.Errorf("missing file: err = %v, want ErrEntryNotFound", err)
	}
}

func TestRevisionPinning(t *testing.T) {
	srv := hubtest.New(t)
	repo := srv.AddRepo(testRepo, hubtest.Public)
	oldFiles := modelFiles(10, 40_000)
	oldCommit := repo.Commit("main", oldFiles...)
	repo.Tag("v1.0", oldCommit)
	newFiles := modelFiles(11, 60_000)
	newCommit := repo.Commit("main", newFiles...)
	repo.Tag("refs/pr/1", oldCommit)
	c := newTestClient(t, srv)
	ctx := context.Background()

	tests := []struct {
		revision   string
		wantCommit string
		files      []hubtest.File
		wantRef    bool
	}{
		{"v1.0", oldCommit, oldFiles, true},
		{oldCommit, oldCommit, oldFiles, false},
		{"main", newCommit, newFiles, true},
		{"", newCommit, newFiles, true},
		{"refs/pr/1", oldCommit, oldFiles, true},
	}
	for _, tc := range tests {
		t.Run("rev="+tc.revision, func(t *testing.T) {
			snap, err := c.Download(ctx, testRepo, DownloadOptions{Revision: tc.revision, Quiet: true})
			if err != nil {
				t.Fatalf("Download: %v", err)
			}
			if snap.Commit != tc.wantCommit {
				t.Errorf("commit = %s, want %s", snap.Commit, tc.wantCommit)
			}
			assertSnapshot(t, c.CacheDir, testRepo, tc.wantCommit, tc.files, wantedFiles(tc.files))
			rev := tc.revision
			if rev == "" {
				rev = "main"
			}
			ref, err := os.ReadFile(filepath.Join(c.CacheDir, RepoFolderName(testRepo), "refs", filepath.FromSlash(rev)))
			if tc.wantRef && string(ref) != tc.wantCommit {
				t.Errorf("refs/%s = %q, %v; want %s", rev, ref, err, tc.wantCommit)
			}
			if !tc.wantRef && err == nil {
				t.Errorf("a ref file was written for commit hash %s", rev)
			}
		})
	}
	// Both snapshots stay side by side, sharing the blobs that did not change.
	snaps, _ := os.ReadDir(filepath.Join(c.CacheDir, RepoFolderName(testRepo), "snapshots"))
	if len(snaps) != 2 {
		t.Errorf("%d snapshots, want 2", len(snaps))
	}
}

func TestRenamedRepositoryIsFollowed(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(5, 30_000)
	commit := srv.AddRepo("new-org/tiny-model", hubtest.Public).Commit("main", files...)
	srv.Rename("old-org/tiny-model", "new-org/tiny-model")
	c := newTestClient(t, srv)

	snap, err := c.Download(context.Background(), "old-org/tiny-model", quiet)
	if err != nil {
		t.Fatalf("Download through a relative redirect: %v", err)
	}
	// Like huggingface_hub, the cache is keyed by the name the user asked for.
	assertSnapshot(t, c.CacheDir, "old-org/tiny-model", commit, files, wantedFiles(files))
	if snap.Commit != commit {
		t.Errorf("commit = %s, want %s", snap.Commit, commit)
	}
	if n := srv.Count(func(r hubtest.Request) bool { return r.Status == 307 }); n == 0 {
		t.Error("the server never redirected; the test does not test redirects")
	}
}

func TestCorruptDownloadIsRejected(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(6, 70_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	srv.InjectFault(testRepo, "model.safetensors", hubtest.Fault{Kind: hubtest.Corrupt, After: 1234})
	c := newTestClient(t, srv)

	_, err := c.Download(context.Background(), testRepo, DownloadOptions{Quiet: true, Workers: 1})
	if !errors.Is(err, ErrIntegrity) {
		t.Fatalf("err = %v, want ErrIntegrity", err)
	}
	if !strings.Contains(err.Error(), "sha256") {
		t.Errorf("message %q does not say which check failed", err)
	}
	weights := fileByPath(t, files, "model.safetensors")
	rc := newRepoCache(c.CacheDir, testRepo)
	for _, p := range []string{rc.blobPath(expectedETag(weights)), rc.incompletePath(expectedETag(weights)), rc.pointerPath(commit, "model.safetensors")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists after a failed verification", p)
		}
	}
	// The fault was one-off: the next attempt downloads a good copy.
	if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatalf("retry: %v", err)
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))
}

func TestNoMatchingFiles(t *testing.T) {
	srv := hubtest.New(t)
	srv.AddRepo(testRepo, hubtest.Public).Commit("main", modelFiles(7, 1000)...)
	c := newTestClient(t, srv)
	_, err := c.Download(context.Background(), testRepo, DownloadOptions{AllowPatterns: []string{"*.gguf"}, Quiet: true})
	if err == nil || !strings.Contains(err.Error(), "*.gguf") {
		t.Errorf("err = %v, want one naming the patterns", err)
	}
}

func TestCustomAllowPatterns(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(8, 1000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)
	snap, err := c.Download(context.Background(), testRepo, DownloadOptions{AllowPatterns: []string{"extra/", "README.md"}, Quiet: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{
		"extra/notes v1#2.txt": fileByPath(t, files, "extra/notes v1#2.txt").Data,
		"README.md":            fileByPath(t, files, "README.md").Data,
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, want)
	if len(snap.Files) != 2 {
		t.Errorf("Files = %v", snap.Files)
	}
}
