package engine

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// On the CPU backend a 16-token verify reduces in the same order as a 1-token decode, so
// the logprobs are bit-identical and no greedy token can flip, even on a model with
// small logit gaps (near-ties). The same measurement runs on the GPU in `bench --flips`.
func TestVerifyDecodeFlipsOnCPU(t *testing.T) {
	// testenv.GPU starts the runtime first: the device is unknown until it has started.
	if testenv.GPU() {
		t.Skip("a GPU backend reduces verify rows and decode steps differently; measured by `bench --flips`")
	}
	spec := modelgen.TinyQwen3()
	spec.Seed, spec.WeightStd = 31, 0.02 // flat logits: many near-ties
	p := loadPair(t, "flat-logits", spec, 0)
	// Bucket 8: the verify's keys padded and masked (the CUDA layout) change nothing either,
	// and neither does row-by-row attention (the GPU-exact layout).
	for _, vopt := range []model.ForwardOptions{{}, {KeyBucket: 8}, {RowwiseAttention: true}} {
		bucket := vopt.KeyBucket
		var rep FlipReport
		err := mlxc.Do(func() error {
			var err error
			rep, err = MeasureFlips(p.target, []int32{1, 2, 3, 4, 5}, 96, 16, vopt)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("bucket %d rowwise %v: positions %d, flips %d, max |Δ logprob| %g, median decode gap %g", bucket, vopt.RowwiseAttention, rep.Positions, len(rep.Flips), rep.MaxAbsDiff, rep.MedianGap)
		if rep.MaxAbsDiff != 0 || len(rep.Flips) != 0 {
			t.Errorf("%+v: verify and decode differ on CPU: max |Δ| %g, %d flips", vopt, rep.MaxAbsDiff, len(rep.Flips))
		}
	}
}
