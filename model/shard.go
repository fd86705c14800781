package model

import (
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// Shard is this process's part of a tensor-parallel model: rank Rank of Size ranks of
// Group. Each rank holds 1/Size of every split product (heads, MLP columns) and a whole
// copy of the rest (embedding, norms, head); a split product whose input is split ends in
// an all-sum, so every rank leaves each layer with the whole residual stream.
type Shard struct {
	Group      *mlxc.Group
	Rank, Size int
}

// Split reports whether s splits anything (more than one rank).
func (s *Shard) Split() bool { return s != nil && s.Size > 1 }

// Part is this rank's range [lo, hi) of n items split evenly; n must be a multiple of Size
// (SplitOut and SplitIn check it).
func (s *Shard) Part(n int) (lo, hi int) {
	if !s.Split() {
		return 0, n
	}
	per := n / s.Size
	return s.Rank * per, (s.Rank + 1) * per
}

// Local is this rank's count of n items (n on an unsplit model).
func (s *Shard) Local(n int) int {
	lo, hi := s.Part(n)
	return hi - lo
}

// AllSum sums x over the ranks (x itself on an unsplit model).
func (s *Shard) AllSum(x *mlxc.Array) *mlxc.Array {
	if !s.Split() {
		return x
	}
	return mlxc.AllSum(x, s.Group)
}

// Divides checks that n items (what, e.g. "attention heads") split evenly over the ranks.
func (s *Shard) Divides(n int, what string) error {
	if s.Split() && n%s.Size != 0 {
		return fmt.Errorf("%d %s do not split over %d ranks (give a rank count that divides %d)", n, what, s.Size, n)
	}
	return nil
}

// SplitOut takes the Linear at path like Linear and keeps this rank's rows of its output
// (a column-parallel product: no communication; its output is this rank's share of the
// features). Unsplit, it is Linear.
func (b *Builder) SplitOut(path string, out, in int, bias bool) *Linear {
	return b.splitOut(path, []int{out}, in, bias)
}

// SplitOutSegments is SplitOut for a product whose output rows are several tensors one
// after another (segments: their row counts, summing to the output): each segment is
// split, and this rank keeps its part of each, in order (a fused q|k|v projection).
func (b *Builder) SplitOutSegments(path string, segments []int, in int) *Linear {
	return b.splitOut(path, segments, in, false)
}

func (b *Builder) splitOut(path string, segments []int, in int, bias bool) *Linear {
	out := 0
	for _, n := range segments {
		out += n
	}
	l := b.Linear(path, out, in, bias)
	if !b.w.Shard.Split() {
		return l
	}
	b.w.shardTaken = true
	if !b.segmentsSplit(path, segments) {
		return l
	}
	l.W = b.keepSegments(l.W, segments)
	l.Bias = b.keepSegments(l.Bias, segments)
	if l.Q != nil {
		l.Q.W = b.keepSegments(l.Q.W, segments)
		l.Q.Scales = b.keepSegments(l.Q.Scales, segments)
		l.Q.Biases = b.keepSegments(l.Q.Biases, segments)
	}
	return l
}

// FloatSplit takes a float tensor like Float and keeps this rank's part of each of its
// segments along axis 0 (nil segments: the whole first axis is one).
func (b *Builder) FloatSplit(name string, segments []int, shape ...int) *mlxc.Array {
	a := b.Float(name, shape...)
	sh := b.w.Shard
	if !sh.Split() || a == nil {
		return a
	}
	b.w.shardTaken = true
	if segments == nil {
		segments = []int{shape[0]}
	}
	if !b.segmentsSplit(name, segments) {
		return a
	}
	return b.keepSegments(a, segments)
}

func (b *Builder) segmentsSplit(name string, segments []int) bool {
	for _, n := range segments {
		if n%b.w.Shard.Size != 0 {
			b.errf("%s: %d rows do not split over %d ranks", name, n, b.w.Shard.Size)
			return false
		}
	}
	return true
}

// keepSegments replaces a taken tensor by its own copy of this rank's part of each
// segment of its first axis, concatenated in order.
func (b *Builder) keepSegments(a *mlxc.Array, segments []int) *mlxc.Array {
	if a == nil {
		return nil
	}
	if len(segments) == 1 {
		lo, hi := b.w.Shard.Part(segments[0])
		return b.keepPart(a, 0, lo, hi)
	}
	parts := make([]*mlxc.Array, len(segments))
	off := 0
	for i, n := range segments {
		lo, hi := b.w.Shard.Part(n)
		parts[i] = mlxc.SliceAxis(a, 0, off+lo, off+hi)
		off += n
	}
	kept := mlxc.Concatenate(parts, 0).Detach()
	for i, t := range b.taken {
		if t == a {
			b.taken[i] = kept
		}
	}
	a.Free()
	return kept
}

// SplitIn takes the Linear at path like Linear and keeps this rank's columns of its input
// (a row-parallel product: each rank's product is a partial sum, which Apply all-sums).
// A quantized product's columns split at whole quantization groups. Unsplit, it is Linear.
func (b *Builder) SplitIn(path string, out, in int) *Linear {
	l := b.Linear(path, out, in, false)
	sh := b.w.Shard
	if !sh.Split() {
		return l
	}
	b.w.shardTaken = true
	if in%sh.Size != 0 {
		b.errf("%s: %d input columns do not split over %d ranks", path, in, sh.Size)
		return l
	}
	lo, hi := sh.Part(in)
	l.Reduce = sh
	if l.Q == nil {
		l.W = b.keepPart(l.W, 1, lo, hi)
		return l
	}
	q := l.Q
	if per := in / sh.Size; per%q.GroupSize != 0 || (per*q.Bits)%32 != 0 {
		b.errf("%s: %d input columns per rank are not whole %d-wide quantization groups (%d ranks)", path, per, q.GroupSize, sh.Size)
		return l
	}
	q.W = b.keepPart(q.W, 1, lo*q.Bits/32, hi*q.Bits/32)
	q.Scales = b.keepPart(q.Scales, 1, lo/q.GroupSize, hi/q.GroupSize)
	q.Biases = b.keepPart(q.Biases, 1, lo/q.GroupSize, hi/q.GroupSize)
	return l
}

// Shard is the split the Builder's weights are loaded under (nil: none).
func (b *Builder) Shard() *Shard { return b.w.Shard }

// KeepPart is keepPart for a family's own modules (stacked experts it adopted): a taken or
// adopted array is replaced by this rank's own copy of [lo, hi) along axis, and the model
// counts as split.
func (b *Builder) KeepPart(a *mlxc.Array, axis, lo, hi int) *mlxc.Array {
	b.w.shardTaken = true
	return b.keepPart(a, axis, lo, hi)
}

// keepPart replaces a taken tensor by its own copy of [lo, hi) along axis, so that the
// whole tensor's memory goes once the model is evaluated (a slice alone would be a view
// that keeps it). nil stays nil.
func (b *Builder) keepPart(a *mlxc.Array, axis, lo, hi int) *mlxc.Array {
	if a == nil {
		return nil
	}
	part := cache.OwnCopy(mlxc.SliceAxis(a, axis, lo, hi)).Detach()
	for i, t := range b.taken {
		if t == a {
			b.taken[i] = part
		}
	}
	a.Free()
	return part
}
