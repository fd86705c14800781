package engine

import (
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/prefixcache"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// The prefix cache in the loops (Engine.Prefix). A request looks up the longest cached
// prefix of its prompt (never the last prompt token, which the first step runs to give
// the first logits), loads the target's layers and the drafter's context there, and
// prefills only the rest; the prompt's state then goes into the cache, and every loop adds
// the state after the tokens it committed when it ends. On
// the CPU (and wherever rows round alike whatever the chunking) a resumed request is the
// uncached one bit for bit; elsewhere it is as exact as a different prefill chunking.

// contextSaver is a proposer whose per-sequence context can be saved and resumed.
type contextSaver interface {
	SaveContext(n int) ([]cache.Saved, error)
	LoadContext(s []cache.Saved, n int) error
}

// prefixSaver returns the proposer's saver and whether the prefix cache serves requests
// with this proposer (nil: plain decoding); a proposer that cannot save its context
// (a scripted one in tests) gets no prefix cache.
func (e *Engine) prefixSaver(p verify.Proposer) (contextSaver, bool) {
	if e.Prefix == nil {
		return nil, false
	}
	if p == nil {
		return nil, true
	}
	s, ok := p.(contextSaver)
	return s, ok
}

// resume loads the longest cached prefix of prompt into the empty caches and returns its
// length (0 on a miss, or when loading fails: the caches are then empty again).
func (e *Engine) resume(prompt []int32, c model.Cache, p verify.Proposer, saver contextSaver) int {
	h := e.Prefix.Lookup(prompt, len(prompt)-1, p != nil)
	if h == nil {
		return 0
	}
	defer h.Release()
	if err := c.Load(h.Target, h.N); err != nil {
		c.Free()
		return 0
	}
	if saver != nil {
		if err := saver.LoadContext(h.Draft, h.N); err != nil {
			c.Free()
			p.End()
			p.Begin()
			return 0
		}
	}
	return h.N
}

// entry saves the target's layers (and the proposer's context when withDraft) after the
// tokens the caches hold, evaluated; nil when a layer cannot be saved there.
func (e *Engine) entry(tokens []int32, c model.Cache, saver contextSaver, withDraft bool) *prefixcache.Entry {
	n := len(tokens)
	if c.Offset() != n {
		return nil
	}
	t, err := c.Save(n)
	if err != nil {
		return nil
	}
	ent := &prefixcache.Entry{Tokens: append([]int32(nil), tokens...), Target: t}
	if withDraft {
		d, err := saver.SaveContext(n)
		if err != nil {
			cache.FreeSaved(t)
			return nil
		}
		ent.Draft = d
	}
	ent.Eval()
	return ent
}

// saveCommitted puts the state after the committed tokens fed (the caches' positions, in
// order) into the prefix cache when a loop ends; pending, when set, are the tapped rows
// of the last committed positions that the proposer has not taken in yet.
func (e *Engine) saveCommitted(fed []int32, c model.Cache, p verify.Proposer, pending *mlxc.Array) {
	saver, ok := e.prefixSaver(p)
	if !ok || c.Offset() != len(fed) {
		return
	}
	s := mlxc.NewScope()
	defer s.Close()
	if p != nil && pending != nil {
		p.Context(pending)
	}
	if ent := e.entry(fed, c, saver, p != nil); ent != nil {
		e.Prefix.Insert(ent)
	}
}

// sortedMarks is a sorted copy of the requested mark positions.
func sortedMarks(m []int) []int {
	out := slices.Clone(m)
	slices.Sort(out)
	return out
}
