package engine

import (
	"sort"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// Flip is one position where block verification chose a different greedy token than
// one-token decoding did.
type Flip struct {
	Position  int     `json:"position"`
	DecodeGap float64 `json:"decode_gap"` // top-1 − top-2 logprob of the decode step
	VerifyGap float64 `json:"verify_gap"` // top-1 − top-2 logprob of the verify row
}

// FlipReport measures how often verify and decode round differently enough to change a
// greedy token, on a given model.
type FlipReport struct {
	Positions  int       `json:"positions"`
	Flips      []Flip    `json:"flips"`
	MaxAbsDiff float64   `json:"max_abs_logprob_diff"`
	MedianGap  float64   `json:"median_decode_gap"` // over all positions, for scale
	Block      int       `json:"block"`
	Gaps       []float64 `json:"-"`
}

// MeasureFlips decodes n tokens greedily one at a time from prompt (recording each step's
// logprobs), then re-runs the same tokens through a fresh cache in verify blocks of
// `block` tokens (with the verify's KeyBucket and RowwiseAttention settings from vopt) and
// compares the rows. Runs on the MLX thread.
func MeasureFlips(m model.Model, prompt []int32, n, block int, vopt model.ForwardOptions) (FlipReport, error) {
	rep := FlipReport{Block: block}
	err := mlxc.Catch(func() {
		c := m.NewCache()
		defer c.Free()
		s := mlxc.NewScope()
		if len(prompt) > 1 {
			m.Forward(mlxc.FromSlice(prompt[:len(prompt)-1], 1, len(prompt)-1), c, model.ForwardOptions{Logits: model.LogitsNone})
		}
		s.Close()
		tok := prompt[len(prompt)-1]
		seq := []int32{tok}
		var decodeLP [][]float32
		for i := 0; i < n; i++ {
			s := mlxc.NewScope()
			o := m.Forward(mlxc.FromSlice([]int32{tok}, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
			lp := mlxc.AsType(sample.LogProbs(mlxc.Reshape(o.Logits, 1, -1)), mlxc.Float32)
			row := lp.Float32s()
			s.Close()
			decodeLP = append(decodeLP, row)
			tok = argmax32(row)
			seq = append(seq, tok)
		}
		// Verify pass over the same tokens: seq[0..n) are the inputs whose outputs we compare.
		c2 := m.NewCache()
		defer c2.Free()
		s = mlxc.NewScope()
		if len(prompt) > 1 {
			m.Forward(mlxc.FromSlice(prompt[:len(prompt)-1], 1, len(prompt)-1), c2, model.ForwardOptions{Logits: model.LogitsNone})
		}
		s.Close()
		for start := 0; start < n; start += block {
			end := min(start+block, n)
			s := mlxc.NewScope()
			o := m.Forward(mlxc.FromSlice(seq[start:end], 1, end-start), c2, model.ForwardOptions{Logits: model.LogitsAll, KeyBucket: vopt.KeyBucket, RowwiseAttention: vopt.RowwiseAttention})
			lp := mlxc.AsType(sample.LogProbs(mlxc.Reshape(o.Logits, end-start, -1)), mlxc.Float32).Float32s()
			s.Close()
			V := len(decodeLP[0])
			for r := 0; r < end-start; r++ {
				vrow := lp[r*V : (r+1)*V]
				drow := decodeLP[start+r]
				for j := range vrow {
					if d := float64(vrow[j] - drow[j]); d > rep.MaxAbsDiff || -d > rep.MaxAbsDiff {
						if d < 0 {
							d = -d
						}
						rep.MaxAbsDiff = d
					}
				}
				dg, vg := gap(drow), gap(vrow)
				rep.Gaps = append(rep.Gaps, dg)
				if argmax32(vrow) != argmax32(drow) {
					rep.Flips = append(rep.Flips, Flip{Position: start + r, DecodeGap: dg, VerifyGap: vg})
				}
			}
		}
		rep.Positions = n
		g := append([]float64(nil), rep.Gaps...)
		sort.Float64s(g)
		if len(g) > 0 {
			rep.MedianGap = g[len(g)/2]
		}
	})
	return rep, err
}

func argmax32(v []float32) int32 {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return int32(best)
}

func gap(v []float32) float64 {
	a, b := float32(-1e30), float32(-1e30)
	for _, x := range v {
		if x > a {
			a, b = x, a
		} else if x > b {
			b = x
		}
	}
	return float64(a - b)
}
