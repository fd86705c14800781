package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/internal/distest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// float32Pair writes the demo pair's shape in float32 (tensor parallelism sums the ranks'
// partial products in another order than one product does; in float32 that moves logits
// by about 1e-6, in bf16 enough to flip near-ties of random weights) and returns its
// folders (seed: the target's weights).
func float32Pair(t *testing.T, seed uint64) (string, string) {
	t.Helper()
	tinyPair(t) // the tokenizer assets and variables
	ts, ds, err := pairShape("demo")
	if err != nil {
		t.Fatal(err)
	}
	ts.Dtype, ds.Dtype, ts.WeightStd, ts.Seed = mlxc.Float32, mlxc.Float32, 0.1, seed
	dir := t.TempDir()
	td, dd := filepath.Join(dir, "target"), filepath.Join(dir, "draft")
	if err := writePair(td, dd, ts, ds); err != nil {
		t.Fatal(err)
	}
	return td, dd
}

type runTokens struct {
	Tokens []int32 `json:"tokens"`
}

func tokensOf(t *testing.T, what, stdout, stderr string, code int) []int32 {
	t.Helper()
	var out runTokens
	if code != 0 || json.Unmarshal([]byte(stdout), &out) != nil || len(out.Tokens) == 0 {
		t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, code, stdout, stderr)
	}
	return out.Tokens
}

// launch -n 2 runs `run` as two ranks of the split target: the single process's greedy
// tokens, plain and with DFlash.
func TestLaunchSplitsTheTarget(t *testing.T) {
	td, dd := float32Pair(t, 7)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	args := []string{"run", "--target-model", td, "--prompt", "Write a Go function that reverses a slice.", "-n", "24", "--ignore-eos", "--json"}
	stdout, stderr, code := runCLI(t, append(args, "--no-draft")...)
	want := tokensOf(t, "single process", stdout, stderr, code)
	for _, variant := range [][]string{{"--no-draft"}, {"--draft-model", dd}} {
		stdout, stderr, code := runCLI(t, append([]string{"launch", "-n", "2", "--"}, append(args, variant...)...)...)
		got := tokensOf(t, "launch "+variant[0], stdout, stderr, code)
		if at, ok := sameTokens(got, want); !ok {
			t.Errorf("launch -n 2 %v: tokens depart from the single process's plain decoding at %d\ngot  %v\nwant %v", variant, at, got, want)
		}
	}
}

// rankCmds makes the commands of n ranks of args (ring over loopback, as MLX's launcher
// starts them), with per-rank extra arguments.
func rankCmds(t *testing.T, n int, args []string, extra func(rank int) []string) []*exec.Cmd {
	t.Helper()
	hostfile, err := distest.Hostfile(t.TempDir(), n)
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, n)
	for r := range cmds {
		cmds[r] = cliCmd(t, append(args, extra(r)...)...)
		cmds[r].Env = append(cmds[r].Env, "MLX_RANK="+strconv.Itoa(r), "MLX_HOSTFILE="+hostfile, "DFLASH_DIST_BACKEND=ring")
	}
	return cmds
}

// A rank killed mid-generation ends the other within 10 s, with an error that says which
// rank saw it and that a neighbour stopped (no hang).
func TestRankDeathEndsTheOthers(t *testing.T) {
	td, _ := float32Pair(t, 7)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	cmds := rankCmds(t, 2, []string{"run", "--target-model", td, "--no-draft", "--prompt", "hello", "-n", "30000", "--ignore-eos", "--no-chat-template",
		"--context-length", "40000"}, func(int) []string { return nil })
	var out0 syncBuffer
	var err0 bytes.Buffer
	cmds[0].Stdout, cmds[0].Stderr = &out0, &err0
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
	}()
	for start := time.Now(); len(out0.String()) < 64; time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("rank 0 printed nothing in 2 minutes: %s", err0.String())
		}
	}
	killRankOne(t, cmds, err0.String)
}

// killRankOne kills rank 1 and expects rank 0 to end within 10 s with an error exit whose
// message (stderr() once it ended) says that rank 0 of 2 saw a neighbour stop.
func killRankOne(t *testing.T, cmds []*exec.Cmd, stderr func() string) {
	t.Helper()
	if err := cmds[1].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmds[0].Wait() }()
	select {
	case err := <-done:
		t.Logf("rank 0 ended %v after rank 1 was killed: %v", time.Since(killed).Round(time.Millisecond), err)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() <= 0 {
			t.Errorf("rank 0 ended with %v; want an error exit (not a signal)", err)
		}
		if msg := stderr(); !strings.Contains(msg, "rank 0 of 2") || !strings.Contains(msg, "stopped") {
			t.Errorf("rank 0's error does not say what happened:\n%s", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("rank 0 still running 10 s after rank 1 was killed:\n%s", stderr())
	}
	_ = cmds[1].Wait()
}

// Ranks that load different checkpoints or flags are refused at start, on every rank.
func TestMismatchedRanksRefused(t *testing.T) {
	td, dd := float32Pair(t, 7)
	other, _ := float32Pair(t, 8) // the same shape and files, other values
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	run := []string{"run", "--prompt", "hi", "-n", "4", "--json"}
	for _, tc := range []struct {
		name  string
		base  []string
		extra func(rank int) []string
	}{
		{"checkpoint", run, func(r int) []string {
			if r == 1 {
				return []string{"--target-model", other, "--no-draft"}
			}
			return []string{"--target-model", td, "--no-draft"}
		}},
		{"flags", run, func(r int) []string {
			return []string{"--target-model", td, "--draft-model", dd, "--block-size", strconv.Itoa(4 + 4*r)}
		}},
		// A split server's ranks keep the same prompt-cache entries only with one budget.
		{"prompt cache", []string{"serve", "--port", "0"}, func(r int) []string {
			return []string{"--target-model", td, "--no-draft", "--prompt-cache-bytes", strconv.Itoa(1<<20 + r)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds := rankCmds(t, 2, tc.base, tc.extra)
			errs := make([]bytes.Buffer, len(cmds))
			for r, c := range cmds {
				c.Stderr = &errs[r]
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
			}
			for r, c := range cmds {
				err := c.Wait()
				if err == nil || !strings.Contains(errs[r].String(), "rank(s) 1 loaded another checkpoint, drafter, build or settings than rank 0") {
					t.Errorf("rank %d: %v\n%s", r, err, errs[r].String())
				}
			}
		})
	}
}

// A rank that fails ends the launch with an error that names it; a command launch does
// not run is refused.
func TestLaunchReportsAFailedRank(t *testing.T) {
	td, _ := float32Pair(t, 7)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	_, stderr, code := runCLI(t, "launch", "-n", "3", "--", "run", "--target-model", td, "--no-draft", "--prompt", "hi", "-n", "4")
	if code == 0 || !strings.Contains(stderr, "ended") || !strings.Contains(stderr, "of 3") || !strings.Contains(stderr, "2 KV heads cannot be split over 3 ranks") {
		t.Errorf("launch over 3 ranks of a model with 2 KV heads: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := runCLI(t, "launch", "-n", "2", "--", "download", "x"); code != 2 || !strings.Contains(stderr, "not \"download\"") {
		t.Errorf("launch of download: exit %d\n%s", code, stderr)
	}
}

// launch --hostfile starts each rank through ssh with the ring's hostfile written on its
// host, only the variables given with --env, this program's path and working folder: a
// stand-in ssh that runs the command in a clean environment here gives the single
// process's tokens; a hostfile that is not one is refused.
func TestLaunchHostfile(t *testing.T) {
	td, _ := float32Pair(t, 9)
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh")
	// The stand-in: $1 is the host (recorded), $2 the shell command, run with no inherited
	// environment but PATH, as a login on another machine would be.
	script := "#!/bin/sh\necho \"$1\" >> " + filepath.Join(dir, "hosts.log") + "\nexec env -i PATH=\"$PATH\" sh -c \"$2\"\n"
	if err := os.WriteFile(ssh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ports, err := distest.Hostfile(t.TempDir(), 1) // a free port to start from
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(ports)
	var ring [][]string
	if err := json.Unmarshal(b, &ring); err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(ring[0][0], ":")
	hosts := filepath.Join(dir, "hosts.json")
	if err := os.WriteFile(hosts, []byte(`[{"ssh": "mac-a", "ips": ["127.0.0.1"]}, {"ssh": "mac-b", "ips": ["127.0.0.1"]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--target-model", td, "--no-draft", "--prompt", "Write a Go function that reverses a slice.", "-n", "16", "--ignore-eos", "--json"}
	stdout, stderr, code := runCLI(t, args...)
	want := tokensOf(t, "single process", stdout, stderr, code)
	var env []string
	for _, k := range []string{"DFLASH_TOKENIZER_DIR", "XDG_CACHE_HOME"} {
		env = append(env, "--env", k+"="+os.Getenv(k))
	}
	env = append(env, "--env", "DFLASH_CLI_MAIN=1", "--env", "HF_HUB_OFFLINE=1", "--env", "HF_HOME="+t.TempDir(), "--env", "HOME="+t.TempDir())
	launch := append(append([]string{"launch", "--hostfile", hosts, "--ssh", ssh, "--starting-port", port}, env...), "--")
	stdout, stderr, code = runCLI(t, append(launch, args...)...)
	got := tokensOf(t, "launch --hostfile", stdout, stderr, code)
	if at, ok := sameTokens(got, want); !ok {
		t.Errorf("tokens depart from the single process's at %d\ngot  %v\nwant %v", at, got, want)
	}
	if log, _ := os.ReadFile(filepath.Join(dir, "hosts.log")); string(log) != "mac-a\nmac-b\n" && string(log) != "mac-b\nmac-a\n" {
		t.Errorf("ssh reached %q, want mac-a and mac-b", log)
	}
	for _, c := range []struct{ hostfile, want string }{
		{`{"ssh": "a"}`, "not an mlx.launch hostfile"},
		{`[]`, "lists no host"},
		{`[{"ips": ["10.0.0.1"]}]`, `has no "ssh" name`},
	} {
		bad := filepath.Join(t.TempDir(), "bad.json")
		if err := os.WriteFile(bad, []byte(c.hostfile), 0o644); err != nil {
			t.Fatal(err)
		}
		_, stderr, code := runCLI(t, "launch", "--hostfile", bad, "--", "run", "--prompt", "hi")
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("hostfile %s: exit %d, want 2 and %q:\n%s", c.hostfile, code, c.want, stderr)
		}
	}
}

// A rank that stops (SIGSTOP) without dying ends the run too: launch reports it within
// 10 s instead of leaving the others waiting on it.
func TestStoppedRankEndsTheRun(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: stopped ranks are not detected here")
	}
	cmd, errOut, ranks, rank1 := startLongLaunch(t)
	if len(ranks) != 2 || rank1 == 0 {
		t.Fatalf("launcher's children %v (rank 1: %d), want its 2 ranks", ranks, rank1)
	}
	if err := syscall.Kill(rank1, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Logf("launch ended %v after rank 1 stopped: %v", time.Since(stopped).Round(time.Millisecond), err)
		if err == nil || !strings.Contains(errOut.String(), "rank 1 of 2 ended: stopped") {
			t.Errorf("launch ended with %v; stderr does not name the stopped rank:\n%s", err, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("launch still running 10 s after rank 1 stopped")
	}
}

// startLongLaunch starts `launch -n 2` on a long generation and returns once rank 0 has
// printed, with the launcher's ranks (rank1: the one with MLX_RANK=1). The launcher and
// the ranks are killed when the test ends; ranks that outlive the launcher hold its
// output pipes, so Wait gives up on them after a second.
func startLongLaunch(t *testing.T) (cmd *exec.Cmd, errOut *syncBuffer, ranks []int, rank1 int) {
	t.Helper()
	td, _ := float32Pair(t, 7)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	cmd = cliCmd(t, "launch", "-n", "2", "--", "run", "--target-model", td, "--no-draft", "--prompt", "hello", "-n", "30000",
		"--ignore-eos", "--no-chat-template", "--context-length", "40000")
	var out syncBuffer
	errOut = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = &out, errOut
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for _, pid := range ranks {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	for start := time.Now(); len(out.String()) < 64; time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("rank 0 printed nothing in 2 minutes: %s", errOut.String())
		}
	}
	ranks, rank1 = launchedRanks(cmd.Process.Pid)
	return cmd, errOut, ranks, rank1
}

// launchedRanks lists a launcher's children, from every thread's list (Go starts them from
// any thread), and which of them is rank 1 (its environment says MLX_RANK=1).
func launchedRanks(launcher int) (ranks []int, rank1 int) {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(launcher) + "/task/*/children")
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			ranks = append(ranks, pid)
			if env, err := os.ReadFile("/proc/" + f + "/environ"); err == nil && slices.Contains(strings.Split(string(env), "\x00"), "MLX_RANK=1") {
				rank1 = pid
			}
		}
	}
	return ranks, rank1
}

// A launcher killed outright (SIGKILL: it cannot stop its ranks itself) takes its local
// ranks with it.
func TestKilledLauncherTakesItsRanks(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	cmd, _, ranks, _ := startLongLaunch(t)
	if len(ranks) != 2 {
		t.Fatalf("launcher's children %v, want its 2 ranks", ranks)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		alive := 0
		for _, pid := range ranks {
			// A rank that ended but was not reaped yet (its parent is gone: init reaps it)
			// shows as a zombie, state Z.
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
				if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] != 'Z' {
					alive++
				}
			}
		}
		if alive == 0 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d of the ranks still running 5 s after their launcher was killed", alive)
		}
	}
}
