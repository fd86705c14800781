package hub

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

const testRepo = "test-org/tiny-model"

// newTestClient returns a quiet client for srv with its own empty cache.
func newTestClient(t *testing.T, srv *hubtest.Server) *Client {
	t.Helper()
	c := NewClient(Env{Endpoint: srv.URL, CacheDir: filepath.Join(t.TempDir(), "hub")})
	c.StallTimeout = 5 * time.Second
	return c
}

// quiet are the options of most tests: the default patterns, no progress output.
var quiet = DownloadOptions{Quiet: true}

// randomBytes is deterministic filler for weights.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// modelFiles is a small model repository in the usual shape: configs, tokenizer files, a chat
// template, an LFS weights file, files the default patterns leave out, and names that need
// escaping in URLs.
func modelFiles(seed uint64, weightBytes int) []hubtest.File {
	return hubtest.LFSIfWeights(
		hubtest.File{Path: "config.json", Data: []byte(fmt.Sprintf(`{"model_type":"qwen3","hidden_size":64,"seed":%d}`, seed))},
		hubtest.File{Path: "tokenizer.json", Data: []byte(`{"version":"1.0","model":{"type":"BPE"}}`)},
		hubtest.File{Path: "tokenizer_config.json", Data: []byte(`{"eos_token":"<|im_end|>"}`)},
		hubtest.File{Path: "chat_template.jinja", Data: []byte(`{% for m in messages %}{{ m.content }}{% endfor %}`)},
		hubtest.File{Path: "merges.txt", Data: []byte("#version: 0.2\nĠ t\n")},
		hubtest.File{Path: "extra/notes v1#2.txt", Data: []byte("a file whose name needs escaping\n")},
		hubtest.File{Path: "model.safetensors", Data: randomBytes(seed, weightBytes)},
		hubtest.File{Path: "README.md", Data: []byte("# tiny model\n")},
		hubtest.File{Path: ".gitattributes", Data: []byte("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")},
	)
}

// wantedFiles are the paths of files the default patterns select.
func wantedFiles(files []hubtest.File) map[string][]byte {
	out := map[string][]byte{}
	for _, f := range files {
		if matchAny(DefaultAllowPatterns, f.Path) {
			out[f.Path] = f.Data
		}
	}
	return out
}

func fileByPath(t *testing.T, files []hubtest.File, path string) hubtest.File {
	t.Helper()
	for _, f := range files {
		if f.Path == path {
			return f
		}
	}
	t.Fatalf("no file %s in test repository", path)
	return hubtest.File{}
}

// expectedETag is the blob name the cache must use: sha256 for LFS files, git blob ID otherwise.
func expectedETag(f hubtest.File) string {
	if f.LFS {
		sum := sha256.Sum256(f.Data)
		return hex.EncodeToString(sum[:])
	}
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(f.Data))
	h.Write(f.Data)
	return hex.EncodeToString(h.Sum(nil))
}

// readTree returns every file under dir (following symlinks) keyed by slash path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[filepath.ToSlash(rel)] = data
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	return out
}

// assertSnapshot checks that a snapshot holds exactly want, in huggingface_hub's layout: every
// file a relative symlink into blobs/, named by the file's ETag.
func assertSnapshot(t *testing.T, cacheDir, repoID, commit string, files []hubtest.File, want map[string][]byte) {
	t.Helper()
	snapDir := filepath.Join(cacheDir, RepoFolderName(repoID), "snapshots", commit)
	got := readTree(t, snapDir)
	if len(got) != len(want) {
		t.Errorf("snapshot has %d files %v, want %d %v", len(got), keys(got), len(want), keys(want))
	}
	for path, data := range want {
		if !bytes.Equal(got[path], data) {
			t.Errorf("%s: content differs (got %d bytes, want %d)", path, len(got[path]), len(data))
		}
		pointer := filepath.Join(snapDir, filepath.FromSlash(path))
		target, err := os.Readlink(pointer)
		if err != nil {
			t.Errorf("%s is not a symlink: %v", path, err)
			continue
		}
		if filepath.IsAbs(target) {
			t.Errorf("%s links to absolute path %s; huggingface_hub uses relative links", path, target)
		}
		wantTarget, _ := filepath.Rel(filepath.Dir(pointer), filepath.Join(cacheDir, RepoFolderName(repoID), "blobs", expectedETag(fileByPath(t, files, path))))
		if target != wantTarget {
			t.Errorf("%s links to %s, want %s", path, target, wantTarget)
		}
	}
}

// incompleteFiles lists leftover partial downloads in a repository's blobs folder.
func incompleteFiles(t *testing.T, cacheDir, repoID string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(cacheDir, RepoFolderName(repoID), "blobs", "*.incomplete"))
	if err != nil {
		t.Fatal(err)
	}
	return matches
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// isContentGET matches GETs of a file's bytes, wherever they are served from.
func isContentGET(repoID, path string) func(hubtest.Request) bool {
	return func(r hubtest.Request) bool {
		return r.Method == "GET" && r.RepoID == repoID && r.File == path && (r.Origin == "cdn" || strings.Contains(r.Path, "/resolve/"))
	}
}
