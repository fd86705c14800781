package hub

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Model is where a model named on the command line lives on disk.
type Model struct {
	// Dir is the model folder: the local folder itself, or the snapshot folder in the cache.
	Dir string
	// RepoID and Commit are set when the model came from the Hub (or its cache).
	RepoID string
	Commit string
}

// Local reports whether the model is a folder the user named rather than a Hub repository.
func (m *Model) Local() bool { return m.RepoID == "" }

// ResolveModel turns what a user typed into a model folder. An existing folder wins (so a local
// "org/name" folder shadows the repository of that name, as in transformers); a file or a path that
// clearly means the local disk ("./x", "/x", "~/x") but does not exist is an error; anything else
// must be a repository ID and is downloaded into the cache (or found there when offline).
func (c *Client) ResolveModel(ctx context.Context, ref string, opts DownloadOptions) (*Model, error) {
	if ref == "" {
		return nil, fmt.Errorf("hub: no model given")
	}
	path := ref
	if home, err := os.UserHomeDir(); err == nil && (path == "~" || strings.HasPrefix(path, "~/")) {
		path = home + path[1:]
	}
	if fi, err := os.Stat(path); err == nil {
		if !fi.IsDir() {
			return nil, fmt.Errorf("hub: %s is a file; give the folder that holds the model", ref)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("hub: resolving %s: %w", ref, err)
		}
		return &Model{Dir: abs}, nil
	}
	if looksLikeLocalPath(ref) {
		return nil, fmt.Errorf("hub: model folder %s does not exist", ref)
	}
	if err := ValidateRepoID(ref); err != nil {
		return nil, fmt.Errorf("hub: %q is neither an existing folder nor a Hub repository ID (org/name)", ref)
	}
	snap, err := c.Download(ctx, ref, opts)
	if err != nil {
		return nil, err
	}
	return &Model{Dir: snap.Dir, RepoID: snap.RepoID, Commit: snap.Commit}, nil
}

// looksLikeLocalPath reports references that can only mean a path on disk.
func looksLikeLocalPath(ref string) bool {
	return filepath.IsAbs(ref) || ref == "." || ref == ".." || ref == "~" ||
		strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "../") || strings.HasPrefix(ref, "~/") ||
		(filepath.Separator != '/' && strings.ContainsRune(ref, filepath.Separator)) ||
		strings.Count(ref, "/") > 1
}
