package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// CachedModel is one model repository found in the cache.
type CachedModel struct {
	RepoID string
	// Dir is {cache}/models--org--name.
	Dir string
	// SizeOnDisk counts every file under blobs/, shared by all revisions (unfinished downloads
	// included, since they take space too).
	SizeOnDisk int64
	// Revisions are the snapshots, most recently modified first.
	Revisions []CachedRevision
	// LastModified is the newest modification time among the blobs.
	LastModified time.Time
}

// CachedRevision is one snapshot of a cached repository.
type CachedRevision struct {
	Commit string
	// Refs are the branches and tags that pointed at Commit when last downloaded.
	Refs []string
	// Dir is the snapshot folder.
	Dir string
	// Files counts the files of the snapshot.
	Files int
	// SizeOnDisk is the size of the distinct blobs the snapshot uses.
	SizeOnDisk int64
	modified   time.Time
}

// ListCachedModels lists the model repositories in a hub cache, sorted by repository ID. A cache
// that does not exist yet holds no models.
func ListCachedModels(cacheDir string) ([]CachedModel, error) {
	entries, err := os.ReadDir(cacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hub: reading cache %s: %w", cacheDir, err)
	}
	var models []CachedModel
	for _, e := range entries {
		repoID, ok := repoIDFromFolder(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		m, err := scanRepo(filepath.Join(cacheDir, e.Name()), repoID)
		if err != nil {
			return nil, err
		}
		models = append(models, m)
	}
	sort.Slice(models, func(i, j int) bool { return models[i].RepoID < models[j].RepoID })
	return models, nil
}

func scanRepo(dir, repoID string) (CachedModel, error) {
	m := CachedModel{RepoID: repoID, Dir: dir}
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("hub: reading blobs of %s: %w", repoID, err)
	}
	for _, b := range blobs {
		info, err := b.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		m.SizeOnDisk += info.Size()
		if info.ModTime().After(m.LastModified) {
			m.LastModified = info.ModTime()
		}
	}
	refs, err := readRefs(filepath.Join(dir, "refs"))
	if err != nil {
		return m, fmt.Errorf("hub: reading refs of %s: %w", repoID, err)
	}
	snaps, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("hub: reading snapshots of %s: %w", repoID, err)
	}
	for _, s := range snaps {
		if !s.IsDir() {
			continue
		}
		rev, err := scanRevision(filepath.Join(dir, "snapshots", s.Name()))
		if err != nil {
			return m, fmt.Errorf("hub: scanning %s: %w", repoID, err)
		}
		rev.Commit = s.Name()
		rev.Refs = refs[rev.Commit]
		m.Revisions = append(m.Revisions, rev)
	}
	sort.Slice(m.Revisions, func(i, j int) bool { return m.Revisions[i].modified.After(m.Revisions[j].modified) })
	return m, nil
}

// scanRevision counts a snapshot's files and the distinct blobs they resolve to.
func scanRevision(dir string) (CachedRevision, error) {
	rev := CachedRevision{Dir: dir}
	seen := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rev.Files++
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil // a dangling pointer takes no space
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil
		}
		if fi.ModTime().After(rev.modified) {
			rev.modified = fi.ModTime()
		}
		if !seen[real] {
			seen[real] = true
			rev.SizeOnDisk += fi.Size()
		}
		return nil
	})
	return rev, err
}

// readRefs maps each commit to the refs naming it; refs may be nested ("refs/pr/1").
func readRefs(dir string) (map[string][]string, error) {
	refs := map[string][]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path == dir {
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasSuffix(d.Name(), ".tmp") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		name, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		commit := strings.TrimSpace(string(data))
		refs[commit] = append(refs[commit], filepath.ToSlash(name))
		return nil
	})
	for _, names := range refs {
		sort.Strings(names)
	}
	return refs, err
}
