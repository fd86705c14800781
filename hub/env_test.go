package hub

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnvFrom(t *testing.T) {
	home := t.TempDir()
	hfHome := filepath.Join(home, "hf")
	if err := os.MkdirAll(hfHome, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hfHome, "token"), []byte("hf_fromfile\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherToken := filepath.Join(home, "other-token")
	if err := os.WriteFile(otherToken, []byte("  hf_other \r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	defaultHome := filepath.Join(home, ".cache", "huggingface")

	tests := []struct {
		name string
		vars map[string]string
		want Env
	}{
		{"defaults", nil,
			Env{Endpoint: DefaultEndpoint, Home: defaultHome, CacheDir: filepath.Join(defaultHome, "hub")}},
		{"XDG_CACHE_HOME", map[string]string{"XDG_CACHE_HOME": "/xdg"},
			Env{Endpoint: DefaultEndpoint, Home: "/xdg/huggingface", CacheDir: "/xdg/huggingface/hub"}},
		{"HF_HOME with ~ and token file", map[string]string{"HF_HOME": "~/hf"},
			Env{Endpoint: DefaultEndpoint, Home: hfHome, CacheDir: filepath.Join(hfHome, "hub"), Token: "hf_fromfile"}},
		{"HF_HUB_CACHE with a variable", map[string]string{"HF_HUB_CACHE": "$BASE/cache", "BASE": "/data"},
			Env{Endpoint: DefaultEndpoint, Home: defaultHome, CacheDir: "/data/cache"}},
		{"legacy HUGGINGFACE_HUB_CACHE", map[string]string{"HUGGINGFACE_HUB_CACHE": "/legacy"},
			Env{Endpoint: DefaultEndpoint, Home: defaultHome, CacheDir: "/legacy"}},
		{"HF_HUB_CACHE beats the legacy name", map[string]string{"HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HUB_CACHE": "/new"},
			Env{Endpoint: DefaultEndpoint, Home: defaultHome, CacheDir: "/new"}},
		{"HF_ENDPOINT loses its trailing slash", map[string]string{"HF_ENDPOINT": "http://mirror.local:8080/"},
			Env{Endpoint: "http://mirror.local:8080", Home: defaultHome, CacheDir: filepath.Join(defaultHome, "hub")}},
		{"HF_TOKEN beats the token file", map[string]string{"HF_HOME": hfHome, "HF_TOKEN": " hf_env\n"},
			Env{Endpoint: DefaultEndpoint, Home: hfHome, CacheDir: filepath.Join(hfHome, "hub"), Token: "hf_env"}},
		{"legacy HUGGING_FACE_HUB_TOKEN", map[string]string{"HUGGING_FACE_HUB_TOKEN": "hf_legacy"},
			Env{Endpoint: DefaultEndpoint, Home: defaultHome, CacheDir: filepath.Join(defaultHome, "hub"), Token: "hf_legacy"}},
		{"HF_TOKEN_PATH", map[string]string{"HF_TOKEN_PATH": otherToken},
			Env{Endpoint: DefaultEndpoint, Home: defaultHome, CacheDir: filepath.Join(defaultHome, "hub"), Token: "hf_other"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envFrom(func(k string) string { return tc.vars[k] }, home)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestEnvOffline(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want bool
	}{
		{map[string]string{"HF_HUB_OFFLINE": "1"}, true},
		{map[string]string{"HF_HUB_OFFLINE": "yes"}, true},
		{map[string]string{"HF_HUB_OFFLINE": "TRUE"}, true},
		{map[string]string{"HF_HUB_OFFLINE": "on"}, true},
		{map[string]string{"HF_HUB_OFFLINE": "0"}, false},
		{map[string]string{"HF_HUB_OFFLINE": "false"}, false},
		{map[string]string{"TRANSFORMERS_OFFLINE": "1"}, true},
		{nil, false},
	} {
		got, err := envFrom(func(k string) string { return tc.vars[k] }, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if got.Offline != tc.want {
			t.Errorf("%v: Offline = %v, want %v", tc.vars, got.Offline, tc.want)
		}
	}
}

func TestEnvUnreadableTokenFile(t *testing.T) {
	home := t.TempDir()
	// A directory where the token file should be cannot be read.
	if err := os.MkdirAll(filepath.Join(home, "hf", "token"), 0o755); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"HF_HOME": filepath.Join(home, "hf")}
	if _, err := envFrom(func(k string) string { return vars[k] }, home); err == nil {
		t.Error("an unreadable token file was ignored silently")
	}
}

func TestLoadEnvReadsTheProcessEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HF_HOME", dir)
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HUGGINGFACE_HUB_CACHE", "")
	t.Setenv("HF_TOKEN", "hf_process")
	t.Setenv("HF_HUB_OFFLINE", "1")
	t.Setenv("HF_ENDPOINT", "http://127.0.0.1:9")
	c, err := NewClientFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if c.CacheDir != filepath.Join(dir, "hub") || c.Token != "hf_process" || !c.Offline || c.Endpoint != "http://127.0.0.1:9" {
		t.Errorf("client = %+v", c)
	}
}
