package hub

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
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
	// PartialBytes counts the blobs still being written (*.incomplete): a download that was
	// interrupted, or is running.
	PartialBytes int64
}

// Incomplete reports a model that cannot be used as it is: a download left unfinished
// blobs, or the newest snapshot lacks files it needs (see CachedRevision.Complete).
// Downloading it again resumes.
func (m CachedModel) Incomplete() bool {
	return m.PartialBytes > 0 || len(m.Revisions) == 0 || !m.Revisions[0].Complete()
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
	// Missing lists what a loadable model folder needs that the snapshot lacks: config.json,
	// the weights (every shard its safetensors index names, else one *.safetensors file),
	// and the targets of dangling links.
	Missing  []string
	modified time.Time
}

// Complete reports a snapshot that has its config, its weights and no dangling links.
func (r CachedRevision) Complete() bool { return len(r.Missing) == 0 }

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
		if strings.HasSuffix(b.Name(), ".incomplete") {
			m.PartialBytes += info.Size()
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

// scanRevision counts a snapshot's files and the distinct blobs they resolve to, and lists
// what it lacks to be loaded.
func scanRevision(dir string) (CachedRevision, error) {
	rev := CachedRevision{Dir: dir}
	seen := map[string]bool{}
	present := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rev.Files++
		name, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		name = filepath.ToSlash(name)
		real, err := filepath.EvalSymlinks(path)
		present[name] = err == nil
		if err != nil {
			rev.Missing = append(rev.Missing, name) // a dangling pointer takes no space
			return nil
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
	if err != nil {
		return rev, err
	}
	rev.Missing = append(rev.Missing, missingModelFiles(dir, present)...)
	sort.Strings(rev.Missing)
	rev.Missing = slices.Compact(rev.Missing) // a dangling shard is also a missing one
	return rev, nil
}

// missingModelFiles lists the files a model folder needs that are not present: config.json
// and the weights, which are the shards a safetensors index names or, without an index, at
// least one *.safetensors file ("*.safetensors" stands for it then). present maps the
// snapshot's names to whether their content is there (false: a dangling link).
func missingModelFiles(dir string, present map[string]bool) []string {
	var missing []string
	if !present["config.json"] {
		missing = append(missing, "config.json")
	}
	var indexes []string
	hasWeights := false
	for name := range present {
		switch {
		case strings.HasSuffix(name, ".safetensors.index.json"):
			indexes = append(indexes, name)
		case strings.HasSuffix(name, ".safetensors"):
			hasWeights = true
		}
	}
	if len(indexes) == 0 && !hasWeights {
		return append(missing, "*.safetensors")
	}
	for _, index := range indexes {
		if !present[index] {
			continue // listed as dangling already
		}
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(index)))
		if err != nil || json.Unmarshal(b, &idx) != nil {
			missing = append(missing, index) // unreadable: the shards cannot be known
			continue
		}
		shards := map[string]bool{}
		for _, shard := range idx.WeightMap {
			shards[path.Join(path.Dir(index), shard)] = true
		}
		for shard := range shards {
			if !present[shard] {
				missing = append(missing, shard)
			}
		}
	}
	return missing
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
