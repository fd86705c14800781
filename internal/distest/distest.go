// Package distest runs a test as several ranks of MLX's ring backend on this machine: the
// test binary starts itself once per rank over loopback, with the variables MLX's
// launcher sets (MLX_RANK, MLX_HOSTFILE), and collects what each rank reports.
package distest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// outVar names the file a rank writes its report to; its presence marks a rank process.
const outVar = "DISTEST_REPORT"

// Rank reports whether this process is a rank started by Run, and which.
func Rank() (rank int, ok bool) {
	if os.Getenv(outVar) == "" {
		return 0, false
	}
	r, err := strconv.Atoi(os.Getenv("MLX_RANK"))
	if err != nil {
		return 0, false
	}
	return r, true
}

// Report writes v (JSON) as this rank's report; Run returns it to the parent.
func Report(v any) error {
	path := os.Getenv(outVar)
	if path == "" {
		return fmt.Errorf("distest: not a rank process")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Hostfile writes a ring hostfile of n ranks on 127.0.0.1 at free ports to dir and
// returns its path: a JSON list with one list of "ip:port" per rank.
func Hostfile(dir string, n int) (string, error) {
	hosts := make([][]string, n)
	for i := range hosts {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("distest: a free port: %w", err)
		}
		hosts[i] = []string{l.Addr().String()}
		defer l.Close() // held until all are chosen, so no two ranks get one port
	}
	b, err := json.Marshal(hosts)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "hostfile.json")
	return path, os.WriteFile(path, b, 0o600)
}

// Result is one rank's outcome.
type Result struct {
	Rank   int
	Report []byte // what the rank passed to Report (nil: nothing)
	Output string // its test output
	Err    error  // its exit status, or the timeout
}

// Run starts n ranks of the test named test (this test binary, -test.run ^test$), each
// with MLX_RANK, MLX_HOSTFILE and env, and waits for all of them, at most timeout: a
// rank still running then is killed. The ranks' results come back in rank order.
func Run(t *testing.T, n int, test string, timeout time.Duration, env ...string) []Result {
	t.Helper()
	dir := t.TempDir()
	hostfile, err := Hostfile(dir, n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	results := make([]Result, n)
	var wg sync.WaitGroup
	for r := range n {
		out := filepath.Join(dir, fmt.Sprintf("rank%d.json", r))
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^"+test+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), append([]string{"MLX_RANK=" + strconv.Itoa(r), "MLX_HOSTFILE=" + hostfile, outVar + "=" + out}, env...)...)
		cmd.WaitDelay = 5 * time.Second
		var buf strings.Builder
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			if ctx.Err() != nil {
				err = fmt.Errorf("rank %d still running after %v: %w", r, timeout, ctx.Err())
			}
			rep, _ := os.ReadFile(out)
			results[r] = Result{Rank: r, Report: rep, Output: buf.String(), Err: err}
		}()
	}
	wg.Wait()
	return results
}
