// Package cache is the per-layer state of a sequence as the decoding loops see it: a model
// returns a List of Layer caches (mixed kinds allowed), and the loops speculate, commit,
// rewind and reserve through the list without knowing what a layer holds. KV layers
// implement it in package model; the contract is written so that a recurrent layer (a
// snapshot plus a tape of the tentative forward) drops in.
package cache

import (
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Layer is one layer's cache.
type Layer interface {
	// Offset is the number of positions the layer holds.
	Offset() int
	// Arrays lists the buffers to evaluate together with a step, so that its graph is freed.
	Arrays() []*mlxc.Array
	// Speculate marks the next forward as tentative: a KV layer remembers its offset; a
	// recurrent layer snapshots its state and records the forward's steps.
	Speculate()
	// Commit keeps the given rows of the tentative forward and drops the rest: 0..a for a
	// chain of drafts, the accepted path for a tree. It ends the speculation.
	Commit(keep []int) error
	// Snapshot captures the layer's state; Restore returns to it (a prefix cache).
	Snapshot() Snapshot
	Restore(Snapshot) error
	// Bytes is the memory the layer's buffers hold.
	Bytes() int64
	// Free releases all buffers.
	Free()
}

// Snapshot is a layer's saved state, opaque to all but the layer that made it.
type Snapshot interface {
	// Free releases what the snapshot holds (nothing for a KV offset).
	Free()
}

// Reserver is a layer that can preallocate room for n positions in total, so that it does
// not regrow while decoding. Layers of fixed size (recurrent state) need not implement it.
type Reserver interface {
	Reserve(n int)
}

// Trimmer is a layer that can drop its last n positions at any time (KV); a recurrent
// layer cannot, and rolls back only through Speculate and Commit.
type Trimmer interface {
	Trim(n int) int
}

// Placed is the run-ahead loop's capability: a forward placed at a position computed on
// the device (model.ForwardOptions.Pos) leaves the layer's offset alone, and SetOffset
// declares the first n positions valid once the host has read how many rows are kept.
type Placed interface {
	SetOffset(n int) error
}

// Caches is a model's caches as the decoding loops use them.
type Caches interface {
	Offset() int
	Speculate()
	Commit(keep []int) error
	// Rewind drops the last n positions (only where every layer is a Trimmer).
	Rewind(n int) error
	Reserve(n int)
	Arrays() []*mlxc.Array
	Bytes() int64
	Free()
	// RunAhead is the run-ahead capability of all layers, or nil when a layer lacks it:
	// the loop then runs serially.
	RunAhead() Placed
	// Save and Load keep every layer's state apart from the caches and resume an empty
	// list from it (Saver, per layer): the prefix cache.
	Save(n int) ([]Saved, error)
	Load(s []Saved, n int) error
	// Trimmable reports whether every layer can drop positions (all Trimmers); SaveFixed
	// saves only the layers that cannot (a prefix cache's mark).
	Trimmable() bool
	SaveFixed(n int) ([]Saved, error)
}

// Prefix is the keep list of a chain that accepted the first n rows: 0..n-1.
func Prefix(n int) []int {
	keep := make([]int, max(n, 0))
	for i := range keep {
		keep[i] = i
	}
	return keep
}

// IsPrefix reports whether keep is 0..len(keep)-1, the only shape a KV layer can keep
// without moving rows.
func IsPrefix(keep []int) bool {
	for i, k := range keep {
		if k != i {
			return false
		}
	}
	return true
}

// List is the caches of a model's layers, in layer order.
type List struct {
	layers []Layer
}

// NewList makes a list of the given layers.
func NewList(layers ...Layer) *List { return &List{layers: layers} }

// Layers returns the layers (not a copy: for the model that owns them).
func (l *List) Layers() []Layer { return l.layers }

// Offset is the first layer's offset (all layers hold the same positions).
func (l *List) Offset() int {
	if len(l.layers) == 0 {
		return 0
	}
	return l.layers[0].Offset()
}

// Speculate marks the next forward as tentative in every layer.
func (l *List) Speculate() {
	for _, c := range l.layers {
		c.Speculate()
	}
}

// Commit keeps the rows keep of the tentative forward in every layer.
func (l *List) Commit(keep []int) error {
	for i, c := range l.layers {
		if err := c.Commit(keep); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

// Rewind drops the last n positions of every layer; it fails, changing nothing, when n is
// out of range or a layer cannot be trimmed.
func (l *List) Rewind(n int) error {
	if n < 0 || n > l.Offset() {
		return fmt.Errorf("cache: cannot rewind %d of %d positions", n, l.Offset())
	}
	ts := make([]Trimmer, len(l.layers))
	for i, c := range l.layers {
		t, ok := c.(Trimmer)
		if !ok {
			return fmt.Errorf("cache: layer %d cannot be rewound", i)
		}
		ts[i] = t
	}
	for _, t := range ts {
		t.Trim(n)
	}
	return nil
}

// Reserve preallocates room for n positions in every layer that can.
func (l *List) Reserve(n int) {
	for _, c := range l.layers {
		if r, ok := c.(Reserver); ok {
			r.Reserve(n)
		}
	}
}

// Arrays lists every layer's buffers.
func (l *List) Arrays() []*mlxc.Array {
	var out []*mlxc.Array
	for _, c := range l.layers {
		out = append(out, c.Arrays()...)
	}
	return out
}

// Bytes sums the layers' buffers.
func (l *List) Bytes() int64 {
	var b int64
	for _, c := range l.layers {
		b += c.Bytes()
	}
	return b
}

// Free releases every layer.
func (l *List) Free() {
	for _, c := range l.layers {
		c.Free()
	}
}

// RunAhead returns the list as a Placed when every layer is one, else nil.
func (l *List) RunAhead() Placed {
	for _, c := range l.layers {
		if _, ok := c.(Placed); !ok {
			return nil
		}
	}
	return placedList{l}
}

// placedList sets the offset of every layer of a list whose layers are all Placed.
type placedList struct{ l *List }

func (p placedList) SetOffset(n int) error {
	for i, c := range p.l.layers {
		if err := c.(Placed).SetOffset(n); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

// ListSnapshot is the snapshots of a list's layers.
type ListSnapshot []Snapshot

// Free releases every layer's snapshot.
func (s ListSnapshot) Free() {
	for _, x := range s {
		x.Free()
	}
}

// Snapshot captures every layer.
func (l *List) Snapshot() ListSnapshot {
	s := make(ListSnapshot, len(l.layers))
	for i, c := range l.layers {
		s[i] = c.Snapshot()
	}
	return s
}

// Restore returns every layer to a list snapshot taken earlier.
func (l *List) Restore(s ListSnapshot) error {
	if len(s) != len(l.layers) {
		return errors.New("cache: snapshot of another list")
	}
	for i, c := range l.layers {
		if err := c.Restore(s[i]); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

// Saved is one layer's state after Offset positions in arrays that no live cache writes
// into: what a prefix cache keeps, and what an empty layer of the same kind resumes from.
type Saved struct {
	// Kind names the layer kind that made it ("kv", "recurrent"); Load refuses another.
	Kind string
	// Offset is the number of positions the state holds.
	Offset int
	// Trimmable: the layer can resume at any position up to Offset (KV rows); otherwise
	// only at Offset (a recurrent state cannot drop positions).
	Trimmable bool
	// Arrays are the state's buffers, owned by the Saved (detached); none for Offset 0.
	Arrays []*mlxc.Array
}

// Free releases the arrays.
func (s Saved) Free() {
	for _, a := range s.Arrays {
		a.Free()
	}
}

// Bytes is the memory the arrays hold.
func (s Saved) Bytes() int64 {
	var n int64
	for _, a := range s.Arrays {
		n += int64(a.NBytes())
	}
	return n
}

// Saver is a layer whose state can be kept apart from it and resumed by an empty layer.
type Saver interface {
	// Save returns the state after the first n positions (n ≤ Offset; only n = Offset
	// for a layer that cannot trim), outside any speculation. The arrays may be lazy: the
	// caller evaluates them.
	Save(n int) (Saved, error)
	// Load makes an empty layer hold the first n positions of s.
	Load(s Saved, n int) error
}

// CanResume reports whether a layer saved as s can resume at position n.
func (s Saved) CanResume(n int) bool {
	return n >= 0 && (n == s.Offset || (s.Trimmable && n < s.Offset))
}

// Save saves every layer after its first n positions; on an error nothing is kept.
func (l *List) Save(n int) ([]Saved, error) { return l.save(n, false) }

// save saves the layers after their first n positions, only those that are no Trimmer
// when fixedOnly (the others keep the zero Saved).
func (l *List) save(n int, fixedOnly bool) ([]Saved, error) {
	out := make([]Saved, len(l.layers))
	for i, c := range l.layers {
		if _, ok := c.(Trimmer); ok && fixedOnly {
			continue
		}
		sv, ok := c.(Saver)
		if !ok {
			FreeSaved(out)
			return nil, fmt.Errorf("cache: layer %d cannot be saved", i)
		}
		s, err := sv.Save(n)
		if err != nil {
			FreeSaved(out)
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		out[i] = s
	}
	return out, nil
}

// Load makes every (empty) layer hold the first n positions of its saved state. A list
// that is not empty, or whose layers cannot load, is refused unchanged; a load that fails
// part way leaves the list empty.
func (l *List) Load(s []Saved, n int) error {
	if len(s) != len(l.layers) {
		return fmt.Errorf("cache: %d saved layers for a list of %d", len(s), len(l.layers))
	}
	svs := make([]Saver, len(l.layers))
	for i, c := range l.layers {
		sv, ok := c.(Saver)
		if !ok {
			return fmt.Errorf("cache: layer %d cannot be loaded", i)
		}
		if c.Offset() != 0 {
			return fmt.Errorf("cache: layer %d holds %d positions, a load needs an empty layer", i, c.Offset())
		}
		svs[i] = sv
	}
	for i, sv := range svs {
		if err := sv.Load(s[i], n); err != nil {
			l.Free()
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

// SavedArrays lists the arrays of saved layers, in order.
func SavedArrays(s []Saved) []*mlxc.Array {
	var out []*mlxc.Array
	for _, x := range s {
		out = append(out, x.Arrays...)
	}
	return out
}

// FreeSaved releases a list of saved layers.
func FreeSaved(s []Saved) {
	for _, x := range s {
		x.Free()
	}
}

// Trimmable reports whether every layer is a Trimmer.
func (l *List) Trimmable() bool {
	for _, c := range l.layers {
		if _, ok := c.(Trimmer); !ok {
			return false
		}
	}
	return true
}

// SaveFixed saves the layers that are no Trimmer after their first n positions, leaving
// the zero Saved at the others: their state at n is any longer saved state's prefix.
func (l *List) SaveFixed(n int) ([]Saved, error) { return l.save(n, true) }

// OwnCopy is a copy of x in a buffer of exactly its size that shares no other array's.
// MLX's copy and contiguous of a view, and a slice update that covers its whole target,
// may return a view of x's buffer; a saved state made that way would keep the whole
// source alive (a cache's reserved keys, every row of a batch, a prefill chunk's conv
// input) while counting only its own bytes. A concatenation always writes a new buffer.
func OwnCopy(x *mlxc.Array) *mlxc.Array {
	empty := x.Shape()
	empty[0] = 0
	return mlxc.Concatenate([]*mlxc.Array{x, mlxc.Zeros(empty, x.Dtype())}, 0)
}
