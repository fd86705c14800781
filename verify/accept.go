package verify

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// Verdict holds the lazy results of one verification; evaluate them together (one sync).
type Verdict struct {
	// Next[i] is the token to emit if exactly i drafts are accepted: the target's own choice
	// (greedy argmax, or a residual sample) at slot i, and the bonus at i = n. int32 [n+1].
	Next *mlxc.Array
	// Accept[i] reports whether draft i+1 is accepted given drafts 1..i were. bool [n].
	Accept *mlxc.Array
	// lead, when set, computes Leading in one kernel (GreedyLogits on a CUDA or Metal GPU).
	lead *model.RowArgmax
}

// Arrays lists the verdict's arrays for evaluation.
func (v Verdict) Arrays() []*mlxc.Array {
	if v.Accept == nil {
		return []*mlxc.Array{v.Next}
	}
	return []*mlxc.Array{v.Next, v.Accept}
}

// Leading is Resolve on the device: how many drafts are accepted in a row, and the token
// that follows them, as int32 [1] arrays, so the next cycle can be built from them before
// the host reads this one (the engine's run-ahead loop).
func (v Verdict) Leading() (accepted, next *mlxc.Array) {
	if v.Accept == nil {
		accepted = mlxc.FromSlice([]int32{0}, 1)
	} else if v.lead != nil {
		return v.lead.Leading(v.Next, v.Accept)
	} else {
		// The first rejection's index (argmax takes the first maximum), with a rejection
		// appended so that accepting everything gives n: five graph nodes, where a
		// cumulative sum of rejections took seven.
		rejected := mlxc.Concatenate([]*mlxc.Array{mlxc.LogicalNot(v.Accept), mlxc.FromSlice([]bool{true}, 1)}, 0)
		accepted = mlxc.Reshape(mlxc.AsType(mlxc.Argmax(rejected, 0, false), mlxc.Int32), 1)
	}
	return accepted, mlxc.Take(v.Next, accepted, 0)
}

// Greedy builds the greedy verdict: row i's target token is argmax of its logprobs
// (mlx-lm's rounding), draft i+1 is accepted iff it equals row i's token.
// logprobs: [n+1, V]; drafts: int32 [n] (nil when n = 0).
func Greedy(logprobs, drafts *mlxc.Array) Verdict {
	next := mlxc.AsType(mlxc.Argmax(logprobs, -1, false), mlxc.Int32)
	if drafts == nil {
		return Verdict{Next: next}
	}
	n := drafts.Dim(0)
	acc := mlxc.Equal(mlxc.SliceAxis(next, 0, 0, n), drafts)
	return Verdict{Next: next, Accept: acc}
}

// GreedyLogits is Greedy(sample.LogProbs(logits), drafts) for logits [n+1, V]: the same
// tokens and verdict, from k's kernels when it fits them (three launches after the
// logsumexp instead of about twelve; nil k: the ops).
func GreedyLogits(k *model.RowArgmax, logits, drafts *mlxc.Array) Verdict {
	if !k.Fits(logits) {
		return Greedy(sample.LogProbs(logits), drafts)
	}
	next, match := k.Of(logits, mlxc.LogSumExp(logits, []int{-1}, true), drafts)
	if drafts == nil {
		return Verdict{Next: next}
	}
	return Verdict{Next: next, Accept: match, lead: k}
}

// Speculative builds the Leviathan/Chen verdict for temperature > 0. Target rows p_i come
// from logprobs [n+1, V] with the same filters and temperature as plain sampling; the draft
// distributions q are probs [n, V] (nil: point masses on drafts). Draft i+1 is accepted with
// probability min(1, p_i(d)/q_i(d)); on rejection the token is drawn from
// normalize(max(p_i − q_i, 0)); after n acceptances the bonus is drawn from p_n. Every
// possible outcome is drawn up front so one evaluation answers them all.
func Speculative(logprobs, drafts, probs *mlxc.Array, sp sample.Params, keys *sample.Keys) Verdict {
	p := sp.Probs(sp.Filter(logprobs)) // float32 [n+1, V]
	rows := p.Dim(0)
	if drafts == nil {
		return Verdict{Next: mlxc.AsType(mlxc.Categorical(mlxc.Log(p), -1, keys.Next()), mlxc.Int32)}
	}
	n := drafts.Dim(0)
	V := p.Dim(1)
	pHead := mlxc.SliceAxis(p, 0, 0, n)
	idx := mlxc.Reshape(mlxc.AsType(drafts, mlxc.Int32), n, 1)
	pd := mlxc.Reshape(mlxc.TakeAlongAxis(pHead, idx, 1), n)
	var q, qd *mlxc.Array
	if probs == nil {
		// Point mass on each draft: q(d) = 1 and q is zero elsewhere.
		q = mlxc.PutAlongAxis(mlxc.Zeros([]int{n, V}, mlxc.Float32), idx, mlxc.BroadcastTo(mlxc.Scalar(1, mlxc.Float32), n, 1), 1)
		qd = mlxc.BroadcastTo(mlxc.Scalar(1, mlxc.Float32), n)
	} else {
		q = mlxc.AsType(probs, mlxc.Float32)
		qd = mlxc.Reshape(mlxc.TakeAlongAxis(q, idx, 1), n)
	}
	u := mlxc.Uniform(0, 1, []int{n}, mlxc.Float32, keys.Next())
	accept := mlxc.Less(mlxc.Multiply(u, qd), pd) // u < p/q without dividing by q
	resid := mlxc.Maximum(mlxc.Subtract(pHead, q), mlxc.Scalar(0, mlxc.Float32))
	mass := mlxc.Sum(resid, []int{-1}, true)
	// When p ≤ q everywhere the residual is empty; that row is then never rejected
	// (p(d)/q(d) ≥ 1 only if p = q), so any valid distribution works: use p.
	empty := mlxc.LessEqual(mass, mlxc.Scalar(0, mlxc.Float32))
	resid = mlxc.Where(empty, pHead, resid)
	residTok := mlxc.Categorical(mlxc.Log(resid), -1, keys.Next())
	bonus := mlxc.Categorical(mlxc.Log(mlxc.SliceAxis(p, 0, n, rows)), -1, keys.Next())
	next := mlxc.AsType(mlxc.Concatenate([]*mlxc.Array{residTok, bonus}, 0), mlxc.Int32)
	return Verdict{Next: next, Accept: accept}
}

// Resolve reads an evaluated verdict: a = number of leading accepted drafts, and the token
// that follows them.
func Resolve(next []int32, accept []bool) (a int, tok int32) {
	for a < len(accept) && accept[a] {
		a++
	}
	return a, next[a]
}
