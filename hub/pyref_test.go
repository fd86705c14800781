package hub

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

// The interop tests run Python's huggingface_hub, the reference for the cache layout, on the same
// cache as our client. The interpreter is <repo>/third_party/pyref/bin/python (installed by
// `make deps`), or $DFLASH_PYREF.

// pythonReference returns the reference interpreter, or skips (fails under
// DFLASH_REQUIRE_REFERENCE=1) when it or huggingface_hub is missing.
func pythonReference(t *testing.T) string {
	t.Helper()
	py := os.Getenv("DFLASH_PYREF")
	if py == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatal(err)
		}
		py = filepath.Join(root, "third_party", "pyref", "bin", "python")
	}
	missing := func(why string) {
		msg := "Python reference unavailable (" + why + "): run `make deps`, or set DFLASH_PYREF to a python with huggingface_hub"
		if os.Getenv("DFLASH_REQUIRE_REFERENCE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := os.Stat(py); err != nil {
		missing(py + " not found")
	}
	if out, err := exec.Command(py, "-c", "import huggingface_hub").CombinedOutput(); err != nil {
		missing("huggingface_hub does not import: " + strings.TrimSpace(string(out)))
	}
	return py
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

// runPython runs script with a JSON request on stdin and decodes its JSON answer from stdout.
func runPython(t *testing.T, py, script string, env []string, request, answer any) {
	t.Helper()
	in, err := json.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", script)
	// Only what huggingface_hub needs, so a developer's own token or cache cannot leak in.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python: %v\nstderr:\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), answer); err != nil {
		t.Fatalf("python answer %q: %v\nstderr:\n%s", stdout.String(), err, stderr.String())
	}
}

const pyReadCache = `
import hashlib, json, sys
from huggingface_hub import snapshot_download, hf_hub_download
req = json.load(sys.stdin)
out = {}
for rev in req["revisions"]:
    folder = snapshot_download(req["repo"], revision=rev, local_files_only=True)
    files = {}
    for f in req["files"]:
        path = hf_hub_download(req["repo"], f, revision=rev, local_files_only=True)
        with open(path, "rb") as fh:
            files[f] = {"path": path, "sha256": hashlib.sha256(fh.read()).hexdigest()}
    out[rev] = {"folder": folder, "files": files}
json.dump(out, sys.stdout)
`

// TestPythonFindsWhatWeDownloaded: after our client fills the cache, huggingface_hub in offline
// mode resolves the same snapshot folders and files, with the same bytes.
func TestPythonFindsWhatWeDownloaded(t *testing.T) {
	py := pythonReference(t)
	srv := hubtest.New(t)
	repo := srv.AddRepo(testRepo, hubtest.Public)
	oldFiles := modelFiles(90, 150_000)
	oldCommit := repo.Commit("main", oldFiles...)
	repo.Tag("v1", oldCommit)
	files := modelFiles(91, 200_000)
	commit := repo.Commit("main", files...)

	c := newTestClient(t, srv)
	ctx := context.Background()
	snaps := map[string]*Snapshot{}
	for _, rev := range []string{"main", "v1", oldCommit} {
		s, err := c.Download(ctx, testRepo, DownloadOptions{Revision: rev, Quiet: true})
		if err != nil {
			t.Fatal(err)
		}
		snaps[rev] = s
	}
	before := len(srv.Requests())

	var answer map[string]struct {
		Folder string
		Files  map[string]struct{ Path, SHA256 string }
	}
	env := append(srv.Env(c.CacheDir, t.TempDir()), "HF_HUB_OFFLINE=1")
	runPython(t, py, pyReadCache, env, map[string]any{
		"repo": testRepo, "revisions": []string{"main", "v1", oldCommit}, "files": snaps["main"].Files,
	}, &answer)

	for rev, want := range map[string]struct {
		commit string
		files  []hubtest.File
	}{"main": {commit, files}, "v1": {oldCommit, oldFiles}, oldCommit: {oldCommit, oldFiles}} {
		got := answer[rev]
		if filepath.Clean(got.Folder) != snaps[rev].Dir {
			t.Errorf("%s: Python's snapshot folder %s, ours %s", rev, got.Folder, snaps[rev].Dir)
		}
		for _, f := range snaps["main"].Files {
			data := fileByPath(t, want.files, f).Data
			sum := sha256.Sum256(data)
			pf := got.Files[f]
			if pf.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("%s: Python read %s with sha256 %s, want %x", rev, f, pf.SHA256, sum)
			}
			if filepath.Clean(pf.Path) != snaps[rev].Path(f) {
				t.Errorf("%s: Python resolved %s to %s, we to %s", rev, f, pf.Path, snaps[rev].Path(f))
			}
		}
	}
	if n := len(srv.Requests()) - before; n != 0 {
		t.Errorf("Python made %d requests in offline mode", n)
	}
}

const pyDownload = `
import json, sys
from huggingface_hub import snapshot_download, hf_hub_download
req = json.load(sys.stdin)
out = {}
for job in req["jobs"]:
    if job.get("file"):
        out[job["name"]] = hf_hub_download(job["repo"], job["file"], revision=job["revision"])
    else:
        out[job["name"]] = snapshot_download(job["repo"], revision=job["revision"], max_workers=4)
json.dump(out, sys.stdout)
`

// TestWeFindWhatPythonDownloaded: huggingface_hub downloads from the fake Hub (so the fake must be
// realistic enough for it), then our client finds everything offline, and online re-downloads nothing.
func TestWeFindWhatPythonDownloaded(t *testing.T) {
	py := pythonReference(t)
	srv := hubtest.New(t)
	repo := srv.AddRepo(testRepo, hubtest.Public)
	oldFiles := modelFiles(92, 120_000)
	oldCommit := repo.Commit("main", oldFiles...)
	repo.Tag("v1", oldCommit)
	files := modelFiles(93, 300_000)
	commit := repo.Commit("main", files...)
	srv.AddToken("hf_python")
	private := srv.AddRepo("test-org/private-model", hubtest.Private)
	private.Grant("hf_python")
	privateFiles := modelFiles(94, 50_000)
	privateCommit := private.Commit("main", privateFiles...)

	cacheDir := filepath.Join(t.TempDir(), "hub")
	var answer map[string]string
	env := append(srv.Env(cacheDir, t.TempDir()), "HF_TOKEN=hf_python")
	runPython(t, py, pyDownload, env, map[string]any{"jobs": []map[string]string{
		{"name": "main", "repo": testRepo, "revision": "main"},
		{"name": "v1-config", "repo": testRepo, "revision": "v1", "file": "config.json"},
		{"name": "private", "repo": "test-org/private-model", "revision": "main"},
	}}, &answer)

	// The fake Hub must have been realistic enough for Python's own path: listing through the tree
	// API, LFS files through a 302 to the CDN, and no token sent there.
	isPython := func(r hubtest.Request) bool { return strings.HasPrefix(r.UserAgent, "unknown/None; hf_hub/") }
	if srv.Count(func(r hubtest.Request) bool { return isPython(r) && strings.Contains(r.Path, "/tree/") }) == 0 {
		t.Error("Python never listed files through the tree API")
	}
	if srv.Count(func(r hubtest.Request) bool { return isPython(r) && r.Method == "HEAD" && r.Status == 302 }) == 0 {
		t.Error("Python never met an LFS redirect")
	}
	if n := srv.Count(func(r hubtest.Request) bool {
		return isPython(r) && r.Origin == "cdn" && r.Method == "GET" && r.Status == 200 && r.Authorization == ""
	}); n != 2 {
		t.Errorf("Python made %d token-free CDN downloads, want 2 (one weights file per repository)", n)
	}

	offline := newTestClient(t, srv)
	offline.CacheDir = cacheDir
	offline.Offline = true
	ctx := context.Background()

	snap, err := offline.Download(ctx, testRepo, quiet)
	if err != nil {
		t.Fatalf("offline Download of Python's snapshot: %v", err)
	}
	if snap.Commit != commit || snap.Dir != filepath.Clean(answer["main"]) {
		t.Errorf("snapshot %s at %s; Python: %s", snap.Commit, snap.Dir, answer["main"])
	}
	assertSnapshot(t, cacheDir, testRepo, commit, files, allFiles(files))

	path, err := offline.DownloadFile(ctx, testRepo, "config.json", DownloadOptions{Revision: "v1"})
	if err != nil || path != filepath.Clean(answer["v1-config"]) {
		t.Errorf("offline DownloadFile@v1 = %s, %v; Python put it at %s", path, err, answer["v1-config"])
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, fileByPath(t, oldFiles, "config.json").Data) {
		t.Error("config.json@v1 differs")
	}
	psnap, err := offline.Download(ctx, "test-org/private-model", quiet)
	if err != nil || psnap.Commit != privateCommit {
		t.Errorf("private repository: %+v, %v", psnap, err)
	}

	// Python locks blobs where we do, so the two exclude each other.
	rc := newRepoCache(cacheDir, testRepo)
	for _, f := range files {
		if _, err := os.Stat(rc.lockPath(expectedETag(f))); err != nil {
			t.Errorf("no lock file of Python's at our lock path for %s: %v", f.Path, err)
		}
	}

	// Online, everything Python fetched counts as cached.
	before := len(srv.Requests())
	online := newTestClient(t, srv)
	online.CacheDir = cacheDir
	if _, err := online.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	for _, r := range srv.Requests()[before:] {
		if r.Origin == "cdn" || (r.Method == "GET" && strings.Contains(r.Path, "/resolve/")) {
			t.Errorf("we downloaded %s again although Python had", r.Path)
		}
	}
	if _, err := oldCommitListed(cacheDir, testRepo, oldCommit); err != nil {
		t.Error(err)
	}
}

const pyHoldLock = `
import os, sys, time
from huggingface_hub.utils import WeakFileLock
lock_path, blob_path, data_path = sys.argv[1:4]
os.makedirs(os.path.dirname(lock_path), exist_ok=True)
with WeakFileLock(lock_path):
    print("locked", flush=True)
    time.sleep(0.5)
    os.makedirs(os.path.dirname(blob_path), exist_ok=True)
    with open(data_path, "rb") as src, open(blob_path, "wb") as dst:
        dst.write(src.read())
`

// TestLockExcludesPython: while huggingface_hub holds a blob's lock (and writes the blob), our
// download waits for it and then uses the blob instead of downloading its own copy.
func TestLockExcludesPython(t *testing.T) {
	py := pythonReference(t)
	srv := hubtest.New(t)
	files := modelFiles(95, 200_000)
	commit := srv.AddRepo(testRepo, hubtest.Public).Commit("main", files...)
	c := newTestClient(t, srv)
	rc := newRepoCache(c.CacheDir, testRepo)
	weights := fileByPath(t, files, "model.safetensors")
	dataPath := filepath.Join(t.TempDir(), "weights")
	if err := os.WriteFile(dataPath, weights.Data, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", pyHoldLock, rc.lockPath(expectedETag(weights)), rc.blobPath(expectedETag(weights)), dataPath)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("locked\n"))
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "locked\n" {
		t.Fatalf("python did not take the lock: %q %v\n%s", line, err, stderr.String())
	}
	if _, err := c.Download(ctx, testRepo, quiet); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	assertSnapshot(t, c.CacheDir, testRepo, commit, files, wantedFiles(files))
	if n := srv.Count(isContentGET(testRepo, "model.safetensors")); n != 0 {
		t.Errorf("we downloaded the weights %d times while Python held their lock and wrote them", n)
	}
}

// allFiles maps every file of a commit (Python downloads all of them without patterns).
func allFiles(files []hubtest.File) map[string][]byte {
	out := map[string][]byte{}
	for _, f := range files {
		out[f.Path] = f.Data
	}
	return out
}

// oldCommitListed checks that ListCachedModels sees a snapshot Python made.
func oldCommitListed(cacheDir, repoID, commit string) (CachedRevision, error) {
	models, err := ListCachedModels(cacheDir)
	if err != nil {
		return CachedRevision{}, err
	}
	for _, m := range models {
		for _, r := range m.Revisions {
			if m.RepoID == repoID && r.Commit == commit {
				return r, nil
			}
		}
	}
	return CachedRevision{}, &Error{Kind: ErrNotCached, Msg: "ListCachedModels misses " + repoID + "@" + commit}
}

const pyFilter = `
import json, sys
from huggingface_hub.utils import filter_repo_objects
cases = json.load(sys.stdin)
json.dump([bool(list(filter_repo_objects([c["path"]], allow_patterns=[c["pattern"]]))) for c in cases], sys.stdout)
`

// TestMatchAgreesWithHuggingFaceHub compares our allow-pattern matching with huggingface_hub's.
func TestMatchAgreesWithHuggingFaceHub(t *testing.T) {
	py := pythonReference(t)
	type pc struct {
		Pattern string `json:"pattern"`
		Path    string `json:"path"`
	}
	var cases []pc
	for _, c := range matchCases {
		cases = append(cases, pc{c.pattern, c.path})
	}
	for _, p := range DefaultAllowPatterns {
		for _, path := range []string{"config.json", "a/b.safetensors", "tokenizer.model", "x/tokenizer.model", "merges.txt", "t.tiktoken", "c.jinja", "README.md"} {
			cases = append(cases, pc{p, path})
		}
	}
	var want []bool
	runPython(t, py, pyFilter, nil, cases, &want)
	if len(want) != len(cases) {
		t.Fatalf("python answered %d results for %d cases", len(want), len(cases))
	}
	for i, c := range cases {
		if got := Match(c.Pattern, c.Path); got != want[i] {
			t.Errorf("Match(%q, %q) = %v, huggingface_hub says %v", c.Pattern, c.Path, got, want[i])
		}
	}
}
