package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
)

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServe runs `dflash-mlx serve` on the tiny pair and waits for /health.
func startServe(t *testing.T, extra ...string) (string, *exec.Cmd, *syncBuffer) {
	td, dd := tinyPair(t)
	port := freePort(t)
	args := append([]string{"serve", "--target-model", td, "--draft-model", dd, "--port", fmt.Sprint(port), "--block-size", "4", "--model-id", "tiny-qwen3"}, extra...)
	cmd := cliCmd(t, args...)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	base := serveUp(t, cmd, port, &logs)
	t.Cleanup(func() { drainServer(t, cmd, &logs) })
	return base, cmd, &logs
}

// drainServer sends SIGTERM to a server and expects it to exit cleanly within 30 s.
func drainServer(t *testing.T, cmd *exec.Cmd, logs *syncBuffer) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve did not exit cleanly on SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Errorf("serve did not drain within 30 s")
	}
}

// serveUp starts cmd, a server on port, and waits for its /health (90 s); it returns the
// server's base URL.
func serveUp(t *testing.T, cmd *exec.Cmd, port int, logs *syncBuffer) string {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("server did not come up: %s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return base
}

func postJSON(t *testing.T, url string, body any) (int, map[string]any) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// Greedy output through the server equals `dflash-mlx run`, which equals plain decoding.
func TestServeMatchesRunAndPlain(t *testing.T) {
	td, dd := tinyPair(t)
	base, _, logs := startServe(t)
	const prompt = "Name three colours."
	code, resp := postJSON(t, base+"/v1/chat/completions", map[string]any{
		"model": "tiny-qwen3", "messages": []map[string]any{{"role": "user", "content": prompt}},
		"max_tokens": 10, "temperature": 0, "chat_template_kwargs": map[string]any{"enable_thinking": false},
	})
	if code != 200 {
		t.Fatalf("status %d: %v\n%s", code, resp, logs.String())
	}
	choice := resp["choices"].([]any)[0].(map[string]any)
	content, _ := choice["message"].(map[string]any)["content"].(string)
	usage := resp["usage"].(map[string]any)
	if _, ok := resp["dflash"]; !ok {
		t.Errorf("no dflash object in %v", resp)
	}
	for _, mode := range [][]string{{"--draft-model", dd, "--block-size", "4"}, {"--no-draft"}} {
		if mode[0] == "--no-draft" && testenv.GPU() {
			// A GPU's verify blocks round apart from its decode steps (testenv.ShapeExact):
			// plain decoding may flip a near-tie that the server's DFlash did not.
			continue
		}
		args := append([]string{"run", "--target-model", td, "--prompt", prompt, "-n", "10", "--json"}, mode...)
		out, errOut, c := runCLI(t, args...)
		if c != 0 {
			t.Fatalf("run: %s", errOut)
		}
		var r struct {
			Text   string  `json:"text"`
			Tokens []int32 `json:"tokens"`
		}
		json.Unmarshal([]byte(out), &r)
		if r.Text != content {
			t.Errorf("run %v text %q differs from the server's %q", mode, r.Text, content)
		}
		if int(usage["completion_tokens"].(float64)) != len(r.Tokens) {
			t.Errorf("usage.completion_tokens %v, run generated %d", usage["completion_tokens"], len(r.Tokens))
		}
	}
	// Errors are answered, not dropped.
	if code, body := postJSON(t, base+"/v1/chat/completions", map[string]any{"model": "tiny-qwen3", "messages": []any{}}); code != 400 || body["error"] == nil {
		t.Errorf("empty messages: %d %v", code, body)
	}
	long := strings.Repeat("word ", 50000)
	if code, body := postJSON(t, base+"/v1/completions", map[string]any{"model": "tiny-qwen3", "prompt": long, "max_tokens": 5}); code != 400 {
		t.Errorf("over-long prompt: %d %v", code, body)
	}
}

// The official OpenAI SDKs (Python and Node) against the real server and engine.
func TestServeWithOpenAISDKs(t *testing.T) {
	py := reftest.Python(t)
	base, _, logs := startServe(t)
	runSDKScript(t, 3*time.Minute, py, "sdk_test.py", base, "tiny-qwen3", logs)
	runSDKScript(t, 3*time.Minute, sdkNode(t, "openai"), "sdk_test.mjs", base, "tiny-qwen3", logs)
}

// runSDKScript runs script of server/sdktest with interp against the server at base,
// asking for model (env adds variables), within timeout; a failing script fails t with
// its output and the server's log.
func runSDKScript(t *testing.T, timeout time.Duration, interp, script, base, model string, logs fmt.Stringer, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, interp, script)
	cmd.Dir = filepath.Join(reftest.RepoRoot(), "server", "sdktest")
	cmd.Env = append(append(os.Environ(), "DFLASH_BASE_URL="+base+"/v1", "DFLASH_API_KEY=unused", "DFLASH_MODEL="+model), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s: %v\n%s\nserver log:\n%s", script, err, out, logs.String())
		return
	}
	t.Logf("%s", out)
}

// sdkNode is node, once server/sdktest's node_modules hold pkgs (npm ci there).
func sdkNode(t *testing.T, pkgs ...string) string {
	t.Helper()
	for _, pkg := range pkgs {
		if _, err := os.Stat(filepath.Join(reftest.RepoRoot(), "server", "sdktest", "node_modules", pkg)); err != nil {
			reftest.Missing(t, "server/sdktest/node_modules/"+pkg+" (npm ci)")
		}
	}
	node, err := exec.LookPath("node")
	if err != nil {
		reftest.Missing(t, "node")
	}
	return node
}
