package deltanet

import (
	"fmt"
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
