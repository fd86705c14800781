package cli

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// splitServeArgs are the serve flags of the split-server tests.
func splitServeArgs(td, dd string, port int) []string {
	return []string{"serve", "--target-model", td, "--draft-model", dd, "--port", fmt.Sprint(port),
		"--block-size", "4", "--model-id", "tiny-qwen3", "--max-batch", "4"}
}

// A split target behind `serve`: rank 0 serves HTTP and the other rank follows its
// schedule. Requests sent at once (greedy and seeded sampling, a grammar, a stop string,
// DFlash, rows joining and leaving) get the answers a single process gives them one at a time; a client that
// leaves mid-stream costs only itself; SIGTERM to the launcher drains and ends every rank
// cleanly.
func TestLaunchServesASplitTarget(t *testing.T) {
	td, dd := float32Pair(t, 7)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	reqs := []map[string]any{
		chatReq("Name three colours.", 24, nil),
		chatReq("Write a Go function that adds two ints.", 32, nil),
		chatReq(strings.Repeat("Explain slices and maps in Go. ", 12), 16, nil),
		chatReq("Count to five.", 24, map[string]any{"temperature": 0.8, "top_p": 0.9, "seed": 42}),
		chatReq("Say hi.", 8, map[string]any{"temperature": 1.0, "top_k": 20, "seed": 7}),
		// A grammar and a stop string: every rank builds the matcher and the detokenizer.
		chatReq("Describe a colour as JSON.", 40, map[string]any{"response_format": map[string]any{"type": "json_object"}}),
		chatReq("Spell the alphabet.", 40, map[string]any{"stop": []string{"e"}}),
	}

	port := freePort(t)
	single := cliCmd(t, splitServeArgs(td, dd, port)...)
	// A split target drafts the whole block every cycle; a sampled answer follows the
	// cycles' key stream, so the single process takes the same fixed block.
	single.Env = append(single.Env, "DFLASH_ADAPTIVE_BLOCK=0")
	var slogs syncBuffer
	single.Stdout, single.Stderr = &slogs, &slogs
	base := serveUp(t, single, port, &slogs)
	want := make([]string, len(reqs))
	for i, r := range reqs {
		code, resp := postJSON(t, base+"/v1/chat/completions", r)
		if code != 200 {
			t.Fatalf("single process, request %d: %d %v\n%s", i, code, resp, slogs.String())
		}
		want[i] = contentOf(t, resp)
	}
	drainServer(t, single, &slogs)

	port = freePort(t)
	launch := cliCmd(t, append([]string{"launch", "-n", "2", "--"}, splitServeArgs(td, dd, port)...)...)
	var logs syncBuffer
	launch.Stdout, launch.Stderr = &logs, &logs
	base = serveUp(t, launch, port, &logs)
	drained := false
	defer func() {
		if !drained {
			_ = launch.Process.Kill()
			_ = launch.Wait()
		}
	}()

	var wg sync.WaitGroup
	got := make([]string, 2*len(reqs))
	codes := make([]int, len(got))
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i >= len(reqs) {
				time.Sleep(time.Duration(i-len(reqs)) * 150 * time.Millisecond) // join a running batch
			}
			code, resp := postJSON(t, base+"/v1/chat/completions", reqs[i%len(reqs)])
			codes[i] = code
			if code == 200 {
				got[i] = contentOf(t, resp)
			}
		}()
	}
	gone := streamAndLeave(t, base, chatReq("Tell a long story.", 200, nil), 3)
	wg.Wait()
	for i, g := range got {
		if codes[i] != 200 {
			t.Errorf("request %d on the split server: status %d\n%s", i, codes[i], logs.String())
			continue
		}
		if g != want[i%len(reqs)] {
			t.Errorf("request %d on the split server differs from the single process:\n got %q\nwant %q", i, g, want[i%len(reqs)])
		}
	}
	if !gone {
		t.Error("the client that left never got its first chunks")
	}
	metrics := getText(t, base+"/metrics")
	if total, single := histCount(metrics, "dflash_batch_rows", "+Inf"), histCount(metrics, "dflash_batch_rows", "1"); total == 0 || single >= total {
		t.Errorf("no step of the split server decoded more than one row (%d of %d steps had one)", single, total)
	}
	// After a pause longer than the idle heartbeat, it still answers.
	time.Sleep(2500 * time.Millisecond)
	if code, resp := postJSON(t, base+"/v1/chat/completions", reqs[0]); code != 200 || contentOf(t, resp) != want[0] {
		t.Errorf("after an idle pause: status %d, %v", code, resp)
	}
	drainServer(t, launch, &logs)
	drained = true
	if !strings.Contains(logs.String(), "[rank 1] note: rank 1 of 2: following rank 0's requests") {
		t.Errorf("rank 1 did not say that it follows rank 0:\n%s", logs.String())
	}
}

// A rank of a split server that dies ends rank 0 within 10 s with an error naming the
// rank: while idle (the heartbeat notices) and while a request streams (which fails).
func TestSplitServerRankDeath(t *testing.T) {
	td, dd := float32Pair(t, 7)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	for _, busy := range []bool{false, true} {
		t.Run(map[bool]string{false: "idle", true: "streaming"}[busy], func(t *testing.T) {
			port := freePort(t)
			cmds := rankCmds(t, 2, splitServeArgs(td, dd, port), func(int) []string { return nil })
			var logs syncBuffer
			cmds[0].Stdout, cmds[0].Stderr = &logs, &logs
			if err := cmds[1].Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, c := range cmds {
					_ = c.Process.Kill()
				}
			}()
			base := serveUp(t, cmds[0], port, &logs)
			var stream *bufio.Reader
			if busy {
				req := chatReq("Tell a long story.", 4000, nil)
				conn := rawPost(t, base, withStream(req))
				defer conn.Close()
				stream = bufio.NewReader(conn)
				for seen := 0; seen < 3; {
					line, err := stream.ReadString('\n')
					if err != nil {
						t.Fatalf("the stream ended before its first chunks: %v\n%s", err, logs.String())
					}
					if strings.HasPrefix(line, "data: ") {
						seen++
					}
				}
			}
			killRankOne(t, cmds, logs.String)
			if busy {
				rest, _ := io.ReadAll(stream)
				if !strings.Contains(string(rest), `"error"`) || !strings.Contains(string(rest), "rank 0 of 2") {
					t.Errorf("the stream did not end with an error naming the rank:\n%s", rest)
				}
			}
		})
	}
}

// withStream is req asking for a stream.
func withStream(req map[string]any) map[string]any {
	req["stream"] = true
	return req
}
