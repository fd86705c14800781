package hub

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

func TestListCachedModels(t *testing.T) {
	srv := hubtest.New(t)
	a := srv.AddRepo("org-a/model-one", hubtest.Public)
	oldFiles := modelFiles(60, 30_000)
	oldCommit := a.Commit("main", oldFiles...)
	a.Tag("v1", oldCommit)
	newFiles := modelFiles(61, 50_000)
	newCommit := a.Commit("main", newFiles...)
	bFiles := modelFiles(62, 10_000)
	bCommit := srv.AddRepo("org-b/model-two", hubtest.Public).Commit("main", bFiles...)

	c := newTestClient(t, srv)
	ctx := context.Background()
	for _, d := range []struct{ repo, rev string }{{"org-a/model-one", "v1"}, {"org-a/model-one", "main"}, {"org-b/model-two", "main"}} {
		if _, err := c.Download(ctx, d.repo, DownloadOptions{Revision: d.rev, Quiet: true}); err != nil {
			t.Fatal(err)
		}
	}
	// Things in the cache that are not model repositories are ignored.
	if err := os.MkdirAll(filepath.Join(c.CacheDir, "datasets--org--data", "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}

	models, err := ListCachedModels(c.CacheDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(models) != 2 || models[0].RepoID != "org-a/model-one" || models[1].RepoID != "org-b/model-two" {
		t.Fatalf("models = %+v", models)
	}

	// Sizes are the distinct blobs: files that did not change between commits are stored once.
	sizeOf := func(files []hubtest.File) map[string]int64 {
		out := map[string]int64{}
		for _, f := range files {
			if matchAny(DefaultAllowPatterns, f.Path) {
				out[expectedETag(f)] = int64(len(f.Data))
			}
		}
		return out
	}
	sum := func(ms ...map[string]int64) int64 {
		all := map[string]int64{}
		for _, m := range ms {
			for k, v := range m {
				all[k] = v
			}
		}
		var n int64
		for _, v := range all {
			n += v
		}
		return n
	}
	one := models[0]
	if want := sum(sizeOf(oldFiles), sizeOf(newFiles)); one.SizeOnDisk != want {
		t.Errorf("org-a size = %d, want %d", one.SizeOnDisk, want)
	}
	if len(one.Revisions) != 2 {
		t.Fatalf("org-a revisions = %+v", one.Revisions)
	}
	byCommit := map[string]CachedRevision{}
	for _, r := range one.Revisions {
		byCommit[r.Commit] = r
	}
	for commit, want := range map[string]struct {
		refs  string
		files []hubtest.File
	}{oldCommit: {"v1", oldFiles}, newCommit: {"main", newFiles}} {
		r := byCommit[commit]
		if len(r.Refs) != 1 || r.Refs[0] != want.refs {
			t.Errorf("revision %s refs = %v, want [%s]", commit, r.Refs, want.refs)
		}
		if r.Files != len(wantedFiles(want.files)) {
			t.Errorf("revision %s has %d files, want %d", commit, r.Files, len(wantedFiles(want.files)))
		}
		if ws := sum(sizeOf(want.files)); r.SizeOnDisk != ws {
			t.Errorf("revision %s size = %d, want %d", commit, r.SizeOnDisk, ws)
		}
	}
	if two := models[1]; len(two.Revisions) != 1 || two.Revisions[0].Commit != bCommit || two.SizeOnDisk != sum(sizeOf(bFiles)) {
		t.Errorf("org-b = %+v", two)
	}
}

func TestListCachedModelsOfMissingCache(t *testing.T) {
	models, err := ListCachedModels(filepath.Join(t.TempDir(), "never-created"))
	if err != nil || len(models) != 0 {
		t.Errorf("ListCachedModels = %v, %v; want nothing and no error", models, err)
	}
}
