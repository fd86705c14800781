package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/internal/atomicfile"
)

// repoCache knows where one repository lives in the cache. The layout is huggingface_hub's:
//
//	{cache}/models--org--name/blobs/{etag}                 file contents, named by ETag
//	{cache}/models--org--name/snapshots/{commit}/{path}    relative symlinks into blobs/
//	{cache}/models--org--name/refs/{revision}              commit hash of a branch or tag (no newline)
//	{cache}/.locks/models--org--name/{etag}.lock           flock(2) lock held while a blob is written
type repoCache struct {
	cacheDir string
	repoID   string
	dir      string
}

func newRepoCache(cacheDir, repoID string) repoCache {
	return repoCache{cacheDir: cacheDir, repoID: repoID, dir: filepath.Join(cacheDir, RepoFolderName(repoID))}
}

func (rc repoCache) blobPath(etag string) string {
	return filepath.Join(rc.dir, "blobs", etag)
}

// incompletePath is where a blob is written until it is complete and verified. Being keyed by the
// ETag, an interrupted download can be resumed by the next process that wants the same blob.
func (rc repoCache) incompletePath(etag string) string {
	return rc.blobPath(etag) + ".incomplete"
}

func (rc repoCache) lockPath(etag string) string {
	return filepath.Join(rc.cacheDir, ".locks", RepoFolderName(rc.repoID), etag+".lock")
}

func (rc repoCache) snapshotDir(commit string) string {
	return filepath.Join(rc.dir, "snapshots", commit)
}

func (rc repoCache) pointerPath(commit, repoPath string) string {
	return filepath.Join(rc.snapshotDir(commit), filepath.FromSlash(repoPath))
}

func (rc repoCache) refPath(revision string) string {
	return filepath.Join(rc.dir, "refs", filepath.FromSlash(revision))
}

// readRef returns the commit a branch or tag pointed at when last seen, or "" when unknown.
func (rc repoCache) readRef(revision string) (string, error) {
	data, err := os.ReadFile(rc.refPath(revision))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("hub: reading ref %s of %s: %w", revision, rc.repoID, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// commitFor maps a revision to a commit using the cache only ("" when the cache cannot tell).
func (rc repoCache) commitFor(revision string) (string, error) {
	if IsCommitHash(revision) {
		return revision, nil
	}
	return rc.readRef(revision)
}

// writeRef records that revision points at commit. It writes through a temporary file and a
// rename, so a concurrent reader never sees a truncated ref, and skips the write when nothing
// changed (the cache may be read-only for us).
func (rc repoCache) writeRef(revision, commit string) error {
	if revision == commit {
		return nil
	}
	if cur, err := rc.readRef(revision); err == nil && cur == commit {
		return nil
	}
	path := rc.refPath(revision)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("hub: creating refs folder: %w", err)
	}
	// No trailing newline: huggingface_hub reads the file verbatim.
	if err := atomicfile.Write(path, []byte(commit), 0o644); err != nil {
		return fmt.Errorf("hub: writing ref %s of %s: %w", revision, rc.repoID, err)
	}
	return nil
}

// linkPointer makes pointer a relative symlink to blob, the way huggingface_hub does, so the cache
// can be moved as a whole. A symlink appears atomically, and only ever points at a complete blob.
func linkPointer(blob, pointer string) error {
	if err := os.MkdirAll(filepath.Dir(pointer), 0o755); err != nil {
		return fmt.Errorf("hub: creating snapshot folder: %w", err)
	}
	target, err := filepath.Rel(filepath.Dir(pointer), blob)
	if err != nil {
		return fmt.Errorf("hub: relative path from %s to %s: %w", pointer, blob, err)
	}
	if cur, err := os.Readlink(pointer); err == nil && cur == target {
		return nil
	}
	// A stale pointer (dangling, or to an older blob) is replaced.
	if err := os.Remove(pointer); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hub: replacing %s: %w", pointer, err)
	}
	if err := os.Symlink(target, pointer); err != nil {
		// Another process may have made the same link between our Remove and Symlink.
		if cur, rerr := os.Readlink(pointer); rerr == nil && cur == target {
			return nil
		}
		return fmt.Errorf("hub: linking %s: %w", pointer, err)
	}
	return nil
}

// cacheDirTag marks the cache for backup tools (https://bford.info/cachedir/), as huggingface_hub does.
const cacheDirTag = "Signature: 8a477f597d28d172789f06886806bc55\n" +
	"# This directory is a Hugging Face Hub cache; its contents can be downloaded again.\n"

func writeCacheDirTag(cacheDir string) {
	path := filepath.Join(cacheDir, "CACHEDIR.TAG")
	if _, err := os.Stat(path); err == nil {
		return
	}
	// Best effort: the tag is a courtesy to backup tools, not part of the cache's contract.
	_ = atomicfile.Write(path, []byte(cacheDirTag), 0o644)
}

// fileExists reports whether path names a regular file, following symlinks (a dangling pointer
// does not count).
func fileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
