package draft

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
)

// Selector is DFlash2's candidate selector (DFLASH2.md §7): it turns a block's per-row
// logits into one left-to-right path. Each row's candidates are the top-k tokens of its
// logits; a candidate's score is its logit plus ⟨pred[prev] ⊙ proj(h), succ[cand]⟩, prev
// being the token chosen at the row before (the anchor for the first row). Greedy takes
// the best score; at temperature T the token is drawn from q = softmax(score/T) over the
// candidates, the proposal distribution exact speculative sampling needs.
type Selector struct {
	TopK       int
	proj       *model.Linear    // hidden_projection: H → R
	pred, succ *model.Embedding // codebooks [V, R]
	Rank       int
	greedy     *mlxc.Compiled
	sampled    *mlxc.Compiled
}

// Path is a selector's choice over n rows: Tokens int32 [n], the candidates int32 [n, k]
// in the order the selector ranks them, and (sampled paths only) Q float32 [n, k], each
// row the distribution its token was drawn from given the tokens before it.
type Path struct {
	Tokens, Candidates, Q *mlxc.Array
}

// walkInputs are the per-row arrays a walk reads: unary [n, k] scores, the projected
// hidden rows [n, R], the candidates [n, k], their successor rows [n, k, R], their
// predecessor rows [n, k, R] (row l's candidates precede row l+1) and the anchor's
// predecessor row [1, R].
type walkInputs struct {
	unary, hp, cand, succ, pred, anchor *mlxc.Array
}

// inputs gathers what a walk of the first n rows of (hidden [L, H], logits [L, V]) reads.
func (s *Selector) inputs(hidden, logits, anchor *mlxc.Array, n int) walkInputs {
	if n < hidden.Dim(0) {
		hidden, logits = mlxc.SliceAxis(hidden, 0, 0, n), mlxc.SliceAxis(logits, 0, 0, n)
	}
	V := logits.Dim(1)
	cand := mlxc.AsType(mlxc.SliceAxis(mlxc.Argpartition(logits, V-s.TopK, -1), 1, V-s.TopK, V), mlxc.Int32)
	flat := mlxc.Reshape(cand, -1)
	R := s.Rank
	return walkInputs{
		unary:  mlxc.TakeAlongAxis(logits, cand, 1),
		hp:     s.proj.Apply(hidden),
		cand:   cand,
		succ:   mlxc.Reshape(s.succ.Lookup(flat), n, s.TopK, R),
		pred:   mlxc.Reshape(s.pred.Lookup(flat), n, s.TopK, R),
		anchor: mlxc.Reshape(s.pred.Lookup(mlxc.Reshape(anchor, 1)), 1, R),
	}
}

// Walk chooses the path over the first n rows of a DFlash2 block (Block.Hidden,
// Block.Logits) after the anchor token (int32 [1]): greedy when temperature ≤ 0, else
// sampled with keys [n, 2] (one key per row). The n dependent steps run as one compiled
// function.
func (s *Selector) Walk(b Block, anchor *mlxc.Array, n int, temperature float64, keys *mlxc.Array) Path {
	in := s.inputs(b.Hidden, b.Logits, anchor, n)
	args := []*mlxc.Array{in.unary, in.hp, in.cand, in.succ, in.pred, in.anchor}
	if temperature <= 0 {
		if s.greedy == nil {
			s.greedy = mlxc.Compile(func(a []*mlxc.Array) []*mlxc.Array {
				tok, _ := walkOps(walkInputs{a[0], a[1], a[2], a[3], a[4], a[5]}, nil, nil)
				return []*mlxc.Array{tok}
			}, false)
		}
		return Path{Tokens: s.greedy.Call(args...)[0], Candidates: in.cand}
	}
	if s.sampled == nil {
		s.sampled = mlxc.Compile(func(a []*mlxc.Array) []*mlxc.Array {
			tok, q := walkOps(walkInputs{a[0], a[1], a[2], a[3], a[4], a[5]}, a[6], a[7])
			return []*mlxc.Array{tok, q}
		}, false)
	}
	out := s.sampled.Call(append(args, mlxc.Scalar(temperature, mlxc.Float32), keys)...)
	return Path{Tokens: out[0], Candidates: in.cand, Q: out[1]}
}

// WalkOps is Walk as plain MLX ops (its fallback and reference), in the reference
// implementation's order of operations.
func (s *Selector) WalkOps(b Block, anchor *mlxc.Array, n int, temperature float64, keys *mlxc.Array) Path {
	in := s.inputs(b.Hidden, b.Logits, anchor, n)
	if temperature <= 0 {
		tok, _ := walkOps(in, nil, nil)
		return Path{Tokens: tok, Candidates: in.cand}
	}
	tok, q := walkOps(in, mlxc.Scalar(temperature, mlxc.Float32), keys)
	return Path{Tokens: tok, Candidates: in.cand, Q: q}
}

// QOf is the selector's q along a given path: row l's distribution over its candidates
// given the path's token at row l−1 (the anchor before row 0), at temperature T > 0.
// It is what Walk returns for the path it draws; tests use it to compare the reference's
// q for the path the reference drew.
func (s *Selector) QOf(b Block, anchor, path *mlxc.Array, n int, temperature float64) *mlxc.Array {
	in := s.inputs(b.Hidden, b.Logits, anchor, n)
	T := mlxc.Scalar(temperature, mlxc.Float32)
	var rows []*mlxc.Array
	prev := in.anchor
	for l := 0; l < n; l++ {
		scores := rowScores(in, l, prev)
		rows = append(rows, rowQ(scores, T))
		// The predecessor row of the path's token: it is one of row l's candidates.
		hit := mlxc.Equal(mlxc.Reshape(mlxc.SliceAxis(in.cand, 0, l, l+1), -1), mlxc.SliceAxis(path, 0, l, l+1))
		k := mlxc.Reshape(mlxc.AsType(mlxc.Argmax(hit, 0, false), mlxc.Int32), 1)
		prev = mlxc.Take(mlxc.Reshape(mlxc.SliceAxis(in.pred, 0, l, l+1), s.TopK, -1), k, 0)
	}
	return mlxc.Stack(rows, 0)
}

// rowScores are row l's candidate scores [k] after a token whose predecessor row is prev
// [1, R]: unary + Σ_r (prev ⊙ hp[l]) ⊙ succ[l].
func rowScores(in walkInputs, l int, prev *mlxc.Array) *mlxc.Array {
	hp := mlxc.SliceAxis(in.hp, 0, l, l+1)                                  // [1, R]
	succ := mlxc.Reshape(mlxc.SliceAxis(in.succ, 0, l, l+1), -1, hp.Dim(1)) // [k, R]
	edges := mlxc.Sum(mlxc.Multiply(mlxc.Multiply(prev, hp), succ), []int{-1}, false)
	return mlxc.Add(mlxc.Reshape(mlxc.SliceAxis(in.unary, 0, l, l+1), -1), edges)
}

// rowQ is a row's proposal distribution softmax(scores/T) over its candidates, in float32.
func rowQ(scores, T *mlxc.Array) *mlxc.Array {
	return mlxc.Softmax(mlxc.Divide(mlxc.AsType(scores, mlxc.Float32), T), []int{-1}, false)
}

// walkOps walks the rows: greedy when T is nil, else each row's token drawn from
// softmax(score/T) with its key (keys [n, 2]). It returns the tokens [n] and, sampled,
// q [n, k].
func walkOps(in walkInputs, T, keys *mlxc.Array) (tokens, q *mlxc.Array) {
	n, K := in.cand.Dim(0), in.cand.Dim(1)
	prev := in.anchor
	var toks, qs []*mlxc.Array
	for l := 0; l < n; l++ {
		scores := rowScores(in, l, prev)
		var k *mlxc.Array
		if T == nil {
			k = mlxc.Reshape(mlxc.Argmax(scores, 0, false), 1)
		} else {
			ql := rowQ(scores, T)
			qs = append(qs, ql)
			k = mlxc.Reshape(mlxc.Categorical(mlxc.Log(ql), -1, mlxc.Reshape(mlxc.SliceAxis(keys, 0, l, l+1), 2)), 1)
		}
		k = mlxc.AsType(k, mlxc.Int32)
		toks = append(toks, mlxc.Take(mlxc.Reshape(mlxc.SliceAxis(in.cand, 0, l, l+1), K), k, 0))
		prev = mlxc.Take(mlxc.Reshape(mlxc.SliceAxis(in.pred, 0, l, l+1), K, -1), k, 0)
	}
	tokens = mlxc.AsType(mlxc.Concatenate(toks, 0), mlxc.Int32)
	if qs != nil {
		q = mlxc.Stack(qs, 0)
	}
	return tokens, q
}

// Free releases the selector's weights and compiled walks.
func (s *Selector) Free() {
	if s == nil {
		return
	}
	s.proj.Free()
	s.pred.Free()
	s.succ.Free()
	s.greedy.Free()
	s.sampled.Free()
}

// arrays are the selector's weights.
func (s *Selector) arrays() []*mlxc.Array {
	return append(append(s.proj.Arrays(), s.pred.Arrays()...), s.succ.Arrays()...)
}
