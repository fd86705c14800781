package cli

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
)

// The APIs coding agents use, through their official SDKs, against `dflash-mlx serve` on
// the Go-code pair (testdata/gocode, with DFlash): the openai SDK's Responses calls (plain,
// streamed, chained by previous_response_id, a function-call round trip sent as history),
// the Vercel AI SDK's default provider (generateText, streamText), and the anthropic SDKs
// (messages.create, messages.stream, count_tokens, a tool_use → tool_result round trip).
// Answers are greedy, and each must equal the chat-completions answer to the same
// conversation, with the same usage. The pair's model writes Go and never calls tools, so
// the scripts run without DFLASH_SDK_STRICT_TOOLS: the model side of a tool call is
// covered by server/templatetest and the fake-backed SDK tests in server.
func TestServeAgentAPIsWithSDKsOnTheGoCodePair(t *testing.T) {
	if testing.Short() {
		t.Skip("serves the Go-code pair and runs the SDK scripts (about a minute on a CPU)")
	}
	py := reftest.Python(t)
	if err := exec.Command(py, "-c", "import openai, anthropic").Run(); err != nil {
		reftest.Missing(t, "the openai and anthropic Python SDKs in "+py)
	}
	pair := filepath.Join(reftest.RepoRoot(), "testdata", "gocode")
	base, logs := startServeArgs(t, "--target-model", filepath.Join(pair, "target"),
		"--draft-model", filepath.Join(pair, "draft"), "--model-id", "gocode")
	runSDKScript(t, 5*time.Minute, py, "agents_test.py", base, "gocode", logs, "DFLASH_SDK_STRICT_TOOLS=")
	node := sdkNode(t, "ai", "@ai-sdk/openai", "@anthropic-ai/sdk")
	runSDKScript(t, 5*time.Minute, node, "agents_test.mjs", base, "gocode", logs, "DFLASH_SDK_STRICT_TOOLS=")
}

// startServeArgs runs `dflash-mlx serve` with args on a free port, waits for /health, and
// drains it with SIGTERM when the test ends.
func startServeArgs(t *testing.T, args ...string) (string, *syncBuffer) {
	port := freePort(t)
	cmd := cliCmd(t, append([]string{"serve", "--port", fmt.Sprint(port)}, args...)...)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	base := serveUp(t, cmd, port, &logs)
	t.Cleanup(func() { drainServer(t, cmd, &logs) })
	return base, &logs
}
