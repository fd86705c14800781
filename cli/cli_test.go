package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
)

// The test binary doubles as the CLI: with DFLASH_CLI_MAIN=1 it runs Main, so end-to-end
// tests exercise the real command line in a separate process.
func TestMain(m *testing.M) {
	if os.Getenv("DFLASH_CLI_MAIN") == "1" {
		os.Exit(Main(append([]string{"dflash-mlx"}, os.Args[1:]...)))
	}
	code := m.Run()
	if pairDir != "" {
		os.RemoveAll(pairDir)
	}
	os.Exit(code)
}

var pairDir string

// tinyPair writes the demo pair (real Qwen3 tokenizer, random weights) once.
func tinyPair(t *testing.T) (string, string) {
	t.Helper()
	tokDir := filepath.Join(reftest.RepoRoot(), "third_party", "testdata", "qwen3")
	if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err != nil {
		reftest.Missing(t, "Qwen3 tokenizer asset "+tokDir)
	}
	t.Setenv("DFLASH_TOKENIZER_DIR", tokDir) // for the CLI subprocesses
	resolved.Diagnostics.TokenizerDir = tokDir
	if pairDir == "" {
		dir, err := os.MkdirTemp("", "dflash-cli-test-")
		if err != nil {
			t.Fatal(err)
		}
		tspec, dspec, _ := pairShape("demo")
		if err := writePair(filepath.Join(dir, "target"), filepath.Join(dir, "draft"), tspec, dspec); err != nil {
			t.Fatal(err)
		}
		pairDir = dir
	}
	return filepath.Join(pairDir, "target"), filepath.Join(pairDir, "draft")
}

func cliCmd(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "DFLASH_CLI_MAIN=1", "HF_HUB_OFFLINE=1", "HF_HOME="+t.TempDir())
	return cmd
}

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := cliCmd(t, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func TestRunStreamsAndJSON(t *testing.T) {
	td, dd := tinyPair(t)
	out, errOut, code := runCLI(t, "run", "--target-model", td, "--draft-model", dd, "--prompt", "Hello there", "-n", "12", "--ignore-eos", "--block-size", "4", "--stats")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.TrimSpace(out) == "" {
		t.Error("no streamed text")
	}
	if !strings.Contains(errOut, "dflash") || !strings.Contains(errOut, "tok/s") {
		t.Errorf("--stats printed no statistics: %s", errOut)
	}
	var res struct {
		Text         string  `json:"text"`
		Tokens       []int32 `json:"tokens"`
		FinishReason string  `json:"finish_reason"`
		Stats        struct {
			Mode            string  `json:"mode"`
			GeneratedTokens int     `json:"generated_tokens"`
			Cycles          int     `json:"cycles"`
			Tau             float64 `json:"tau"`
		} `json:"stats"`
	}
	dj, errOut, code := runCLI(t, "run", "--target-model", td, "--draft-model", dd, "--prompt", "Hello there", "-n", "12", "--ignore-eos", "--block-size", "4", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(dj), &res); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, dj)
	}
	if res.Stats.Mode != "dflash" || len(res.Tokens) != 12 || res.FinishReason != "length" || res.Stats.GeneratedTokens != 12 || res.Stats.Cycles == 0 {
		t.Errorf("unexpected result: %+v", res)
	}
	if strings.TrimSpace(out) != strings.TrimSpace(res.Text) {
		t.Errorf("streamed text %q differs from --json text %q", out, res.Text)
	}
	pj, _, code := runCLI(t, "run", "--target-model", td, "--no-draft", "--prompt", "Hello there", "-n", "12", "--ignore-eos", "--json")
	var plain struct {
		Tokens []int32 `json:"tokens"`
	}
	if code != 0 || json.Unmarshal([]byte(pj), &plain) != nil {
		t.Fatalf("plain run failed: %s", pj)
	}
	// Plain decoding's tokens on the CPU. A GPU's verify blocks round apart from its decode
	// steps (testenv.ShapeExact), so a near-tie may flip a token there.
	if fmt.Sprint(plain.Tokens) != fmt.Sprint(res.Tokens) && !testenv.GPU() {
		t.Errorf("DFlash tokens %v differ from plain %v", res.Tokens, plain.Tokens)
	}
}

func TestCLIErrors(t *testing.T) {
	td, _ := tinyPair(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad temperature", []string{"run", "--target-model", td, "--no-draft", "--prompt", "x", "--temperature", "-1"}, "temperature"},
		{"missing folder", []string{"run", "--target-model", "./no/such/model", "--no-draft", "--prompt", "x"}, "does not exist"},
		{"unknown repo offline", []string{"run", "--target-model", "nobody/no-such-model", "--no-draft", "--prompt", "x"}, "nobody/no-such-model"},
		{"unknown flag", []string{"run", "--bogus"}, "bogus"},
		{"required draft", []string{"run", "--target-model", td, "--require-draft", "--prompt", "x"}, "no DFlash draft is known"},
		{"stray argument", []string{"run", "--target-model", td, "hello"}, "unexpected argument"},
		{"bad draft", []string{"run", "--target-model", td, "--draft-model", td, "--prompt", "x"}, "draft"},
		{"prompt past the context", []string{"run", "--target-model", td, "--no-draft", "--context-length", "16", "--prompt", strings.Repeat("many words ", 20)}, "the model's context is 16 tokens"},
		{"answer past the context", []string{"run", "--target-model", td, "--no-draft", "--context-length", "64", "-n", "60", "--prompt", "four words of prompt"}, "lower --max-new-tokens to at most"},
		{"bad prompt cache size", []string{"run", "--target-model", td, "--no-draft", "--prompt", "x", "--prompt-cache-dir", t.TempDir(), "--prompt-cache-bytes", "lots"}, "--prompt-cache-bytes"},
		{"bad context sweep", []string{"bench", "--demo", "--context", "12x"}, "--context"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := runCLI(t, c.args...)
			if code == 0 {
				t.Fatalf("exit 0 for %v", c.args)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not mention %q", errOut, c.want)
			}
		})
	}
}

// Chat keeps the real history: the second turn's prompt contains the first exchange
// rendered through the template; Ctrl-C stops an answer without ending the program.
func TestChatKeepsHistoryAndSurvivesCtrlC(t *testing.T) {
	td, dd := tinyPair(t)
	cmd := cliCmd(t, "chat", "--target-model", td, "--draft-model", dd, "-n", "6", "--block-size", "4")
	cmd.Env = append(cmd.Env, "DFLASH_CHAT_DEBUG=1")
	stdin, _ := cmd.StdinPipe()
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	prompts := make(chan string, 8)
	go func() {
		r := bufio.NewReader(stderr)
		var cur strings.Builder
		for {
			line, err := r.ReadString('\n')
			if strings.Contains(line, "[prompt]") || cur.Len() > 0 {
				cur.WriteString(line)
				if strings.Contains(line, "[/prompt]") {
					prompts <- cur.String()
					cur.Reset()
				}
			}
			if err != nil {
				close(prompts)
				return
			}
		}
	}()
	next := func() string {
		select {
		case p, ok := <-prompts:
			if !ok {
				t.Fatal("chat ended early")
			}
			return p
		case <-time.After(60 * time.Second):
			t.Fatal("timed out waiting for a prompt")
		}
		return ""
	}
	io.WriteString(stdin, "first question about cats\n")
	p1 := next()
	io.WriteString(stdin, "second question about dogs\n")
	p2 := next()
	if strings.Contains(p1, "dogs") || !strings.Contains(p1, "first question about cats") {
		t.Errorf("first prompt wrong: %q", p1)
	}
	if !strings.Contains(p2, "<|im_start|>user\nfirst question about cats<|im_end|>\n<|im_start|>assistant\n") ||
		!strings.Contains(p2, "<|im_start|>user\nsecond question about dogs<|im_end|>") {
		t.Errorf("second prompt lacks the first exchange through the template:\n%s", p2)
	}
	// /reset forgets the history.
	io.WriteString(stdin, "/reset\nthird after reset\n")
	p3 := next()
	if strings.Contains(p3, "cats") {
		t.Errorf("history kept after /reset: %q", p3)
	}
	// Ctrl-C while idle does not end the program.
	cmd.Process.Signal(syscall.SIGINT)
	time.Sleep(300 * time.Millisecond)
	io.WriteString(stdin, "/stats\n/exit\n")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("chat exited with %v; output %s", err, stdout.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("chat did not exit on /exit")
	}
	if !strings.Contains(stdout.String(), "tok/s") {
		t.Errorf("/stats printed nothing: %s", stdout.String())
	}
}

func TestChatCtrlCStopsTheAnswerOnly(t *testing.T) {
	td, dd := tinyPair(t)
	cmd := cliCmd(t, "chat", "--target-model", td, "--draft-model", dd, "-n", "100000", "--block-size", "4", "--context-length", "40000")
	cmd.Env = append(cmd.Env, "DFLASH_CHAT_DEBUG=1")
	stdin, _ := cmd.StdinPipe()
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "tell me a very long story\n")
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), "[/prompt]") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // let it generate for a while
	cmd.Process.Signal(syscall.SIGINT)
	for !strings.Contains(stdout.String(), "[stopped]") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(stdout.String(), "[stopped]") {
		cmd.Process.Kill()
		t.Fatalf("Ctrl-C did not stop the answer: %q", stdout.String())
	}
	io.WriteString(stdin, "/exit\n")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("chat ended with %v after Ctrl-C", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// boolPtr prints an optional JSON boolean: null when absent.
func boolPtr(b *bool) string {
	if b == nil {
		return "null"
	}
	return fmt.Sprint(*b)
}

// bench: the JSON report's shape and its invariants, replayed acceptance at a known τ, the
// flips measurement, and bad flags.
func TestBenchJSON(t *testing.T) {
	td, dd := tinyPair(t)
	// The checks below read a fixed block's cycles (its draft and verify split, τ 11 with
	// every draft right); the adaptive block would take one-token steps on random weights.
	t.Setenv("DFLASH_ADAPTIVE_BLOCK", "0")
	gpu := testenv.GPU()
	// A GPU's first run compiles kernels on the host (Metal pipelines, CUDA's NVRTC), which a
	// cold run counts as building: one untimed run first there, so the split below is warm.
	warmup := "0"
	if gpu {
		warmup = "1"
	}
	base := []string{"bench", "--target-model", td, "--draft-model", dd, "--num-prompts", "1", "--warmup", warmup, "-q", "--json"}
	// bench compares DFlash with plain decoding and the two loops with each other: equal on
	// the CPU. A GPU's verify blocks round apart from its decode steps (and the run-ahead
	// loop's from the plain loop's), so a near-tie may flip a token: the check must be made
	// there, and may come out false.
	checked := func(b *bool) bool { return b != nil && (*b || gpu) }
	type row struct {
		PlainTPS   float64            `json:"plain_tok_s"`
		DFlashTPS  float64            `json:"dflash_tok_s"`
		PlainRuns  []float64          `json:"plain_runs_tok_s"`
		DFlashRuns []float64          `json:"dflash_runs_tok_s"`
		DFlashTaus []float64          `json:"dflash_runs_tau"`
		Tau        float64            `json:"tau"`
		Exact      *bool              `json:"exact"`
		LoopsAgree *bool              `json:"loops_agree"`
		Tokens     int                `json:"tokens"`
		StepNodes  float64            `json:"plain_step_nodes"`
		DraftNodes float64            `json:"draft_nodes_per_cycle"`
		VerNodes   float64            `json:"verify_nodes_per_cycle"`
		StepOps    map[string]float64 `json:"plain_step_ops"`
		OtherTPS   float64            `json:"other_loop_tok_s"`
		OtherRuns  []float64          `json:"other_loop_runs_tok_s"`
		OtherLoop  string             `json:"other_loop"`
		CycleMS    float64            `json:"cycle_ms"`
		LoopBuild  float64            `json:"loop_build_ms_per_cycle"`
		LoopWait   float64            `json:"loop_wait_ms_per_cycle"`
		LoopHost   float64            `json:"loop_host_ms_per_cycle"`
		PlainBuild float64            `json:"plain_build_ms_per_step"`
		PlainWait  float64            `json:"plain_wait_ms_per_step"`
		Pipelined  *struct {
			CycleMS float64 `json:"cycle_ms"`
			HostMS  float64 `json:"host_ms"`
		} `json:"pipelined"`
	}
	type report struct {
		Rows       []row    `json:"rows"`
		AllExact   *bool    `json:"all_exact"`
		LoopsAgree *bool    `json:"all_loops_agree"`
		Replay     *float64 `json:"replay_error_rate"`
		Note       string   `json:"note"`
		Reports    []struct {
			Positions int `json:"positions"`
		} `json:"reports"`
	}
	run := func(extra ...string) report {
		t.Helper()
		out, errOut, code := runCLI(t, append(append([]string{}, base...), extra...)...)
		if code != 0 {
			t.Fatalf("bench %v: exit %d\n%s", extra, code, errOut)
		}
		var r report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("bench %v: not JSON: %v\n%s", extra, err, out)
		}
		return r
	}

	r := run("-n", "12", "--repeats", "2")
	if len(r.Rows) != 1 || !checked(r.AllExact) || !checked(r.Rows[0].Exact) || r.Replay != nil {
		t.Fatalf("report %+v", r)
	}
	x := r.Rows[0]
	if x.Tokens != 12 || len(x.PlainRuns) != 2 || len(x.DFlashRuns) != 2 || x.PlainTPS <= 0 || x.DFlashTPS <= 0 || x.Tau < 1 {
		t.Errorf("row %+v", x)
	}
	if len(x.DFlashTaus) != 2 || min(x.DFlashTaus[0], x.DFlashTaus[1]) > x.Tau || max(x.DFlashTaus[0], x.DFlashTaus[1]) < x.Tau {
		t.Errorf("per-run τ %v do not bracket the median %g", x.DFlashTaus, x.Tau)
	}
	if x.StepNodes <= 0 || x.DraftNodes <= 0 || x.VerNodes <= 0 || len(x.StepOps) == 0 {
		t.Errorf("profiled graph counts missing: %+v", x)
	}
	// The timed runs' split: each part measured, and together no longer than the cycle
	// (other repeats' medians may differ a little; the loop also emits tokens).
	if parts := x.LoopBuild + x.LoopWait + x.LoopHost; x.LoopBuild <= 0 || x.LoopWait <= 0 || x.LoopHost < 0 ||
		x.PlainBuild <= 0 || x.PlainWait < 0 || parts > 1.5*x.CycleMS {
		t.Errorf("loop split: build %g + wait %g + host %g ms against a %g ms cycle; plain build %g, wait %g",
			x.LoopBuild, x.LoopWait, x.LoopHost, x.CycleMS, x.PlainBuild, x.PlainWait)
	}
	if x.Pipelined == nil || x.Pipelined.CycleMS <= 0 || x.Pipelined.HostMS <= 0 || x.OtherLoop != "" {
		t.Errorf("pipelined probe %+v, other loop %q", x.Pipelined, x.OtherLoop)
	}

	// The run-ahead loop timed alongside, replayed: the same tokens as the plain loop. Replayed
	// acceptance is not checked against plain decoding, so exactness is absent, not true.
	r = run("-n", "12", "--repeats", "2", "--replay-drafts", "0.2", "--compare-run-ahead")
	if x := r.Rows[0]; !checked(r.LoopsAgree) || !checked(x.LoopsAgree) || x.OtherLoop != "run-ahead" || len(x.OtherRuns) != 2 || x.OtherTPS <= 0 {
		t.Errorf("--compare-run-ahead: loops agree %s, row %+v", boolPtr(r.LoopsAgree), x)
	}
	if r.AllExact != nil || r.Rows[0].Exact != nil {
		t.Errorf("replayed run reports exactness it did not check: all_exact %s, exact %s", boolPtr(r.AllExact), boolPtr(r.Rows[0].Exact))
	}

	// Every draft right: 12 tokens = the first (from the prompt) + one cycle of 10 drafts and
	// the bonus token, so τ is exactly 11.
	r = run("-n", "12", "--repeats", "1", "--replay-drafts", "0")
	if r.Replay == nil || *r.Replay != 0 || !strings.Contains(r.Note, "replayed") || r.Rows[0].Tau != 11 {
		t.Errorf("replayed run: replay %v, note %q, τ %v", r.Replay, r.Note, r.Rows[0].Tau)
	}
	if r.AllExact != nil || r.Rows[0].Exact != nil || r.LoopsAgree != nil {
		t.Errorf("replayed run without a second loop reports checks it did not make: all_exact %v, exact %v, loops agree %s", boolPtr(r.AllExact), boolPtr(r.Rows[0].Exact), boolPtr(r.LoopsAgree))
	}

	r = run("-n", "10", "--flips")
	if len(r.Reports) != 1 || r.Reports[0].Positions != 10 {
		t.Errorf("flips report %+v", r.Reports)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{{[]string{"--replay-drafts", "1.5"}, "error rate between 0 and 1"}, {[]string{"-n", "0"}, "--max-new-tokens must be at least 1"}} {
		_, errOut, code := runCLI(t, append(append([]string{}, base...), bad.args...)...)
		if code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("bench %v: exit %d, stderr %q, want %q", bad.args, code, errOut, bad.want)
		}
	}
}
