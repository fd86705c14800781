package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// TestFusedJobsCompileWhatGenerationMeets: every compiled function a generation calls (the
// SwiGLU, a GatedDeltaNet layer's element-wise steps, DFlash2's convolution and its greedy
// and sampled candidate walks) makes fused-kernel jobs, as a first use on a GPU does, and
// each job, compiled anew from its file, meets the kernels of the call it was written for:
// what a helper process compiles is what the generation's own compiles ask for.
func TestFusedJobsCompileWhatGenerationMeets(t *testing.T) {
	hybrid := hybridPairs(t)["bf16"]
	dflash2 := dflash2Pairs(t)
	cases := []struct {
		name    string
		p       *pair
		minJobs int // one per compiled function the pair's generation calls, at least
	}{
		{"qwen3.5 with a DFlash drafter", hybrid, 4},
		{"qwen3 with a DFlash2 drafter", dflash2["qwen3-bf16"], 3},
		{"qwen3.5 with a DFlash2 drafter", dflash2["qwen35-bf16"], 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var jobs []string
			var found int
			err := mlxc.Do(func() error {
				generate := func(i int, sp sample.Params) ([]int32, error) {
					e := &Engine{Target: tc.p.target, Proposer: proposerOf(tc.p.drft)}
					req := Request{Prompt: prompts(tc.p.vocab)[i], MaxTokens: 12, BlockSize: 4, IgnoreEOS: true, Sampling: sp}
					res, err := e.Generate(context.Background(), req, func(Event) error { return nil })
					return res.Tokens, err
				}
				var want [][]int32
				for i, sp := range []sample.Params{{}, {Temperature: 0.8, Seed: 5}} {
					toks, err := generate(i, sp)
					if err != nil {
						return fmt.Errorf("generate: %w", err)
					}
					want = append(want, toks)
				}
				stop := mlxc.RecordFusedJobs(dir)
				for i, sp := range []sample.Params{{}, {Temperature: 0.8, Seed: 5}} {
					toks, err := generate(i, sp)
					if err != nil {
						stop()
						return fmt.Errorf("generate: %w", err)
					}
					// Writing the jobs leaves the generation as it was.
					if n, ok := eqTokens(toks, want[i]); !ok {
						stop()
						return fmt.Errorf("request %d: tokens differ from token %d on with jobs written", i, n)
					}
				}
				var err error
				if jobs, err = stop(); err != nil {
					return fmt.Errorf("a call's trace was not exported: %w", err)
				}
				for _, job := range jobs {
					names, err := mlxc.CheckFusedJob(job)
					if err != nil {
						return err
					}
					found += len(names)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d jobs, %d kernels", len(jobs), found)
			if len(jobs) < tc.minJobs {
				t.Errorf("%d fused-kernel jobs (%d kernels met), want at least %d: %v", len(jobs), found, tc.minJobs, baseNames(jobs))
			}
		})
	}
}

// baseNames are the paths' file names.
func baseNames(paths []string) []string {
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(p))
	}
	return out
}
