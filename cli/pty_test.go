package cli

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ptyCommand runs argv in a fresh pseudo-terminal through the system's `script`, or says why
// it cannot: util-linux's (Linux) takes the command as one shell string after -c, the BSD one
// (macOS) as arguments after the log file, and has no -c, -e or -f.
func ptyCommand(argv []string) (*exec.Cmd, string) {
	bin, err := exec.LookPath("script")
	if err != nil {
		return nil, "no `script` on PATH (util-linux's on Linux, the system's on macOS)"
	}
	// util-linux's names itself in --version; BSD's has no such flag and fails.
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err == nil && strings.Contains(string(out), "util-linux") {
		quoted := make([]string, len(argv))
		for i, a := range argv {
			quoted[i] = shellQuote(a)
		}
		return exec.Command(bin, "-qfec", strings.Join(quoted, " "), "/dev/null"), ""
	}
	switch runtime.GOOS {
	case "darwin", "freebsd", "netbsd", "openbsd", "dragonfly":
		// -q: no start and end lines; the log goes to /dev/null, and script exits with the
		// command's status.
		return exec.Command(bin, append([]string{"-q", "/dev/null"}, argv...)...), ""
	}
	return nil, "`script` at " + bin + " is neither util-linux's nor a BSD one"
}

// The chat REPL in a real pseudo-terminal (`script` allocates it), as a person uses it: two
// turns, the second prompt carries the first exchange through the template, then /exit.
func TestChatInPseudoTerminal(t *testing.T) {
	td, dd := tinyPair(t)
	cmd, why := ptyCommand([]string{os.Args[0], "chat", "--target-model", td, "--draft-model", dd, "-n", "6", "--block-size", "4"})
	if cmd == nil {
		t.Skip(why + "; the pipe-driven chat tests cover the REPL")
	}
	cmd.Env = append(os.Environ(), "DFLASH_CLI_MAIN=1", "HF_HUB_OFFLINE=1", "HF_HOME="+t.TempDir(), "DFLASH_CHAT_DEBUG=1")
	stdin, _ := cmd.StdinPipe()
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor := func(substr string, count int) {
		deadline := time.Now().Add(60 * time.Second)
		for strings.Count(out.String(), substr) < count {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("timed out waiting for %q ×%d; screen:\n%s", substr, count, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(">>> ", 1)
	io.WriteString(stdin, "first question about cats\r")
	waitFor("[/prompt]", 1)
	waitFor(">>> ", 2)
	io.WriteString(stdin, "second question about dogs\r")
	waitFor("[/prompt]", 2)
	waitFor(">>> ", 3)
	io.WriteString(stdin, "/exit\r")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("chat in a pty ended with %v:\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("chat did not exit")
	}
	screen := strings.ReplaceAll(out.String(), "\r", "")
	second := screen[strings.LastIndex(screen, "[prompt]"):]
	if !strings.Contains(second, "<|im_start|>user\nfirst question about cats<|im_end|>\n<|im_start|>assistant\n") ||
		!strings.Contains(second, "<|im_start|>user\nsecond question about dogs<|im_end|>") {
		t.Errorf("second prompt lacks the first exchange:\n%s", second)
	}
}
