package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// PromptCacheConfig says whether and where a session keeps a prefix cache.
type PromptCacheConfig struct {
	// Bytes is the memory budget; 0 means no prefix cache.
	Bytes int64
	// Dir, when set, keeps the entries on disk too (written through), for other processes.
	Dir string
	// DiskBytes bounds the directory's entries of this model (0: the default).
	DiskBytes int64
}

// promptCacheFlags are the prefix cache's flags; on says whether the cache is on without
// a directory (chat and serve) or only with one (run).
func promptCacheFlags(on bool) []cli.Flag {
	def := "0"
	usage := "memory for the prompt cache when --prompt-cache-dir is given (K, M, G suffixes: powers of 1024)"
	if on {
		def = "2G"
		usage = "memory for the prompt cache, which resumes a prompt from the longest part already computed (0 turns it off; K, M, G suffixes: powers of 1024)"
	}
	return []cli.Flag{
		&cli.StringFlag{Name: "prompt-cache-bytes", Value: def, Usage: usage},
		&cli.StringFlag{Name: "prompt-cache-dir", Usage: "keep prompt-cache entries in this directory too, for later runs (checksummed, written atomically)"},
		&cli.StringFlag{Name: "prompt-cache-disk-bytes", Value: "16G", Usage: "disk budget of this model's entries in --prompt-cache-dir (the least recently used go first)"},
	}
}

// promptCacheConfig reads the prefix cache's flags.
func promptCacheConfig(c *cli.Context) (PromptCacheConfig, error) {
	var pc PromptCacheConfig
	if c.String("prompt-cache-bytes") == "" {
		return pc, nil // a command without the flags
	}
	b, err := parseBytes(c.String("prompt-cache-bytes"))
	if err != nil {
		return pc, cli.Exit("--prompt-cache-bytes: "+err.Error(), 2)
	}
	db, err := parseBytes(c.String("prompt-cache-disk-bytes"))
	if err != nil {
		return pc, cli.Exit("--prompt-cache-disk-bytes: "+err.Error(), 2)
	}
	pc.Bytes, pc.Dir, pc.DiskBytes = b, c.String("prompt-cache-dir"), db
	if pc.Dir != "" && pc.Bytes == 0 {
		if c.IsSet("prompt-cache-bytes") {
			return pc, cli.Exit("--prompt-cache-dir needs memory for the cache: --prompt-cache-bytes is 0", 2)
		}
		pc.Bytes = prefixcache.DefaultBudget
	}
	return pc, nil
}

// parseBytes reads a size: a whole number of bytes with an optional K, M, G or T suffix
// (powers of 1024; "KiB", "KB" and "k" alike).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(strings.TrimSuffix(u, "B"), "I")
	mult := int64(1)
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			u = u[:n-1]
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(u), 64)
	if err != nil || v < 0 || v*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("%q is not a size (for example 512M or 4G)", s)
	}
	return int64(v * float64(mult)), nil
}

// promptCacheKey names what a cache entry's numbers depend on: the models' files (name,
// size, modification time: a changed checkpoint is another key), the MLX build and
// device, and every setting (some change numerics; all of them is the safe side).
func promptCacheKey(targetDir, draftDir string, st settings.Settings) (string, error) {
	files := func(dir string) ([]string, error) {
		if dir == "" {
			return nil, nil
		}
		var out []string
		names, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if !strings.HasSuffix(n.Name(), ".safetensors") && !strings.HasSuffix(n.Name(), ".json") {
				continue
			}
			info, err := os.Stat(filepath.Join(dir, n.Name())) // through the hub cache's links
			if err != nil {
				return nil, err
			}
			out = append(out, fmt.Sprintf("%s %d %d", n.Name(), info.Size(), info.ModTime().UnixNano()))
		}
		sort.Strings(out)
		return out, nil
	}
	abs := func(d string) string {
		if d == "" {
			return ""
		}
		a, err := filepath.Abs(d)
		if err != nil {
			return d
		}
		return a
	}
	tf, err := files(targetDir)
	if err != nil {
		return "", err
	}
	df, err := files(draftDir)
	if err != nil {
		return "", err
	}
	key := map[string]any{
		"format": 1, "target": abs(targetDir), "target_files": tf, "draft": abs(draftDir), "draft_files": df,
		"mlx": mlxc.Version(), "backend": mlxc.Backend(), "device": mlxc.CurrentDevice().String(), "settings": st,
	}
	b, err := json.Marshal(key)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// openPromptCache makes the session's prefix cache as pc asks (nothing for a zero budget).
func (s *Session) openPromptCache(pc PromptCacheConfig) error {
	if pc.Bytes == 0 {
		return nil
	}
	warn := func(msg string) { s.Notice(msg) }
	var disk *prefixcache.Disk
	if pc.Dir != "" {
		key, err := promptCacheKey(s.TargetDir, s.DraftDir, s.Settings)
		if err != nil {
			return fmt.Errorf("prompt cache: %w", err)
		}
		if disk, err = prefixcache.OpenDisk(pc.Dir, key, pc.DiskBytes, warn); err != nil {
			return err
		}
	}
	c, err := prefixcache.New(prefixcache.Options{Budget: pc.Bytes, Disk: disk, Warn: warn})
	if err != nil {
		return err
	}
	s.Engine.Prefix = c
	return nil
}

// PromptCacheStats are the session's prefix cache counters (nil without one).
func (s *Session) PromptCacheStats() *prefixcache.Stats {
	if s.Engine == nil || s.Engine.Prefix == nil {
		return nil
	}
	st := s.Engine.Prefix.Stats()
	return &st
}

// CheckRoom refuses, before any work, a prompt of n tokens that leaves no room in the
// context, or whose answer of maxTokens (explicit: asked for by the user) would not fit;
// a default maxTokens is shortened to the room instead, as the server does.
func (s *Session) CheckRoom(n, maxTokens int, explicit bool) error {
	ctxLen := s.Engine.ContextLen()
	switch {
	case n >= ctxLen:
		return cli.Exit(fmt.Sprintf("the prompt has %d tokens, but the model's context is %d tokens and the answer needs at least one (--context-length sets a shorter context, never a longer one)", n, ctxLen), 2)
	case explicit && n+maxTokens > ctxLen:
		return cli.Exit(fmt.Sprintf("the model's context is %d tokens, but %d were asked for (%d in the prompt, --max-new-tokens %d); lower --max-new-tokens to at most %d or shorten the prompt", ctxLen, n+maxTokens, n, maxTokens, ctxLen-n), 2)
	}
	return nil
}

// PrefixMarks are the positions of a prompt where its chat messages start (before each
// <|im_start|>): where the next turn's prompt, re-rendered by the template, may leave this
// one's, so a recurrent target's prefix cache keeps its state there.
func (s *Session) PrefixMarks(ids []int32) []int {
	id, ok := s.Tok.TokenID("<|im_start|>")
	if !ok {
		return nil
	}
	var out []int
	for i, t := range ids {
		if t == id && i > 0 {
			out = append(out, i)
		}
	}
	return out
}
