package sample

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Params are the user's sampling settings (mlx-lm semantics and defaults).
type Params struct {
	Temperature float64 // 0 = greedy
	TopP        float64 // (0, 1): nucleus; 0 or ≥ 1: off
	TopK        int     // > 0: keep the k best
	MinP        float64 // (0, 1): drop tokens below max·min_p
	// RepetitionPenalty (> 0, ≠ 1) rescales the logits of tokens seen in the last
	// RepetitionContext tokens (default 20).
	RepetitionPenalty float64
	RepetitionContext int
	Seed              uint64
}

// Validate reports the first invalid setting.
func (p Params) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(p.Temperature) || math.IsInf(p.Temperature, 0):
		return fmt.Errorf("temperature must be ≥ 0, got %v", p.Temperature)
	case p.TopP < 0 || p.TopP > 1 || math.IsNaN(p.TopP):
		return fmt.Errorf("top_p must be in [0, 1], got %v", p.TopP)
	case p.TopK < 0:
		return fmt.Errorf("top_k must be ≥ 0, got %d", p.TopK)
	case p.MinP < 0 || p.MinP > 1 || math.IsNaN(p.MinP):
		return fmt.Errorf("min_p must be in [0, 1], got %v", p.MinP)
	case p.RepetitionPenalty < 0 || math.IsNaN(p.RepetitionPenalty):
		return fmt.Errorf("repetition_penalty must be ≥ 0, got %v", p.RepetitionPenalty)
	}
	return nil
}

// Greedy reports whether decoding is deterministic argmax.
func (p Params) Greedy() bool { return p.Temperature == 0 }

func (p Params) penaltyOn() bool { return p.RepetitionPenalty > 0 && p.RepetitionPenalty != 1 }

func (p Params) context() int {
	if p.RepetitionContext > 0 {
		return p.RepetitionContext
	}
	return 20
}

// Keys hands out PRNG keys from one seed, one per draw, in a fixed order.
type Keys struct {
	seed uint64
	n    uint64
}

// NewKeys starts a key sequence.
func NewKeys(seed uint64) *Keys { return &Keys{seed: seed} }

// Next returns a fresh key (a SplitMix-style counter mixed into the seed, so draws never
// depend on MLX's per-thread global RNG).
func (k *Keys) Next() *mlxc.Array {
	k.n++
	z := k.seed + k.n*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return mlxc.RandomKey(z)
}

// PenaltyRows applies the repetition penalty to logits [R, V], where row r sees the history
// tail followed by extra[0..r) (extra: lazy draft tokens, int32 [E], E ≥ R−1, may be nil
// when R = 1). This is mlx-lm's processor, extended row by row the way plain decoding would
// see it after accepting the drafts.
func (p Params) PenaltyRows(logits *mlxc.Array, history []int32, extra *mlxc.Array) *mlxc.Array {
	if !p.penaltyOn() {
		return logits
	}
	rows := logits.Dim(0)
	ctx := p.context()
	hist := history
	if len(hist) > ctx {
		hist = hist[len(hist)-ctx:]
	}
	// seq = hist ++ extra; row r uses the last ctx tokens of seq[:len(hist)+r].
	seq := mlxc.FromSlice(append([]int32(nil), hist...), len(hist))
	if extra != nil && rows > 1 {
		seq = mlxc.Concatenate([]*mlxc.Array{seq, mlxc.AsType(mlxc.SliceAxis(extra, 0, 0, rows-1), mlxc.Int32)}, 0)
	}
	width := 0
	for r := 0; r < rows; r++ {
		width = max(width, min(ctx, len(hist)+r))
	}
	if width == 0 {
		return logits
	}
	idx := make([]int32, rows*width)
	for r := 0; r < rows; r++ {
		n := min(ctx, len(hist)+r)
		end := len(hist) + r
		for j := 0; j < width; j++ {
			// Pad short rows by repeating their first token: a duplicate index rewrites the
			// same penalised value, so it changes nothing.
			k := j
			if k >= n {
				k = 0
			}
			idx[r*width+j] = int32(end - n + k)
		}
	}
	toks := mlxc.Reshape(mlxc.Take(seq, mlxc.FromSlice(idx, len(idx)), 0), rows, width)
	sel := mlxc.TakeAlongAxis(logits, toks, 1)
	pen := mlxc.Scalar(p.RepetitionPenalty, logits.Dtype())
	neg := mlxc.Less(sel, mlxc.Scalar(0, logits.Dtype()))
	newSel := mlxc.Where(neg, mlxc.Multiply(sel, pen), mlxc.Divide(sel, pen))
	out := mlxc.PutAlongAxis(logits, toks, newSel, 1)
	if len(hist) == 0 {
		// Row 0 had nothing to penalise; restore it.
		first := mlxc.SliceAxis(logits, 0, 0, 1)
		out = mlxc.Concatenate([]*mlxc.Array{first, mlxc.SliceAxis(out, 0, 1, rows)}, 0)
	}
	return out
}

// LogProbs is logits − logsumexp(logits) along the last axis, in the logits' dtype, as
// mlx-lm computes it before sampling.
func LogProbs(logits *mlxc.Array) *mlxc.Array {
	return mlxc.Subtract(logits, mlxc.LogSumExp(logits, []int{-1}, true))
}

// Filter applies top-p, min-p and top-k (mlx-lm's order) to logprobs [R, V], setting
// removed entries to −inf.
func (p Params) Filter(logprobs *mlxc.Array) *mlxc.Array {
	negInf := mlxc.Scalar(math.Inf(-1), logprobs.Dtype())
	if p.TopP > 0 && p.TopP < 1 {
		probs := mlxc.Exp(logprobs)
		order := mlxc.Argsort(logprobs, -1) // ascending
		sorted := mlxc.TakeAlongAxis(probs, order, -1)
		cum := mlxc.Cumsum(sorted, -1, false, true)
		keepSorted := mlxc.Greater(cum, mlxc.Scalar(1-p.TopP, cum.Dtype()))
		// Scatter the keep flags back to vocabulary order.
		keep := mlxc.PutAlongAxis(mlxc.Zeros(logprobs.Shape(), mlxc.Bool), order, keepSorted, -1)
		logprobs = mlxc.Where(keep, logprobs, negInf)
	}
	if p.MinP > 0 && p.MinP < 1 {
		top := mlxc.Max(logprobs, []int{-1}, true)
		thresh := mlxc.Add(top, mlxc.Scalar(math.Log(p.MinP), logprobs.Dtype()))
		keep := mlxc.GreaterEqual(logprobs, thresh)
		logprobs = mlxc.Where(keep, logprobs, negInf)
	}
	if p.TopK > 0 && p.TopK < logprobs.Dim(-1) {
		v := logprobs.Dim(-1)
		idx := mlxc.Argpartition(mlxc.Negative(logprobs), p.TopK-1, -1)
		drop := mlxc.SliceAxis(idx, -1, p.TopK, v)
		fill := mlxc.BroadcastTo(negInf, drop.Shape()...)
		logprobs = mlxc.PutAlongAxis(logprobs, drop, fill, -1)
	}
	return logprobs
}

// Probs is the sampling distribution (float32) over the filtered logprobs at temperature T.
func (p Params) Probs(filtered *mlxc.Array) *mlxc.Array {
	x := mlxc.AsType(filtered, mlxc.Float32)
	x = mlxc.Multiply(x, mlxc.Scalar(1/p.Temperature, mlxc.Float32))
	return mlxc.Softmax(x, []int{-1}, true)
}

// Draw samples one token per row (uint32 [R]) from logprobs [R, V]: argmax when greedy,
// else categorical(filtered · 1/T) with the given key.
func (p Params) Draw(logprobs *mlxc.Array, key *mlxc.Array) *mlxc.Array {
	if p.Greedy() {
		return mlxc.Argmax(logprobs, -1, false)
	}
	f := p.Filter(logprobs)
	scaled := mlxc.Multiply(f, mlxc.Scalar(1/p.Temperature, f.Dtype()))
	return mlxc.Categorical(scaled, -1, key)
}
