package verify

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	_ "github.com/dflash-mlx/dflash-mlx/model/families"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// tinyDrafter writes a tiny Qwen3 target and a 2-layer drafter of block 8 for it (DFlash2
// when dflash2) under t's temporary folder, loads both on the MLX thread and frees them
// when the test ends. It returns the drafter and the width of its context rows.
func tinyDrafter(t *testing.T, dflash2 bool) (*draft.Drafter, int) {
	t.Helper()
	dir := t.TempDir()
	spec := modelgen.TinyQwen3()
	ds := modelgen.DrafterFor(spec, 2)
	ds.BlockSize = 8
	if dflash2 {
		ds = ds.DFlash2For()
	}
	var target model.Model
	var d *draft.Drafter
	err := mlxc.Do(func() error {
		if err := modelgen.WriteQwen3(filepath.Join(dir, "t"), spec); err != nil {
			return err
		}
		if err := modelgen.WriteDrafter(filepath.Join(dir, "d"), ds); err != nil {
			return err
		}
		var err error
		if target, err = model.Load(filepath.Join(dir, "t"), model.LoadOptions{}); err != nil {
			return err
		}
		d, err = draft.Load(filepath.Join(dir, "d"), target, draft.LoadOptions{})
		return err
	})
	t.Cleanup(func() {
		mlxc.Do(func() error {
			if d != nil {
				d.Free()
			}
			if target != nil {
				target.Free()
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, len(d.TapLayers()) * spec.Hidden
}

// rowsCase is one sequence of a ProposeRows test: its prompt's context rows, the cycles it
// drafts alone before the batched ones (so that the rows' caches hold different histories:
// 0 is a sequence just begun, whose first batched cycle has no context), and its draft
// count in each batched cycle.
type rowsCase struct {
	prompt, before int
	n              []int
}

// ProposeRows drafts what Propose drafts row by row, bit for bit on the CPU (tokens and
// q), draws the same keys, and leaves the proposers' caches as Propose leaves them: two
// sets of proposers forked from one, fed the same prompts and cycles, one set drafting
// through ProposeRows, the other through Propose, agree cycle after cycle, greedy and
// sampled (each row with its own key stream). DFlash1's rows draft different counts (its
// blocks have different lengths); DFlash2's always run the trained block and propose a
// prefix. One DFlash1 case pads the keys and bounds the context with a window, both per
// row.
func TestProposeRowsMatchesPropose(t *testing.T) {
	dflash1 := []rowsCase{
		{prompt: 37, before: 3, n: []int{7, 3, 0, 1, 7, 2}},
		{prompt: 5, before: 1, n: []int{3, 0, 7, 7, 1, 4}},
		{prompt: 60, before: 0, n: []int{0, 1, 3, 7, 7, 0}},
		{prompt: 12, before: 0, n: []int{1, 7, 1, 3, 0, 7}},
	}
	// The DFlash2 window keeps 63 rows: the 90-row prompt overflows it.
	dflash2 := []rowsCase{
		{prompt: 90, before: 2, n: []int{7, 3, 0, 1, 7, 5}},
		{prompt: 4, before: 1, n: []int{3, 7, 7, 0, 2, 7}},
		{prompt: 30, before: 0, n: []int{1, 0, 3, 7, 7, 1}},
	}
	for _, tc := range []struct {
		name    string
		dflash2 bool
		rows    []rowsCase
		tune    func(d *draft.Drafter)
	}{
		{name: "dflash1", rows: dflash1},
		{name: "dflash1 padded keys and context window", rows: dflash1, tune: func(d *draft.Drafter) {
			d.KeyBucket, d.ContextWindow, d.ContextSink = 32, 24, 8
		}},
		{name: "dflash2", dflash2: true, rows: dflash2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, width := tinyDrafter(t, tc.dflash2)
			if tc.tune != nil {
				tc.tune(d)
			}
			var base Forker = NewDFlash(d)
			if tc.dflash2 {
				base = NewDFlash2(d)
			}
			for _, sp := range []sample.Params{{}, {Temperature: 0.8}} {
				t.Run(fmt.Sprintf("T=%g", sp.Temperature), func(t *testing.T) {
					if err := mlxc.Do(func() error { return proposeRowsMatch(base, width, tc.rows, sp) }); err != nil {
						t.Fatal(err)
					}
				})
			}
		})
	}
}

// proposeRowsMatch runs cases' rows through ProposeRows and through Propose on proposers
// forked from base (on the MLX thread) and reports the first difference.
func proposeRowsMatch(base Forker, width int, cases []rowsCase, sp sample.Params) error {
	R := len(cases)
	ref, bat := make([]Proposer, R), make([]Proposer, R)
	refKeys, batKeys := make([]*sample.Keys, R), make([]*sample.Keys, R)
	pos := make([]int, R)
	pending := make([]int, R) // context rows the next cycle brings (0: none)
	seed := uint64(1)
	ctxRows := func(T int) *mlxc.Array {
		seed++
		return mlxc.Normal([]int{1, T, width}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(seed))
	}
	defer func() {
		for r := range R {
			ref[r].End()
			bat[r].End()
		}
	}()
	for r, c := range cases {
		ref[r], bat[r] = base.Fork(), base.Fork()
		refKeys[r], batKeys[r] = sample.NewKeys(uint64(100+r)), sample.NewKeys(uint64(100+r))
		s := mlxc.NewScope()
		ref[r].Begin()
		bat[r].Begin()
		prompt := ctxRows(c.prompt)
		ref[r].Context(prompt)
		bat[r].Context(prompt)
		pos[r] = c.prompt
		// Cycles before the batched ones, the same on both sides (Propose on each).
		for k := range c.before {
			var ctx *mlxc.Array
			if pending[r] > 0 {
				ctx = ctxRows(pending[r])
			}
			n := 1 + (3*k+r)%7
			want := ref[r].Propose(int32(r+k), pos[r], ctx, n, sp, refKeys[r])
			got := bat[r].Propose(int32(r+k), pos[r], ctx, n, sp, batKeys[r])
			if err := sameProposal(want, got); err != nil {
				return fmt.Errorf("row %d: cycle %d before the batch: %w", r, k, err)
			}
			pending[r] = 1 + (k+2*r)%n
			pos[r] += pending[r]
		}
		if err := sameState(ref[r], bat[r]); err != nil {
			return fmt.Errorf("row %d after its own cycles: %w", r, err)
		}
		s.Close()
	}
	for cycle := range len(cases[0].n) {
		s := mlxc.NewScope()
		rows := make([]RowDraft, R)
		want := make([]Proposal, R)
		for r, c := range cases {
			var ctx *mlxc.Array
			if pending[r] > 0 {
				ctx = ctxRows(pending[r])
			}
			staged := int32((7*cycle + 3*r) % 200)
			rows[r] = RowDraft{P: bat[r], Staged: staged, Pos: pos[r], Ctx: ctx, N: c.n[cycle], Sp: sp, Keys: batKeys[r]}
			want[r] = ref[r].Propose(staged, pos[r], ctx, c.n[cycle], sp, refKeys[r])
		}
		got := ProposeRows(rows)
		for r, c := range cases {
			if err := sameProposal(want[r], got[r]); err != nil {
				return fmt.Errorf("cycle %d, row %d (n %d): %w", cycle, r, c.n[cycle], err)
			}
			if *refKeys[r] != *batKeys[r] {
				return fmt.Errorf("cycle %d, row %d: keys drawn %+v, Propose's %+v", cycle, r, *batKeys[r], *refKeys[r])
			}
			if err := sameState(ref[r], bat[r]); err != nil {
				return fmt.Errorf("cycle %d, row %d: %w", cycle, r, err)
			}
			// The next cycle commits some of the drafts and the staged token.
			pending[r] = 1 + (cycle+r)%(c.n[cycle]+1)
			pos[r] += pending[r]
		}
		s.Close()
	}
	return nil
}

// sameProposal compares two proposals bit for bit (tokens, and q when there is one).
func sameProposal(want, got Proposal) error {
	if (want.Tokens == nil) != (got.Tokens == nil) || (want.Probs == nil) != (got.Probs == nil) {
		return fmt.Errorf("proposal has tokens %v, q %v; Propose's %v, %v", got.Tokens != nil, got.Probs != nil, want.Tokens != nil, want.Probs != nil)
	}
	if want.Tokens != nil {
		w, g := mlxc.ToSlice[int32](want.Tokens), mlxc.ToSlice[int32](got.Tokens)
		if !slices.Equal(w, g) {
			return fmt.Errorf("drafts %v, Propose's %v", g, w)
		}
	}
	if want.Probs != nil {
		if err := sameBits("q", want.Probs, got.Probs); err != nil {
			return err
		}
	}
	return nil
}

// sameBits compares two arrays' shapes and float32 values bit for bit.
func sameBits(what string, want, got *mlxc.Array) error {
	if !slices.Equal(want.Shape(), got.Shape()) {
		return fmt.Errorf("%s has shape %v, want %v", what, got.Shape(), want.Shape())
	}
	w := mlxc.ToSlice[float32](mlxc.AsType(mlxc.Reshape(want, -1), mlxc.Float32))
	g := mlxc.ToSlice[float32](mlxc.AsType(mlxc.Reshape(got, -1), mlxc.Float32))
	for i := range w {
		if math.Float32bits(w[i]) != math.Float32bits(g[i]) {
			return fmt.Errorf("%s element %d is %v, want %v", what, i, g[i], w[i])
		}
	}
	return nil
}

// sameState compares two proposers' draft caches: offsets, and every layer's cached keys
// and values bit for bit.
func sameState(want, got Proposer) error {
	var w, g []*mlxc.Array
	var wo, go_ int
	switch p := want.(type) {
	case *DFlash:
		q := got.(*DFlash)
		wo, go_ = p.CacheOffset(), q.CacheOffset()
		for i := range p.Cache().Layers {
			k, v := p.Cache().Layers[i].State()
			w = append(w, k, v)
			k, v = q.Cache().Layers[i].State()
			g = append(g, k, v)
		}
	case *DFlash2:
		q := got.(*DFlash2)
		wo, go_ = p.CacheOffset(), q.CacheOffset()
		if p.cache.Rows() != q.cache.Rows() {
			return fmt.Errorf("window holds %d rows, Propose's %d", q.cache.Rows(), p.cache.Rows())
		}
		w, g = p.cache.Arrays(), q.cache.Arrays()
	}
	if wo != go_ {
		return fmt.Errorf("cache offset %d, Propose's %d", go_, wo)
	}
	if len(w) != len(g) {
		return fmt.Errorf("cache holds %d arrays, Propose's %d", len(g), len(w))
	}
	for i := range w {
		if err := sameBits(fmt.Sprintf("cache array %d", i), w[i], g[i]); err != nil {
			return err
		}
	}
	return nil
}

// Rows ProposeRows cannot batch go through Propose one by one, with the same results as
// calling it: Scripted proposers, a mix of a DFlash and a Scripted proposer, and one
// DFlash or DFlash2 proposer serving two rows (its second call sees the first one's
// context).
func TestProposeRowsFallback(t *testing.T) {
	d, width := tinyDrafter(t, false)
	d2, width2 := tinyDrafter(t, true)
	if width2 != width {
		t.Fatalf("context widths %d and %d", width, width2)
	}
	ref := make([]int32, 64)
	for i := range ref {
		ref[i] = int32((i*37 + 11) % 250)
	}
	script := &Scripted{Ref: ref, Vocab: 256, Block: 8, Correct: func(cycle, n int) int { return (cycle + n) % (n + 1) }}
	dflash := NewDFlash(d)
	for _, tc := range []struct {
		name  string
		bases []Forker
		same  bool // every row the same proposer
	}{
		{name: "scripted", bases: []Forker{script, script, script}},
		{name: "dflash and scripted", bases: []Forker{dflash, script, dflash}},
		{name: "one dflash proposer twice", bases: []Forker{dflash, dflash}, same: true},
		{name: "one dflash2 proposer twice", bases: []Forker{NewDFlash2(d2), nil}, same: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := mlxc.Do(func() error {
				R := len(tc.bases)
				want, got := make([]Proposer, R), make([]Proposer, R)
				for r, b := range tc.bases {
					if tc.same && r > 0 {
						want[r], got[r] = want[0], got[0]
						continue
					}
					want[r], got[r] = b.Fork(), b.Fork()
					want[r].Begin()
					got[r].Begin()
					defer want[r].End()
					defer got[r].End()
				}
				for cycle := range 4 {
					s := mlxc.NewScope()
					rows := make([]RowDraft, R)
					wantProps := make([]Proposal, R)
					for r := range R {
						ctx := mlxc.Normal([]int{1, 3 + r + cycle, width}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(10*cycle+r)))
						pos, n := 5*cycle+r, 1+(cycle+2*r)%7
						rows[r] = RowDraft{P: got[r], Staged: int32(r + cycle), Pos: pos, Ctx: ctx, N: n}
						wantProps[r] = want[r].Propose(int32(r+cycle), pos, ctx, n, sample.Params{}, nil)
					}
					gotProps := ProposeRows(rows)
					for r := range R {
						if err := sameProposal(wantProps[r], gotProps[r]); err != nil {
							return fmt.Errorf("cycle %d, row %d: %w", cycle, r, err)
						}
						if _, ok := want[r].(*Scripted); !ok {
							if err := sameState(want[r], got[r]); err != nil {
								return fmt.Errorf("cycle %d, row %d: %w", cycle, r, err)
							}
						}
					}
					s.Close()
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Fork makes a proposer that shares the model and hooks but no sequence: a DFlash2 fork
// keeps ProposalQ, a Scripted one its script at cycle 0, and a fork of a begun proposer
// has no cache of its own yet.
func TestFork(t *testing.T) {
	d, _ := tinyDrafter(t, true)
	hook := func(draft.Block, draft.Path, float64) *mlxc.Array { return nil }
	p2 := &DFlash2{D: d, ProposalQ: hook}
	f2 := p2.Fork().(*DFlash2)
	if f2.D != d || f2.ProposalQ == nil || f2.cache != nil {
		t.Errorf("DFlash2 fork: drafter shared %v, hook kept %v, cache %v", f2.D == d, f2.ProposalQ != nil, f2.cache)
	}
	err := mlxc.Do(func() error {
		p1 := NewDFlash(d)
		p1.Begin()
		defer p1.End()
		f1 := p1.Fork().(*DFlash)
		if f1.D != d || f1.Cache() != nil {
			return fmt.Errorf("DFlash fork: drafter shared %v, cache %v", f1.D == d, f1.Cache())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &Scripted{Ref: []int32{1, 2, 3}, Vocab: 9, Block: 4, Taps: []int{1}, cycle: 5}
	fs := s.Fork().(*Scripted)
	if fs.cycle != 0 || fs.Vocab != 9 || fs.Block != 4 || !slices.Equal(fs.Ref, s.Ref) || !slices.Equal(fs.Taps, s.Taps) {
		t.Errorf("Scripted fork = %+v", fs)
	}
}
