package hub

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// A model is incomplete while a download left unfinished blobs or its newest snapshot lacks
// the config, a shard its index names or any weights, or has a dangling link; complete
// downloads are not.
func TestListCachedModelsMarksIncomplete(t *testing.T) {
	srv := hubtest.New(t)
	sharded := hubtest.LFSIfWeights(
		hubtest.File{Path: "config.json", Data: []byte(`{"model_type":"qwen3"}`)},
		hubtest.File{Path: "model.safetensors.index.json", Data: []byte(`{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}`)},
		hubtest.File{Path: "model-00001-of-00002.safetensors", Data: randomBytes(1, 1000)},
		hubtest.File{Path: "model-00002-of-00002.safetensors", Data: randomBytes(2, 1000)},
	)
	for _, id := range []string{"org/complete", "org/interrupted", "org/dangling"} {
		srv.AddRepo(id, hubtest.Public).Commit("main", modelFiles(70, 200_000)...)
	}
	for _, id := range []string{"org/sharded", "org/shard-missing"} {
		srv.AddRepo(id, hubtest.Public).Commit("main", sharded...)
	}
	c := newTestClient(t, srv)
	ctx := context.Background()
	for _, id := range []string{"org/complete", "org/dangling", "org/sharded", "org/shard-missing"} {
		if _, err := c.Download(ctx, id, quiet); err != nil {
			t.Fatal(err)
		}
	}
	// Interrupted while the weights stream: a partial blob stays, the snapshot has no weights.
	srv.InjectFault("org/interrupted", "model.safetensors", hubtest.Fault{Kind: hubtest.Stall, After: 50_000})
	cut, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := c.Download(cut, "org/interrupted", quiet); err == nil {
		t.Fatal("the stalled download succeeded")
	}
	// A shard's link removed, a blob removed under its link; a config alone (what reading a
	// model's config.json first leaves).
	snap := func(id string) string {
		s, err := c.CachedSnapshot(id, "main", []string{"*"})
		if err != nil {
			t.Fatal(err)
		}
		return s.Dir
	}
	if err := os.Remove(filepath.Join(snap("org/shard-missing"), "model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	blob, err := filepath.EvalSymlinks(filepath.Join(snap("org/dangling"), "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(blob); err != nil {
		t.Fatal(err)
	}
	srv.AddRepo("org/config-only", hubtest.Public).Commit("main", sharded...)
	if _, err := c.PeekFile(ctx, "org/config-only", "config.json", quiet); err != nil {
		t.Fatal(err)
	}

	models, err := ListCachedModels(c.CacheDir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		incomplete bool
		partial    bool
		missing    string
	}{
		"org/complete":      {false, false, ""},
		"org/sharded":       {false, false, ""},
		"org/interrupted":   {true, true, "*.safetensors"},
		"org/shard-missing": {true, false, "model-00002-of-00002.safetensors"},
		"org/dangling":      {true, false, "model.safetensors"},
		"org/config-only":   {true, false, "*.safetensors"},
	}
	if len(models) != len(want) {
		t.Fatalf("%d models, want %d: %+v", len(models), len(want), models)
	}
	for _, m := range models {
		w, ok := want[m.RepoID]
		if !ok {
			t.Errorf("unexpected model %s", m.RepoID)
			continue
		}
		var missing []string
		if len(m.Revisions) > 0 {
			missing = m.Revisions[0].Missing
		}
		if m.Incomplete() != w.incomplete || (m.PartialBytes > 0) != w.partial || strings.Join(missing, ",") != w.missing {
			t.Errorf("%s: incomplete %v, partial %d bytes, missing %q; want incomplete %v, partial %v, missing %q",
				m.RepoID, m.Incomplete(), m.PartialBytes, missing, w.incomplete, w.partial, w.missing)
		}
	}
}
