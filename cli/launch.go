package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
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
		Usage:     "start run or bench as several ranks of a tensor-parallel target on this machine",
		ArgsUsage: "-- COMMAND [FLAGS…]",
		Description: `Starts N copies of COMMAND (run or bench) as the ranks of MLX's ring
backend over loopback, each with the variables MLX's launcher sets (MLX_RANK, MLX_HOSTFILE)
and --dist-backend ring: each rank loads its share of the target's heads and MLP and they
decode in lockstep. Rank 0's output is the command's; the other ranks' notices appear
with a "[rank N]" prefix. When a rank fails, the others are stopped within seconds and the
error names it.

Machines joined otherwise (several Macs over Thunderbolt, MPI, NCCL) start the same command
on each through MLX's own launcher, which sets the same variables:
  mlx.launch --hostfile hosts.json -- dflash-mlx run --dist-backend ring …

Examples:
  dflash-mlx launch -n 2 -- run --target-model mlx-community/Qwen3-8B-bf16 --prompt "Hello"
  dflash-mlx launch -n 2 -- run --target-model ./my-model --draft-model ./my-draft --prompt "Hi" --json
  dflash-mlx launch -n 2 -- bench --random qwen3-4b --replay-drafts 0.14 -n 64   # = bench --ranks 2`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "ranks", Aliases: []string{"n"}, Value: 2, Usage: "ranks to start"},
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
	case "run", "bench":
	default:
		return cli.Exit(fmt.Sprintf("launch runs run or bench (the commands that split a target today), not %q", args[0]), 2)
	}
	return launchRanks(args, n)
}

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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return superviseRanks(ctx, exe, args, n, hostfile)
}

// rankExit is how one rank ended.
type rankExit struct {
	rank int
	err  error
}

// superviseRanks starts the n ranks and waits for them: the first rank to fail (or rank
// 0 ending) ends the run; the others get launchGrace to finish, then are stopped.
func superviseRanks(ctx context.Context, exe string, args []string, n int, hostfile string) error {
	cmds := make([]*exec.Cmd, n)
	exits := make(chan rankExit, n)
	var out sync.WaitGroup
	var pipes []*io.PipeWriter
	defer func() {
		for _, pw := range pipes {
			pw.Close()
		}
		out.Wait()
	}()
	for r := range n {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), "MLX_RANK="+strconv.Itoa(r), "MLX_HOSTFILE="+hostfile, "DFLASH_DIST_BACKEND=ring")
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
			stopRanks(cmds[:r])
			return fmt.Errorf("starting rank %d: %w", r, err)
		}
		cmds[r] = cmd
		go func() { exits <- rankExit{r, cmd.Wait()} }()
	}
	var first *rankExit
	left := n
	deadline := (<-chan time.Time)(nil)
	for left > 0 {
		select {
		case e := <-exits:
			left--
			if first == nil && (e.err != nil || e.rank == 0) {
				first = &e
				deadline = time.After(launchGrace)
			}
		case <-deadline:
			stopRanks(cmds)
			deadline = nil
		case <-ctx.Done():
			for _, c := range cmds {
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
