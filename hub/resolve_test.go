package hub

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

func TestResolveModel(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(70, 5_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)

	work := t.TempDir()
	t.Chdir(work)
	if err := os.MkdirAll(filepath.Join(work, "my-model"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A local folder named like a repository shadows the repository.
	if err := os.MkdirAll(filepath.Join(work, "shadow-org", "shadow-model"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "weights.safetensors"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(c.CacheDir, RepoFolderName(testRepo), "snapshots", commit)

	tests := []struct {
		ref       string
		wantDir   string
		wantRepo  string
		wantError string
	}{
		{ref: "my-model", wantDir: filepath.Join(work, "my-model")},
		{ref: "./my-model", wantDir: filepath.Join(work, "my-model")},
		{ref: filepath.Join(work, "my-model"), wantDir: filepath.Join(work, "my-model")},
		{ref: "shadow-org/shadow-model", wantDir: filepath.Join(work, "shadow-org", "shadow-model")},
		{ref: testRepo, wantDir: snapDir, wantRepo: testRepo},
		{ref: "weights.safetensors", wantError: "is a file"},
		{ref: "./missing", wantError: "does not exist"},
		{ref: "/no/such/folder", wantError: "does not exist"},
		{ref: "a/b/c", wantError: "does not exist"},
		{ref: "not a repo!", wantError: "neither an existing folder nor a Hub repository"},
		{ref: "", wantError: "no model"},
	}
	for _, tc := range tests {
		t.Run(tc.ref, func(t *testing.T) {
			m, err := c.ResolveModel(context.Background(), tc.ref, quiet)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Dir != tc.wantDir || m.RepoID != tc.wantRepo || m.Local() != (tc.wantRepo == "") {
				t.Errorf("got %+v, want dir %s repo %q", m, tc.wantDir, tc.wantRepo)
			}
			if tc.wantRepo != "" && m.Commit != commit {
				t.Errorf("commit = %s, want %s", m.Commit, commit)
			}
		})
	}

	t.Run("missing repository", func(t *testing.T) {
		_, err := c.ResolveModel(context.Background(), "test-org/missing-model", quiet)
		if !errors.Is(err, ErrUnauthorized) {
			t.Errorf("err = %v, want the Hub's answer for a missing repository", err)
		}
	})
}
