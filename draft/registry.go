package draft

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Pair maps a target base name (the part after the last "/", matched case-insensitively,
// exactly or as a prefix followed by "-" or "_") to its DFlash draft repo.
type Pair struct {
	Target string `json:"target"`
	Draft  string `json:"draft"`
	// Family is informational: "qwen3" (pure attention) or "qwen3_5" (hybrid) etc.
	Family string `json:"family,omitempty"`
}

// builtinPairs covers every pair the public DFlash MLX projects list. The prefix rule maps
// mlx-community variants (-bf16, -4bit, -8bit, -MLX-bf16 …) and the original Qwen IDs.
var builtinPairs = []Pair{
	{Target: "Qwen3-4B", Draft: "z-lab/Qwen3-4B-DFlash-b16", Family: "qwen3"},
	{Target: "Qwen3-8B", Draft: "z-lab/Qwen3-8B-DFlash-b16", Family: "qwen3"},
	{Target: "Qwen3.5-4B", Draft: "z-lab/Qwen3.5-4B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.5-9B", Draft: "z-lab/Qwen3.5-9B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.5-27B", Draft: "z-lab/Qwen3.5-27B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.5-35B-A3B", Draft: "z-lab/Qwen3.5-35B-A3B-DFlash", Family: "qwen3_5_moe"},
	{Target: "Qwen3.6-27B", Draft: "z-lab/Qwen3.6-27B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.6-35B-A3B", Draft: "z-lab/Qwen3.6-35B-A3B-DFlash", Family: "qwen3_5_moe"},
}

// Registry resolves drafts for targets: the built-in table plus user pairs (which win).
type Registry struct {
	pairs []Pair
}

// DefaultUserFile is where users add pairs: $XDG_CONFIG_HOME/dflash-mlx/drafts.json or
// ~/.config/dflash-mlx/drafts.json.
func DefaultUserFile() string {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "dflash-mlx", "drafts.json")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".config", "dflash-mlx", "drafts.json")
}

// NewRegistry builds a registry from the built-in table and, when path names an existing
// file, the user's pairs: a JSON list of {"target": …, "draft": …} or an object mapping
// target → draft. A missing default file is fine; a malformed one is an error.
func NewRegistry(path string) (*Registry, error) {
	r := &Registry{pairs: append([]Pair(nil), builtinPairs...)}
	if path == "" {
		return r, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read draft registry %s: %w", path, err)
	}
	var list []Pair
	if err := json.Unmarshal(b, &list); err != nil {
		var m map[string]string
		if err2 := json.Unmarshal(b, &m); err2 != nil {
			return nil, fmt.Errorf("%s: want a list of {\"target\",\"draft\"} or an object target→draft: %w", path, err)
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			list = append(list, Pair{Target: k, Draft: m[k]})
		}
	}
	for i, p := range list {
		if strings.TrimSpace(p.Target) == "" || strings.TrimSpace(p.Draft) == "" {
			return nil, fmt.Errorf("%s: entry %d needs both target and draft", path, i)
		}
	}
	// User pairs first so they win over built-ins with the same key.
	r.pairs = append(list, r.pairs...)
	return r, nil
}

// Pairs lists all known pairs (user pairs first).
func (r *Registry) Pairs() []Pair { return append([]Pair(nil), r.pairs...) }

// Resolve returns the draft for a target ID or path. A user pair whose target equals the
// whole ID wins; otherwise the base name is matched exactly, then by the longest key k with
// name = k or name starting with k+"-" / k+"_".
func (r *Registry) Resolve(target string) (string, bool) {
	t := strings.TrimRight(target, "/")
	for _, p := range r.pairs {
		if strings.EqualFold(p.Target, t) {
			return p.Draft, true
		}
	}
	name := strings.ToLower(t[strings.LastIndex(t, "/")+1:])
	best, bestLen := "", -1
	for _, p := range r.pairs {
		k := strings.ToLower(p.Target[strings.LastIndex(p.Target, "/")+1:])
		if name == k {
			return p.Draft, true
		}
		if (strings.HasPrefix(name, k+"-") || strings.HasPrefix(name, k+"_")) && len(k) > bestLen {
			best, bestLen = p.Draft, len(k)
		}
	}
	return best, bestLen >= 0
}

// Known lists the target base names, for error messages.
func (r *Registry) Known() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range r.pairs {
		if !seen[p.Target] {
			seen[p.Target] = true
			out = append(out, p.Target)
		}
	}
	return out
}
