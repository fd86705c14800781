package verify

import (
	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// Forker is a proposer that makes fresh ones for other sequences: the engine forks one
// per sequence it serves and calls Begin, Context, Propose and End on each.
type Forker interface {
	// Fork returns a proposer that shares the loaded model (and any hooks) with this one
	// but none of its per-sequence state: no sequence is begun on it.
	Fork() Proposer
}

// Fork is a DFlash proposer over the same drafter, no sequence begun.
func (p *DFlash) Fork() Proposer { return NewDFlash(p.D) }

// Fork is a DFlash2 proposer over the same drafter and ProposalQ hook, no sequence begun.
func (p *DFlash2) Fork() Proposer { return &DFlash2{D: p.D, ProposalQ: p.ProposalQ} }

// Fork is a Scripted proposer with the same script (Ref, Correct, Vocab, Block, Taps), at
// cycle 0. Correct is shared: a stateful one (ReplayCorrect) advances for every fork.
func (s *Scripted) Fork() Proposer {
	return &Scripted{Ref: s.Ref, Correct: s.Correct, Vocab: s.Vocab, Block: s.Block, Taps: s.Taps}
}

// RowDraft is one sequence's Propose call in a ProposeRows batch: its proposer and the
// arguments Propose takes.
type RowDraft struct {
	P      Proposer
	Staged int32
	Pos    int
	Ctx    *mlxc.Array
	N      int
	Sp     sample.Params
	Keys   *sample.Keys
	// Cands > 0 asks a DFlash proposer's greedy drafts for the drafter's Cands most likely
	// tokens at each position too (Proposal.Cands).
	Cands int
}

// ProposeRows drafts for several sequences at once. Proposal i is what
// rows[i].P.Propose(Staged, Pos, Ctx, N, Sp, Keys) returns (bit for bit on the CPU, tokens
// and Probs, with the same keys drawn from rows[i].Keys in the same order), and each
// proposer's state is left as that call leaves it. When every proposer is a *DFlash, or
// every one a *DFlash2, of one drafter, and no proposer appears twice, the rows that draft
// (N > 0) go through one drafter forward (draft.Drafter.ForwardRows,
// ForwardWindowRows); rows with N ≤ 0 only append their context, as Propose does. Any
// other mix calls Propose row by row. Proposals are lazy arrays in the caller's scope.
func ProposeRows(rows []RowDraft) []Proposal {
	if d1, ok := sameDrafter(rows, func(p Proposer) (*draft.Drafter, bool) {
		q, ok := p.(*DFlash)
		if !ok {
			return nil, false
		}
		return q.D, true
	}); ok && d1 != nil {
		return proposeDFlashRows(d1, rows)
	}
	if d2, ok := sameDrafter(rows, func(p Proposer) (*draft.Drafter, bool) {
		q, ok := p.(*DFlash2)
		if !ok {
			return nil, false
		}
		return q.D, true
	}); ok && d2 != nil {
		return proposeDFlash2Rows(d2, rows)
	}
	out := make([]Proposal, len(rows))
	for i, r := range rows {
		out[i] = r.P.Propose(r.Staged, r.Pos, r.Ctx, r.N, r.Sp, r.Keys)
	}
	return out
}

// sameDrafter reports the drafter every row's proposer has (as drafterOf reads it) when
// they all have one and it is the same, and no proposer serves two rows (its state would
// change between the two calls that a batch makes at once).
func sameDrafter(rows []RowDraft, drafterOf func(Proposer) (*draft.Drafter, bool)) (*draft.Drafter, bool) {
	var d *draft.Drafter
	seen := make(map[Proposer]bool, len(rows))
	for i, r := range rows {
		rd, ok := drafterOf(r.P)
		if !ok || seen[r.P] || i > 0 && rd != d {
			return nil, false
		}
		d = rd
		seen[r.P] = true
	}
	return d, true
}

// proposeDFlashRows is ProposeRows for DFlash proposers of drafter d.
func proposeDFlashRows(d *draft.Drafter, rows []RowDraft) []Proposal {
	out := make([]Proposal, len(rows))
	var (
		drafting []int
		blocks   []*mlxc.Array
		ctxs     []*mlxc.Array
		caches   []*model.KVCaches
	)
	for i, r := range rows {
		p := r.P.(*DFlash)
		if r.N <= 0 {
			out[i] = p.Propose(r.Staged, r.Pos, r.Ctx, r.N, r.Sp, r.Keys)
			continue
		}
		block := p.maskBlock(r.N)
		block[0] = r.Staged
		drafting = append(drafting, i)
		blocks = append(blocks, mlxc.FromSlice(block, 1, r.N+1))
		ctxs = append(ctxs, r.Ctx)
		caches = append(caches, p.cache)
	}
	if len(drafting) == 0 {
		return out
	}
	logits := d.ForwardRows(blocks, ctxs, caches)
	// Row order: rows sharing a key stream draw from it in the order Propose would.
	for j, i := range drafting {
		r := rows[i]
		lg := mlxc.Reshape(logits[j], r.N, -1)
		out[i] = r.P.(*DFlash).draw(lg, r.Sp, r.Keys)
		if r.Cands > 0 && r.Sp.Greedy() {
			out[i].Cands, out[i].CandLogits = candidates(lg, r.Cands)
		}
	}
	return out
}

// proposeDFlash2Rows is ProposeRows for DFlash2 proposers of drafter d. A misused window
// cache panics as Propose's does.
func proposeDFlash2Rows(d *draft.Drafter, rows []RowDraft) []Proposal {
	out := make([]Proposal, len(rows))
	var (
		drafting []int
		anchors  []*mlxc.Array
		blocks   []*mlxc.Array
		ctxs     []*mlxc.Array
		caches   []*draft.WindowCache
	)
	for i, r := range rows {
		p := r.P.(*DFlash2)
		if r.N <= 0 {
			out[i] = p.Propose(r.Staged, r.Pos, r.Ctx, r.N, r.Sp, r.Keys)
			continue
		}
		anchor := mlxc.FromSlice([]int32{r.Staged}, 1)
		drafting = append(drafting, i)
		anchors = append(anchors, anchor)
		blocks = append(blocks, mlxc.Concatenate([]*mlxc.Array{mlxc.Reshape(anchor, 1, 1), p.block()}, 1))
		ctxs = append(ctxs, r.Ctx)
		caches = append(caches, p.cache)
	}
	if len(drafting) == 0 {
		return out
	}
	bs, err := d.ForwardWindowRows(blocks, ctxs, caches)
	rows[drafting[0]].P.(*DFlash2).check(err)
	for j, i := range drafting {
		r := rows[i]
		out[i] = r.P.(*DFlash2).walk(bs[j], anchors[j], r.N, r.Sp, r.Keys)
	}
	return out
}

// candidates are the k most likely tokens of each row of logits [n, V], int32 [n, k], and
// their logits as float32, in no particular order.
func candidates(logits *mlxc.Array, k int) (idx, vals *mlxc.Array) {
	k = min(k, logits.Dim(1))
	part := mlxc.Argpartition(mlxc.Negative(logits), k-1, -1)
	idx = mlxc.SliceAxis(part, 1, 0, k)
	return mlxc.AsType(idx, mlxc.Int32), mlxc.AsType(mlxc.TakeAlongAxis(logits, idx, 1), mlxc.Float32)
}
