package draft_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// sameBits reports the first element where two arrays differ bit for bit (as float32),
// or a shape mismatch.
func sameBits(what string, want, got *mlxc.Array) error {
	if !slices.Equal(want.Shape(), got.Shape()) {
		return fmt.Errorf("%s: shape %v, want %v", what, got.Shape(), want.Shape())
	}
	w := mlxc.ToSlice[float32](mlxc.AsType(mlxc.Reshape(want, -1), mlxc.Float32))
	g := mlxc.ToSlice[float32](mlxc.AsType(mlxc.Reshape(got, -1), mlxc.Float32))
	for i := range w {
		if math.Float32bits(w[i]) != math.Float32bits(g[i]) {
			return fmt.Errorf("%s: element %d is %v, want %v", what, i, g[i], w[i])
		}
	}
	return nil
}

// maskBlock is a block of L tokens: staged, then mask tokens.
func maskBlock(staged int32, L, mask int) *mlxc.Array {
	b := make([]int32, L)
	b[0] = staged
	for i := 1; i < L; i++ {
		b[i] = int32(mask)
	}
	return mlxc.FromSlice(b, 1, L)
}

// The convolution of R blocks at once ([R, L, H]) is each block's own convolution bit for
// bit, compiled and as ops: its taps never reach into the block before.
func TestConvBlocksMatchOneBlock(t *testing.T) {
	const R, L, H, group, K = 3, 5, 32, 8, 2
	G := H / group
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			h := mlxc.Normal([]int{R, L, H}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(1))
			coeff := mlxc.Normal([]int{R, L, K, G}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(2))
			base := mlxc.Normal([]int{K, H}, mlxc.Float32, 1, 0.5, mlxc.RandomKey(3))
			conv := draft.NewConv(group)
			defer conv.Free()
			ops, comp := draft.ConvOps(h, coeff, base, group), conv.Apply(h, coeff, base)
			for r := range R {
				hr := mlxc.Reshape(mlxc.SliceAxis(h, 0, r, r+1), L, H)
				cr := mlxc.Reshape(mlxc.SliceAxis(coeff, 0, r, r+1), L, K, G)
				want := draft.ConvOps(hr, cr, base, group)
				for _, got := range []struct {
					name string
					a    *mlxc.Array
				}{{"ops", ops}, {"compiled", comp}} {
					if err := sameBits(fmt.Sprintf("%s block %d", got.name, r), want, mlxc.Reshape(mlxc.SliceAxis(got.a, 0, r, r+1), L, H)); err != nil {
						t.Error(err)
					}
				}
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ForwardRows gives each row the logits Forward gives it alone, bit for bit, and leaves
// each cache as Forward leaves it: rows of different block lengths after different
// contexts (one with no new rows), cycle after cycle.
func TestForwardRowsMatchesForward(t *testing.T) {
	spec := modelgen.TinyQwen3()
	err := withTinyDrafter(t.TempDir(), spec, func(d *draft.Drafter, ds modelgen.DrafterSpec) error {
		taps := len(d.TapLayers()) * spec.Hidden
		prompts := []int{30, 3, 17}
		lens := [][]int{{8, 4, 2}, {2, 8, 5}, {6, 6, 8}}
		var ref, rows []*model.KVCaches
		for r, P := range prompts {
			ref, rows = append(ref, d.NewCache()), append(rows, d.NewCache())
			defer ref[r].Free()
			defer rows[r].Free()
			s := mlxc.NewScope()
			prompt := mlxc.Normal([]int{1, P, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(r)))
			d.AddContext(prompt, ref[r])
			d.AddContext(prompt, rows[r])
			mlxc.Eval(append(ref[r].Arrays(), rows[r].Arrays()...)...)
			s.Close()
		}
		for cycle, ls := range lens {
			s := mlxc.NewScope()
			blocks, ctxs := make([]*mlxc.Array, len(ls)), make([]*mlxc.Array, len(ls))
			for r, L := range ls {
				blocks[r] = maskBlock(int32(10*cycle+r), L, ds.MaskTokenID)
				if r != cycle { // row r brings no context in cycle r
					ctxs[r] = mlxc.Normal([]int{1, 1 + (r+cycle)%5, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(100+10*cycle+r)))
				}
			}
			got := d.ForwardRows(blocks, ctxs, rows)
			for r := range ls {
				want := d.Forward(blocks[r], ctxs[r], ref[r])
				if err := sameBits(fmt.Sprintf("cycle %d row %d logits", cycle, r), want, got[r]); err != nil {
					return err
				}
				if ref[r].Offset() != rows[r].Offset() {
					return fmt.Errorf("cycle %d row %d: offset %d, want %d", cycle, r, rows[r].Offset(), ref[r].Offset())
				}
				for i := range ref[r].Layers {
					wk, wv := ref[r].Layers[i].State()
					gk, gv := rows[r].Layers[i].State()
					if err := sameBits(fmt.Sprintf("cycle %d row %d layer %d keys", cycle, r, i), wk, gk); err != nil {
						return err
					}
					if err := sameBits(fmt.Sprintf("cycle %d row %d layer %d values", cycle, r, i), wv, gv); err != nil {
						return err
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
}

// ForwardWindowRows gives each row the Block ForwardWindow gives it alone (normed rows
// and logits), bit for bit, and leaves each window as ForwardWindow leaves it: windows of
// different lengths (one overflowing its keep), rows with and without new context, cycle
// after cycle. Rows of different block lengths are refused.
func TestForwardWindowRowsMatchesForwardWindow(t *testing.T) {
	spec, ds := tinyDFlash2()
	err := withDrafter(t.TempDir(), loadTarget(t, t.TempDir(), spec), ds, func(d *draft.Drafter) error {
		taps := len(d.TapLayers()) * spec.Hidden
		L, keep := d.Cfg.BlockSize, d.Cfg.SlidingWindow-1
		prompts := []int{80, 2, 40}
		var ref, rows []*draft.WindowCache
		for r, P := range prompts {
			ref = append(ref, draft.NewWindowCache(d.Cfg.NumLayers, keep))
			rows = append(rows, draft.NewWindowCache(d.Cfg.NumLayers, keep))
			defer ref[r].Free()
			defer rows[r].Free()
			s := mlxc.NewScope()
			prompt := mlxc.Normal([]int{1, P, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(r)))
			if err := d.AddWindowContext(prompt, ref[r]); err != nil {
				return err
			}
			if err := d.AddWindowContext(prompt, rows[r]); err != nil {
				return err
			}
			mlxc.Eval(append(ref[r].Arrays(), rows[r].Arrays()...)...)
			s.Close()
		}
		for cycle := range 3 {
			s := mlxc.NewScope()
			blocks, ctxs := make([]*mlxc.Array, len(prompts)), make([]*mlxc.Array, len(prompts))
			for r := range prompts {
				blocks[r] = maskBlock(int32(10*cycle+r), L, ds.MaskTokenID)
				if r != cycle {
					ctxs[r] = mlxc.Normal([]int{1, 1 + (r+cycle)%L, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(100+10*cycle+r)))
				}
			}
			got, err := d.ForwardWindowRows(blocks, ctxs, rows)
			if err != nil {
				return err
			}
			for r := range prompts {
				want, err := d.ForwardWindow(blocks[r], ctxs[r], ref[r])
				if err != nil {
					return err
				}
				what := fmt.Sprintf("cycle %d row %d", cycle, r)
				if err := sameBits(what+" hidden", want.Hidden, got[r].Hidden); err != nil {
					return err
				}
				if err := sameBits(what+" logits", want.Logits, got[r].Logits); err != nil {
					return err
				}
				if ref[r].Offset() != rows[r].Offset() || ref[r].Rows() != rows[r].Rows() {
					return fmt.Errorf("%s: window at %d with %d rows, want %d with %d", what, rows[r].Offset(), rows[r].Rows(), ref[r].Offset(), ref[r].Rows())
				}
				wa, ga := ref[r].Arrays(), rows[r].Arrays()
				for i := range wa {
					if err := sameBits(fmt.Sprintf("%s window array %d", what, i), wa[i], ga[i]); err != nil {
						return err
					}
				}
			}
			s.Close()
		}
		s := mlxc.NewScope()
		defer s.Close()
		_, err := d.ForwardWindowRows([]*mlxc.Array{maskBlock(1, L, ds.MaskTokenID), maskBlock(2, L-1, ds.MaskTokenID)}, make([]*mlxc.Array, 2), rows[:2])
		if err == nil || !strings.Contains(err.Error(), "share the trained block") {
			return fmt.Errorf("blocks of %d and %d tokens: err = %v", L, L-1, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A DFlash2 block over keys padded to KeyBucket (hidden zero keys after the window and the
// block) drafts what the exact keys do, over cycles whose window grows across bucket
// boundaries and then slides; one row alone and three rows at once.
func TestDFlash2PaddedKeysMatchExact(t *testing.T) {
	spec, ds := tinyDFlash2()
	err := withDrafter(t.TempDir(), loadTarget(t, t.TempDir(), spec), ds, func(d *draft.Drafter) error {
		taps := len(d.TapLayers()) * spec.Hidden
		L, keep := d.Cfg.BlockSize, d.Cfg.SlidingWindow-1
		for _, R := range []int{1, 3} {
			exact, padded := make([]*draft.WindowCache, R), make([]*draft.WindowCache, R)
			for r := range R {
				exact[r], padded[r] = draft.NewWindowCache(d.Cfg.NumLayers, keep), draft.NewWindowCache(d.Cfg.NumLayers, keep)
				defer exact[r].Free()
				defer padded[r].Free()
			}
			rng := rand.New(rand.NewPCG(uint64(R), 5))
			for cycle := range 24 {
				s := mlxc.NewScope()
				blocks, ctxs := make([]*mlxc.Array, R), make([]*mlxc.Array, R)
				for r := range R {
					blocks[r] = maskBlock(int32(rng.IntN(spec.Vocab)), L, ds.MaskTokenID)
					n := 1 + rng.IntN(L)
					if cycle == 0 {
						n = 5 + 7*r // prompts of different lengths
					}
					ctxs[r] = mlxc.Normal([]int{1, n, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(1000*R+10*cycle+r)))
				}
				d.KeyBucket = 0
				want, err := d.ForwardWindowRows(blocks, ctxs, exact)
				if err != nil {
					return err
				}
				d.KeyBucket = 8
				got, err := d.ForwardWindowRows(blocks, ctxs, padded)
				d.KeyBucket = 0
				if err != nil {
					return err
				}
				for r := range R {
					diff, scale, wa, ga := compareDrafts(want[r].Logits, got[r].Logits)
					if diff > 1e-2*scale || !sameDrafts(want[r].Logits, wa, ga, 1e-2*scale, testenv.ShapeExact()) {
						s.Close()
						return fmt.Errorf("rows %d cycle %d row %d: logits differ by %g (scale %g), drafts %v want %v", R, cycle, r, diff, scale, ga, wa)
					}
					if exact[r].Offset() != padded[r].Offset() {
						s.Close()
						return fmt.Errorf("rows %d row %d: offsets %d vs %d", R, r, padded[r].Offset(), exact[r].Offset())
					}
				}
				s.Close()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// withDrafter writes the drafter ds under dir/d for target, loads it and runs f with it
// on the MLX thread, freeing it after.
func withDrafter(dir string, target model.Model, ds modelgen.DrafterSpec, f func(d *draft.Drafter) error) error {
	return mlxc.Do(func() error {
		dd := filepath.Join(dir, "d")
		if err := modelgen.WriteDrafter(dd, ds); err != nil {
			return err
		}
		d, err := draft.Load(dd, target, draft.LoadOptions{})
		if err != nil {
			return err
		}
		defer d.Free()
		return f(d)
	})
}

// tinyDFlash2 is the tiny Qwen3 target's spec and a 2-layer DFlash2 drafter's for it.
func tinyDFlash2() (modelgen.Qwen3Spec, modelgen.DrafterSpec) {
	spec := modelgen.TinyQwen3()
	return spec, modelgen.DrafterFor(spec, 2).DFlash2For()
}
