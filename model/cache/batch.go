package cache

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// BatchLayer is one layer's state for B sequences at once, stacked on a leading row axis,
// each row with its own length. Rows are handed over as Saved states, the same form a
// prefix cache keeps and a single-sequence layer saves and loads: a row joins from a
// single-sequence layer's Save and leaves into an empty single-sequence layer's Load.
type BatchLayer interface {
	// Lens are the rows' lengths (positions taken in), in row order; the caller must not
	// change the slice.
	Lens() []int
	// Join appends a row holding the state s (s.Offset positions): the arrays are copied
	// or referenced, s stays the caller's to free.
	Join(s Saved) error
	// Extract returns row r's state in arrays of its own (the batch keeps the row).
	Extract(r int) (Saved, error)
	// Keep keeps only the rows listed (increasing, no repeats), in that order.
	Keep(rows []int) error
	// Tentative reports whether the last step was tentative and is not committed yet:
	// until Commit the layer refuses Join, Extract, Keep and a new step.
	Tentative() bool
	// Commit ends a tentative step, keeping row r's first keep[r] positions of it (0 ≤
	// keep[r] ≤ the positions the step gave the row); the rest leave no trace. It fails
	// without a tentative step, and leaves the layer unchanged when it fails.
	Commit(keep []int) error
	Arrays() []*mlxc.Array
	Bytes() int64
	Free()
}

// Batch is a model's batched state, one BatchLayer per layer, all with the same rows:
// what a batched forward (model.BatchModel) reads and appends to.
type Batch interface {
	Rows() int
	Lens() []int
	Join(c Caches) (row int, err error)
	Extract(r int, into Caches) error
	Keep(rows []int) error
	Leave(r int, into Caches) error
	// Tentative and Commit are BatchLayer's, for every layer at once: a tentative step
	// (a speculative verify) writes its positions without counting them, and Commit keeps
	// each row's accepted prefix of them.
	Tentative() bool
	Commit(keep []int) error
	Arrays() []*mlxc.Array
	Bytes() int64
	Free()
}

// BatchList is a model's mixed list of batched layers, which all hold the same rows at
// the same lengths (the lengths of layer 0 are the rows' lengths).
type BatchList struct{ layers []BatchLayer }

var _ Batch = (*BatchList)(nil)

// NewBatchList makes a list of batched layers with no rows.
func NewBatchList(layers ...BatchLayer) *BatchList { return &BatchList{layers: layers} }

// Layers returns the per-layer batched caches.
func (b *BatchList) Layers() []BatchLayer { return b.layers }

// Rows is the number of sequences in the batch.
func (b *BatchList) Rows() int { return len(b.Lens()) }

// Lens are the rows' lengths.
func (b *BatchList) Lens() []int {
	if len(b.layers) == 0 {
		return nil
	}
	return b.layers[0].Lens()
}

// Join appends the state of the single-sequence cache c (a prompt prefilled alone, or a
// prefix cache entry loaded into one) as a new row and returns its index. c is unchanged
// and stays the caller's. On an error the batch is unchanged.
func (b *BatchList) Join(c Caches) (int, error) {
	if c == nil {
		return 0, errors.New("batch join: no cache")
	}
	if b.Tentative() {
		return 0, errUncommitted("join")
	}
	row := b.Rows()
	saved, err := c.Save(c.Offset())
	if err != nil {
		return 0, fmt.Errorf("batch join: saving the sequence's state: %w", err)
	}
	defer FreeSaved(saved)
	if len(saved) != len(b.layers) {
		return 0, fmt.Errorf("batch join: the sequence has %d layers, the batch %d", len(saved), len(b.layers))
	}
	for i, l := range b.layers {
		if err := l.Join(saved[i]); err != nil {
			b.dropLast(i, row)
			return 0, fmt.Errorf("batch join: layer %d: %w", i, err)
		}
	}
	return row, nil
}

// dropLast removes the row just joined by the first n layers (a join that failed part way).
func (b *BatchList) dropLast(n, row int) {
	keep := make([]int, row)
	for i := range keep {
		keep[i] = i
	}
	for _, l := range b.layers[:n] {
		_ = l.Keep(keep) // removing the last row of a consistent layer cannot fail
	}
}

// Extract loads row r's state into the empty single-sequence cache into (of the same
// model), which then holds exactly what a sequence decoded alone would: for the prefix
// cache, or to continue the sequence alone. The batch keeps the row.
func (b *BatchList) Extract(r int, into Caches) error {
	if b.Tentative() {
		return errUncommitted("extract")
	}
	if r < 0 || r >= b.Rows() {
		return fmt.Errorf("batch extract: row %d of %d", r, b.Rows())
	}
	n := b.Lens()[r]
	saved := make([]Saved, len(b.layers))
	defer FreeSaved(saved)
	for i, l := range b.layers {
		s, err := l.Extract(r)
		if err != nil {
			return fmt.Errorf("batch extract: layer %d: %w", i, err)
		}
		saved[i] = s
	}
	if err := into.Load(saved, n); err != nil {
		return fmt.Errorf("batch extract: loading row %d: %w", r, err)
	}
	return nil
}

// Keep keeps only the rows listed (increasing, no repeats), in that order.
func (b *BatchList) Keep(rows []int) error {
	if b.Tentative() {
		return errUncommitted("keep")
	}
	n := b.Rows()
	for i, r := range rows {
		if r < 0 || r >= n || (i > 0 && r <= rows[i-1]) {
			return fmt.Errorf("batch keep: rows %v are not increasing rows of %d", rows, n)
		}
	}
	for i, l := range b.layers {
		if err := l.Keep(rows); err != nil {
			return fmt.Errorf("batch keep: layer %d: %w", i, err)
		}
	}
	return nil
}

// Leave extracts row r into the empty cache into (nil: discard it, e.g. a cancelled
// request) and removes it from the batch; the rows after it move up by one.
func (b *BatchList) Leave(r int, into Caches) error {
	if b.Tentative() {
		return errUncommitted("leave")
	}
	if into != nil {
		if err := b.Extract(r, into); err != nil {
			return err
		}
	}
	n := b.Rows()
	if r < 0 || r >= n {
		return fmt.Errorf("batch leave: row %d of %d", r, n)
	}
	rest := make([]int, 0, n-1)
	for i := range n {
		if i != r {
			rest = append(rest, i)
		}
	}
	return b.Keep(rest)
}

// Tentative reports whether a tentative step awaits its Commit (all layers take the same
// steps, so any one layer's answer is the batch's).
func (b *BatchList) Tentative() bool {
	for _, l := range b.layers {
		if l.Tentative() {
			return true
		}
	}
	return false
}

// Commit keeps row r's first keep[r] positions of the tentative step in every layer. The
// layers check keep against the same step before changing anything, so a refused commit
// (at layer 0) leaves the batch as it was and the step still tentative.
func (b *BatchList) Commit(keep []int) error {
	if !b.Tentative() {
		return errors.New("batch commit: no tentative step to commit")
	}
	if len(keep) != b.Rows() {
		return fmt.Errorf("batch commit: %d keep counts for %d rows", len(keep), b.Rows())
	}
	for i, l := range b.layers {
		if err := l.Commit(keep); err != nil {
			return fmt.Errorf("batch commit: layer %d: %w", i, err)
		}
	}
	return nil
}

// errUncommitted is a change of the rows refused while a tentative step is pending: its
// positions are written but not counted, and which of them a row keeps is not known yet.
func errUncommitted(op string) error {
	return fmt.Errorf("batch %s: a tentative step is not committed", op)
}

// Arrays lists every layer's buffers, for evaluation after a step.
func (b *BatchList) Arrays() []*mlxc.Array {
	var out []*mlxc.Array
	for _, l := range b.layers {
		out = append(out, l.Arrays()...)
	}
	return out
}

// Bytes is the memory the layers' buffers hold.
func (b *BatchList) Bytes() int64 {
	var n int64
	for _, l := range b.layers {
		n += l.Bytes()
	}
	return n
}

// Free releases every layer; the batch has no rows afterwards.
func (b *BatchList) Free() {
	for _, l := range b.layers {
		l.Free()
	}
}

// CheckLens reports an error unless every layer holds the same rows at the same lengths
// (the batched forward's precondition).
func (b *BatchList) CheckLens() error {
	want := b.Lens()
	for i, l := range b.layers {
		if !slices.Equal(l.Lens(), want) {
			return fmt.Errorf("batch: layer %d holds rows of lengths %v, layer 0 %v", i, l.Lens(), want)
		}
	}
	return nil
}
