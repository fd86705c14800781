package cli

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
)

// copyBandwidth times a device-to-device copy of a 2 GiB buffer and returns bytes/s
// counting both the read and the write (as the usual copy-bandwidth figures do).
func copyBandwidth() (float64, error) {
	var bw float64
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		const n = 1 << 29 // float32 elements: 2 GiB
		x := mlxc.AsType(mlxc.Arange(0, n, 1, mlxc.Float32), mlxc.Float32)
		mlxc.Eval(x)
		best := 0.0
		for i := 0; i < 6; i++ {
			inner := mlxc.NewScope()
			y := mlxc.Add(x, mlxc.Scalar(1, mlxc.Float32)) // reads x, writes y: one pass each way
			t := time.Now()
			mlxc.Eval(y)
			el := time.Since(t).Seconds()
			inner.Close()
			if i > 0 && 2*4*float64(n)/el > best {
				best = 2 * 4 * float64(n) / el
			}
		}
		bw = best
		return nil
	})
	return bw, err
}

func benchFlips(c *cli.Context, s *Session, prompts [][]int32) error {
	type out struct {
		Target  string              `json:"target"`
		Backend string              `json:"backend"`
		Reports []engine.FlipReport `json:"reports"`
	}
	o := out{Target: s.TargetRef}
	block := c.Int("block-size")
	if block <= 0 {
		block = 16
	}
	for i, p := range prompts {
		var rep engine.FlipReport
		err := mlxc.Do(func() error {
			o.Backend = mlxc.Backend()
			var err error
			rep, err = engine.MeasureFlips(s.Engine.Target, p, c.Int("max-new-tokens"), block,
				model.ForwardOptions{KeyBucket: s.Engine.KeyBucket, RowwiseAttention: s.Engine.RowwiseVerify})
			return err
		})
		if err != nil {
			return err
		}
		o.Reports = append(o.Reports, rep)
		if !c.Bool("json") {
			fmt.Printf("prompt %d: %d positions, %d flips, max |Δ logprob| verify vs decode %.4g, median top-1 gap %.3g\n", i, rep.Positions, len(rep.Flips), rep.MaxAbsDiff, rep.MedianGap)
			for _, f := range rep.Flips {
				fmt.Printf("  flip at %d: decode gap %.4g, verify gap %.4g\n", f.Position, f.DecodeGap, f.VerifyGap)
			}
		}
	}
	if c.Bool("json") {
		return printJSON(o)
	}
	return nil
}
