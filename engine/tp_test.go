package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/distest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// tpSpec is a float32 Qwen3 whose heads, KV heads and MLP width split over 2 and 3 ranks.
func tpSpec() modelgen.Qwen3Spec {
	s := modelgen.TinyQwen3()
	s.Heads, s.KVHeads, s.HeadDim, s.Inter, s.Hidden = 12, 6, 16, 192, 96
	s.Dtype, s.Seed, s.WeightStd, s.EOS = mlxc.Float32, 31, 0.1, []int{-1}
	return s
}

// tpReport is what one process (a rank, or the single-process reference) computed.
type tpReport struct {
	Plain    [][]int32 // greedy tokens per prompt
	DFlash   [][]int32 // greedy DFlash tokens per prompt and block (tpBlocks)
	Logits   []float32 // the last row's logits after the first prompt
	Resident int64     // device memory the target holds
	Sampled  [][]int32 // seeded T > 0 DFlash tokens per prompt
	Err      string    `json:",omitempty"`
}

var tpBlocks = []int{4, 8}

// tpRun loads the pair in dir (the target split by shard; nil: whole) and decodes the
// test's prompts plainly and with DFlash, greedy and seeded at T = 0.8.
func tpRun(dir string, shard *model.Shard) (rep tpReport, err error) {
	err = mlxc.Do(func() error {
		before := mlxc.ActiveMemory()
		target, err := model.Load(filepath.Join(dir, "target"), model.LoadOptions{Settings: testSettings(), Shard: shard})
		if err != nil {
			return err
		}
		defer target.Free()
		rep.Resident = int64(mlxc.ActiveMemory()) - int64(before)
		d, err := draft.Load(filepath.Join(dir, "draft"), target, draft.LoadOptions{Settings: testSettings()})
		if err != nil {
			return err
		}
		defer d.Free()
		gen := func(e *Engine, req Request) ([]int32, error) {
			res, err := e.Generate(context.Background(), req, func(Event) error { return nil })
			return res.Tokens, err
		}
		for pi, prompt := range tpPrompts() {
			toks, err := gen(&Engine{Target: target}, Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: true})
			if err != nil {
				return err
			}
			rep.Plain = append(rep.Plain, toks)
			for _, B := range tpBlocks {
				toks, err := gen(&Engine{Target: target, Proposer: verify.NewDFlash(d)}, Request{Prompt: prompt, MaxTokens: 20, BlockSize: B, IgnoreEOS: true})
				if err != nil {
					return err
				}
				rep.DFlash = append(rep.DFlash, toks)
			}
			toks, err = gen(&Engine{Target: target, Proposer: verify.NewDFlash(d)},
				Request{Prompt: prompt, MaxTokens: 20, BlockSize: 4, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.8, Seed: uint64(7 + pi)}})
			if err != nil {
				return err
			}
			rep.Sampled = append(rep.Sampled, toks)
		}
		s := mlxc.NewScope()
		defer s.Close()
		c := target.NewCache()
		defer c.Free()
		ids := mlxc.FromSlice(tpPrompts()[0], 1, len(tpPrompts()[0]))
		out := target.Forward(ids, c, model.ForwardOptions{Logits: model.LogitsLast})
		rep.Logits = mlxc.AsType(out.Logits, mlxc.Float32).Float32s()
		return nil
	})
	return rep, err
}

func tpPrompts() [][]int32 {
	return [][]int32{{1, 2, 3, 4, 5, 6}, {200, 17, 9}}
}

// Tensor parallelism over the ring backend on loopback: 2 and 3 ranks of a float32 Qwen3
// give the single process's greedy tokens, plain and DFlash (which still equals plain
// decoding); every rank gives the same tokens, sampled ones included; the logits stay
// within 1e-4 of the single process's (the all-sum adds the ranks' partial products in
// another order); and each rank holds its share of the split weights and a whole copy
// of the rest (embedding and norms).
func TestTensorParallelQwen3(t *testing.T) {
	if _, ok := distest.Rank(); ok {
		t.Skip("a rank process runs TestTensorParallelRank only")
	}
	spec := tpSpec()
	dir := t.TempDir()
	if err := mlxc.Do(func() error {
		if err := modelgen.WriteQwen3(filepath.Join(dir, "target"), spec); err != nil {
			return err
		}
		return modelgen.WriteDrafter(filepath.Join(dir, "draft"), modelgen.DrafterFor(spec, 2))
	}); err != nil {
		t.Fatal(err)
	}
	ref, err := tpRun(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range ref.Plain {
		for j := range tpBlocks {
			if at, ok := eqTokens(ref.DFlash[i*len(tpBlocks)+j], want); !ok {
				t.Fatalf("single process, prompt %d, block %d: DFlash departs from plain decoding at %d", i, tpBlocks[j], at)
			}
		}
	}
	// Bytes per weight: the embedding (tied head) and norms stay whole on every rank, the
	// attention and MLP products split.
	H, V, L := spec.Hidden, spec.Vocab, spec.Layers
	whole := int64(4 * (V*H + H + L*(2*H+2*spec.HeadDim)))
	split := int64(4*L) * int64((spec.Heads+2*spec.KVHeads)*spec.HeadDim*H+spec.Heads*spec.HeadDim*H+3*spec.Inter*H)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks%d", n), func(t *testing.T) {
			results := distest.Run(t, n, "TestTensorParallelRank", 3*time.Minute, "DFLASH_TP_DIR="+dir)
			for _, r := range results {
				var got tpReport
				if r.Err != nil || json.Unmarshal(r.Report, &got) != nil || got.Err != "" {
					t.Fatalf("rank %d: %v %s\n%s", r.Rank, r.Err, got.Err, r.Output)
				}
				for i := range ref.Plain {
					if at, ok := eqTokens(got.Plain[i], ref.Plain[i]); !ok {
						t.Errorf("rank %d, prompt %d: plain tokens depart from the single process's at %d", r.Rank, i, at)
					}
				}
				for k := range ref.DFlash {
					if at, ok := eqTokens(got.DFlash[k], ref.Plain[k/len(tpBlocks)]); !ok {
						t.Errorf("rank %d, prompt %d, block %d: DFlash departs from plain decoding at %d", r.Rank, k/len(tpBlocks), tpBlocks[k%len(tpBlocks)], at)
					}
				}
				first := results[0]
				var rank0 tpReport
				_ = json.Unmarshal(first.Report, &rank0)
				for i := range got.Sampled {
					if at, ok := eqTokens(got.Sampled[i], rank0.Sampled[i]); !ok {
						t.Errorf("rank %d, prompt %d: sampled tokens depart from rank 0's at %d", r.Rank, i, at)
					}
				}
				var worst float64
				for i := range ref.Logits {
					worst = math.Max(worst, math.Abs(float64(got.Logits[i]-ref.Logits[i])))
				}
				if worst > 1e-4 || len(got.Logits) != len(ref.Logits) {
					t.Errorf("rank %d: logits differ from the single process's by up to %g (bound 1e-4)", r.Rank, worst)
				}
				want := whole + split/int64(n)
				t.Logf("rank %d of %d: resident %d bytes (single process %d; whole parts %d + split %d/%d = %d); logits within %.2g",
					r.Rank, n, got.Resident, ref.Resident, whole, split, n, want, worst)
				if got.Resident > want+want/20 || got.Resident < want-want/20 {
					t.Errorf("rank %d: holds %d bytes, want %d ± 5%% (whole parts + split / %d)", r.Rank, got.Resident, want, n)
				}
			}
		})
	}
}

// TestTensorParallelRank is one rank of TestTensorParallelQwen3.
func TestTensorParallelRank(t *testing.T) {
	rank, ok := distest.Rank()
	if !ok || os.Getenv("DFLASH_TP_DIR") == "" {
		t.Skip("runs as a rank of TestTensorParallelQwen3")
	}
	var rep tpReport
	err := func() error {
		var g *mlxc.Group
		if err := mlxc.Do(func() error {
			var err error
			g, err = mlxc.InitDistributed(mlxc.BackendRing, true)
			return err
		}); err != nil {
			return err
		}
		var err error
		rep, err = tpRun(os.Getenv("DFLASH_TP_DIR"), &model.Shard{Group: g, Rank: g.Rank(), Size: g.Size()})
		if err == nil && g.Rank() != rank {
			err = fmt.Errorf("group rank %d, MLX_RANK %d", g.Rank(), rank)
		}
		return err
	}()
	if err != nil {
		rep.Err = err.Error()
	}
	if err := distest.Report(rep); err != nil {
		t.Fatal(err)
	}
	if rep.Err != "" {
		t.Fatal(rep.Err)
	}
}
