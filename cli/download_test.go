package cli

import (
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
// alone: one line on stderr, and neither its weights nor any drafter's are requested.
func TestUnloadableFamilyRefusedBeforeDownload(t *testing.T) {
	const target, drafter = "org/Qwen3.5-4B-bf16", "z-lab/Qwen3.5-4B-DFlash"
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
			fakeModel(srv, target, "qwen3_5")
			fakeModel(srv, drafter, "qwen3")
			_, errOut, code := hubCLI(t, srv, args...)
			if code == 0 {
				t.Fatal("exit 0")
			}
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], `model_type "qwen3_5"`) || !strings.Contains(lines[0], "cannot load") {
				t.Errorf("stderr is not one line naming the model_type:\n%s", errOut)
			}
			weights := srv.Count(func(r hubtest.Request) bool { return strings.HasSuffix(r.File, ".safetensors") })
			if weights != 0 || requestsFor(srv, drafter) != 0 {
				t.Errorf("%d weight requests, %d drafter requests; want none", weights, requestsFor(srv, drafter))
			}
		})
	}
}
