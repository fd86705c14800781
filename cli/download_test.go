package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

// hubCLI runs the CLI against a fake Hub with an empty cache of its own.
func hubCLI(t *testing.T, srv *hubtest.Server, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	home := t.TempDir()
	cmd := cliCmd(t, args...)
	cmd.Env = append(cmd.Env, srv.Env(filepath.Join(home, "hub"), home)...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// fakeModel commits a small model repository whose config declares modelType.
func fakeModel(srv *hubtest.Server, id, modelType string) {
	srv.AddRepo(id, hubtest.Public).Commit("main", hubtest.LFSIfWeights(
		hubtest.File{Path: "config.json", Data: []byte(`{"model_type":"` + modelType + `","hidden_size":64}`)},
		hubtest.File{Path: "tokenizer.json", Data: []byte(`{"version":"1.0"}`)},
		hubtest.File{Path: "model.safetensors", Data: make([]byte, 4096)},
	)...)
}

// requestsFor counts the fake Hub's requests that name repo (content and API alike).
func requestsFor(srv *hubtest.Server, repo string) int {
	return srv.Count(func(r hubtest.Request) bool {
		return r.RepoID == repo || strings.Contains(r.Path, "/"+repo+"/") || strings.HasSuffix(r.Path, "/"+repo)
	})
}

// download reads its flags after the target ID as well as before it, and says exactly what
// is wrong with extra arguments or unknown flags.
func TestDownloadFlagsAfterID(t *testing.T) {
	const target = "org/Qwen3-4B-bf16" // the registry pairs it with z-lab/Qwen3-4B-DFlash-b16
	for _, tc := range []struct {
		name string
		args []string
		want string // "" = succeeds
	}{
		{"flag after the ID", []string{"download", target, "--no-draft", "-q"}, ""},
		{"flag before the ID", []string{"download", "--no-draft", target, "-q"}, ""},
		{"value flag after the ID", []string{"download", target, "--revision", "main", "--no-draft", "--quiet"}, ""},
		{"two IDs", []string{"download", target, "org/other", "--no-draft"}, "download takes one target ID, got 2: org/Qwen3-4B-bf16 org/other"},
		{"unknown flag after the ID", []string{"download", target, "--bogus"}, "flag provided but not defined: -bogus"},
		{"value flag without a value", []string{"download", target, "--revision"}, "flag needs an argument: -revision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := hubtest.New(t)
			fakeModel(srv, target, "qwen3")
			out, errOut, code := hubCLI(t, srv, tc.args...)
			if tc.want != "" {
				if code == 0 || !strings.Contains(errOut, tc.want) {
					t.Fatalf("exit %d, stderr %q, want an error with %q", code, errOut, tc.want)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.Contains(out, target+" → ") {
				t.Errorf("stdout %q does not report where %s went", out, target)
			}
			if n := requestsFor(srv, "z-lab/Qwen3-4B-DFlash-b16"); n != 0 {
				t.Errorf("--no-draft still asked for the drafter (%d requests)", n)
			}
		})
	}
}

// A target whose model_type no family of this build loads is refused after its config.json
// alone: one line on stderr, and neither its weights nor any drafter's are requested. The
// name is a known pair's, so only the model_type (one nobody serves) stops it.
func TestUnloadableFamilyRefusedBeforeDownload(t *testing.T) {
	const target, drafter = "org/Qwen3.5-35B-A3B-4bit", "z-lab/Qwen3.5-35B-A3B-DFlash"
	const unserved = "made_up_moe"
	for _, args := range [][]string{
		{"download", target},
		{"download", target, "--no-draft"},
		{"run", "--target-model", target, "--prompt", "hi"},
		{"run", "--target-model", target, "--draft-model", drafter, "--prompt", "hi"},
		{"chat", "--target-model", target},
		{"serve", "--target-model", target, "--port", "0"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			srv := hubtest.New(t)
			fakeModel(srv, target, unserved)
			fakeModel(srv, drafter, "qwen3")
			_, errOut, code := hubCLI(t, srv, args...)
			if code == 0 {
				t.Fatal("exit 0")
			}
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], `model_type "`+unserved+`"`) || !strings.Contains(lines[0], "cannot load") {
				t.Errorf("stderr is not one line naming the model_type:\n%s", errOut)
			}
			weights := srv.Count(func(r hubtest.Request) bool { return strings.HasSuffix(r.File, ".safetensors") })
			if weights != 0 || requestsFor(srv, drafter) != 0 {
				t.Errorf("%d weight requests, %d drafter requests; want none", weights, requestsFor(srv, drafter))
			}
		})
	}
}

// cacheRepo writes a model repository into a Hub cache the way downloads leave it, every
// file holding a config of modelType; partial adds a blob still being written.
func cacheRepo(t *testing.T, cache, id, modelType string, files []string, partial bool) {
	t.Helper()
	dir := filepath.Join(cache, "models--"+strings.ReplaceAll(id, "/", "--"))
	commit := strings.Repeat("a", 40)
	for _, f := range files {
		blob := filepath.Join(dir, "blobs", f+".blob")
		link := filepath.Join(dir, "snapshots", commit, f)
		if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(blob, []byte(`{"model_type":"`+modelType+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", f+".blob"), link); err != nil {
			t.Fatal(err)
		}
	}
	if partial {
		if err := os.WriteFile(filepath.Join(dir, "blobs", "feed.incomplete"), make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// models pairs cached targets with served drafters only, shows drafters as drafters (not as
// their own draft), marks incomplete downloads, and marks which known pairs are served.
func TestModelsListing(t *testing.T) {
	cache := t.TempDir()
	whole := []string{"config.json", "model.safetensors", "tokenizer.json"}
	cacheRepo(t, cache, "mlx-community/Qwen3-4B-bf16", "qwen3", whole, false)
	cacheRepo(t, cache, "z-lab/Qwen3-4B-DFlash-b16", "qwen3", []string{"config.json", "model.safetensors"}, false)
	cacheRepo(t, cache, "mlx-community/Qwen3-8B-4bit", "qwen3", []string{"config.json", "tokenizer.json"}, true)
	cacheRepo(t, cache, "mlx-community/Qwen3.5-4B-bf16", "qwen3_5", whole, false)
	cacheRepo(t, cache, "mlx-community/Qwen3.5-35B-A3B-4bit", "qwen3_5_moe", whole, false)
	cacheRepo(t, cache, "org/Made-Up-MoE-4bit", "made_up_moe", whole, false)
	run := func(args ...string) string {
		cmd := cliCmd(t, append([]string{"models", "--drafts-file", filepath.Join(cache, "none.json")}, args...)...)
		cmd.Env = append(cmd.Env, "HF_HUB_CACHE="+cache)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("models %v: %v", args, err)
		}
		return string(out)
	}
	var res struct {
		Cached []struct {
			RepoID      string   `json:"repo_id"`
			Draft       string   `json:"draft"`
			Drafter     bool     `json:"drafter"`
			Incomplete  bool     `json:"incomplete"`
			Missing     []string `json:"missing"`
			Unsupported bool     `json:"unsupported"`
		} `json:"cached"`
		Pairs []struct {
			Target string `json:"target"`
			Served bool   `json:"served"`
		} `json:"pairs"`
	}
	if err := json.Unmarshal([]byte(run("--json")), &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		draft                            string
		drafter, incomplete, unsupported bool
	}{
		"mlx-community/Qwen3-4B-bf16":        {"z-lab/Qwen3-4B-DFlash-b16", false, false, false},
		"z-lab/Qwen3-4B-DFlash-b16":          {"", true, false, false},
		"mlx-community/Qwen3-8B-4bit":        {"z-lab/Qwen3-8B-DFlash-b16", false, true, false},
		"mlx-community/Qwen3.5-4B-bf16":      {"z-lab/Qwen3.5-4B-DFlash", false, false, false},
		"mlx-community/Qwen3.5-35B-A3B-4bit": {"z-lab/Qwen3.5-35B-A3B-DFlash", false, false, false},
		"org/Made-Up-MoE-4bit":               {"", false, false, true},
	}
	if len(res.Cached) != len(want) {
		t.Fatalf("cached rows %+v", res.Cached)
	}
	for _, r := range res.Cached {
		w := want[r.RepoID]
		if r.Draft != w.draft || r.Drafter != w.drafter || r.Incomplete != w.incomplete || (r.Incomplete != (len(r.Missing) > 0)) || r.Unsupported != w.unsupported {
			t.Errorf("%s: %+v, want draft %q, drafter %v, incomplete %v, unsupported %v", r.RepoID, r, w.draft, w.drafter, w.incomplete, w.unsupported)
		}
	}
	served := map[string]bool{}
	for _, p := range res.Pairs {
		served[p.Target] = p.Served
	}
	if !served["Qwen3-4B"] || !served["Qwen3.5-4B"] || !served["Qwen3.5-35B-A3B"] || len(served) < 8 {
		t.Errorf("pairs' served marks %v", served)
	}
	text := run()
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.Contains(line, "z-lab/Qwen3-4B-DFlash-b16 ") && strings.Contains(line, "draft: z-lab/Qwen3-4B-DFlash-b16"):
			t.Errorf("the drafter is listed as its own draft: %q", line)
		case strings.Contains(line, "Qwen3-8B-4bit") && !strings.Contains(line, "incomplete"):
			t.Errorf("the partial download is not marked: %q", line)
		case strings.Contains(line, "Qwen3-4B-bf16") && strings.Contains(line, "incomplete"):
			t.Errorf("a complete download is marked incomplete: %q", line)
		case strings.HasPrefix(strings.TrimSpace(line), "Qwen3.5-4B ") && strings.Contains(line, "not served"):
			t.Errorf("a served pair is marked unserved: %q", line)
		case strings.HasPrefix(strings.TrimSpace(line), "Qwen3.5-35B-A3B ") && strings.Contains(line, "not served"):
			t.Errorf("the served MoE pair is marked unserved: %q", line)
		case strings.Contains(line, "Made-Up-MoE-4bit") && !strings.Contains(line, `cannot load model_type "made_up_moe"`):
			t.Errorf("a cached model of an unloadable family is not marked: %q", line)
		case line != strings.TrimRight(line, " "):
			t.Errorf("trailing spaces: %q", line)
		}
	}
}
