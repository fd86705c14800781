package draft_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Padded keys (the block written after the context in the cache buffer, a padded view and
// a mask) must draft what the concatenated context + block does, over many cycles whose
// context lengths cross bucket boundaries and buffer growth.
func TestDrafterPaddedKeysMatchConcatenated(t *testing.T) {
	spec := modelgen.TinyQwen3()
	err := withTinyDrafter(t.TempDir(), spec, func(d *draft.Drafter, ds modelgen.DrafterSpec) error {
		for _, bucket := range []int{8, 256} {
			ref, pad := d.NewCache(), d.NewCache()
			rng := rand.New(rand.NewPCG(uint64(bucket), 3))
			taps := len(d.TapLayers()) * spec.Hidden
			for cycle := 0; cycle < 40; cycle++ {
				s := mlxc.NewScope()
				T := 1 + rng.IntN(8) // committed rows this cycle
				if cycle == 0 {
					T = 37 // a prompt's worth of context
				}
				ctx := mlxc.Normal([]int{1, T, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(1000*bucket+cycle)))
				block := make([]int32, ds.BlockSize)
				block[0] = int32(rng.IntN(spec.Vocab))
				for i := 1; i < len(block); i++ {
					block[i] = int32(ds.MaskTokenID)
				}
				ids := mlxc.FromSlice(block, 1, len(block))
				d.KeyBucket = 0
				want := d.Forward(ids, ctx, ref)
				d.KeyBucket = bucket
				got := d.Forward(ids, ctx, pad)
				d.KeyBucket = 0
				diff, scale, wa, ga := compareDrafts(want, got)
				s.Close()
				if diff > 0.02*scale {
					return fmt.Errorf("bucket %d cycle %d: logits differ by %g (scale %g)", bucket, cycle, diff, scale)
				}
				if !sameDrafts(want, wa, ga, 0.02*scale, testenv.ShapeExact()) {
					return fmt.Errorf("bucket %d cycle %d: drafts %v, want %v", bucket, cycle, ga, wa)
				}
				if ref.Offset() != pad.Offset() {
					return fmt.Errorf("bucket %d: offsets %d vs %d", bucket, pad.Offset(), ref.Offset())
				}
			}
			ref.Free()
			pad.Free()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// On CUDA, the fused drafter (the default there: the fused head-prep and gated-activation kernels on the
// block rows) drafts what the op path does: logits within bf16 rounding, the same argmax,
// over cycles that grow the context.
func TestDrafterFusedMatchesOps(t *testing.T) {
	if !mlxc.CUDAKernelsAvailable() {
		t.Skip("needs the CUDA backend and a GPU")
	}
	dir := t.TempDir()
	spec := modelgen.TinyQwen3()
	spec.HeadDim = 64 // the fused kernels need a multiple of 64
	var plain, fused *draft.Drafter
	var target model.Model
	s := settings.Default()
	load := func() (*draft.Drafter, error) {
		return draft.Load(filepath.Join(dir, "d"), target, draft.LoadOptions{Settings: &s})
	}
	s.Kernels.FusedDraft = false
	err := mlxc.Do(func() error {
		var err error
		if target, _, err = writeTinyPair(dir, spec); err != nil {
			return err
		}
		plain, err = load()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Kernels.FusedDraft = true
	err = mlxc.Do(func() error {
		defer target.Free()
		defer plain.Free()
		var err error
		if fused, err = load(); err != nil {
			return err
		}
		defer fused.Free()
		ds := modelgen.DrafterFor(spec, 2)
		c1, c2 := plain.NewCache(), fused.NewCache()
		defer c1.Free()
		defer c2.Free()
		taps := len(plain.TapLayers()) * spec.Hidden
		for cycle := range 12 {
			s := mlxc.NewScope()
			T := 3 + cycle%5
			ctx := mlxc.Normal([]int{1, T, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(cycle)))
			block := make([]int32, 8)
			block[0] = int32(cycle * 7 % spec.Vocab)
			for i := 1; i < len(block); i++ {
				block[i] = int32(ds.MaskTokenID)
			}
			ids := mlxc.FromSlice(block, 1, len(block))
			want, got := plain.Forward(ids, ctx, c1), fused.Forward(ids, ctx, c2)
			diff, scale, wa, ga := compareDrafts(want, got)
			s.Close()
			if diff > 0.05*scale {
				return fmt.Errorf("cycle %d: logits differ by %g (scale %g)", cycle, diff, scale)
			}
			if fmt.Sprint(wa) != fmt.Sprint(ga) {
				t.Logf("cycle %d: drafts %v vs %v (a near-tie may flip)", cycle, ga, wa)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// compareDrafts returns the largest logit difference between two drafts, the largest
// logit magnitude of the first, and both drafts' argmax tokens.
func compareDrafts(want, got *mlxc.Array) (diff, scale float64, wa, ga []uint32) {
	mlxc.Eval(want, got)
	w32, g32 := mlxc.AsType(want, mlxc.Float32), mlxc.AsType(got, mlxc.Float32)
	diff = mlxc.Max(mlxc.Abs(mlxc.Subtract(w32, g32)), nil, false).Float()
	scale = mlxc.Max(mlxc.Abs(w32), nil, false).Float()
	return diff, scale, mlxc.ToSlice[uint32](mlxc.Argmax(want, -1, false)), mlxc.ToSlice[uint32](mlxc.Argmax(got, -1, false))
}

// sameDrafts reports whether the drafts ga are the drafts wa of the logits want. Where
// rounding does not depend on the shape (exact) they must be the same tokens. Elsewhere (a
// GPU: padded keys, a device-placed window and exact keys reduce in different orders) a row
// may pick another token whose logit in want is within tol of that row's best: a near-tie
// that the two computations round apart.
func sameDrafts(want *mlxc.Array, wa, ga []uint32, tol float64, exact bool) bool {
	if fmt.Sprint(wa) == fmt.Sprint(ga) {
		return true
	}
	if exact || len(wa) != len(ga) {
		return false
	}
	w := mlxc.AsType(want, mlxc.Float32).Float32s()
	V := len(w) / len(wa)
	for i := range wa {
		if wa[i] != ga[i] && float64(w[i*V+int(wa[i])])-float64(w[i*V+int(ga[i])]) > tol {
			return false
		}
	}
	return true
}

// writeTinyPair writes a target of spec under dir/t and a 2-layer drafter of block 8 for it
// under dir/d, and loads the target (MLX thread; the caller frees it and loads the drafter).
func writeTinyPair(dir string, spec modelgen.Qwen3Spec) (model.Model, modelgen.DrafterSpec, error) {
	ds := modelgen.DrafterFor(spec, 2)
	ds.BlockSize = 8
	if err := modelgen.WriteQwen3(filepath.Join(dir, "t"), spec); err != nil {
		return nil, ds, err
	}
	if err := modelgen.WriteDrafter(filepath.Join(dir, "d"), ds); err != nil {
		return nil, ds, err
	}
	target, err := model.Load(filepath.Join(dir, "t"), model.LoadOptions{})
	return target, ds, err
}
