package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultEndpoint is the Hub used when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Env holds the settings huggingface_hub reads from the environment, resolved the same way, so that
// both tools agree on where the cache is and which token to send.
type Env struct {
	// Endpoint is HF_ENDPOINT without a trailing slash (default https://huggingface.co).
	Endpoint string
	// Home is HF_HOME (default $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface).
	Home string
	// CacheDir is HF_HUB_CACHE (legacy HUGGINGFACE_HUB_CACHE; default $HF_HOME/hub).
	CacheDir string
	// Token is HF_TOKEN (legacy HUGGING_FACE_HUB_TOKEN), else the content of HF_TOKEN_PATH
	// (default $HF_HOME/token); "" when there is none.
	Token string
	// Offline is HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to 1, ON, YES or TRUE.
	Offline bool
}

// LoadEnv reads the process environment. It fails only when a token file exists but cannot be read.
func LoadEnv() (Env, error) {
	home, _ := os.UserHomeDir()
	return envFrom(os.Getenv, home)
}

// envFrom resolves the settings from getenv; home is the user's home directory.
func envFrom(getenv func(string) string, home string) (Env, error) {
	expand := func(p string) string { return expandPath(p, getenv, home) }
	var e Env
	e.Home = expand(getenv("HF_HOME"))
	if e.Home == "" {
		xdg := expand(getenv("XDG_CACHE_HOME"))
		if xdg == "" {
			xdg = filepath.Join(home, ".cache")
		}
		e.Home = filepath.Join(xdg, "huggingface")
	}
	e.CacheDir = expand(firstNonEmpty(getenv("HF_HUB_CACHE"), getenv("HUGGINGFACE_HUB_CACHE")))
	if e.CacheDir == "" {
		e.CacheDir = filepath.Join(e.Home, "hub")
	}
	e.Endpoint = strings.TrimRight(firstNonEmpty(getenv("HF_ENDPOINT"), DefaultEndpoint), "/")
	e.Offline = isTrue(firstNonEmpty(getenv("HF_HUB_OFFLINE"), getenv("TRANSFORMERS_OFFLINE")))

	e.Token = cleanToken(firstNonEmpty(getenv("HF_TOKEN"), getenv("HUGGING_FACE_HUB_TOKEN")))
	if e.Token == "" {
		tokenPath := expand(getenv("HF_TOKEN_PATH"))
		if tokenPath == "" {
			tokenPath = filepath.Join(e.Home, "token")
		}
		data, err := os.ReadFile(tokenPath)
		switch {
		case err == nil:
			e.Token = cleanToken(string(data))
		case !errors.Is(err, fs.ErrNotExist):
			return e, fmt.Errorf("hub: reading token file: %w", err)
		}
	}
	return e, nil
}

// expandPath expands a leading ~ and $VARS, as huggingface_hub does for its path variables.
func expandPath(p string, getenv func(string) string, home string) string {
	if p == "" {
		return ""
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = home + p[1:]
	}
	return os.Expand(p, getenv)
}

// cleanToken drops line breaks and surrounding blanks, which token files usually end with.
func cleanToken(t string) string {
	t = strings.ReplaceAll(t, "\r", "")
	t = strings.ReplaceAll(t, "\n", "")
	return strings.TrimSpace(t)
}

func isTrue(v string) bool {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
