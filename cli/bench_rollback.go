package cli

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// rollbackProbe times the rollback of one DFlash cycle on its own: after a prompt of
// prompt tokens and a tentative verify block of B rows (both evaluated), the target's
// caches commit keep rows (attention layers: the kept offset; recurrent layers: the
// snapshot restored and keep steps of the tape replayed) and the caches' arrays are
// evaluated alone. In the loop that work joins the next cycle's graphs, where no clock
// can single it out. Returns the median of repeats, in milliseconds.
func rollbackProbe(target model.Model, prompt []int32, B, keep, repeats int) (float64, error) {
	var times []float64
	var commitErr error
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			c := target.NewCache()
			defer c.Free()
			c.Reserve(len(prompt) + (repeats+1)*B)
			s := mlxc.NewScope()
			out := target.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Logits: model.LogitsLast})
			mlxc.Eval(append(c.Arrays(), out.Logits)...)
			s.Close()
			V := target.Arch().VocabSize
			r := rand.New(rand.NewPCG(uint64(keep), 17))
			for i := 0; i <= repeats; i++ { // the first round warms up
				s := mlxc.NewScope()
				ids := randomIDs(r, B, V)
				c.Speculate()
				out := target.Forward(mlxc.FromSlice(ids, 1, B), c, model.ForwardOptions{Logits: model.LogitsAll})
				mlxc.Eval(append(c.Arrays(), out.Logits)...)
				t := time.Now()
				if commitErr = c.Commit(cache.Prefix(keep)); commitErr != nil {
					s.Close()
					return
				}
				mlxc.Eval(c.Arrays()...)
				if i > 0 {
					times = append(times, ms(time.Since(t)))
				}
				s.Close()
			}
		})
	})
	if err == nil {
		err = commitErr
	}
	return median(times), err
}

// typicalKeep is the rows a cycle of τ tokens keeps, within the block.
func typicalKeep(tau float64, B int) int {
	return min(max(int(math.Round(tau)), 1), B)
}

// blockSizeOf is the engine's block for a drafter's block and a requested one (0: the
// drafter's).
func blockSizeOf(drafter, requested int) int {
	if requested > 0 && requested < drafter {
		return max(requested, 1)
	}
	return max(drafter, 1)
}
