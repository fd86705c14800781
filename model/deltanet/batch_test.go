package deltanet

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// soloRow is a sequence run alone through a single-sequence cache: its stream and the
// positions it has taken.
type soloRow struct {
	c      *Cache
	s      stream
	offset int
}

// A batched layer whose rows joined from single-sequence caches of different lengths (an
// empty one too), stepped together with some rows held, then filtered and joined again,
// gives each live row the output of that row's own step, keeps a held row's state and
// tail bit for bit, and extracts every row to its single-sequence cache, bit for bit.
func TestBatchCacheMatchesSolo(t *testing.T) {
	g := geometry{1, 1, 2, 4, 32, 32, 4}
	do(t, func() {
		r := newRNG(900)
		m := mixerFor(r, g)
		b := NewBatchCache()
		defer b.Free()
		var solos []*soloRow
		join := func(prefill int) {
			row := &soloRow{c: NewCache(), s: newStream(r, g, prefill+12)}
			if prefill > 0 {
				m.apply(row.s.rows(0, prefill), row.c, nil)
			}
			row.offset = prefill
			saved, err := row.c.Save(prefill)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Join(saved); err != nil {
				t.Fatalf("join a row of %d: %v", prefill, err)
			}
			saved.Free()
			solos = append(solos, row)
		}
		check := func(what string) {
			t.Helper()
			for i, row := range solos {
				s, err := b.Extract(i)
				if err != nil {
					t.Fatalf("%s: extract row %d: %v", what, i, err)
				}
				got := NewCache()
				if err := got.Load(s, s.Offset); err != nil {
					t.Fatalf("%s: load row %d: %v", what, i, err)
				}
				sameCache(t, fmt.Sprintf("%s: row %d", what, i), got, row.c)
				got.Free()
				s.Free()
			}
		}
		step := func(live []bool) {
			t.Helper()
			var qkv, a, bb []*mlxc.Array
			for _, row := range solos {
				one := row.s.rows(row.offset, row.offset+1)
				qkv, a, bb = append(qkv, one.qkv), append(a, one.a), append(bb, one.b)
			}
			var counts []int
			if live != nil {
				counts = make([]int, len(live))
				for i, l := range live {
					if l {
						counts[i] = 1
					}
				}
			}
			y := m.ApplyRows(mlxc.Concatenate(qkv, 0), mlxc.Concatenate(a, 0), mlxc.Concatenate(bb, 0), b, counts, false)
			mlxc.Eval(append(b.Arrays(), y)...)
			for i, row := range solos {
				if live != nil && !live[i] {
					continue
				}
				want := m.apply(row.s.rows(row.offset, row.offset+1), row.c, nil)
				row.offset++
				same(t, fmt.Sprintf("row %d's output at %d", i, row.offset), mlxc.SliceAxis(y, 0, i, i+1), want)
			}
		}
		for _, n := range []int{3, 0, 9, 1} {
			join(n)
		}
		check("after the joins")
		step(nil)
		step([]bool{true, false, true, false})
		check("after a held step")
		if err := b.Keep([]int{0, 2, 3}); err != nil {
			t.Fatal(err)
		}
		solos = []*soloRow{solos[0], solos[2], solos[3]}
		check("after a leave")
		join(5)
		step([]bool{false, true, true, true})
		step(nil)
		check("after a join and two steps")
		if got, want := b.Lens(), []int{6, 13, 4, 7}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("lengths %v, want %v", got, want)
		}
		for _, row := range solos {
			row.c.Free()
		}
		if err := b.Join(cache.Saved{Kind: "kv", Offset: 1}); err == nil {
			t.Error("a KV layer's state joined a recurrent batch")
		}
	})
}

// A batched layer stepping blocks of T positions in which each row takes its own count
// (0, 1, some, all): a tentative step gives each row the outputs of its block run alone
// after Speculate, and Commit of per-row keeps leaves each row's state and tail those of
// its single cache after Commit(Prefix(keep)) (a per-row replay); a counted step leaves
// each row after its count; rows of width 0 keep their state bit for bit. Changes and
// steps are refused until the commit, and a commit without a tentative step or past a
// row's count is refused.
func TestBatchCacheVerifyMatchesSolo(t *testing.T) {
	g := geometry{1, 1, 2, 4, 32, 32, 4}
	const T = 4
	do(t, func() {
		r := newRNG(905)
		m := mixerFor(r, g)
		b := NewBatchCache()
		defer b.Free()
		var solos []*soloRow
		for _, prefill := range []int{3, 0, 9, 1} {
			row := &soloRow{c: NewCache(), s: newStream(r, g, prefill+4*T)}
			if prefill > 0 {
				m.apply(row.s.rows(0, prefill), row.c, nil)
			}
			row.offset = prefill
			saved, err := row.c.Save(prefill)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Join(saved); err != nil {
				t.Fatal(err)
			}
			saved.Free()
			defer row.c.Free()
			solos = append(solos, row)
		}
		check := func(what string) {
			t.Helper()
			for i, row := range solos {
				s, err := b.Extract(i)
				if err != nil {
					t.Fatalf("%s: extract row %d: %v", what, i, err)
				}
				got := NewCache()
				if err := got.Load(s, s.Offset); err != nil {
					t.Fatalf("%s: load row %d: %v", what, i, err)
				}
				if gt, _ := got.State(); gt == nil && row.offset == 0 {
					// No state yet either way: the solo cache of an empty row that kept none of
					// a block holds zeros, the batch none.
				} else {
					sameCache(t, fmt.Sprintf("%s: row %d", what, i), got, row.c)
				}
				got.Free()
				s.Free()
			}
		}
		// step runs a block of T positions per row, row i taking counts[i]; keep nil: a
		// counted step, else a tentative one committed to keep.
		step := func(what string, counts, keep []int) {
			t.Helper()
			var qkv, a, bb []*mlxc.Array
			for i, row := range solos {
				// Positions past the row's count are padding: any rows of the right shape.
				blk := row.s.rows(row.offset, row.offset+T)
				if counts[i] < T {
					blk = row.s.rows(0, T)
					if counts[i] > 0 {
						pad := row.s.rows(0, T-counts[i])
						own := row.s.rows(row.offset, row.offset+counts[i])
						blk = stream{mlxc.Concatenate([]*mlxc.Array{own.qkv, pad.qkv}, 1), mlxc.Concatenate([]*mlxc.Array{own.a, pad.a}, 1), mlxc.Concatenate([]*mlxc.Array{own.b, pad.b}, 1)}
					}
				}
				qkv, a, bb = append(qkv, blk.qkv), append(a, blk.a), append(bb, blk.b)
			}
			y := m.ApplyRows(mlxc.Concatenate(qkv, 0), mlxc.Concatenate(a, 0), mlxc.Concatenate(bb, 0), b, counts, keep != nil)
			mlxc.Eval(append(b.Arrays(), y)...)
			if keep != nil {
				if !b.Tentative() {
					t.Fatalf("%s: the tentative step is not pending", what)
				}
				if _, err := b.Extract(0); err == nil {
					t.Errorf("%s: extract during a tentative step", what)
				}
				if err := b.Keep([]int{0}); err == nil {
					t.Errorf("%s: keep during a tentative step", what)
				}
				if err := mlxc.Catch(func() {
					m.ApplyRows(mlxc.Concatenate(qkv, 0), mlxc.Concatenate(a, 0), mlxc.Concatenate(bb, 0), b, counts, false)
				}); err == nil {
					t.Errorf("%s: a step during a tentative step", what)
				}
				over := append([]int(nil), counts...)
				over[0]++
				if err := b.Commit(over); err == nil || !strings.Contains(err.Error(), "cannot keep") {
					t.Errorf("%s: commit past row 0's count: error %v", what, err)
				}
			}
			for i, row := range solos {
				n := counts[i]
				if n == 0 {
					continue
				}
				if keep != nil {
					row.c.Speculate()
				}
				want := m.apply(row.s.rows(row.offset, row.offset+n), row.c, nil)
				same(t, fmt.Sprintf("%s: row %d's outputs", what, i), mlxc.SliceAxis(mlxc.SliceAxis(y, 0, i, i+1), 1, 0, n), want)
				if keep != nil {
					n = keep[i]
					if err := row.c.Commit(cache.Prefix(n)); err != nil {
						t.Fatal(err)
					}
				}
				row.offset += n
			}
			if keep != nil {
				if err := b.Commit(keep); err != nil {
					t.Fatalf("%s: commit %v: %v", what, keep, err)
				}
				mlxc.Eval(b.Arrays()...)
			}
			for i, row := range solos {
				if b.Lens()[i] != row.offset {
					t.Errorf("%s: row %d has length %d, want %d", what, i, b.Lens()[i], row.offset)
				}
			}
			check(what)
		}
		if err := b.Commit([]int{0, 0, 0, 0}); err == nil || !strings.Contains(err.Error(), "without a tentative step") {
			t.Errorf("commit without a tentative step: error %v", err)
		}
		step("verify, keeping some", []int{4, 1, 0, 3}, []int{2, 1, 0, 0})
		step("verify, keeping all", []int{4, 4, 4, 4}, []int{4, 4, 4, 4})
		step("verify, keeping none or all", []int{4, 2, 4, 0}, []int{0, 2, 4, 0})
		step("counted", []int{2, 4, 0, 1}, nil)
		step("verify, keeping the widths", []int{3, 1, 4, 2}, []int{3, 1, 4, 2})
	})
}
