package engine

import (
	"fmt"
	"math"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Constraint is a grammar a request's output must follow (a JSON schema, a tool call in
// the model's own format, a Lark grammar): a matcher over the tokens committed so far.
// The caller makes it for one request and closes it after the request ends; the engine
// uses it from one goroutine at a time. grammar.Matcher is the implementation.
//
// A mask is MaskWords() words: bit v of word v>>5 is set when token v may come next. It
// covers the grammar's vocabulary (the tokenizer's), which may be longer or shorter than
// the model's (the rows of its head): tokens past either are never chosen.
type Constraint interface {
	// MaskWords is the length of one mask.
	MaskWords() int
	// MaskInto writes the mask of the tokens allowed now.
	MaskInto(dst []uint32) error
	// ChainMasks writes the masks of a verify block: row 0 the mask now, row j+1 the mask
	// after drafts[0..j], up to the first draft its row does not allow (k, returned; the
	// rows after it are copies). The matcher is where it was before.
	ChainMasks(drafts []int32, dst []uint32) (int, error)
	// Consume commits tokens.
	Consume(tokens ...int32) error
	// Rollback takes back the last n tokens consumed.
	Rollback(n int) error
	// Stopped reports that the grammar is complete: only an end token may follow.
	Stopped() bool
}

// constrained is a sequence's constraint state: the matcher and the host buffers of its
// masks.
type constrained struct {
	m     Constraint
	words []uint32 // one or more masks of MaskWords() words
	allow []bool   // the masks unpacked, one bool per token
}

// maskRows returns the bool mask [n, V] of one mask (n = 1, drafts nil) or of a verify
// block's n = len(drafts)+1 rows, computed on the host.
func (c *constrained) maskRows(st *Stats, V int, drafts []int32) (*mlxc.Array, error) {
	t0 := time.Now()
	defer func() { st.MaskTime += time.Since(t0) }()
	st.Masks += len(drafts) + 1
	n := len(drafts) + 1
	words := c.masks(n)
	var err error
	if drafts == nil {
		err = c.m.MaskInto(words)
	} else {
		_, err = c.m.ChainMasks(drafts, words)
	}
	if err != nil {
		return nil, fmt.Errorf("constraint: %w", err)
	}
	return c.unpack(words, n, V)
}

// masks is the host buffer of n masks, grown as needed.
func (c *constrained) masks(n int) []uint32 {
	size := n * c.m.MaskWords()
	if cap(c.words) < size {
		c.words = make([]uint32, size)
	}
	return c.words[:size]
}

// allows reports whether mask allows token v.
func allows(mask []uint32, v int) bool { return mask[v>>5]>>(v&31)&1 != 0 }

// unpack turns n masks of MaskWords() words into a bool mask [n, V] over the model's
// vocabulary; the first must allow some token.
func (c *constrained) unpack(words []uint32, n, V int) (*mlxc.Array, error) {
	W := c.m.MaskWords()
	if cap(c.allow) < n*V {
		c.allow = make([]bool, n*V)
	}
	allow := c.allow[:n*V]
	any := false
	for j := range n {
		row, out := words[j*W:(j+1)*W], allow[j*V:(j+1)*V]
		for v := range min(V, 32*W) {
			out[v] = allows(row, v)
			any = any || (j == 0 && out[v])
		}
		clear(out[min(V, 32*W):])
	}
	if !any {
		return nil, fmt.Errorf("constraint: no token of the model's %d may come next", V)
	}
	return mlxc.FromSlice(allow, n, V), nil
}

// chooseDrafts picks a greedy row's drafts under its grammar from the drafter's
// candidates (cands and their logits, K per position for n positions): position i's
// draft is its most likely candidate that the grammar allows after the drafts before it,
// and the drafts end at the first position none of whose candidates it allows. It returns
// the drafts and the bool masks [len(drafts)+1, V] of their verify block (the mask before
// each draft, and after the last), computed on the way; the matcher is left where it was.
func (c *constrained) chooseDrafts(st *Stats, V int, cands []int32, logits []float32, K int) (drafts []int32, allow *mlxc.Array, err error) {
	t0 := time.Now()
	defer func() { st.MaskTime += time.Since(t0) }()
	n, W := len(cands)/K, c.m.MaskWords()
	words := c.masks(n + 1)
	defer func() {
		if rerr := c.m.Rollback(len(drafts)); rerr != nil && err == nil {
			err = fmt.Errorf("constraint: %w", rerr)
		}
	}()
	for i := 0; ; i++ {
		row := words[i*W : (i+1)*W]
		st.Masks++
		if err := c.m.MaskInto(row); err != nil {
			return drafts, nil, fmt.Errorf("constraint: %w", err)
		}
		if i == n {
			break
		}
		bestJ := -1
		for j := i * K; j < (i+1)*K; j++ {
			t := cands[j]
			if t < 0 || int(t) >= min(V, 32*W) || !allows(row, int(t)) {
				continue
			}
			if bestJ < 0 || logits[j] > logits[bestJ] {
				bestJ = j
			}
		}
		if bestJ < 0 {
			break
		}
		best := cands[bestJ]
		if err := c.m.Consume(best); err != nil {
			return drafts, nil, fmt.Errorf("constraint: %w", err)
		}
		drafts = append(drafts, best)
	}
	allow, err = c.unpack(words, len(drafts)+1, V)
	return drafts, allow, err
}

// masked sets logits [n, V] outside allow [n, V] to −∞: those tokens get no probability
// under every sampling rule, and no argmax picks them.
func masked(logits, allow *mlxc.Array) *mlxc.Array {
	return mlxc.Where(allow, logits, mlxc.Scalar(math.Inf(-1), logits.Dtype()))
}

// commit consumes the tokens the row's output took in a step (a stop token ends the
// output and is not consumed) and ends the sequence when the grammar is complete: the
// grammar's stop ends the generation.
func (c *constrained) commit(q *sequence, toks []int32) {
	if len(toks) > 0 {
		if err := c.m.Consume(toks...); err != nil {
			q.err = fmt.Errorf("constraint: committing %v: %w", toks, err)
			return
		}
	}
	if c.m.Stopped() && !q.o.done {
		q.o.end(FinishStop)
	}
}
