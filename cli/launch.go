package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/internal/distest"
)

// launchGrace is how long the other ranks get to end on their own once one rank failed
// (or rank 0 finished), before they are stopped.
const launchGrace = 5 * time.Second

func launchCommand() *cli.Command {
	return &cli.Command{
		Name:      "launch",
		Usage:     "start run, bench or serve as the ranks of a tensor-parallel target, on this machine or over ssh",
		ArgsUsage: "-- COMMAND [FLAGS…]",
		Description: `Starts N copies of COMMAND (run, bench or serve) as the ranks of MLX's ring
backend over loopback, each with the variables MLX's launcher sets (MLX_RANK, MLX_HOSTFILE)
and --dist-backend ring: each rank loads its share of the target's heads and MLP and they
decode in lockstep. Rank 0's output is the command's; the other ranks' notices appear
with a "[rank N]" prefix. A split server listens on rank 0 only; the other ranks run the
requests rank 0 admits, step for step, and end when it does. When a rank fails, the others are stopped within seconds and the
error names it.

With --hostfile (mlx.launch's format) each rank starts over ssh on its host, the ring on
the host's first address; this program must sit at the same path on every host, and ssh
passes no environment (give variables with --env). Other backends (JACCL, MPI, NCCL) start
the same command on each machine through MLX's own launcher, which sets their variables:
  mlx.launch --backend jaccl --hostfile hosts.json -- dflash-mlx run --dist-backend jaccl …

Examples:
  dflash-mlx launch -n 2 -- run --target-model mlx-community/Qwen3-8B-bf16 --prompt "Hello"
  dflash-mlx launch -n 2 -- run --target-model ./my-model --draft-model ./my-draft --prompt "Hi" --json
  dflash-mlx launch -n 2 -- bench --random qwen3-4b --replay-drafts 0.14 -n 64   # = bench --ranks 2
  dflash-mlx launch -n 2 -- serve --target-model mlx-community/Qwen3-8B-bf16 --port 8000
  dflash-mlx launch --hostfile hosts.json --env HF_HOME=/Volumes/models -- run --target-model mlx-community/Qwen3.5-27B-bf16 --prompt "Hi"`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "ranks", Aliases: []string{"n"}, Value: 2, Usage: "ranks to start (with --hostfile: one per host)"},
			&cli.StringFlag{Name: "hostfile", Usage: "start the ranks over ssh on the hosts of an mlx.launch hostfile ([{\"ssh\": \"mac1\", \"ips\": [\"10.0.0.1\"]}, …]): rank i on host i, the ring on its first ip; this program's path and working folder must be the same on every host"},
			&cli.IntFlag{Name: "starting-port", Value: 5000, Usage: "with --hostfile: rank i's ring port is this + i"},
			&cli.StringFlag{Name: "ssh", Value: "ssh", Usage: "with --hostfile: the ssh command (it is given the host and one shell command)"},
			&cli.StringSliceFlag{Name: "env", Usage: "with --hostfile: K=V set on every rank (ssh passes no environment; repeatable)"},
		},
		Action: launchAction,
	}
}

func launchAction(c *cli.Context) error {
	n := c.Int("ranks")
	if n < 1 {
		return cli.Exit("--ranks must be ≥ 1", 2)
	}
	args := c.Args().Slice()
	if len(args) == 0 {
		return cli.Exit("give the command to run after --, e.g. dflash-mlx launch -n 2 -- run --prompt hi", 2)
	}
	switch args[0] {
	case "run", "bench", "serve":
	default:
		return cli.Exit(fmt.Sprintf("launch runs run, bench or serve (the commands that split a target today), not %q", args[0]), 2)
	}
	if path := c.String("hostfile"); path != "" {
		hosts, err := readLauncherHostfile(path)
		if err != nil {
			return cli.Exit(err.Error(), 2)
		}
		if c.IsSet("ranks") && n != len(hosts) {
			return cli.Exit(fmt.Sprintf("--ranks %d but %s lists %d hosts (one rank per host)", n, path, len(hosts)), 2)
		}
		cmds, err := sshRankCmds(hosts, args, c.Int("starting-port"), c.String("ssh"), c.StringSlice("env"))
		if err != nil {
			return cli.Exit(err.Error(), 2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return superviseRanks(ctx, cmds)
	}
	return launchRanks(args, n)
}

// launcherHost is one host of an mlx.launch hostfile.
type launcherHost struct {
	SSH string   `json:"ssh"`
	IPs []string `json:"ips"`
}

// readLauncherHostfile reads an mlx.launch hostfile: a JSON list of hosts, each with the
// name ssh reaches it by and the addresses the ring uses (the first; the ssh name when
// none is given).
func readLauncherHostfile(path string) ([]launcherHost, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--hostfile: %w", err)
	}
	var hosts []launcherHost
	if err := json.Unmarshal(b, &hosts); err != nil {
		return nil, fmt.Errorf("--hostfile %s: not an mlx.launch hostfile (a JSON list of {\"ssh\": …, \"ips\": […]}): %w", path, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("--hostfile %s lists no host", path)
	}
	for i, h := range hosts {
		if h.SSH == "" {
			return nil, fmt.Errorf("--hostfile %s: host %d has no \"ssh\" name", path, i)
		}
	}
	return hosts, nil
}

// sshRankCmds makes the ssh commands of the hosts' ranks: each writes the ring's hostfile
// (rank i at its host's first address, port startPort+i) to a temporary file there and
// runs this program with args as rank i, with the variables MLX's launcher sets and env.
func sshRankCmds(hosts []launcherHost, args []string, startPort int, ssh string, env []string) ([]*exec.Cmd, error) {
	if startPort < 1 || startPort+len(hosts) > 65536 {
		return nil, fmt.Errorf("--starting-port %d: the ports must lie in 1–65535", startPort)
	}
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsAny(k, " '\"$;") {
			return nil, fmt.Errorf("--env %q: want NAME=value", kv)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	ring := make([][]string, len(hosts))
	for i, h := range hosts {
		ip := h.SSH
		if len(h.IPs) > 0 {
			ip = h.IPs[0]
		}
		ring[i] = []string{net.JoinHostPort(ip, strconv.Itoa(startPort+i))}
	}
	ringJSON, err := json.Marshal(ring)
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, len(hosts))
	for r, h := range hosts {
		var sh strings.Builder
		fmt.Fprintf(&sh, "cd %s 2>/dev/null; f=$(mktemp) && printf '%%s' %s > \"$f\" || exit 1; ", shellQuote(wd), shellQuote(string(ringJSON)))
		fmt.Fprintf(&sh, "MLX_RANK=%d MLX_HOSTFILE=\"$f\" DFLASH_DIST_BACKEND=ring", r)
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			fmt.Fprintf(&sh, " %s=%s", k, shellQuote(v))
		}
		sh.WriteString(" " + shellQuote(exe))
		for _, a := range args {
			sh.WriteString(" " + shellQuote(a))
		}
		sh.WriteString(`; s=$?; rm -f "$f"; exit $s`)
		cmds[r] = exec.Command(ssh, h.SSH, sh.String())
	}
	return cmds, nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// launchRanks runs this program with args as n ranks of the ring backend over loopback
// and supervises them (superviseRanks).
func launchRanks(args []string, n int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "dflash-launch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	hostfile, err := distest.Hostfile(dir, n)
	if err != nil {
		return err
	}
	cmds := make([]*exec.Cmd, n)
	for r := range cmds {
		cmds[r] = exec.Command(exe, args...)
		cmds[r].Env = append(os.Environ(), "MLX_RANK="+strconv.Itoa(r), "MLX_HOSTFILE="+hostfile, "DFLASH_DIST_BACKEND=ring")
		cmds[r].SysProcAttr = rankProcAttr()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return superviseRanks(ctx, cmds)
}

// stopPoll is how often the supervisor looks for stopped ranks; stopLimit how long one
// may stay stopped before the run ends (with launchGrace, under 10 s in all).
const (
	stopPoll  = 500 * time.Millisecond
	stopLimit = 3 * time.Second
)

// processStopped reports whether the process is stopped (state T in /proc; false where
// there is no /proc or the process is gone).
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}

// rankExit is how one rank ended.
type rankExit struct {
	rank int
	err  error
}

// superviseRanks starts the ranks' commands (rank i: cmds[i]) and waits for them: the
// first rank to fail (or rank 0 ending) ends the run; the others get launchGrace to
// finish, then are stopped. Rank 0 has this process's stdio; the others' stdout is
// dropped and their stderr prefixed.
func superviseRanks(ctx context.Context, cmds []*exec.Cmd) error {
	n := len(cmds)
	started := make([]*exec.Cmd, n)
	exits := make(chan rankExit, n)
	var out sync.WaitGroup
	var pipes []*io.PipeWriter
	defer func() {
		for _, pw := range pipes {
			pw.Close()
		}
		out.Wait()
	}()
	for r, cmd := range cmds {
		cmd.Stdin = nil
		if r == 0 {
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		} else {
			cmd.Stdout = io.Discard
			pr, pw := io.Pipe()
			cmd.Stderr = pw
			out.Add(1)
			go func() {
				defer out.Done()
				sc := bufio.NewScanner(pr)
				for sc.Scan() {
					fmt.Fprintf(os.Stderr, "[rank %d] %s\n", r, sc.Text())
				}
			}()
			pipes = append(pipes, pw)
		}
		if err := cmd.Start(); err != nil {
			stopRanks(started[:r])
			return fmt.Errorf("starting rank %d: %w", r, err)
		}
		started[r] = cmd
		go func() { exits <- rankExit{r, cmd.Wait()} }()
	}
	var first *rankExit
	left := n
	deadline := (<-chan time.Time)(nil)
	watch := time.NewTicker(stopPoll)
	defer watch.Stop()
	interrupted := ctx.Done()
	stoppedSince := make([]time.Time, n)
	ended := make([]bool, n)
	for left > 0 {
		select {
		case e := <-exits:
			left--
			ended[e.rank] = true
			if first == nil && (e.err != nil || e.rank == 0) {
				first = &e
				deadline = time.After(launchGrace)
			}
		case now := <-watch.C:
			// A stopped rank (SIGSTOP, a debugger) never answers the others' collectives:
			// past stopLimit it counts as failed, so that the run ends instead of hanging.
			for r, c := range started {
				if ended[r] || !processStopped(c.Process.Pid) {
					stoppedSince[r] = time.Time{}
					continue
				}
				if stoppedSince[r].IsZero() {
					stoppedSince[r] = now
				} else if first == nil && now.Sub(stoppedSince[r]) >= stopLimit {
					first = &rankExit{r, fmt.Errorf("stopped for %s and not answering", stopLimit)}
					deadline = time.After(launchGrace)
					_ = c.Process.Kill()
				}
			}
		case <-deadline:
			stopRanks(started)
			deadline = nil
		case <-interrupted:
			// Once: a rank that has handled the first interrupt (a server draining) and is
			// ending must not get another, which would kill it mid-exit.
			interrupted = nil
			for _, c := range started {
				_ = c.Process.Signal(os.Interrupt)
			}
			if deadline == nil {
				deadline = time.After(launchGrace)
			}
		}
	}
	if first != nil && first.err != nil {
		msg := fmt.Sprintf("rank %d of %d ended: %v (the other ranks were stopped)", first.rank, n, first.err)
		var ee *exec.ExitError
		if errors.As(first.err, &ee) && ee.ExitCode() > 0 {
			return cli.Exit(msg, ee.ExitCode())
		}
		return cli.Exit(msg, 1)
	}
	return nil
}

// stopRanks kills the ranks (those that ended already are left as they are: killing an
// ended process only returns an error, which is of no use here).
func stopRanks(cmds []*exec.Cmd) {
	for _, c := range cmds {
		if c != nil {
			_ = c.Process.Kill()
		}
	}
}
