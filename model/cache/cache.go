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
