package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// DefaultWorkers is how many files are downloaded at once unless told otherwise (as huggingface_hub).
const DefaultWorkers = 8

// DownloadOptions tune Download and DownloadFile. The zero value downloads the model files of the
// main branch with a progress bar on stderr.
type DownloadOptions struct {
	// Revision is a branch, a tag or a full commit hash; "" means main.
	Revision string
	// AllowPatterns selects the files of a snapshot (fnmatch syntax, as huggingface_hub's
	// allow_patterns; '*' also matches '/'); nil means DefaultAllowPatterns.
	AllowPatterns []string
	// Workers bounds parallel file downloads; 0 means DefaultWorkers.
	Workers int
	// Progress receives the progress bar; nil means os.Stderr unless Quiet.
	Progress io.Writer
	// Quiet turns the progress bar off.
	Quiet bool
}

func (o DownloadOptions) revision() string {
	if o.Revision == "" {
		return DefaultRevision
	}
	return o.Revision
}

func (o DownloadOptions) progressWriter() io.Writer {
	switch {
	case o.Quiet:
		return nil
	case o.Progress != nil:
		return o.Progress
	}
	return os.Stderr
}

// Snapshot is one revision of a repository, complete in the cache for the requested files.
type Snapshot struct {
	RepoID string
	// Revision is what was asked for; Commit what it resolved to.
	Revision string
	Commit   string
	// Dir is {cache}/models--org--name/snapshots/{commit}: a model folder that can be loaded as is.
	Dir string
	// Files are the repository paths of the requested files, sorted.
	Files []string
}

// Path returns the local path of a repository file of the snapshot.
func (s *Snapshot) Path(repoPath string) string {
	return filepath.Join(s.Dir, filepath.FromSlash(repoPath))
}

// Download makes the files of a repository revision that match the allow patterns available in the
// cache, downloading what is missing, and returns the snapshot. With Offline set it only looks in
// the cache (see CachedSnapshot).
func (c *Client) Download(ctx context.Context, repoID string, opts DownloadOptions) (*Snapshot, error) {
	rev := opts.revision()
	patterns := opts.AllowPatterns
	if patterns == nil {
		patterns = DefaultAllowPatterns
	}
	if err := c.checkCacheDir(); err != nil {
		return nil, err
	}
	if c.Offline {
		return c.CachedSnapshot(repoID, rev, patterns)
	}
	info, err := c.RepoInfo(ctx, repoID, rev)
	if err != nil {
		return nil, err
	}
	rc := newRepoCache(c.CacheDir, repoID)
	t := target{repoID: repoID, revision: rev}

	var wanted []Sibling
	for _, s := range info.Siblings {
		if matchAny(patterns, s.RFilename) {
			wanted = append(wanted, s)
		}
	}
	if len(wanted) == 0 {
		return nil, &Error{Kind: ErrEntryNotFound, RepoID: repoID, Revision: rev,
			Msg: fmt.Sprintf("hub: %s has no files matching %q (it has %d files)", t, patterns, len(info.Siblings))}
	}
	if err := os.MkdirAll(c.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("hub: creating cache %s: %w", c.CacheDir, err)
	}
	writeCacheDirTag(c.CacheDir)

	prog := newProgress(opts.progressWriter(), repoID+"@"+shortRev(rev, info.SHA), wanted)
	err = c.fetchAll(ctx, rc, info.SHA, wanted, opts.Workers, prog)
	prog.finish(err)
	if err != nil {
		return nil, err
	}
	// The ref moves only once the snapshot is complete, so that after a failed update offline
	// mode still finds the previous, complete snapshot of the branch.
	if err := rc.writeRef(rev, info.SHA); err != nil {
		return nil, err
	}
	snap := &Snapshot{RepoID: repoID, Revision: rev, Commit: info.SHA, Dir: rc.snapshotDir(info.SHA)}
	for _, s := range wanted {
		snap.Files = append(snap.Files, s.RFilename)
	}
	sort.Strings(snap.Files)
	return snap, nil
}

// fetchAll downloads files with a bounded number of workers. The first failure cancels the rest;
// it is the error returned (not the cancellations it caused).
func (c *Client) fetchAll(ctx context.Context, rc repoCache, commit string, files []Sibling, workers int, prog *progress) error {
	if workers <= 0 {
		workers = DefaultWorkers
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan Sibling)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range min(workers, len(files)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range jobs {
				if _, err := c.fetchFile(ctx, rc, commit, s.RFilename, nil, prog); err != nil {
					once.Do(func() { firstErr = err })
					cancel(err)
				}
			}
		}()
	}
	for _, s := range files {
		select {
		case jobs <- s:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(jobs)
	wg.Wait()
	return firstErr
}

// fetchFile makes snapshots/{commit}/{path} point at a complete blob and returns that path. revision
// may be a branch or tag (DownloadFile) or the commit itself (snapshots); meta is the file's
// metadata when the caller already has it.
func (c *Client) fetchFile(ctx context.Context, rc repoCache, revision, repoPath string, meta *fileMeta, prog *progress) (string, error) {
	if err := validateRepoPath(repoPath); err != nil {
		return "", err
	}
	if IsCommitHash(revision) {
		if pointer := rc.pointerPath(revision, repoPath); fileExists(pointer) {
			prog.fileDone(repoPath, true)
			return pointer, nil
		}
	}
	if meta == nil {
		m, err := c.headFile(ctx, rc.repoID, revision, repoPath)
		if err != nil {
			return "", err
		}
		meta = &m
	}
	prog.learnSize(repoPath, meta.Size)
	t := target{repoID: rc.repoID, revision: revision, file: repoPath}
	blob := rc.blobPath(meta.ETag)
	pointer := rc.pointerPath(meta.Commit, repoPath)

	lock, err := lockBlob(ctx, rc.lockPath(meta.ETag))
	if err != nil {
		return "", err
	}
	defer lock.unlock()
	cached := fileExists(blob)
	if !cached {
		if err := c.fetchBlob(ctx, t, rc, *meta, func(n int64) { prog.add(n) }); err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return "", fmt.Errorf("hub: %s: download interrupted (it resumes next time): %w", t, err)
			}
			return "", err
		}
	}
	if err := linkPointer(blob, pointer); err != nil {
		return "", err
	}
	prog.fileDone(repoPath, cached)
	return pointer, nil
}

// DownloadFile makes one file of a repository revision available in the cache and returns its path
// in the snapshot folder, like huggingface_hub's hf_hub_download.
func (c *Client) DownloadFile(ctx context.Context, repoID, repoPath string, opts DownloadOptions) (string, error) {
	rev := opts.revision()
	if err := ValidateRepoID(repoID); err != nil {
		return "", err
	}
	if err := validateRevision(rev); err != nil {
		return "", err
	}
	if err := validateRepoPath(repoPath); err != nil {
		return "", err
	}
	if err := c.checkCacheDir(); err != nil {
		return "", err
	}
	rc := newRepoCache(c.CacheDir, repoID)
	if c.Offline {
		return c.cachedFile(rc, rev, repoPath)
	}
	if IsCommitHash(rev) {
		// A commit never changes, so a file already linked in its snapshot needs no network at all.
		if pointer := rc.pointerPath(rev, repoPath); fileExists(pointer) {
			return pointer, nil
		}
	}
	meta, err := c.headFile(ctx, repoID, rev, repoPath)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(c.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("hub: creating cache %s: %w", c.CacheDir, err)
	}
	writeCacheDirTag(c.CacheDir)
	pointer := rc.pointerPath(meta.Commit, repoPath)
	if !fileExists(pointer) {
		listing := []Sibling{{RFilename: repoPath}}
		if meta.Size >= 0 {
			listing[0].Size = &meta.Size
		}
		prog := newProgress(opts.progressWriter(), repoID+"@"+shortRev(rev, meta.Commit), listing)
		_, err = c.fetchFile(ctx, rc, rev, repoPath, &meta, prog)
		prog.finish(err)
		if err != nil {
			return "", err
		}
	}
	if err := rc.writeRef(rev, meta.Commit); err != nil {
		return "", err
	}
	return pointer, nil
}

// PeekFile makes one file of a revision available like DownloadFile, but leaves the
// revision's ref where it was: it asks which commit the revision is at and fetches the file
// of that commit. Reading a model's config.json before deciding to download the model then
// does not point the branch at a snapshot that holds nothing else, which offline mode would
// take for the branch's current one. Offline it reads the cache, as DownloadFile does.
func (c *Client) PeekFile(ctx context.Context, repoID, repoPath string, opts DownloadOptions) (string, error) {
	if c.Offline || IsCommitHash(opts.revision()) {
		return c.DownloadFile(ctx, repoID, repoPath, opts)
	}
	if err := validateRepoPath(repoPath); err != nil {
		return "", err
	}
	info, err := c.RepoInfo(ctx, repoID, opts.revision())
	if err != nil {
		return "", err
	}
	opts.Revision = info.SHA
	return c.DownloadFile(ctx, repoID, repoPath, opts)
}

// shortRev labels a revision for display: the branch or tag with the commit it is at.
func shortRev(rev, commit string) string {
	if rev == commit {
		return commit[:12]
	}
	return rev + " (" + commit[:12] + ")"
}
