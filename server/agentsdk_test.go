package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// The agent SDK tests drive the Responses and Messages APIs with the official SDKs
// (sdktest/agents_test.py: openai and anthropic; sdktest/agents_test.mjs: the Vercel AI SDK
// and @anthropic-ai/sdk), against a fake whose model calls get_weather(city="Paris") and
// then answers with the tool's result, in each tool-call format. As for the chat SDK tests,
// a missing reference skips unless DFLASH_REQUIRE_REFERENCE=1.

// agentFakes are fakes of both tool-call formats running the agent script.
func agentFakes() map[string]func() *servertest.Fake {
	return map[string]func() *servertest.Fake{
		"json": func() *servertest.Fake {
			return &servertest.Fake{Script: servertest.AgentScript(servertest.ToolCallScript("get_weather", `{"city": "Paris"}`))}
		},
		"qwen3_coder": func() *servertest.Fake {
			return &servertest.Fake{ToolFormat: server.ToolCallQwen3Coder, Script: servertest.AgentScript(
				servertest.CoderToolCallScript("get_weather", servertest.Param{Name: "city", Value: "Paris"}))}
		},
	}
}

func TestAgentAPIsPythonSDKs(t *testing.T) {
	python := os.Getenv("DFLASH_PYREF")
	if python == "" {
		python = filepath.Join(repoRoot(t), "third_party", "pyref", "bin", "python")
	}
	if err := exec.Command(python, "-c", "import openai, anthropic").Run(); err != nil {
		missingReference(t, "the Python openai and anthropic SDKs (%s: %v); run make deps or set DFLASH_PYREF", python, err)
	}
	for format, fake := range agentFakes() {
		t.Run(format, func(t *testing.T) { runAgentScript(t, fake(), python, "agents_test.py") })
	}
}

func TestAgentAPIsNodeSDKs(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		missingReference(t, "node is not on PATH")
	}
	for _, pkg := range []string{"ai", "@ai-sdk/openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join("sdktest", "node_modules", pkg, "package.json")); err != nil {
			missingReference(t, "the npm package %s (run npm ci in server/sdktest): %v", pkg, err)
		}
	}
	for format, fake := range agentFakes() {
		t.Run(format, func(t *testing.T) { runAgentScript(t, fake(), node, "agents_test.mjs") })
	}
}

func runAgentScript(t *testing.T, fake *servertest.Fake, interpreter, script string) {
	srv := servertest.Start(t, server.Config{}, fake, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, interpreter, script)
	cmd.Dir = "sdktest"
	cmd.Env = append(os.Environ(), "DFLASH_BASE_URL="+srv.URL+"/v1", "DFLASH_SDK_STRICT_TOOLS=1", "DFLASH_API_KEY=unused",
		"DFLASH_MODEL="+fake.ModelID())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(interpreter), script, err, out)
	}
	t.Logf("%s", out)
}
