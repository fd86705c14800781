package verify

import (
	"errors"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// DFlash2 adapts a DFlash2 drafter to the Proposer interface. It always drafts the
// trained block (the drafter's attention is bidirectional inside the block, so a
// narrower block would draft other tokens) and proposes its first n drafts: the selector
// walks left to right, so the first n drafts and their q do not depend on the rows after
// them, and verifying a prefix is as exact as verifying all.
type DFlash2 struct {
	D     *draft.Drafter
	cache *draft.WindowCache
	// maskRow is the block's mask tokens [1, B−1], made once.
	maskRow *mlxc.Array
	// ProposalQ, when set, replaces the q handed to the verdict (nil: the selector's q
	// scattered over the vocabulary, the only right choice). The sampling tests set a
	// wrong one to show that their statistic rejects it.
	ProposalQ func(b draft.Block, path draft.Path, T float64) *mlxc.Array
}

// NewDFlash2 wraps a loaded DFlash2 drafter.
func NewDFlash2(d *draft.Drafter) *DFlash2 { return &DFlash2{D: d} }

func (p *DFlash2) TapLayers() []int { return p.D.TapLayers() }
func (p *DFlash2) BlockSize() int   { return p.D.BlockSize() }

func (p *DFlash2) Begin() {
	p.End()
	// The window keeps at least a block's rows: a run-ahead draft writes a whole verify
	// block of context before the count of committed rows is known.
	keep := p.D.Cfg.SlidingWindow - 1
	if w := p.D.ContextWindow; w > 0 && w < keep {
		keep = max(w, p.D.BlockSize())
	}
	p.cache = draft.NewWindowCache(p.D.Cfg.NumLayers, keep)
}

// Context writes committed prompt rows into the window without drafting.
func (p *DFlash2) Context(ctx *mlxc.Array) {
	if ctx != nil {
		p.check(p.D.AddWindowContext(ctx, p.cache))
	}
}

// check turns an error of the window cache's bookkeeping (a misuse by the caller, never
// the data) into a panic as an MLX failure is one: Propose has no error to return, and
// the engine turns such a panic into the request's error.
func (p *DFlash2) check(err error) {
	if err != nil {
		panic(&mlxc.Error{Op: "dflash2 drafter", Msg: err.Error()})
	}
}

func (p *DFlash2) block() *mlxc.Array {
	if p.maskRow == nil {
		B := p.D.BlockSize()
		p.maskRow = mlxc.Full([]int{1, B - 1}, mlxc.ScalarInt(int64(p.D.Cfg.MaskTokenID), mlxc.Int32), mlxc.Int32).Detach()
	}
	return p.maskRow
}

func (p *DFlash2) Propose(staged int32, pos int, ctx *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	if n <= 0 {
		p.Context(ctx)
		return Proposal{}
	}
	anchor := mlxc.FromSlice([]int32{staged}, 1)
	block := mlxc.Concatenate([]*mlxc.Array{mlxc.Reshape(anchor, 1, 1), p.block()}, 1)
	b, err := p.D.ForwardWindow(block, ctx, p.cache)
	p.check(err)
	return p.walk(b, anchor, n, sp, keys)
}

// ProposeAt drafts n tokens after staged (int32 [1], device) when the previous verify
// block's tapped rows ctx [1, T, ·] are cached whole and only valid (int32 [1], device) of
// them are committed (the engine's run-ahead loop). SetContext declares the count once
// known. n = 0 caches the rows only.
func (p *DFlash2) ProposeAt(staged, ctx, valid *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	if n <= 0 {
		p.Context(ctx)
		return Proposal{}
	}
	anchor := mlxc.Reshape(staged, 1)
	block := mlxc.Concatenate([]*mlxc.Array{mlxc.Reshape(staged, 1, 1), p.block()}, 1)
	b, err := p.D.ForwardWindowAt(block, ctx, valid, p.cache)
	p.check(err)
	return p.walk(b, anchor, n, sp, keys)
}

// walk chooses n drafts with the selector: the greedy path for greedy requests, else a
// path sampled at the request's temperature, whose q (scattered over the vocabulary, zero
// off the candidates) is the proposal distribution the verdict needs. The request's
// top-p, top-k and min-p shape the target's distribution only: speculative sampling is
// exact for any q that is the distribution the drafts were really drawn from.
func (p *DFlash2) walk(b draft.Block, anchor *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	s := p.D.Selector
	if sp.Greedy() {
		return Proposal{Tokens: s.Walk(b, anchor, n, 0, nil).Tokens}
	}
	path := s.Walk(b, anchor, n, sp.Temperature, mlxc.RandomSplit(keys.Next(), n))
	if p.ProposalQ != nil {
		return Proposal{Tokens: path.Tokens, Probs: p.ProposalQ(b, path, sp.Temperature)}
	}
	V := b.Logits.Dim(1)
	q := mlxc.PutAlongAxis(mlxc.Zeros([]int{n, V}, mlxc.Float32), path.Candidates, path.Q, 1)
	return Proposal{Tokens: path.Tokens, Probs: q}
}

// SetContext declares the first n context positions committed (after ProposeAt).
func (p *DFlash2) SetContext(n int) error { return p.cache.SetOffset(n) }

func (p *DFlash2) End() {
	if p.cache != nil {
		p.cache.Free()
		p.cache = nil
	}
	p.maskRow.Free()
	p.maskRow = nil
}

// SaveContext keeps the window before position n (the prefix cache).
func (p *DFlash2) SaveContext(n int) ([]cache.Saved, error) {
	if p.cache == nil {
		return nil, errors.New("dflash2 proposer: no sequence begun")
	}
	return p.cache.Save(n)
}

// LoadContext makes the window of a sequence just begun what s holds before position n.
func (p *DFlash2) LoadContext(s []cache.Saved, n int) error {
	if p.cache == nil {
		return errors.New("dflash2 proposer: no sequence begun")
	}
	return p.cache.Load(s, n)
}

// CacheOffset is the number of committed context positions.
func (p *DFlash2) CacheOffset() int {
	if p.cache == nil {
		return 0
	}
	return p.cache.Offset()
}
