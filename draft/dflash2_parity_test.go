package draft_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	_ "github.com/dflash-mlx/dflash-mlx/model/families"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// Parity with z-lab's DFlash2 reference (dflash==0.1.0, through draft/testdata/dflash2_ref.py)
// on float32 pairs the reference's own writers make, over a Qwen3 and a Qwen3.5 target: the
// same loader reads the published layout, one forward gives the same hidden rows, logits,
// candidates and greedy path bit for bit, the same q along a sampled path, and a whole
// greedy generation drafts and accepts the same per cycle.

type refPair struct {
	dir, target, draft string
	t                  model.Model
	d                  *draft.Drafter
}

func refScript() string {
	return filepath.Join(reftest.RepoRoot(), "draft", "testdata", "dflash2_ref.py")
}

// writeRefPair has the reference write a target of kind whose greedy text repeats one
// token and a drafter leaning toward it (so cycles accept some drafts and not others), and
// loads both here.
func writeRefPair(t *testing.T, py, kind, favourScale string) *refPair {
	t.Helper()
	p := &refPair{dir: t.TempDir()}
	p.target, p.draft = filepath.Join(p.dir, "target"), filepath.Join(p.dir, "draft")
	reftest.Run(t, py, refScript(), "maketarget", kind, "--out", p.target, "--seed", "1", "--favour", "123")
	reftest.Run(t, py, refScript(), "makedraft", "--target", p.target, "--out", p.draft, "--seed", "2",
		"--window", "64", "--block-size", "5", "--favour-scale", favourScale)
	err := mlxc.Do(func() error {
		var err error
		if p.t, err = model.Load(p.target, model.LoadOptions{}); err != nil {
			return err
		}
		p.d, err = draft.Load(p.draft, p.t, draft.LoadOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mlxc.Do(func() error { p.d.Free(); p.t.Free(); return nil }) })
	return p
}

// runRef saves inputs, runs the reference in mode and returns its outputs as host values.
func (p *refPair) runRef(t *testing.T, py, mode string, inputs map[string]*mlxc.Array) map[string]*mlxc.Array {
	t.Helper()
	in, out := filepath.Join(p.dir, mode+"-in.safetensors"), filepath.Join(p.dir, mode+"-out.safetensors")
	if err := mlxc.Do(func() error {
		return mlxc.Catch(func() { mlxc.SaveSafetensors(in, inputs, nil) })
	}); err != nil {
		t.Fatal(err)
	}
	reftest.Run(t, py, refScript(), mode, "--target", p.target, "--draft", p.draft, "--inputs", in, "--out", out)
	var res map[string]*mlxc.Array
	if err := mlxc.Do(func() error {
		return mlxc.Catch(func() { res, _ = mlxc.LoadSafetensors(out) })
	}); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestDFlash2MatchesReference(t *testing.T) {
	py := reftest.Python(t)
	// The favour scales make each pair accept whole blocks, parts of blocks and nothing
	// over the prompt below (found by running the reference).
	for _, c := range []struct{ kind, favourScale string }{{"qwen3", "12"}, {"qwen3_5", "5"}} {
		kind := c.kind
		t.Run(kind, func(t *testing.T) {
			p := writeRefPair(t, py, kind, c.favourScale)
			t.Run("forward", func(t *testing.T) { forwardParity(t, py, p) })
			t.Run("generate", func(t *testing.T) { generateParity(t, py, p) })
		})
	}
}

// forwardParity drafts two blocks on one window (10 context rows, then 3 more) here and
// in the reference, greedy and at T = 0.8.
func forwardParity(t *testing.T, py string, p *refPair) {
	cfg := p.d.Cfg
	L := cfg.BlockSize
	block := func(anchor int32) []int32 {
		b := []int32{anchor}
		for len(b) < L {
			b = append(b, int32(cfg.MaskTokenID))
		}
		return b
	}
	width := len(cfg.TargetLayerIDs) * cfg.HiddenSize
	var inputs map[string]*mlxc.Array
	if err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			keys := mlxc.RandomSplit(mlxc.RandomKey(5), 2)
			inputs = map[string]*mlxc.Array{
				"block":          mlxc.FromSlice(block(17), 1, L),
				"target_hidden":  mlxc.Normal([]int{1, 10, width}, mlxc.Float32, 0, 1, mlxc.Reshape(mlxc.SliceAxis(keys, 0, 0, 1), 2)),
				"block2":         mlxc.FromSlice(block(123), 1, L),
				"target_hidden2": mlxc.Normal([]int{1, 3, width}, mlxc.Float32, 0, 1, mlxc.Reshape(mlxc.SliceAxis(keys, 0, 1, 2), 2)),
			}
			for _, a := range inputs {
				mlxc.Eval(a)
				a.Detach()
			}
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, temp := range []float64{0, 0.8} {
		t.Run(fmt.Sprintf("T%g", temp), func(t *testing.T) {
			in := map[string]*mlxc.Array{}
			for k, v := range inputs {
				in[k] = v
			}
			_ = mlxc.Do(func() error {
				in["temperature"] = mlxc.Scalar(temp, mlxc.Float32)
				in["seed"] = mlxc.ScalarInt(9, mlxc.Int32)
				return nil
			})
			ref := p.runRef(t, py, "forward", in)
			var fail error
			err := mlxc.Do(func() error {
				return mlxc.Catch(func() {
					s := mlxc.NewScope()
					defer s.Close()
					c := draft.NewWindowCache(cfg.NumLayers, cfg.SlidingWindow-1)
					defer c.Free()
					for call, suffix := range []string{"", "_2"} {
						blk, ctx := inputs["block"], inputs["target_hidden"]
						if call == 1 {
							blk, ctx = inputs["block2"], inputs["target_hidden2"]
						}
						b, err := p.d.ForwardWindow(blk, ctx, c)
						if err != nil {
							fail = err
							return
						}
						mlxc.Eval(append(c.Arrays(), b.Hidden, b.Logits)...)
						anchor := mlxc.SliceAxis(mlxc.Reshape(blk, L), 0, 0, 1)
						path := p.d.Selector.Walk(b, anchor, L-1, 0, nil)
						checks := []func() error{
							func() error { return sameFloats32("hidden"+suffix, b.Hidden, ref["hidden"+suffix]) },
							func() error { return sameFloats32("logits"+suffix, b.Logits, ref["logits"+suffix]) },
							func() error { return sameInts("candidates"+suffix, path.Candidates, ref["candidates_raw"+suffix]) },
						}
						if temp == 0 {
							checks = append(checks, func() error { return sameInts("tokens"+suffix, path.Tokens, ref["tokens"+suffix]) })
						} else {
							// The reference drew its path with its own generator: q along that path.
							checks = append(checks, func() error {
								q := p.d.Selector.QOf(b, anchor, mlxc.AsType(ref["tokens"+suffix], mlxc.Int32), L-1, temp)
								return sameFloats32("q"+suffix, q, ref["q"+suffix])
							})
						}
						for _, check := range checks {
							if fail = check(); fail != nil {
								return
							}
						}
					}
				})
			})
			if err == nil {
				err = fail
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// generateParity runs greedy DFlash2 here and in the reference over one prompt at the
// trained block: the same tokens (plain decoding's), and cycle by cycle the same drafts
// and the same accepted count, for every cycle that drafted the whole block. The block
// is pinned (DFLASH_ADAPTIVE_BLOCK=0's engine: no BlockCosts), as the reference's is.
func generateParity(t *testing.T, py string, p *refPair) {
	prompt := make([]int32, 20)
	for i := range prompt {
		prompt[i] = int32((i*29 + 3) % 250)
	}
	const maxTokens = 40
	var in map[string]*mlxc.Array
	_ = mlxc.Do(func() error {
		in = map[string]*mlxc.Array{
			"prompt":     mlxc.FromSlice(prompt, len(prompt)),
			"block_size": mlxc.ScalarInt(int64(p.d.Cfg.BlockSize), mlxc.Int32),
			"max_tokens": mlxc.ScalarInt(maxTokens, mlxc.Int32),
		}
		return nil
	})
	ref := p.runRef(t, py, "generate", in)
	var refTokens, refPlain, refAccepted, refBS, refDrafts []int32
	var draftCols int
	_ = mlxc.Do(func() error {
		refTokens = mlxc.ToSlice[int32](mlxc.AsType(ref["tokens"], mlxc.Int32))
		refPlain = mlxc.ToSlice[int32](mlxc.AsType(ref["plain"], mlxc.Int32))
		refAccepted = mlxc.ToSlice[int32](mlxc.AsType(ref["accepted"], mlxc.Int32))
		refBS = mlxc.ToSlice[int32](mlxc.AsType(ref["cycle_bs"], mlxc.Int32))
		refDrafts = mlxc.ToSlice[int32](mlxc.AsType(ref["drafts"], mlxc.Int32))
		draftCols = ref["drafts"].Dim(1)
		return nil
	})
	rec := &recordingProposer{DFlash2: verify.NewDFlash2(p.d)}
	e := &engine.Engine{Target: p.t, Proposer: rec}
	var cycles []int // tokens emitted per event after the first (one event per cycle)
	var res engine.Result
	err := mlxc.Do(func() error {
		var err error
		first := true
		res, err = e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true}, func(ev engine.Event) error {
			if first {
				first = false
				return nil
			}
			cycles = append(cycles, len(ev.Tokens))
			return nil
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Tokens, refTokens) || !slices.Equal(refTokens, refPlain) {
		t.Fatalf("tokens differ:\n ours      %v\n reference %v\n plain     %v", res.Tokens, refTokens, refPlain)
	}
	// Near the end the reference drafts a full block and cuts what it emits, while this
	// engine drafts only what the budget can take: those cycles are not compared.
	B := p.d.Cfg.BlockSize
	compared, partial, emitted := 0, 0, 1
	for i, a := range refAccepted {
		if int(refBS[i]) != B || i >= len(cycles) || emitted+B > maxTokens {
			break
		}
		emitted += cycles[i]
		want := refDrafts[i*draftCols : i*draftCols+B-1]
		if i >= len(rec.drafts) || !slices.Equal(rec.drafts[i], want) {
			t.Fatalf("cycle %d: drafts differ from the reference's %v (ours: %v)", i, want, rec.drafts)
		}
		if cycles[i] != int(a)+1 {
			t.Fatalf("cycle %d: we emitted %d tokens, the reference accepted %d drafts (ours %v, reference %v)", i, cycles[i], a, cycles, refAccepted)
		}
		compared++
		if a > 0 && int(a) < p.d.Cfg.BlockSize-1 {
			partial++
		}
	}
	t.Logf("%d cycles compared, %d with partial acceptance; accepted %v", compared, partial, refAccepted)
	if compared < 3 || partial == 0 {
		t.Fatalf("too few comparable cycles (%d, %d partly accepted): the pair no longer exercises rollback", compared, partial)
	}
}

// sameFloats32 compares two arrays' values exactly (on the MLX thread).
// recordingProposer is the DFlash2 proposer that keeps every cycle's drafts (read on the
// MLX thread as they are proposed).
type recordingProposer struct {
	*verify.DFlash2
	drafts [][]int32
}

func (r *recordingProposer) Propose(staged int32, pos int, ctx *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) verify.Proposal {
	prop := r.DFlash2.Propose(staged, pos, ctx, n, sp, keys)
	if prop.Tokens != nil {
		r.drafts = append(r.drafts, mlxc.ToSlice[int32](prop.Tokens))
	}
	return prop
}

func sameFloats32(what string, got, want *mlxc.Array) error {
	if want == nil {
		return fmt.Errorf("%s: the reference gave no such output", what)
	}
	g := mlxc.ToSlice[float32](mlxc.AsType(mlxc.Reshape(got, -1), mlxc.Float32))
	w := mlxc.ToSlice[float32](mlxc.AsType(mlxc.Reshape(want, -1), mlxc.Float32))
	if len(g) != len(w) {
		return fmt.Errorf("%s: %d values, the reference %d", what, len(g), len(w))
	}
	for i := range g {
		if g[i] != w[i] {
			return fmt.Errorf("%s: element %d is %v, the reference's %v", what, i, g[i], w[i])
		}
	}
	return nil
}

// sameInts compares two integer arrays (on the MLX thread).
func sameInts(what string, got, want *mlxc.Array) error {
	if want == nil {
		return fmt.Errorf("%s: the reference gave no such output", what)
	}
	g := mlxc.ToSlice[int32](mlxc.AsType(mlxc.Reshape(got, -1), mlxc.Int32))
	w := mlxc.ToSlice[int32](mlxc.AsType(mlxc.Reshape(want, -1), mlxc.Int32))
	if !slices.Equal(g, w) {
		return fmt.Errorf("%s: %v, the reference %v", what, g, w)
	}
	return nil
}
