package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// The SDK tests drive the server with the official openai SDKs (sdktest/sdk_test.py and
// sdktest/sdk_test.mjs), as clients really use it. The reference interpreter is
// <repo>/third_party/pyref/bin/python (DFLASH_PYREF overrides it), with the openai package;
// the Node SDK lives in sdktest/node_modules (npm ci in server/sdktest). When either is
// missing the test skips, saying what to install, unless DFLASH_REQUIRE_REFERENCE=1, when
// it fails. The same scripts run against a real engine by setting DFLASH_BASE_URL.

func TestOpenAIPythonSDK(t *testing.T) {
	python := os.Getenv("DFLASH_PYREF")
	if python == "" {
		python = filepath.Join(repoRoot(t), "third_party", "pyref", "bin", "python")
	}
	if err := exec.Command(python, "-c", "import openai").Run(); err != nil {
		missingReference(t, "the Python openai SDK (%s -c 'import openai': %v); run make deps or set DFLASH_PYREF", python, err)
	}
	runSDKScript(t, python, "sdk_test.py")
}

func TestOpenAINodeSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		missingReference(t, "node is not on PATH")
	}
	if _, err := os.Stat(filepath.Join("sdktest", "node_modules", "openai", "package.json")); err != nil {
		missingReference(t, "the npm openai SDK (run npm ci in server/sdktest): %v", err)
	}
	runSDKScript(t, node, "sdk_test.mjs")
}

func missingReference(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("DFLASH_REQUIRE_REFERENCE") == "1" {
		t.Fatalf("reference missing: "+format, args...)
	}
	t.Skipf("skipping: reference missing: "+format, args...)
}

// runSDKScript serves a fake that calls get_weather when offered tools, and runs script
// against it.
func runSDKScript(t *testing.T, interpreter, script string) {
	fake := &servertest.Fake{Script: servertest.ToolCallScript("get_weather", `{"city": "Paris"}`)}
	srv := servertest.Start(t, server.Config{}, fake, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, interpreter, script)
	cmd.Dir = "sdktest"
	cmd.Env = append(os.Environ(), "DFLASH_BASE_URL="+srv.URL+"/v1", "DFLASH_SDK_STRICT_TOOLS=1", "DFLASH_API_KEY=unused",
		"DFLASH_MODEL=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(interpreter), script, err, out)
	}
	t.Logf("%s", out)
}

// repoRoot is the module root: this file's directory's parent.
func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Dir(filepath.Dir(file))
}
