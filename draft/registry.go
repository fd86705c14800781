package draft

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/model"
)

// Pair maps a target base name (the part after the last "/", matched case-insensitively,
// exactly or as a prefix followed by "-" or "_") to its DFlash draft repo.
type Pair struct {
	Target string `json:"target"`
	Draft  string `json:"draft"`
	// Family is the target's model_type: "qwen3" (pure attention), "qwen3_5" (hybrid) etc.
	Family string `json:"family,omitempty"`
	// Served: the target's family is one this build loads (always for user pairs, whose
	// target's config decides at load time). Only served pairs resolve.
	Served bool `json:"served"`
}

// builtinPairs covers every pair the public DFlash MLX projects list, served or not, so
// that `models` can show them all; the prefix rule maps mlx-community variants (-bf16,
// -4bit, -8bit, -MLX-bf16 …) and the original Qwen IDs.
var builtinPairs = []Pair{
	{Target: "Qwen3-4B", Draft: "z-lab/Qwen3-4B-DFlash-b16", Family: "qwen3"},
	{Target: "Qwen3-8B", Draft: "z-lab/Qwen3-8B-DFlash-b16", Family: "qwen3"},
	{Target: "Qwen3.5-4B", Draft: "z-lab/Qwen3.5-4B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.5-9B", Draft: "z-lab/Qwen3.5-9B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.5-27B", Draft: "z-lab/Qwen3.5-27B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.5-35B-A3B", Draft: "z-lab/Qwen3.5-35B-A3B-DFlash", Family: "qwen3_5_moe"},
	{Target: "Qwen3.6-27B", Draft: "z-lab/Qwen3.6-27B-DFlash", Family: "qwen3_5"},
	{Target: "Qwen3.6-35B-A3B", Draft: "z-lab/Qwen3.6-35B-A3B-DFlash", Family: "qwen3_5_moe"},
	// Qwen3.8-27B (model_type qwen3_5) has only a second-generation drafter. Conversions
	// seen in public sources: Qwen/Qwen3.8-27B, mlx-community/Qwen3.8-27B-4bit and
	// mlx-community/Qwen3.8-27B-mxfp8; a -bf16 conversion is reported without its
	// organisation. The prefix rule pairs any of them (and -8bit, unconfirmed).
	{Target: "Qwen3.8-27B", Draft: "z-lab/Qwen3.8-27B-DFlash2", Family: "qwen3_5"},
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
	for i := range r.pairs {
		r.pairs[i].Served = slices.Contains(model.Families(), r.pairs[i].Family)
	}
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
		list[i].Served = true
	}
	// User pairs first so they win over built-ins with the same key.
	r.pairs = append(list, r.pairs...)
	return r, nil
}

// Pairs lists all known pairs (user pairs first), served or not.
func (r *Registry) Pairs() []Pair { return append([]Pair(nil), r.pairs...) }

// Resolve returns the draft for a target ID or path, from a served pair only (see Match).
func (r *Registry) Resolve(target string) (string, bool) {
	p, ok := r.Match(target)
	if !ok || !p.Served {
		return "", false
	}
	return p.Draft, true
}

// Match returns the pair of a target ID or path, served or not. A user pair whose target
// equals the whole ID wins; a known drafter is no target (the rule below would pair
// "Qwen3-4B-DFlash-b16" with itself); otherwise the base name is matched exactly, then by
// the longest key k with name = k or name starting with k+"-" / k+"_".
func (r *Registry) Match(target string) (Pair, bool) {
	t := strings.TrimRight(target, "/")
	for _, p := range r.pairs {
		if strings.EqualFold(p.Target, t) {
			return p, true
		}
	}
	if r.IsDraft(t) {
		return Pair{}, false
	}
	name := baseName(t)
	var best Pair
	bestLen := -1
	for _, p := range r.pairs {
		k := baseName(p.Target)
		if name == k {
			return p, true
		}
		if hasKeyPrefix(name, k) && len(k) > bestLen {
			best, bestLen = p, len(k)
		}
	}
	return best, bestLen >= 0
}

// IsDraft reports whether an ID or path names a known drafter: its base name is a draft's,
// exactly or followed by "-" or "_" (a quantized or renamed copy of it).
func (r *Registry) IsDraft(ref string) bool {
	name := baseName(strings.TrimRight(ref, "/"))
	for _, p := range r.pairs {
		if d := baseName(p.Draft); name == d || hasKeyPrefix(name, d) {
			return true
		}
	}
	return false
}

// baseName is the lower-cased part of an ID or path after its last "/".
func baseName(ref string) string { return strings.ToLower(ref[strings.LastIndex(ref, "/")+1:]) }

// hasKeyPrefix reports whether name is key followed by "-" or "_" and more.
func hasKeyPrefix(name, key string) bool {
	return strings.HasPrefix(name, key+"-") || strings.HasPrefix(name, key+"_")
}

// Known lists the served target base names, for error messages.
func (r *Registry) Known() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range r.pairs {
		if p.Served && !seen[p.Target] {
			seen[p.Target] = true
			out = append(out, p.Target)
		}
	}
	return out
}
