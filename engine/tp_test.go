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

// tpFamily is a float32 target whose heads (attention, KV, GatedDeltaNet key and value)
// and MLP width split over 2 and 3 ranks, with its drafter, and the bytes of its weights
// that every rank keeps whole (embedding, norms, the GatedDeltaNet's output norm).
type tpFamily struct {
	name  string
	write func(dir string) error
	whole int64 // bytes kept whole on every rank
	total int64 // bytes of all weights
}

func tpFamilies() []tpFamily {
	q3 := modelgen.TinyQwen3()
	q3.Heads, q3.KVHeads, q3.HeadDim, q3.Inter, q3.Hidden = 12, 6, 16, 192, 96
	q3.Dtype, q3.Seed, q3.WeightStd, q3.EOS = mlxc.Float32, 31, 0.1, []int{-1}
	H, V, L := int64(q3.Hidden), int64(q3.Vocab), int64(q3.Layers)
	q3Whole := 4 * (V*H + H + L*(2*H+2*int64(q3.HeadDim)))
	q3Split := 4 * L * int64((q3.Heads+2*q3.KVHeads)*q3.HeadDim*q3.Hidden+q3.Heads*q3.HeadDim*q3.Hidden+3*q3.Inter*q3.Hidden)

	q35 := modelgen.TinyQwen35()
	q35.Heads, q35.KVHeads, q35.HeadDim = 6, 6, 16
	q35.LinKeyHeads, q35.LinValueHeads, q35.LinKeyDim, q35.LinValueDim = 6, 12, 8, 8
	q35.Inter, q35.Hidden = 192, 96
	q35.Dtype, q35.Seed, q35.WeightStd, q35.EOS = mlxc.Float32, 32, 0.1, []int{-1}
	H, V, L = int64(q35.Hidden), int64(q35.Vocab), int64(q35.Layers)
	var lin, full int64
	for i := range q35.Layers {
		if modelgen.Qwen35IsLinear(i, q35.Interval) {
			lin++
		} else {
			full++
		}
	}
	kd, vd := int64(q35.LinKeyHeads*q35.LinKeyDim), int64(q35.LinValueHeads*q35.LinValueDim)
	hd := int64(q35.HeadDim)
	q35Whole := 4 * (V*H + H + L*2*H + lin*int64(q35.LinValueDim) + full*2*hd)
	q35Split := 4 * (L*3*int64(q35.Inter)*H +
		lin*((2*kd+vd)*H+vd*H+2*int64(q35.LinValueHeads)*H+vd*H+(2*kd+vd)*int64(q35.Kernel)+2*int64(q35.LinValueHeads)) +
		full*(2*int64(q35.Heads)*hd*H+2*int64(q35.KVHeads)*hd*H+int64(q35.Heads)*hd*H))
	return []tpFamily{
		{"qwen3", func(dir string) error {
			if err := modelgen.WriteQwen3(filepath.Join(dir, "target"), q3); err != nil {
				return err
			}
			return modelgen.WriteDrafter(filepath.Join(dir, "draft"), modelgen.DrafterFor(q3, 2))
		}, q3Whole, q3Whole + q3Split},
		{"qwen3_5", func(dir string) error {
			if err := modelgen.WriteQwen35(filepath.Join(dir, "target"), q35); err != nil {
				return err
			}
			return modelgen.WriteDrafter(filepath.Join(dir, "draft"), modelgen.DrafterForQwen35(q35, 2))
		}, q35Whole, q35Whole + q35Split},
	}
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
// and Qwen3.5 (GatedDeltaNet and gated attention) give the single process's greedy tokens, plain and DFlash (which still equals plain
// decoding); every rank gives the same tokens, sampled ones included; the logits stay
// within 1e-4 of the single process's (the all-sum adds the ranks' partial products in
// another order); and each rank holds its share of the split weights and a whole copy
// of the rest (embedding and norms).
func TestTensorParallel(t *testing.T) {
	if _, ok := distest.Rank(); ok {
		t.Skip("a rank process runs TestTensorParallelRank only")
	}
	for _, fam := range tpFamilies() {
		t.Run(fam.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := mlxc.Do(func() error { return fam.write(dir) }); err != nil {
				t.Fatal(err)
			}
			ref, err := tpRun(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The count of the weights' bytes is the test's own; the single process may hold
			// a few small arrays more (the hybrid: 48 bytes).
			if d := ref.Resident - fam.total; d < 0 || d > 64 {
				t.Errorf("single process holds %d bytes, want %d + at most 64 (the test's count of the weights is off)", ref.Resident, fam.total)
			}
			for i, want := range ref.Plain {
				for j := range tpBlocks {
					if at, ok := eqTokens(ref.DFlash[i*len(tpBlocks)+j], want); !ok {
						t.Fatalf("single process, prompt %d, block %d: DFlash departs from plain decoding at %d", i, tpBlocks[j], at)
					}
				}
			}
			for _, n := range []int{2, 3} {
				t.Run(fmt.Sprintf("ranks%d", n), func(t *testing.T) {
					checkRanks(t, distest.Run(t, n, "TestTensorParallelRank", 3*time.Minute, "DFLASH_TP_DIR="+dir), ref, fam, n)
				})
			}
		})
	}
}

// checkRanks compares the ranks' reports with the single process's (ref).
func checkRanks(t *testing.T, results []distest.Result, ref tpReport, fam tpFamily, n int) {
	t.Helper()
	reps := make([]tpReport, len(results))
	for i, r := range results {
		if r.Err != nil || json.Unmarshal(r.Report, &reps[i]) != nil || reps[i].Err != "" {
			t.Fatalf("rank %d: %v %s\n%s", r.Rank, r.Err, reps[i].Err, r.Output)
		}
	}
	for r, got := range reps {
		for i := range ref.Plain {
			if at, ok := eqTokens(got.Plain[i], ref.Plain[i]); !ok {
				t.Errorf("rank %d, prompt %d: plain tokens depart from the single process's at %d", r, i, at)
			}
		}
		for k := range ref.DFlash {
			if at, ok := eqTokens(got.DFlash[k], ref.Plain[k/len(tpBlocks)]); !ok {
				t.Errorf("rank %d, prompt %d, block %d: DFlash departs from plain decoding at %d", r, k/len(tpBlocks), tpBlocks[k%len(tpBlocks)], at)
			}
		}
		for i := range got.Sampled {
			if at, ok := eqTokens(got.Sampled[i], reps[0].Sampled[i]); !ok {
				t.Errorf("rank %d, prompt %d: sampled tokens depart from rank 0's at %d", r, i, at)
			}
		}
		var worst float64
		for i := range ref.Logits {
			worst = math.Max(worst, math.Abs(float64(got.Logits[i]-ref.Logits[i])))
		}
		if worst > 1e-4 || len(got.Logits) != len(ref.Logits) {
			t.Errorf("rank %d: logits differ from the single process's by up to %g (bound 1e-4)", r, worst)
		}
		want := fam.whole + (fam.total-fam.whole)/int64(n)
		t.Logf("rank %d of %d: resident %d bytes (single process %d: whole parts %d + split %d/%d = %d); logits within %.2g",
			r, n, got.Resident, ref.Resident, fam.whole, fam.total-fam.whole, n, want, worst)
		if got.Resident != want {
			t.Errorf("rank %d: holds %d bytes, want %d (whole parts + split / %d)", r, got.Resident, want, n)
		}
	}
}

// TestTensorParallelRank is one rank of TestTensorParallel.
func TestTensorParallelRank(t *testing.T) {
	rank, ok := distest.Rank()
	if !ok || os.Getenv("DFLASH_TP_DIR") == "" {
		t.Skip("runs as a rank of TestTensorParallel")
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
