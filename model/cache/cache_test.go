package cache

import (
	"errors"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// fakeLayer counts positions only: a stand-in for KV (trimmable, placed) and recurrent
// (neither) layers, to test what the list does with mixed kinds.
type fakeLayer struct {
	offset, base int
	tentative    bool
	reserved     int
}

func (f *fakeLayer) Offset() int           { return f.offset }
func (f *fakeLayer) Arrays() []*mlxc.Array { return nil }
func (f *fakeLayer) Speculate()            { f.base, f.tentative = f.offset, true }
func (f *fakeLayer) Commit(keep []int) error {
	if !f.tentative {
		return errors.New("not speculating")
	}
	f.offset, f.tentative = f.base+len(keep), false
	return nil
}
func (f *fakeLayer) Snapshot() Snapshot { return fakeSnap(f.offset) }
func (f *fakeLayer) Restore(s Snapshot) error {
	f.offset = int(s.(fakeSnap))
	return nil
}
func (f *fakeLayer) Bytes() int64 { return int64(f.offset) }
func (f *fakeLayer) Free()        { f.offset = 0 }

type fakeSnap int

func (fakeSnap) Free() {}

// kvLike adds the capabilities of a KV layer.
type kvLike struct{ fakeLayer }

func (k *kvLike) Trim(n int) int        { k.offset -= n; return n }
func (k *kvLike) Reserve(n int)         { k.reserved = n }
func (k *kvLike) SetOffset(n int) error { k.offset = n; return nil }

// A list of KV-like layers can rewind and run ahead; one with any other layer can do
// neither, and says so without changing a layer; speculate, commit, snapshot and restore
// work for every kind.
func TestListCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name              string
		layers            func() []Layer
		runAhead, rewinds bool
	}{
		{"kv", func() []Layer { return []Layer{&kvLike{}, &kvLike{}} }, true, true},
		{"mixed", func() []Layer { return []Layer{&kvLike{}, &fakeLayer{}, &kvLike{}} }, false, false},
		{"recurrent", func() []Layer { return []Layer{&fakeLayer{}} }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewList(tc.layers()...)
			l.Reserve(64)
			for _, c := range l.Layers() {
				if k, ok := c.(*kvLike); ok && k.reserved != 64 {
					t.Errorf("reserved %d, want 64", k.reserved)
				}
			}
			l.Speculate()
			for _, c := range l.Layers() {
				c.(interface{ add(int) }).add(10)
			}
			if err := l.Commit(Prefix(7)); err != nil || l.Offset() != 7 {
				t.Fatalf("commit: offset %d, %v", l.Offset(), err)
			}
			if got := l.Bytes(); got != int64(7*len(l.Layers())) {
				t.Errorf("bytes %d", got)
			}
			if p := l.RunAhead(); (p != nil) != tc.runAhead {
				t.Errorf("run-ahead capability %v, want %v", p != nil, tc.runAhead)
			} else if p != nil {
				if err := p.SetOffset(5); err != nil || l.Offset() != 5 {
					t.Errorf("set offset: %d, %v", l.Offset(), err)
				}
			}
			before := l.Offset()
			err := l.Rewind(2)
			if (err == nil) != tc.rewinds {
				t.Errorf("rewind error %v, want rewinds %v", err, tc.rewinds)
			}
			for i, c := range l.Layers() {
				want := before
				if tc.rewinds {
					want -= 2
				}
				if c.Offset() != want {
					t.Errorf("layer %d offset %d after rewind, want %d (a refused rewind changes nothing)", i, c.Offset(), want)
				}
			}
			if err := l.Rewind(l.Offset() + 1); err == nil {
				t.Error("rewind past the start accepted")
			}
			at, snap := l.Offset(), l.Snapshot()
			l.Speculate()
			for _, c := range l.Layers() {
				c.(interface{ add(int) }).add(3)
			}
			if err := l.Restore(snap); err != nil || l.Offset() != at {
				t.Errorf("restore: offset %d, %v", l.Offset(), err)
			}
			if err := l.Restore(snap[:0]); err == nil {
				t.Error("restore of another list's snapshot accepted")
			}
		})
	}
}

func (f *fakeLayer) add(n int) { f.offset += n }

// Prefix builds a chain's keep list, and IsPrefix tells it from a tree's path.
func TestPrefix(t *testing.T) {
	for _, tc := range []struct {
		keep   []int
		prefix bool
	}{
		{Prefix(0), true}, {Prefix(3), true}, {[]int{0, 1, 3}, false}, {[]int{1}, false},
	} {
		if got := IsPrefix(tc.keep); got != tc.prefix {
			t.Errorf("IsPrefix(%v) = %v", tc.keep, got)
		}
	}
	if p := Prefix(3); len(p) != 3 || p[2] != 2 {
		t.Errorf("Prefix(3) = %v", p)
	}
}
