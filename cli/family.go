package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/hub"
	"github.com/dflash-mlx/dflash-mlx/model"
)

// checkLoadable refuses a model this build cannot load, judged from its config.json alone:
// read from the folder, or fetched by itself from the Hub (a few hundred bytes), so that a
// target of another family fails in one line before its weights or its drafter's move. A
// reference that is neither a folder nor a repository ID, and Hub failures, are left to the
// download, which reports them as it always does.
func checkLoadable(ctx context.Context, client *hub.Client, ref, revision string) error {
	path, fromHub, err := configFile(ctx, client, ref, revision)
	if err != nil || path == "" {
		return err
	}
	// The loader's own config reader, so that this check and the load judge one file alike.
	cfg, err := model.ReadConfig(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	modelType, err := cfg.StringOr("model_type", "")
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	if _, ok := model.LookupFamily(modelType); ok {
		return nil
	}
	families := model.Families()
	nothingMoved := ""
	if fromHub {
		nothingMoved = "; no weights were downloaded"
	}
	if modelType == "" {
		return fmt.Errorf("%s: config.json has no model_type, so dflash-mlx cannot load it (it loads %s)%s", ref, strings.Join(families, ", "), nothingMoved)
	}
	return fmt.Errorf("%s is a model_type %q model, which dflash-mlx cannot load yet (it loads %s)%s", ref, modelType, strings.Join(families, ", "), nothingMoved)
}

// configFile finds ref's config.json as the download would find the model: an existing
// folder first, else a repository ID (fromHub). It returns "" when it cannot tell.
func configFile(ctx context.Context, client *hub.Client, ref, revision string) (path string, fromHub bool, err error) {
	dir := ref
	if home, err := os.UserHomeDir(); err == nil && (dir == "~" || strings.HasPrefix(dir, "~/")) {
		dir = home + dir[1:]
	}
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return "", false, nil
		}
		path = filepath.Join(dir, "config.json")
		if _, err := os.Stat(path); err != nil {
			return "", false, fmt.Errorf("%s has no config.json: not a model folder dflash-mlx can load", ref)
		}
		return path, false, nil
	}
	if strings.HasPrefix(ref, ".") || strings.HasPrefix(ref, "/") || hub.ValidateRepoID(ref) != nil {
		return "", false, nil
	}
	path, err = client.PeekFile(ctx, ref, "config.json", hub.DownloadOptions{Revision: revision, Quiet: true})
	if errors.Is(err, hub.ErrEntryNotFound) {
		return "", true, fmt.Errorf("%s has no config.json: not a model dflash-mlx can load; no weights were downloaded", ref)
	}
	if err != nil {
		return "", true, nil
	}
	return path, true, nil
}
