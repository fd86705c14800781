package engine

import (
	"fmt"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

func decisiveSpec(seed uint64) modelgen.Qwen3Spec {
	s := modelgen.TinyQwen3()
	s.Seed = seed
	s.WeightStd = 0.12 // large logit gaps: no bf16 near-ties between verify and decode
	s.EOS = []int{-1}
	return s
}

// The core promise: DFlash output equals plain greedy decoding token for token.
func TestDFlashGreedyEqualsPlain(t *testing.T) {
	testenv.RequireShapeExact(t)
	specs := []struct {
		name string
		spec modelgen.Qwen3Spec
	}{
		{"bf16", decisiveSpec(11)},
		{"4bit", func() modelgen.Qwen3Spec { s := decisiveSpec(12); s.QuantBits, s.QuantGroup = 4, 64; return s }()},
	}
	for _, sc := range specs {
		p := loadPair(t, "decisive-"+sc.name, sc.spec, 2)
		for pi, prompt := range prompts(sc.spec.Vocab) {
			for _, maxTok := range []int{1, 5, 37} {
				want := plainGreedy(t, p, prompt, maxTok)
				type variant struct {
					B, bucket int
					rowwise   bool
				}
				vs := []variant{{2, 0, false}, {4, 0, false}, {8, 0, false}, {16, 0, false}}
				if maxTok > 5 {
					// Padded verify/draft keys (what CUDA uses), with a bucket small enough
					// to cross many bucket boundaries; and row-by-row verify attention.
					vs = append(vs, variant{4, 8, false}, variant{16, 8, false}, variant{16, 0, true})
				}
				for _, vr := range vs {
					B := vr.B
					t.Run(fmt.Sprintf("%s/p%d/n%d/B%d/bucket%d/rowwise%v", sc.name, pi, maxTok, B, vr.bucket, vr.rowwise), func(t *testing.T) {
						p.drft.KeyBucket = vr.bucket
						defer func() { p.drft.KeyBucket = 0 }()
						e := &Engine{Target: p.target, Proposer: verify.NewDFlash(p.drft), KeyBucket: vr.bucket, RowwiseVerify: vr.rowwise}
						res, evs := run(t, e, Request{Prompt: prompt, MaxTokens: maxTok, BlockSize: B, IgnoreEOS: true})
						checkLossless(t, res, evs, want, B)
						if st := res.Stats; st.GeneratedTokens != len(res.Tokens) || res.FinishReason != FinishLength {
							t.Errorf("stats: generated %d, tokens %d, finish %q", st.GeneratedTokens, len(res.Tokens), res.FinishReason)
						}
					})
				}
			}
		}
	}
}

// Scripted drafters: every acceptance length 0..B−1 and full acceptance, output still exact.
func TestDFlashScriptedAcceptanceLengths(t *testing.T) {
	testenv.RequireShapeExact(t) // the scripted drafts are plain decoding's tokens
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{4, 8, 15, 16, 23, 42}
	const N = 400
	want := plainGreedy(t, p, prompt, N)
	ref := append(append([]int32(nil), prompt...), want...)
	for _, B := range []int{4, 16} {
		t.Run(fmt.Sprintf("B%d", B), func(t *testing.T) {
			sched := func(cycle, n int) int { return cycle % (B + 1) } // 0..B−1 and "all"
			sp := &verify.Scripted{Ref: ref, Correct: sched, Vocab: p.spec.Vocab, Block: B}
			e := &Engine{Target: p.target, Proposer: sp}
			res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: B, IgnoreEOS: true})
			if i, ok := eqTokens(res.Tokens, want); !ok {
				t.Fatalf("diverges at %d", i)
			}
			for a := 0; a < B; a++ {
				if res.Stats.AcceptHist[a] == 0 {
					t.Errorf("acceptance length %d never happened: %v", a, res.Stats.AcceptHist)
				}
			}
		})
	}
}

// After every cycle the target KV cache and the draft cache hold exactly what a fresh run
// over the committed tokens would.
func TestDFlashCachesMatchFreshRun(t *testing.T) {
	p := loadPair(t, "decisive-bf16", decisiveSpec(11), 2)
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	const N = 60
	want := plainGreedy(t, p, prompt, N)
	ref := append(append([]int32(nil), prompt...), want...)
	prop := &verify.Scripted{Ref: ref, Correct: func(c, n int) int { return (c * 7) % (n + 1) }, Vocab: p.spec.Vocab, Block: 8}
	dfl := verify.NewDFlash(p.drft)
	checked := 0
	defer func() { p.drft.KeyBucket = 0 }()
	for _, bucket := range []int{0, 8} {
		p.drft.KeyBucket = bucket
		for _, pr := range []verify.Proposer{prop, dfl} {
			e := &Engine{Target: p.target, Proposer: pr, KeyBucket: bucket}
			e.afterCycle = func(c model.Cache, committed []int32) {
				checked++
				compareWithFresh(t, p, c, committed, pr)
			}
			res, _ := run(t, e, Request{Prompt: prompt, MaxTokens: N, BlockSize: 8, IgnoreEOS: true})
			// Where rounding depends on the shape a near-tie may flip a token; the caches are
			// still compared with the fresh run over whatever was committed.
			if _, ok := eqTokens(res.Tokens, want); !ok && testenv.ShapeExact() {
				t.Fatalf("bucket %d: output differs from plain", bucket)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d cycles checked", checked)
	}
}

// compareWithFresh runs a fresh target forward over the committed tokens and compares the
// KV contents; for the DFlash proposer, also the draft cache against context built from
// the fresh hidden states. Runs on the MLX thread (inside the hook). On the CPU the caches
// must be equal bit for bit. On a GPU the fresh run is one long prefill, whose products and
// attention use other kernels (cuBLAS, MLX's attention) than decode steps and verify
// blocks, so values may differ by a few bf16 steps of the largest value (0.004–0.055 seen
// on the H200: the tolerance is 1/32 of the fresh cache's largest magnitude, four steps); a
// rollback error leaves wrong rows, which differ by the values' own magnitude.
func compareWithFresh(t *testing.T, p *pair, c model.Cache, committed []int32, pr verify.Proposer) {
	s := mlxc.NewScope()
	defer s.Close()
	exceeds := freshExceeds()
	if c.Offset() != len(committed) {
		t.Errorf("target cache offset %d, committed %d", c.Offset(), len(committed))
		return
	}
	fresh := p.target.NewCache()
	defer fresh.Free()
	var taps []int
	if d, ok := pr.(*verify.DFlash); ok {
		taps = d.TapLayers()
	}
	out := p.target.Forward(mlxc.FromSlice(committed, 1, len(committed)), fresh, model.ForwardOptions{Taps: taps, Logits: model.LogitsNone})
	compareCacheLayers(t, c, fresh, exceeds)
	if d, ok := pr.(*verify.DFlash); ok {
		dc := d.Cache()
		off := dc.Offset()
		if off > len(committed) || off < len(committed)-d.BlockSize() {
			t.Errorf("draft cache offset %d vs committed %d", off, len(committed))
			return
		}
		fd := d.D.NewCache()
		defer fd.Free()
		d.D.AddContext(mlxc.SliceAxis(out.Hidden, 1, 0, off), fd)
		for i, l := range dc.Layers {
			k1, v1 := l.State()
			k2, v2 := fd.Layers[i].State()
			if dd, bad := exceeds(k1, k2); bad {
				t.Errorf("draft layer %d keys differ from a fresh run by %g", i, dd)
			}
			if dd, bad := exceeds(v1, v2); bad {
				t.Errorf("draft layer %d values differ from a fresh run by %g", i, dd)
			}
		}
	}
}

// compareCacheLayers reports every layer of c whose state differs from fresh's (exceeds
// decides what differs). Every layer kind shows its state as two arrays: a KV layer its
// keys and values, a recurrent layer its conv tail and its state.
func compareCacheLayers(t *testing.T, c, fresh model.Cache, exceeds func(a, b *mlxc.Array) (float64, bool)) {
	t.Helper()
	type stated interface {
		State() (*mlxc.Array, *mlxc.Array)
	}
	got, exp := cacheLayers(c), cacheLayers(fresh)
	if len(got) != len(exp) {
		t.Fatalf("target cache has %d layers, a fresh one %d", len(got), len(exp))
	}
	for i, l := range got {
		k1, v1 := l.(stated).State()
		k2, v2 := exp[i].(stated).State()
		if d, bad := exceeds(k1, k2); bad {
			t.Errorf("layer %d (%T) keys / conv tail differ from a fresh run by %g", i, l, d)
		}
		if d, bad := exceeds(v1, v2); bad {
			t.Errorf("layer %d (%T) values / state differ from a fresh run by %g", i, l, d)
		}
	}
}

// checkLossless checks a greedy DFlash run with block size B against plain decoding's tokens
// want: the same tokens, streamed as returned, and honest statistics (every committed token
// comes from a cycle, 1 + accepted each, plus the first token from prefill; truncation only
// at the end).
func checkLossless(t *testing.T, res Result, evs []Event, want []int32, B int) {
	t.Helper()
	if i, ok := eqTokens(res.Tokens, want); !ok {
		t.Fatalf("DFlash diverges from plain at %d:\n dflash %v\n plain  %v", i, res.Tokens, want)
	}
	var streamed []int32
	for _, ev := range evs {
		streamed = append(streamed, ev.Tokens...)
	}
	if _, ok := eqTokens(streamed, res.Tokens); !ok {
		t.Errorf("streamed tokens %v differ from result %v", streamed, res.Tokens)
	}
	st := res.Stats
	if got := 1 + st.Cycles + st.Accepted; got < st.GeneratedTokens || got > st.GeneratedTokens+B {
		t.Errorf("1 + cycles %d + accepted %d = %d, generated %d", st.Cycles, st.Accepted, got, st.GeneratedTokens)
	}
}

// cacheLayers lists a target cache's layers: a pure-attention model's KVCaches, or any
// cache built on a cache.List (mixed kinds).
func cacheLayers(c model.Cache) []cache.Layer {
	switch c := c.(type) {
	case *model.KVCaches:
		return c.List.Layers()
	case interface{ Layers() []cache.Layer }:
		return c.Layers()
	}
	panic(fmt.Sprintf("unknown cache type %T", c))
}

// freshExceeds is the comparison of a cache with a fresh run's: any difference on the CPU; on
// a GPU more than 1/32 of the fresh value's largest magnitude (see compareWithFresh).
func freshExceeds() func(a, b *mlxc.Array) (float64, bool) {
	gpu := mlxc.CurrentDevice().GPU
	return func(a, b *mlxc.Array) (float64, bool) {
		d := maxDiff(a, b)
		if !gpu || b == nil {
			return d, d > 0
		}
		return d, d > maxAbs(b)/32
	}
}

func maxAbs(a *mlxc.Array) float64 {
	return mlxc.Max(mlxc.Abs(mlxc.AsType(a, mlxc.Float32)), nil, false).Float()
}

func maxDiff(a, b *mlxc.Array) float64 {
	if a == nil || b == nil {
		if a != b {
			return 1e9
		}
		return 0
	}
	if fmt.Sprint(a.Shape()) != fmt.Sprint(b.Shape()) {
		return 1e9
	}
	return mlxc.Max(mlxc.Abs(mlxc.Subtract(mlxc.AsType(a, mlxc.Float32), mlxc.AsType(b, mlxc.Float32))), nil, false).Float()
}

// A 4-bit drafter (affine, group 64) loads through the same path and stays lossless.
func TestDFlashQuantizedDrafter(t *testing.T) {
	spec := decisiveSpec(11)
	p := loadPair(t, "decisive-bf16", spec, 2)
	dir := t.TempDir()
	var prop *verify.DFlash
	err := mlxc.Do(func() error {
		ds := modelgen.DrafterFor(spec, 2)
		ds.QuantBits, ds.QuantGroup = 4, 64
		if err := modelgen.WriteDrafter(dir, ds); err != nil {
			return err
		}
		d, err := draft.Load(dir, p.target, draft.LoadOptions{Settings: testSettings()})
		if err != nil {
			return err
		}
		t.Cleanup(func() { mlxc.Do(func() error { d.Free(); return nil }) })
		prop = verify.NewDFlash(d)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{5, 6, 7, 8}
	want := plainGreedy(t, p, prompt, 40)
	res, _ := run(t, &Engine{Target: p.target, Proposer: prop}, Request{Prompt: prompt, MaxTokens: 40, BlockSize: 8, IgnoreEOS: true})
	// Lossless means equal to plain decoding only where rounding does not depend on the
	// shape; elsewhere the quantized drafter still has to load and draft.
	if i, ok := eqTokens(res.Tokens, want); !ok && testenv.ShapeExact() {
		t.Fatalf("quantized drafter: diverges at %d", i)
	}
	if res.Stats.Cycles == 0 {
		t.Fatal("no DFlash cycles ran")
	}
}
