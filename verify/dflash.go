package verify

import (
	"errors"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// DFlash adapts a DFlash drafter to the Proposer interface.
type DFlash struct {
	D     *draft.Drafter
	cache *model.KVCaches
	mask  []int32
	// maskRow is ProposeAt's n mask tokens [1, n], made on the device once per n: an array
	// made from host data lives in unified memory, and the GPU copy that reads it each cycle
	// stalled on page migrations (see docs/perf/device-memory.md).
	maskRow *mlxc.Array
	// argmax picks greedy drafts in one kernel on a CUDA or Metal GPU (nil: MLX's ops); made by
	// Begin, freed by End.
	argmax *model.RowArgmax
}

// NewDFlash wraps a loaded drafter.
func NewDFlash(d *draft.Drafter) *DFlash { return &DFlash{D: d} }

func (p *DFlash) TapLayers() []int { return p.D.TapLayers() }
func (p *DFlash) BlockSize() int   { return p.D.BlockSize() }

func (p *DFlash) Begin() {
	p.End()
	p.cache = p.D.NewCache()
	p.argmax = model.NewRowArgmax(p.D.Settings.Kernels)
}

// Context writes committed prompt rows into the draft cache without drafting: the cheap
// way to keep a long prompt's context, chunk by chunk.
func (p *DFlash) Context(ctx *mlxc.Array) {
	if ctx == nil {
		return
	}
	p.D.AddContext(ctx, p.cache)
}

func (p *DFlash) Propose(staged int32, pos int, ctx *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	if n <= 0 {
		if ctx != nil {
			p.D.AddContext(ctx, p.cache)
		}
		return Proposal{}
	}
	block := p.maskBlock(n)
	block[0] = staged
	return p.draw(mlxc.Reshape(p.D.Forward(mlxc.FromSlice(block, 1, n+1), ctx, p.cache), n, -1), sp, keys)
}

// ProposeAt drafts n tokens after staged (int32 [1], on the device) when the
// previous verify block's tapped rows ctx [1, T, ·] are cached whole and only valid
// (int32 [1], on the device) of them are committed: the engine's run-ahead loop builds a
// cycle this way before it has read the previous one. The draft cache's offset is left
// past all T rows; SetContext sets it once the count is known. n = 0 caches the rows only.
func (p *DFlash) ProposeAt(staged, ctx, valid *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	if n <= 0 {
		p.D.AddContext(ctx, p.cache)
		return Proposal{}
	}
	if p.maskRow == nil || p.maskRow.Dim(1) != n {
		p.maskRow.Free()
		p.maskRow = mlxc.Full([]int{1, n}, mlxc.ScalarInt(int64(p.D.Cfg.MaskTokenID), mlxc.Int32), mlxc.Int32).Detach()
	}
	block := mlxc.Concatenate([]*mlxc.Array{mlxc.Reshape(staged, 1, 1), p.maskRow}, 1)
	return p.draw(mlxc.Reshape(p.D.ForwardAt(block, ctx, valid, p.cache), n, -1), sp, keys)
}

// maskBlock returns the reused block buffer of n+1 tokens: slot 0 for the staged token
// (the caller's), then n mask tokens.
func (p *DFlash) maskBlock(n int) []int32 {
	if cap(p.mask) < n+1 {
		p.mask = make([]int32, n+1)
	}
	block := p.mask[:n+1]
	for i := 1; i <= n; i++ {
		block[i] = int32(p.D.Cfg.MaskTokenID)
	}
	return block
}

// draw picks the drafts from the drafter's logits [n, V]: argmax, or a sample from the
// filtered distribution, whose probabilities the verifier needs.
func (p *DFlash) draw(logits *mlxc.Array, sp sample.Params, keys *sample.Keys) Proposal {
	if sp.Greedy() {
		if p.argmax.Fits(logits) {
			next, _ := p.argmax.Of(logits, nil, nil)
			return Proposal{Tokens: next}
		}
		return Proposal{Tokens: mlxc.AsType(mlxc.Argmax(logits, -1, false), mlxc.Int32)}
	}
	q := sp.Probs(sp.Filter(sample.LogProbs(logits)))
	toks := mlxc.Categorical(mlxc.Log(q), -1, keys.Next())
	return Proposal{Tokens: mlxc.AsType(toks, mlxc.Int32), Probs: q}
}

// SetContext declares the first n context rows of the draft cache committed (after
// ProposeAt, once the engine has read how many of the rows it cached are).
func (p *DFlash) SetContext(n int) error { return p.cache.SetOffset(n) }

func (p *DFlash) End() {
	if p.cache != nil {
		p.cache.Free()
		p.cache = nil
	}
	p.maskRow.Free()
	p.maskRow = nil
	p.argmax.Free()
	p.argmax = nil
}

// Reserve makes the draft cache's first allocation hold n context rows, so that a long
// prompt's context does not regrow it (each regrowth copies every row before it).
func (p *DFlash) Reserve(n int) {
	if p.cache != nil {
		p.cache.Reserve(n)
	}
}

// SaveContext keeps the first n context rows of the draft cache (the prefix cache).
func (p *DFlash) SaveContext(n int) ([]cache.Saved, error) {
	if p.cache == nil {
		return nil, errors.New("dflash proposer: no sequence begun")
	}
	return p.cache.Save(n)
}

// LoadContext makes the draft cache of a sequence just begun hold the first n rows of s.
func (p *DFlash) LoadContext(s []cache.Saved, n int) error {
	if p.cache == nil {
		return errors.New("dflash proposer: no sequence begun")
	}
	return p.cache.Load(s, n)
}

// CacheOffset is the number of context positions in the draft cache (for tests).
func (p *DFlash) CacheOffset() int {
	if p.cache == nil {
		return 0
	}
	return p.cache.Offset()
}

// Cache exposes the draft cache (for tests that compare it with a fresh run).
func (p *DFlash) Cache() *model.KVCaches { return p.cache }
