package sample

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Params are the user's sampling settings (mlx-lm semantics and defaults).
type Params struct {
	Temperature float64 // 0 (or below GreedyBelow) = greedy
	TopP        float64 // (0, 1): nucleus; 0 or ≥ 1: off
	TopK        int     // > 0: keep the k best
	MinP        float64 // (0, 1]: drop tokens below max·min_p; 0: off
	// RepetitionPenalty (> 0, ≠ 1) rescales the logits of tokens seen in the last
	// RepetitionContext tokens (default 20).
	RepetitionPenalty float64
	RepetitionContext int
	Seed              uint64
}

// GreedyBelow is the temperature under which sampling is argmax: 1/T would overflow
// float32 near 1e-38, and far above that logits/T already puts all the mass on the best
// token (exact ties aside), so anything colder is decoded greedily.
const GreedyBelow = 1e-5

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
	case p.RepetitionPenalty < 0 || math.IsNaN(p.RepetitionPenalty) || math.IsInf(p.RepetitionPenalty, 0):
		return fmt.Errorf("repetition_penalty must be ≥ 0 and finite, got %v", p.RepetitionPenalty)
	}
	return nil
}

// Greedy reports whether decoding is deterministic argmax: temperature 0, or below
// GreedyBelow.
func (p Params) Greedy() bool { return p.Temperature < GreedyBelow }

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
// mlx-lm computes it before sampling (greedy decoding takes its argmax, so ties break as
// mlx-lm's do).
func LogProbs(logits *mlxc.Array) *mlxc.Array {
	return mlxc.Subtract(logits, mlxc.LogSumExp(logits, []int{-1}, true))
}

// Filter applies top-p, min-p and top-k (mlx-lm's order) to logprobs [R, V], setting
// removed entries to −inf. It works in float32 whatever the input's dtype (the result is
// float32): a bf16 running sum over a 151 936-token vocabulary stops growing long before 1
// and would keep the wrong set. Every filter keeps the best token, so a row never empties.
func (p Params) Filter(logprobs *mlxc.Array) *mlxc.Array {
	x := mlxc.AsType(logprobs, mlxc.Float32)
	negInf := mlxc.Scalar(math.Inf(-1), mlxc.Float32)
	if p.TopP > 0 && p.TopP < 1 {
		// mlx-lm's rule: drop, from the least likely up, every token whose mass above it
		// (the tokens sorted after it) already reaches top_p of the total; the threshold is
		// a value, so tied tokens are kept or dropped together, and the best token, with no
		// mass above it, always stays.
		sorted := mlxc.Sort(x, -1) // ascending
		probs := mlxc.Exp(sorted)
		above := mlxc.Cumsum(probs, -1, true, false)
		total := mlxc.Add(mlxc.SliceAxis(above, -1, 0, 1), mlxc.SliceAxis(probs, -1, 0, 1))
		reach := mlxc.GreaterEqual(above, mlxc.Multiply(total, mlxc.Scalar(p.TopP, mlxc.Float32)))
		dropped := mlxc.Sum(mlxc.AsType(reach, mlxc.Int32), []int{-1}, true)
		thresh := mlxc.TakeAlongAxis(sorted, dropped, -1)
		x = mlxc.Where(mlxc.Less(x, thresh), negInf, x)
	}
	if p.MinP > 0 {
		// Keep p ≥ min_p · p_max; min_p = 1 keeps the best token and its ties.
		top := mlxc.Max(x, []int{-1}, true)
		thresh := mlxc.Add(top, mlxc.Scalar(math.Log(p.MinP), mlxc.Float32))
		x = mlxc.Where(mlxc.Less(x, thresh), negInf, x)
	}
	if p.TopK > 0 && p.TopK < x.Dim(-1) {
		v := x.Dim(-1)
		idx := mlxc.Argpartition(mlxc.Negative(x), p.TopK-1, -1)
		drop := mlxc.SliceAxis(idx, -1, p.TopK, v)
		fill := mlxc.BroadcastTo(negInf, drop.Shape()...)
		x = mlxc.PutAlongAxis(x, drop, fill, -1)
	}
	return x
}

// Probs is the sampling distribution (float32) over the filtered logprobs at temperature
// T: softmax(filtered · 1/T), the distribution Draw samples from.
func (p Params) Probs(filtered *mlxc.Array) *mlxc.Array {
	return mlxc.Softmax(p.scaled(filtered), []int{-1}, true)
}

// scaled is filtered · 1/T in float32 (T ≥ GreedyBelow, so 1/T is finite).
func (p Params) scaled(filtered *mlxc.Array) *mlxc.Array {
	x := mlxc.AsType(filtered, mlxc.Float32)
	return mlxc.Multiply(x, mlxc.Scalar(1/p.Temperature, mlxc.Float32))
}

// Draw samples one token per row (uint32 [R]) from logprobs [R, V]: argmax when greedy,
// else categorical(filtered · 1/T) with the given key.
func (p Params) Draw(logprobs *mlxc.Array, key *mlxc.Array) *mlxc.Array {
	if p.Greedy() {
		return mlxc.Argmax(logprobs, -1, false)
	}
	return mlxc.Categorical(p.scaled(p.Filter(logprobs)), -1, key)
}
