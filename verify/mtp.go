package verify

import (
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// TokenContext is a proposer whose context rows go with the sequence's tokens: the MTP
// head pairs the target's row at position p with the token at p+1. The engine gives it,
// when a sequence begins, the sequence's committed tokens: tok(p) is the token at position
// p and false where p is not committed yet.
type TokenContext interface {
	SetTokens(tok func(p int) (int32, bool))
}

// MTP proposes with the target's own multi-token-prediction head (qwen35.MTP): k drafts
// by k autoregressive steps of the head over its own KV cache. The head's cache slot p
// holds the pair (t[p+1], h[p]) of the target's final-normed row at p; slots made from
// the head's own rows while drafting are dropped at the next call and remade from the
// target's verify rows of the accepted positions, so every kept slot is exact.
type MTP struct {
	H *qwen35.MTP
	// maxDrafts is the most drafts a proposal has (BlockSize − 1).
	maxDrafts int

	c   *qwen35.MTPCache
	tok func(p int) (int32, bool)
	// rows are the target's final-normed rows [1, n, H] of positions next..next+n−1 that
	// have no slot yet: the token after the last of them was not committed when they came.
	rows *mlxc.Array
	next int // the position of rows' first row = the head's exact slots
	// last is the target's row of position next−1 (final-normed, [1, 1, H]), the row of the
	// last exact slot: a proposal whose staged token was already committed when its rows
	// came (so that slot is written) remakes that slot to draft from it.
	last *mlxc.Array
	// hist holds the target's final-normed rows of every position so far, in parts of
	// [1, n, H] (the prefix cache saves them: a resume needs the row before it).
	hist []*mlxc.Array
}

// DefaultMTPBlock is the block (staged token + drafts) an MTP proposer verifies at most:
// each draft is one more step of the head, whose acceptance falls with depth (MTP.md).
const DefaultMTPBlock = 4

// NewMTP wraps a loaded head; block is the largest block (staged token + drafts), ≥ 2.
func NewMTP(h *qwen35.MTP, block int) *MTP {
	return &MTP{H: h, maxDrafts: max(block, 2) - 1}
}

// TapLayers is the target's last layer: the head reads its rows after the final norm.
func (p *MTP) TapLayers() []int { return []int{p.H.TargetLayers() - 1} }

func (p *MTP) BlockSize() int { return p.maxDrafts + 1 }

// Fork makes a proposer of its own over the same head (a sequence of a batch).
func (p *MTP) Fork() Proposer { return NewMTP(p.H, p.BlockSize()) }

func (p *MTP) SetTokens(tok func(p int) (int32, bool)) { p.tok = tok }

func (p *MTP) Begin() {
	p.End()
	p.c = p.H.NewCache()
	p.next = 0
}

func (p *MTP) End() {
	if p.c != nil {
		p.c.Free()
		p.c = nil
	}
	p.rows.Free()
	p.last.Free()
	p.rows, p.last = nil, nil
	for _, h := range p.hist {
		h.Free()
	}
	p.hist = nil
}

// Context takes the target's rows of committed positions (prefill chunks, plain steps):
// the pairs whose next token is committed become slots; the rest wait for it.
func (p *MTP) Context(ctx *mlxc.Array) {
	if ctx == nil {
		return
	}
	p.add(ctx)
	p.flush(-1, 0)
}

// add appends the target's tapped rows to the waiting rows (final-normed, detached).
func (p *MTP) add(ctx *mlxc.Array) {
	h := p.H.TargetHidden(ctx)
	p.hist = append(p.hist, mlxc.Copy(h).Detach())
	if p.rows != nil {
		h = mlxc.Concatenate([]*mlxc.Array{p.rows, h}, 1)
	}
	h = h.Detach()
	p.rows.Free()
	p.rows = h
}

// token is the token at position q: staged at stagedAt, else the committed one the
// engine's record holds (accepted drafts are committed before the next proposal).
func (p *MTP) token(q, stagedAt int, staged int32) (int32, bool) {
	if q == stagedAt {
		return staged, true
	}
	if p.tok != nil {
		if t, ok := p.tok(q); ok {
			return t, true
		}
	}
	return 0, false
}

// flush writes the slots of the waiting rows whose next token is known (staged at
// stagedAt, or committed) in one step and returns that step's output (nil when no row
// had its token); the rows after the first unknown token keep waiting.
func (p *MTP) flush(stagedAt int, staged int32) *qwen35.MTPOutput {
	if p.rows == nil {
		return nil
	}
	n := p.rows.Dim(1)
	ids := make([]int32, 0, n)
	for i := range n {
		t, ok := p.token(p.next+i+1, stagedAt, staged)
		if !ok {
			break
		}
		ids = append(ids, t)
	}
	if len(ids) == 0 {
		return nil
	}
	if p.c.Offset() > p.next {
		if err := p.c.Truncate(p.next); err != nil {
			panic(err)
		}
	}
	k := len(ids)
	hid := p.rows
	if k < n {
		hid = mlxc.SliceAxis(p.rows, 1, 0, k)
	}
	out := p.H.Step(mlxc.FromSlice(ids, 1, k), hid, p.c, model.LogitsLast)
	p.last.Free()
	p.last = mlxc.SliceAxis(p.rows, 1, k-1, k).Detach()
	var rest *mlxc.Array
	if k < n {
		rest = mlxc.SliceAxis(p.rows, 1, k, n).Detach()
	}
	p.rows.Free()
	p.rows = rest
	p.next += k
	return &out
}

// Propose drafts n tokens after staged at position pos: the rows of the positions the
// previous verify committed (ctx) join the waiting rows, one step writes their exact
// slots up to pos−1 (whose next token is staged) and gives the first draft, and each
// further draft is one step on the head's own row.
func (p *MTP) Propose(staged int32, pos int, ctx *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	if ctx != nil {
		p.add(ctx)
	}
	if n <= 0 {
		p.flush(-1, 0)
		return Proposal{}
	}
	if p.rows == nil && p.next == pos && p.last != nil {
		// The slot of pos−1 is written (staged was committed when its row came): remake it.
		p.rows, p.last = p.last, nil
		p.next--
	}
	if p.next+rowsOf(p.rows) != pos {
		panic(&mlxc.Error{Msg: fmt.Sprintf("mtp proposer: rows up to position %d, staged token at %d", p.next+rowsOf(p.rows), pos)})
	}
	out := p.flush(pos, staged)
	if out == nil || p.rows != nil {
		panic(&mlxc.Error{Msg: "mtp proposer: a committed token before the staged one is unknown"})
	}
	toks := make([]*mlxc.Array, 0, n)
	var probs []*mlxc.Array
	hidden := mlxc.SliceAxis(out.Hidden, 1, out.Hidden.Dim(1)-1, out.Hidden.Dim(1))
	logits := out.Logits
	for i := range n {
		d := draw(mlxc.Reshape(logits, 1, -1), sp, keys)
		toks = append(toks, mlxc.Reshape(d.Tokens, 1))
		if d.Probs != nil {
			probs = append(probs, d.Probs)
		}
		if i == n-1 {
			break
		}
		o := p.H.Step(mlxc.Reshape(d.Tokens, 1, 1), hidden, p.c, model.LogitsLast)
		hidden, logits = o.Hidden, o.Logits
	}
	prop := Proposal{Tokens: mlxc.Concatenate(toks, 0)}
	if len(probs) > 0 {
		prop.Probs = mlxc.Concatenate(probs, 0)
	}
	return prop
}

func rowsOf(a *mlxc.Array) int {
	if a == nil {
		return 0
	}
	return a.Dim(1)
}

// draw picks a draft from logits [1, V]: the argmax when greedy, else a sample of the
// filtered distribution, returned with it (its q).
func draw(logits *mlxc.Array, sp sample.Params, keys *sample.Keys) Proposal {
	if sp.Greedy() {
		return Proposal{Tokens: mlxc.AsType(mlxc.Argmax(logits, -1, false), mlxc.Int32)}
	}
	q := sp.Probs(sp.Filter(sample.LogProbs(logits)))
	toks := mlxc.Categorical(mlxc.Log(q), -1, keys.Next())
	return Proposal{Tokens: mlxc.AsType(toks, mlxc.Int32), Probs: q}
}

// mtpRowsKind names the saved target rows of a sequence's positions (SaveContext).
const mtpRowsKind = "mtp-rows"

// SaveContext keeps the head's state after the first n positions (the prefix cache): its
// exact slots of positions 0..n−2, whose pairs lie inside those n tokens, and the target's
// rows of positions 0..n−1, so that a resume at any m ≤ n has the row of m−1, whose pair
// waits for the token after the resumed ones.
func (p *MTP) SaveContext(n int) ([]cache.Saved, error) {
	if p.c == nil {
		return nil, errors.New("mtp proposer: no sequence begun")
	}
	if n < 1 || p.next < n-1 || p.histLen() < n {
		return nil, fmt.Errorf("mtp proposer: cannot save %d positions (exact slots %d, rows %d)", n, p.next, p.histLen())
	}
	slots, err := p.c.Save(n - 1)
	if err != nil {
		return nil, err
	}
	rows := mlxc.SliceAxis(p.history(), 1, 0, n)
	kept := mlxc.Copy(rows).Detach()
	return append(slots, cache.Saved{Kind: mtpRowsKind, Offset: n, Trimmable: true, Arrays: []*mlxc.Array{kept}}), nil
}

// LoadContext makes the state of a sequence just begun that of SaveContext after its
// first n positions (n at most the saved count).
func (p *MTP) LoadContext(s []cache.Saved, n int) error {
	if p.c == nil {
		return errors.New("mtp proposer: no sequence begun")
	}
	last := len(s) - 1
	if last < 0 || s[last].Kind != mtpRowsKind || n < 1 || n > s[last].Offset || len(s[last].Arrays) != 1 {
		return fmt.Errorf("mtp proposer: saved context is not the head's after %d positions", n)
	}
	rows := s[last].Arrays[0]
	p.End()
	p.c = p.H.NewCache()
	if err := p.c.Load(s[:last], n-1); err != nil {
		return err
	}
	p.hist = []*mlxc.Array{mlxc.Copy(mlxc.SliceAxis(rows, 1, 0, n)).Detach()}
	p.rows = mlxc.Copy(mlxc.SliceAxis(rows, 1, n-1, n)).Detach()
	p.next = n - 1
	return nil
}

// history is the target's rows of every position so far, [1, n, H] (a handle of the
// caller's scope; the parts are joined into one).
func (p *MTP) history() *mlxc.Array {
	if len(p.hist) > 1 {
		all := mlxc.Concatenate(p.hist, 1).Detach()
		for _, h := range p.hist {
			h.Free()
		}
		p.hist = []*mlxc.Array{all}
	}
	return mlxc.Reshape(p.hist[0], p.hist[0].Shape()...)
}

func (p *MTP) histLen() int {
	n := 0
	for _, h := range p.hist {
		n += h.Dim(1)
	}
	return n
}
