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

func TestOfflineResolvesFromTheCache(t *testing.T) {
	srv := hubtest.New(t)
	repo := srv.AddRepo(testRepo, hubtest.Public)
	oldFiles := modelFiles(40, 20_000)
	oldCommit := repo.Commit("main", oldFiles...)
	repo.Tag("v1", oldCommit)
	files := modelFiles(41, 20_000)
	commit := repo.Commit("main", files...)

	online := newTestClient(t, srv)
	ctx := context.Background()
	for _, rev := range []string{"main", "v1"} {
		if _, err := online.Download(ctx, testRepo, DownloadOptions{Revision: rev, Quiet: true}); err != nil {
			t.Fatal(err)
		}
	}
	offline := newTestClient(t, srv)
	offline.CacheDir = online.CacheDir
	offline.Offline = true
	before := len(srv.Requests())

	tests := []struct {
		revision   string
		wantCommit string
		files      []hubtest.File
	}{
		{"", commit, files},
		{"main", commit, files},
		{"v1", oldCommit, oldFiles},
		{oldCommit, oldCommit, oldFiles},
	}
	for _, tc := range tests {
		t.Run("rev="+tc.revision, func(t *testing.T) {
			snap, err := offline.Download(ctx, testRepo, DownloadOptions{Revision: tc.revision, Quiet: true})
			if err != nil {
				t.Fatalf("offline Download: %v", err)
			}
			if snap.Commit != tc.wantCommit {
				t.Errorf("commit = %s, want %s", snap.Commit, tc.wantCommit)
			}
			want := wantedFiles(tc.files)
			if strings.Join(snap.Files, ",") != strings.Join(keys(want), ",") {
				t.Errorf("Files = %v, want %v", snap.Files, keys(want))
			}
			for path, data := range want {
				got, err := os.ReadFile(snap.Path(path))
				if err != nil || string(got) != string(data) {
					t.Errorf("%s: %v or content differs", path, err)
				}
			}
			path, err := offline.DownloadFile(ctx, testRepo, "config.json", DownloadOptions{Revision: tc.revision})
			if err != nil || path != snap.Path("config.json") {
				t.Errorf("offline DownloadFile = %s, %v; want %s", path, err, snap.Path("config.json"))
			}
		})
	}
	if n := len(srv.Requests()) - before; n != 0 {
		t.Errorf("offline mode made %d requests", n)
	}
}

func TestOfflineFailsClearlyWhenNotCached(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(42, 10_000)
	srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	online := newTestClient(t, srv)
	ctx := context.Background()
	if _, err := online.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	offline := newTestClient(t, srv)
	offline.CacheDir = online.CacheDir
	offline.Offline = true
	before := len(srv.Requests())

	tests := []struct {
		name string
		run  func() error
	}{
		{"repository never downloaded", func() error {
			_, err := offline.Download(ctx, "other-org/other-model", quiet)
			return err
		}},
		{"branch never downloaded", func() error {
			_, err := offline.Download(ctx, testRepo, DownloadOptions{Revision: "dev", Quiet: true})
			return err
		}},
		{"commit never downloaded", func() error {
			_, err := offline.Download(ctx, testRepo, DownloadOptions{Revision: strings.Repeat("ab", 20), Quiet: true})
			return err
		}},
		{"no cached file matches", func() error {
			_, err := offline.Download(ctx, testRepo, DownloadOptions{AllowPatterns: []string{"*.gguf"}, Quiet: true})
			return err
		}},
		{"single file not downloaded", func() error {
			_, err := offline.DownloadFile(ctx, testRepo, "README.md", quiet)
			return err
		}},
		{"repository info", func() error {
			_, err := offline.RepoInfo(ctx, testRepo, "main")
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if !errors.Is(err, ErrNotCached) {
				t.Fatalf("err = %v, want ErrNotCached", err)
			}
			if !strings.Contains(err.Error(), "HF_HUB_OFFLINE=1") {
				t.Errorf("message %q does not mention offline mode", err)
			}
		})
	}
	if n := len(srv.Requests()) - before; n != 0 {
		t.Errorf("offline mode made %d requests", n)
	}
}

func TestOfflineReportsMissingBlob(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(43, 10_000)
	srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)
	if _, err := c.Download(context.Background(), testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	rc := newRepoCache(c.CacheDir, testRepo)
	if err := os.Remove(rc.blobPath(expectedETag(fileByPath(t, files, "config.json")))); err != nil {
		t.Fatal(err)
	}
	c.Offline = true
	_, err := c.Download(context.Background(), testRepo, quiet)
	if !errors.Is(err, ErrIntegrity) || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("err = %v, want ErrIntegrity naming config.json", err)
	}
}

// TestFailedUpdateKeepsThePreviousSnapshot: refs/main moves only when the new snapshot is complete,
// so offline mode falls back to the last complete one.
func TestFailedUpdateKeepsThePreviousSnapshot(t *testing.T) {
	srv := hubtest.New(t)
	repo := srv.AddRepo(testRepo, hubtest.Public)
	oldFiles := modelFiles(44, 20_000)
	oldCommit := repo.Commit("main", oldFiles...)
	c := newTestClient(t, srv)
	ctx := context.Background()
	if _, err := c.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	repo.Commit("main", modelFiles(45, 20_000)...)
	srv.InjectFault(testRepo, "model.safetensors", hubtest.Fault{Kind: hubtest.Corrupt, After: 7})
	if _, err := c.Download(ctx, testRepo, quiet); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("update: err = %v, want ErrIntegrity", err)
	}
	c.Offline = true
	snap, err := c.Download(ctx, testRepo, quiet)
	if err != nil || snap.Commit != oldCommit {
		t.Fatalf("offline after a failed update: %+v, %v; want the previous commit %s", snap, err, oldCommit)
	}
	assertSnapshot(t, c.CacheDir, testRepo, oldCommit, oldFiles, wantedFiles(oldFiles))
}

// Peeking at a new commit's config.json leaves the branch at the previous, complete
// snapshot: offline mode still finds it, and the peeked file is the new commit's.
func TestPeekFileLeavesTheRefAlone(t *testing.T) {
	srv := hubtest.New(t)
	repo := srv.AddRepo(testRepo, hubtest.Public)
	oldFiles := modelFiles(46, 20_000)
	oldCommit := repo.Commit("main", oldFiles...)
	c := newTestClient(t, srv)
	ctx := context.Background()
	if _, err := c.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	newFiles := modelFiles(47, 20_000)
	newCommit := repo.Commit("main", newFiles...)
	weights := func(r hubtest.Request) bool { return r.File == "model.safetensors" }
	before := srv.Count(weights)
	path, err := c.PeekFile(ctx, testRepo, "config.json", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(c.CacheDir, RepoFolderName(testRepo), "snapshots", newCommit, "config.json"); path != want {
		t.Errorf("peeked %s, want %s", path, want)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, fileByPath(t, newFiles, "config.json").Data) {
		t.Errorf("peeked content differs (%v)", err)
	}
	if ref, _ := os.ReadFile(filepath.Join(c.CacheDir, RepoFolderName(testRepo), "refs", "main")); string(ref) != oldCommit {
		t.Errorf("refs/main = %q after a peek, want the previous %q", ref, oldCommit)
	}
	if n := srv.Count(weights) - before; n != 0 {
		t.Errorf("the peek made %d requests for the weights", n)
	}
	c.Offline = true
	snap, err := c.Download(ctx, testRepo, quiet)
	if err != nil || snap.Commit != oldCommit {
		t.Fatalf("offline after a peek: %+v, %v; want the previous commit %s", snap, err, oldCommit)
	}
	if _, err := c.PeekFile(ctx, testRepo, "config.json", quiet); err != nil {
		t.Errorf("offline peek of a cached file: %v", err)
	}
	if _, err := c.PeekFile(ctx, "test-org/never-seen", "config.json", quiet); !errors.Is(err, ErrNotCached) {
		t.Errorf("offline peek of an uncached repo: %v, want ErrNotCached", err)
	}
}
