package draft_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// ForwardAt (all of the previous block's rows in the cache, only the device knowing how
// many are committed) drafts what Forward with the committed rows alone does, cycle after
// cycle, and leaves the same context in the cache once the offset is set.
// Head dimension 64 takes the fused head prep on a GPU, which writes the block's keys and
// values into the cache in place.
// With a context window both keep the same rows (the sink and those from the window before
// each cycle's new context on).
func TestDrafterForwardAtMatchesForward(t *testing.T) {
	for _, hd := range []int{32, 64} {
		for _, window := range []int{0, 40} {
			t.Run(fmt.Sprintf("head dim %d window %d", hd, window), func(t *testing.T) { drafterForwardAtMatchesForward(t, hd, window) })
		}
	}
}

func drafterForwardAtMatchesForward(t *testing.T, headDim, window int) {
	spec := modelgen.TinyQwen3()
	spec.HeadDim = headDim
	err := withTinyDrafter(t.TempDir(), spec, func(d *draft.Drafter, ds modelgen.DrafterSpec) error {
		d.ContextWindow, d.ContextSink = window, 8
		ref, at := d.NewCache(), d.NewCache()
		defer ref.Free()
		defer at.Free()
		rng := rand.New(rand.NewPCG(5, 8))
		taps := len(d.TapLayers()) * spec.Hidden
		B := ds.BlockSize
		block := make([]int32, B)
		for i := 1; i < B; i++ {
			block[i] = int32(ds.MaskTokenID)
		}
		// A prompt's context, the same in both caches.
		s := mlxc.NewScope()
		prompt := mlxc.Normal([]int{1, 23, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(1))
		d.AddContext(prompt, ref)
		d.AddContext(prompt, at)
		mlxc.Eval(append(ref.Arrays(), at.Arrays()...)...)
		s.Close()
		for cycle := 0; cycle < 30; cycle++ {
			s := mlxc.NewScope()
			T := B                   // the previous verify block's rows
			valid := 1 + rng.IntN(T) // of which committed
			ctx := mlxc.Normal([]int{1, T, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(100+cycle)))
			block[0] = int32(rng.IntN(spec.Vocab))
			ids := mlxc.FromSlice(block, 1, B)
			base := at.Offset()
			want := d.Forward(ids, mlxc.SliceAxis(ctx, 1, 0, valid), ref)
			got := d.ForwardAt(ids, ctx, mlxc.FromSlice([]int32{int32(valid)}, 1), at)
			diff, scale, wa, ga := compareDrafts(want, got)
			err := at.SetOffset(base + valid)
			s.Close()
			if err != nil {
				return err
			}
			if diff > 0.02*scale {
				return fmt.Errorf("cycle %d (%d of %d rows committed): logits differ by %g (scale %g)", cycle, valid, T, diff, scale)
			}
			if !sameDrafts(want, wa, ga, 0.02*scale, testenv.ShapeExact()) {
				return fmt.Errorf("cycle %d: drafts %v, want %v", cycle, ga, wa)
			}
			if ref.Offset() != at.Offset() {
				return fmt.Errorf("cycle %d: offsets %d vs %d", cycle, at.Offset(), ref.Offset())
			}
		}
		for i := range ref.Layers {
			k1, _ := ref.Layers[i].State()
			k2, _ := at.Layers[i].State()
			diff, scale, _, _ := compareDrafts(mlxc.Reshape(k1, 1, 1, -1), mlxc.Reshape(k2, 1, 1, -1))
			if diff > 0.02*scale {
				return fmt.Errorf("layer %d context keys differ by %g", i, diff)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A context window changes what a long context's drafts attend to: the logits equal the
// whole context's while the context is shorter than sink and window (bit for bit where
// rounding does not depend on shape), and differ once rows fall out of it.
func TestDrafterContextWindow(t *testing.T) {
	spec := modelgen.TinyQwen3()
	err := withTinyDrafter(t.TempDir(), spec, func(d *draft.Drafter, ds modelgen.DrafterSpec) error {
		taps := len(d.TapLayers()) * spec.Hidden
		B := ds.BlockSize
		block := make([]int32, B)
		for i := 1; i < B; i++ {
			block[i] = int32(ds.MaskTokenID)
		}
		for _, tc := range []struct {
			context int
			differ  bool
		}{{40, false}, {300, true}} {
			s := mlxc.NewScope()
			ctx := mlxc.Normal([]int{1, tc.context, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(7))
			next := mlxc.Normal([]int{1, 4, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(8))
			var logits [2]*mlxc.Array
			for i, w := range []int{0, 32} {
				d.ContextWindow, d.ContextSink = w, 8
				c := d.NewCache()
				d.AddContext(ctx, c)
				logits[i] = d.Forward(mlxc.FromSlice(block, 1, B), next, c)
				mlxc.Eval(logits[i])
				c.Free()
			}
			diff, scale, _, _ := compareDrafts(logits[0], logits[1])
			s.Close()
			switch {
			case tc.differ && diff < 1e-3*scale:
				return fmt.Errorf("context %d: the window changed nothing (diff %g)", tc.context, diff)
			case !tc.differ && testenv.ShapeExact() && diff != 0, !tc.differ && diff > 0.02*scale:
				return fmt.Errorf("context %d within the window: logits differ by %g", tc.context, diff)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// withTinyDrafter writes a tiny target of spec and its drafter under dir, loads both and
// runs f on the MLX thread with the drafter, freeing both after.
func withTinyDrafter(dir string, spec modelgen.Qwen3Spec, f func(d *draft.Drafter, ds modelgen.DrafterSpec) error) error {
	return mlxc.Do(func() error {
		target, ds, err := writeTinyPair(dir, spec)
		if err != nil {
			return err
		}
		defer target.Free()
		d, err := draft.Load(filepath.Join(dir, "d"), target, draft.LoadOptions{})
		if err != nil {
			return err
		}
		defer d.Free()
		return f(d, ds)
	})
}
