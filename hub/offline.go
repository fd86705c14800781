package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// CachedSnapshot finds a revision of a repository in the cache without any network access: a
// commit hash directly, a branch or tag through refs/{revision}. It returns the snapshot's files
// that match patterns (nil means DefaultAllowPatterns), and fails with ErrNotCached when the
// revision or matching files are absent, and with ErrIntegrity when a file's blob is missing.
func (c *Client) CachedSnapshot(repoID, revision string, patterns []string) (*Snapshot, error) {
	if revision == "" {
		revision = DefaultRevision
	}
	if patterns == nil {
		patterns = DefaultAllowPatterns
	}
	if err := ValidateRepoID(repoID); err != nil {
		return nil, err
	}
	if err := validateRevision(revision); err != nil {
		return nil, err
	}
	if err := c.checkCacheDir(); err != nil {
		return nil, err
	}
	t := target{repoID: repoID, revision: revision}
	rc := newRepoCache(c.CacheDir, repoID)
	commit, err := rc.commitFor(revision)
	if err != nil {
		return nil, err
	}
	if commit == "" {
		return nil, c.notCached(t, "")
	}
	dir := rc.snapshotDir(commit)
	files, err := snapshotFiles(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, c.notCached(t, "")
	}
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{RepoID: repoID, Revision: revision, Commit: commit, Dir: dir}
	for _, f := range files {
		if matchAny(patterns, f) {
			if !fileExists(snap.Path(f)) {
				return nil, &Error{Kind: ErrIntegrity, RepoID: repoID, Revision: revision, File: f,
					Msg: fmt.Sprintf("hub: %s: %s points at a missing blob; download the repository again", t, snap.Path(f))}
			}
			snap.Files = append(snap.Files, f)
		}
	}
	if len(snap.Files) == 0 {
		return nil, c.notCached(t, fmt.Sprintf(" (the cached snapshot has no files matching %q)", patterns))
	}
	return snap, nil
}

// cachedFile finds one file of a revision in the cache (DownloadFile in offline mode).
func (c *Client) cachedFile(rc repoCache, revision, repoPath string) (string, error) {
	t := target{repoID: rc.repoID, revision: revision, file: repoPath}
	commit, err := rc.commitFor(revision)
	if err != nil {
		return "", err
	}
	if commit != "" {
		if pointer := rc.pointerPath(commit, repoPath); fileExists(pointer) {
			return pointer, nil
		}
	}
	return "", c.notCached(t, "")
}

func (c *Client) notCached(t target, why string) *Error {
	msg := fmt.Sprintf("hub: %s is not in the cache at %s%s", t, c.CacheDir, why)
	if c.Offline {
		msg += "; offline mode is on (HF_HUB_OFFLINE=1), unset it to download"
	}
	return &Error{Kind: ErrNotCached, RepoID: t.repoID, Revision: t.revision, File: t.file, Msg: msg}
}

// snapshotFiles lists the repository paths under a snapshot folder: the symlinks (and, where
// huggingface_hub could not make symlinks, the plain files) at any depth.
func snapshotFiles(dir string) ([]string, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hub: listing %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}
