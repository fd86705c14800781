package draft

import (
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// WindowCache is a DFlash2 drafter's context: every layer's keys and values of the most
// recent context positions, bounded by the sliding window. A block row at position q
// attends to context positions p with q − p < window, so no block ever reads a position
// more than window−1 before the first block row; rows older than that are dropped as new
// ones arrive. Memory and attention cost stay bounded however long the conversation.
//
// Rows are kept in position order: row j of every layer is position start+j. Offset()
// is the count of committed positions; rows past it (written by ForwardAt before the
// host knew how many were committed) are overwritten by the next write.
type WindowCache struct {
	keep   int // the most positions any block can read: window − 1
	start  int // position of row 0
	offset int // committed positions (absolute)
	k, v   []*mlxc.Array
	// from and to are the rows a forward keeps before its new ones (begin).
	from, to int
}

// windowKind names a window cache's saved state.
const windowKind = "window"

// NewWindowCache makes an empty cache for n layers that keeps the last keep positions.
func NewWindowCache(n, keep int) *WindowCache {
	return &WindowCache{keep: keep, k: make([]*mlxc.Array, n), v: make([]*mlxc.Array, n)}
}

// Offset is the number of committed context positions.
func (c *WindowCache) Offset() int { return c.offset }

// Rows is the number of rows held (committed and, after ForwardAt, the uncommitted tail).
func (c *WindowCache) Rows() int {
	if c.k[0] == nil {
		return 0
	}
	return c.k[0].Dim(2)
}

// begin starts a forward that writes context rows after the committed positions at:
// every layer then keeps its rows from the last keep positions before at (none when
// keepOld is false: the new rows fill the window by themselves), dropping the older ones
// and any uncommitted tail at or past at.
func (c *WindowCache) begin(at int, keepOld bool) error {
	if at < c.start || at > c.offset {
		return fmt.Errorf("draft window cache: cannot write at position %d (committed %d, oldest row %d)", at, c.offset, c.start)
	}
	c.to = min(at-c.start, c.Rows())
	c.from = max(0, c.to-c.keep)
	if !keepOld {
		c.from = c.to
	}
	return nil
}

// write puts layer i's keys and values [1, nKV, T, hd] of the positions after the rows
// begin kept.
func (c *WindowCache) write(i int, k, v *mlxc.Array) {
	nk, nv := k, v
	if c.k[i] != nil && c.from < c.to {
		nk = mlxc.Concatenate([]*mlxc.Array{mlxc.SliceAxis(c.k[i], 2, c.from, c.to), k}, 2)
		nv = mlxc.Concatenate([]*mlxc.Array{mlxc.SliceAxis(c.v[i], 2, c.from, c.to), v}, 2)
	}
	nk.Detach()
	nv.Detach()
	c.k[i].Free()
	c.v[i].Free()
	c.k[i], c.v[i] = nk, nv
}

// advance ends a forward that wrote T rows from position at in every layer and counts
// them all committed; after a run-ahead draft SetOffset lowers the count once it is known.
func (c *WindowCache) advance(at, T int) {
	c.start = at + T - c.Rows()
	c.offset = at + T
}

// keys are layer i's rows (keys, values) at positions start … start+Rows()−1.
func (c *WindowCache) keys(i int) (*mlxc.Array, *mlxc.Array) { return c.k[i], c.v[i] }

// SetOffset declares the first n positions committed (after ForwardAt, once the host
// has read the count); rows past n are overwritten by the next write.
func (c *WindowCache) SetOffset(n int) error {
	if n < c.start || n > c.start+c.Rows() {
		return fmt.Errorf("draft window cache: cannot commit %d positions, rows %d…%d held", n, c.start, c.start+c.Rows())
	}
	c.offset = n
	return nil
}

// Arrays are the live buffers, for evaluation.
func (c *WindowCache) Arrays() []*mlxc.Array {
	var out []*mlxc.Array
	for i := range c.k {
		if c.k[i] != nil {
			out = append(out, c.k[i], c.v[i])
		}
	}
	return out
}

// Free releases the rows; the cache is empty again.
func (c *WindowCache) Free() {
	for i := range c.k {
		c.k[i].Free()
		c.v[i].Free()
		c.k[i], c.v[i] = nil, nil
	}
	c.start, c.offset = 0, 0
}

// Save returns the rows a block after position n can read (the last keep committed
// positions before n), in buffers of their own, one Saved per layer. Any shorter prefix
// resumes from it too: Load takes what it holds of that prefix's window (Trimmable).
func (c *WindowCache) Save(n int) ([]cache.Saved, error) {
	if n < 0 || n > c.offset {
		return nil, fmt.Errorf("draft window cache: cannot save %d of %d positions", n, c.offset)
	}
	if n > 0 && n-c.start < min(n, c.keep) {
		return nil, fmt.Errorf("draft window cache: positions before %d are no longer held", n)
	}
	out := make([]cache.Saved, len(c.k))
	from, to := max(0, n-c.start-c.keep), n-c.start
	for i := range c.k {
		out[i] = cache.Saved{Kind: windowKind, Offset: n, Trimmable: true}
		if n == 0 || c.k[i] == nil {
			continue
		}
		for _, b := range []*mlxc.Array{c.k[i], c.v[i]} {
			rows := mlxc.SliceAxis(b, 2, from, to)
			out[i].Arrays = append(out[i].Arrays, mlxc.Contiguous(rows).Detach())
		}
	}
	return out, nil
}

// Load makes the empty cache hold what s has of the window before position n (n ≤ the
// saved offset). A state saved after more positions holds the rows from its own window's
// start: a window that begins before them loads the rows there are, which changes drafts
// but never what a verified block commits.
func (c *WindowCache) Load(s []cache.Saved, n int) error {
	if c.Rows() != 0 || c.offset != 0 {
		return errors.New("draft window cache: load into a cache that holds rows")
	}
	if len(s) != len(c.k) {
		return fmt.Errorf("draft window cache: saved state has %d layers, the drafter %d", len(s), len(c.k))
	}
	for i, l := range s {
		if l.Kind != windowKind {
			return fmt.Errorf("draft window cache: cannot load a %q state", l.Kind)
		}
		if n < 0 || n > l.Offset {
			return fmt.Errorf("draft window cache: cannot resume at %d from a state of %d positions", n, l.Offset)
		}
		if n > 0 && (len(l.Arrays) != 2 || l.Arrays[0].Ndim() != 4 || l.Arrays[0].Dim(2) != l.Arrays[1].Dim(2)) {
			return fmt.Errorf("draft window cache: layer %d's saved state is not keys and values", i)
		}
	}
	if n == 0 {
		return nil
	}
	rows := s[0].Arrays[0].Dim(2)
	start := s[0].Offset - rows
	from, to := max(start, n-c.keep)-start, n-start
	if to <= 0 {
		// The state holds nothing before n: start from an empty window at n.
		c.start, c.offset = n, n
		return nil
	}
	for i, l := range s {
		k := mlxc.SliceAxis(l.Arrays[0], 2, from, to)
		v := mlxc.SliceAxis(l.Arrays[1], 2, from, to)
		c.k[i] = mlxc.Contiguous(k).Detach()
		c.v[i] = mlxc.Contiguous(v).Detach()
	}
	c.start, c.offset = start+from, n
	return nil
}
