package deltanet

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// The tape reproduces the recurrence: RecurrenceTape's outputs are Recurrence's, and
// replaying n steps from the start state (host count or device count) is the state the
// recurrence reaches over the first n rows, for every n.
func TestTapeReplay(t *testing.T) {
	for i, g := range []geometry{
		{1, 16, 2, 2, 32, 32, 4},
		{1, 16, 2, 4, 64, 64, 4},
		{2, 5, 1, 2, 32, 64, 4},
	} {
		t.Run(g.String(), func(t *testing.T) {
			do(t, func() {
				x := inputs(newRNG(uint64(200+i)), g)
				gate, beta := Gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
				q, k, v, s0 := x["q"], x["k"], x["v"], x["state"]
				y, st := Recurrence(q, k, v, gate, beta, s0)
				ty, tst, tape := RecurrenceTape(q, k, v, gate, beta, s0)
				same(t, "tape y", ty, y)
				same(t, "tape state", tst, st)
				if tape.Steps() != g.T {
					t.Errorf("tape holds %d steps, want %d", tape.Steps(), g.T)
				}
				for n := 0; n <= g.T; n++ {
					_, want := Recurrence(rows(q, 0, n), rows(k, 0, n), rows(v, 0, n), rows(gate, 0, n), rows(beta, 0, n), s0)
					same(t, fmt.Sprintf("replay %d", n), Replay(s0, tape, n), want)
					same(t, fmt.Sprintf("replay at %d", n), ReplayAt(s0, tape, mlxc.FromSlice([]int32{int32(n)}, 1)), want)
				}
				// A count past the tape applies every step.
				same(t, "replay at T+3", ReplayAt(s0, tape, mlxc.FromSlice([]int32{int32(g.T + 3)}, 1)), st)
			})
		})
	}
}

// ReplayAt with one count per row (int32 [B]) replays row b through its own count,
// clamped to 0..T: row b's state is Replay of row b's tape alone, bit for bit; a count
// of any other length is refused.
func TestReplayAtPerRow(t *testing.T) {
	g := geometry{4, 5, 1, 2, 32, 64, 4}
	do(t, func() {
		x := inputs(newRNG(210), g)
		gate, beta := Gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
		s0 := x["state"]
		_, _, tape := RecurrenceTape(x["q"], x["k"], x["v"], gate, beta, s0)
		for _, counts := range [][]int32{{0, 5, 2, 1}, {-1, 8, 3, 0}, {5, 5, 5, 5}, {4, 0, 0, 4}} {
			got := ReplayAt(s0, tape, mlxc.FromSlice(counts, g.B))
			for b, n := range counts {
				row := func(x *mlxc.Array) *mlxc.Array { return mlxc.SliceAxis(x, 0, b, b+1) }
				rt := Tape{Delta: row(tape.Delta), K: row(tape.K), G: row(tape.G)}
				want := Replay(row(s0), rt, min(max(int(n), 0), g.T))
				same(t, fmt.Sprintf("counts %v: row %d", counts, b), row(got), want)
			}
		}
		err := mlxc.Catch(func() { ReplayAt(s0, tape, mlxc.FromSlice([]int32{1, 2}, 2)) })
		if err == nil || !strings.Contains(err.Error(), "count must hold 1 or 4") {
			t.Errorf("two counts for four rows: error %v", err)
		}
	})
}

// mixerFor makes a mixer with random weights of geometry g.
func mixerFor(r *rng, g geometry) *Mixer {
	x := inputs(r, g)
	return &Mixer{ConvW: x["conv_w"], ALog: x["A_log"], DtBias: x["dt_bias"],
		KeyHeads: g.Hk, ValueHeads: g.Hv, KeyDim: g.Dk, ValueDim: g.Dv, ConvKernel: g.K}
}

// stream is a run of raw projection rows qkv [1, L, C], a, b [1, L, Hv].
type stream struct{ qkv, a, b *mlxc.Array }

func newStream(r *rng, g geometry, L int) stream {
	return stream{
		qkv: r.normal(mlxc.BFloat16, 1, 1, L, g.C()),
		a:   r.normal(mlxc.BFloat16, 1, 1, L, g.Hv),
		b:   r.normal(mlxc.BFloat16, 1, 1, L, g.Hv),
	}
}

func (s stream) rows(from, to int) stream {
	return stream{rows(s.qkv, from, to), rows(s.a, from, to), rows(s.b, from, to)}
}

func (m *Mixer) apply(s stream, c *Cache, pos *mlxc.Array) *mlxc.Array {
	y := m.Apply(s.qkv, s.a, s.b, c, pos)
	mlxc.Eval(append(c.Arrays(), y)...)
	return y
}

// sameCache compares the committed tail, state and offset of two caches.
func sameCache(t *testing.T, what string, got, want *Cache) {
	t.Helper()
	gt, gs := got.State()
	wt, ws := want.State()
	same(t, what+": tail", gt, wt)
	same(t, what+": state", gs, ws)
	if got.Offset() != want.Offset() {
		t.Errorf("%s: offset %d, want %d", what, got.Offset(), want.Offset())
	}
}

var rollbackGeometry = geometry{1, 16, 2, 4, 32, 32, 4}

// A speculative block of 16 rows committed to any prefix n leaves the layer as a fresh
// cache that took only the committed rows (the prefill in the same chunks, then n rows),
// bit for bit, and so does a second block after it; the kept rows' outputs are the fresh
// run's too.
func TestCommitMatchesFresh(t *testing.T) {
	g := rollbackGeometry
	for n := 0; n <= g.T; n++ {
		t.Run(fmt.Sprintf("keep-%d", n), func(t *testing.T) {
			do(t, func() {
				r := newRNG(300)
				m := mixerFor(r, g)
				prefill := newStream(r, g, 7)
				block := newStream(r, g, g.T)
				block2 := newStream(r, g, g.T)
				spec, fresh := NewCache(), NewCache()
				defer spec.Free()
				defer fresh.Free()
				for _, c := range []*Cache{spec, fresh} {
					m.apply(prefill.rows(0, 4), c, nil)
					m.apply(prefill.rows(4, 7), c, nil)
				}
				spec.Speculate()
				y := m.apply(block, spec, nil)
				if spec.Offset() != 7+g.T {
					t.Errorf("offset while tentative %d, want %d", spec.Offset(), 7+g.T)
				}
				if err := spec.Commit(cache.Prefix(n)); err != nil {
					t.Errorf("commit %d: %v", n, err)
					return
				}
				if n > 0 {
					fy := m.apply(block.rows(0, n), fresh, nil)
					same(t, "kept rows' output", rows(y, 0, n), fy)
				}
				sameCache(t, "after the block", spec, fresh)

				keep2 := (n*5 + 3) % (g.T + 1)
				spec.Speculate()
				m.apply(block2, spec, nil)
				if err := spec.Commit(cache.Prefix(keep2)); err != nil {
					t.Errorf("commit %d: %v", keep2, err)
					return
				}
				if keep2 > 0 {
					m.apply(block2.rows(0, keep2), fresh, nil)
				}
				sameCache(t, fmt.Sprintf("after a second block keeping %d", keep2), spec, fresh)
			})
		})
	}
}

// Two tentative forwards between Speculate and Commit are one tape: any prefix of their
// rows can be kept.
func TestCommitAcrossTwoForwards(t *testing.T) {
	g := rollbackGeometry
	do(t, func() {
		r := newRNG(310)
		m := mixerFor(r, g)
		prefill, block := newStream(r, g, 5), newStream(r, g, 9)
		for _, n := range []int{0, 2, 4, 6, 9} {
			spec, fresh := NewCache(), NewCache()
			m.apply(prefill, spec, nil)
			m.apply(prefill, fresh, nil)
			spec.Speculate()
			m.apply(block.rows(0, 4), spec, nil)
			m.apply(block.rows(4, 9), spec, nil)
			if err := spec.Commit(cache.Prefix(n)); err != nil {
				t.Errorf("commit %d: %v", n, err)
			}
			if n > 0 {
				m.apply(block.rows(0, n), fresh, nil)
			}
			sameCache(t, fmt.Sprintf("keep %d of 4+5", n), spec, fresh)
			spec.Free()
			fresh.Free()
		}
	})
}

// aheadStep is one cycle of a scripted run-ahead run: the rows its block keeps (1 to
// T: the accepted drafts and the token after them) and whether the next block is built
// before this one is read (the loop's steady state) or after (near the token budget).
type aheadStep struct {
	keep  int
	ahead bool
}

// The run-ahead loop's order of calls: blocks placed at device positions computed from the
// previous block's device count, SetOffset of block c after block c+1 was placed (or
// before, near the end), with counts from none kept but the first row to all of them. The
// committed state after every SetOffset, the kept rows' outputs and a serial forward after
// the run are those of a fresh cache that took only the committed rows.
func TestPlacedMatchesFresh(t *testing.T) {
	g := rollbackGeometry
	scripts := map[string][]aheadStep{
		"steady": {{4, true}, {1, true}, {16, true}, {8, true}, {16, true}, {1, true}, {3, false}},
		"late":   {{2, false}, {16, false}, {1, false}, {9, false}},
		"mixed":  {{16, true}, {16, false}, {5, true}, {1, false}, {1, true}, {12, true}, {7, false}},
	}
	for name, script := range scripts {
		t.Run(name, func(t *testing.T) {
			do(t, func() { runPlaced(t, g, script) })
		})
	}
}

func runPlaced(t *testing.T, g geometry, script []aheadStep) {
	r := newRNG(400)
	m := mixerFor(r, g)
	placed, fresh := NewCache(), NewCache()
	defer placed.Free()
	defer fresh.Free()
	prefill := newStream(r, g, 6)
	for _, c := range []*Cache{placed, fresh} {
		m.apply(prefill.rows(0, 5), c, nil)
		m.apply(prefill.rows(5, 6), c, nil) // the last prompt row alone, as the loop's first cycle
	}
	blocks := make([]stream, len(script))
	ys := make([]*mlxc.Array, len(script))
	for i := range blocks {
		blocks[i] = newStream(r, g, g.T)
	}
	// hostPos is each block's first position as the host learns it; devPos the device value.
	hostPos := make([]int, len(script))
	devPos := make([]*mlxc.Array, len(script))
	place := func(c int, pos *mlxc.Array) {
		devPos[c] = pos
		before := placed.Offset()
		ys[c] = m.apply(blocks[c], placed, pos)
		if placed.Offset() != before {
			t.Errorf("block %d: a placed forward moved the offset from %d to %d", c, before, placed.Offset())
		}
	}
	next := func(c int) *mlxc.Array { // block c+1's position: block c's start plus its device count
		return mlxc.Add(devPos[c], mlxc.FromSlice([]int32{int32(script[c].keep)}, 1))
	}
	hostPos[0] = placed.Offset()
	place(0, mlxc.FromSlice([]int32{int32(hostPos[0])}, 1))
	for c, st := range script {
		last := c+1 == len(script)
		if st.ahead && !last {
			place(c+1, next(c))
		}
		end := hostPos[c] + st.keep
		if err := placed.SetOffset(end); err != nil {
			t.Fatalf("block %d: set offset %d: %v", c, end, err)
		}
		fy := m.apply(blocks[c].rows(0, st.keep), fresh, nil)
		same(t, fmt.Sprintf("block %d: kept rows' output", c), rows(ys[c], 0, st.keep), fy)
		sameCache(t, fmt.Sprintf("block %d: committed state", c), placed, fresh)
		if !last {
			hostPos[c+1] = end
			if !st.ahead {
				place(c+1, next(c))
			}
		}
	}
	after := newStream(r, g, 3)
	m.apply(after, placed, nil)
	m.apply(after, fresh, nil)
	sameCache(t, "a serial forward after the run", placed, fresh)
}

// twoCachesAfter makes a mixer of random weights (seeded) and two caches that took the same
// first n rows.
func twoCachesAfter(seed uint64, g geometry, n int) (*rng, *Mixer, *Cache, *Cache) {
	r := newRNG(seed)
	m := mixerFor(r, g)
	c, ref := NewCache(), NewCache()
	pre := newStream(r, g, n)
	m.apply(pre, c, nil)
	m.apply(pre, ref, nil)
	return r, m, c, ref
}

// Snapshot and Restore return the layer to an earlier state exactly, whatever happened in
// between (plain forwards, a speculation).
func TestSnapshotRestore(t *testing.T) {
	g := rollbackGeometry
	do(t, func() {
		r, m, c, ref := twoCachesAfter(500, g, 6)
		defer c.Free()
		defer ref.Free()
		snap := c.Snapshot()
		defer snap.Free()
		m.apply(newStream(r, g, 4), c, nil)
		c.Speculate()
		m.apply(newStream(r, g, 5), c, nil)
		if err := c.Restore(snap); err != nil {
			t.Errorf("restore: %v", err)
		}
		sameCache(t, "restored", c, ref)
		if err := c.Commit(nil); err == nil {
			t.Error("a restore ended the speculation, yet Commit accepted")
		}
		next := newStream(r, g, 2)
		m.apply(next, c, nil)
		m.apply(next, ref, nil)
		sameCache(t, "a forward after the restore", c, ref)
		if c.Bytes() <= 0 {
			t.Errorf("Bytes %d for a live cache", c.Bytes())
		}
		empty := NewCache()
		es := empty.Snapshot()
		if err := c.Restore(es); err != nil || c.Offset() != 0 {
			t.Errorf("restore to empty: %v, offset %d", err, c.Offset())
		}
		if tl, st := c.State(); tl != nil || st != nil {
			t.Error("restoring an empty snapshot kept buffers")
		}
		es.Free()
	})
}

// A saved state resumes an empty layer exactly where it was saved: run on, the loaded layer
// equals the one that never stopped, bit for bit, though the saving layer ran on with other
// rows meanwhile. A recurrent state is saved and loaded only at its own offset, never
// during a speculation, and only into an empty layer.
func TestSaveLoad(t *testing.T) {
	g := rollbackGeometry
	do(t, func() {
		r, m, c, ref := twoCachesAfter(600, g, 6)
		defer c.Free()
		defer ref.Free()
		saved, err := c.Save(6)
		if err != nil {
			t.Fatal(err)
		}
		defer saved.Free()
		if saved.Trimmable || saved.Offset != 6 || saved.Kind != recurrentKind {
			t.Errorf("saved %+v", saved)
		}
		m.apply(newStream(r, g, 4), c, nil) // the saving layer moves on
		loaded := NewCache()
		defer loaded.Free()
		if err := loaded.Load(saved, 6); err != nil {
			t.Fatal(err)
		}
		sameCache(t, "loaded", loaded, ref)
		next := newStream(r, g, 3)
		m.apply(next, loaded, nil)
		m.apply(next, ref, nil)
		sameCache(t, "loaded and run on", loaded, ref)

		for _, bad := range []struct {
			what string
			err  func() error
		}{
			{"save before the offset", func() error { _, err := c.Save(c.Offset() - 1); return err }},
			{"load before the saved offset", func() error { x := NewCache(); defer x.Free(); return x.Load(saved, 5) }},
			{"load into a layer that holds a state", func() error { return loaded.Load(saved, 6) }},
			{"load of a KV state", func() error {
				x := NewCache()
				defer x.Free()
				return x.Load(cache.Saved{Kind: "kv", Offset: 6, Trimmable: true}, 6)
			}},
			{"save during a speculation", func() error {
				c.Speculate()
				defer c.Commit(nil)
				_, err := c.Save(c.Offset())
				return err
			}},
		} {
			if bad.err() == nil {
				t.Errorf("%s accepted", bad.what)
			}
		}
	})
}

// Misuse gives a clear error (Commit, SetOffset) or an *mlxc.Error panic (shapes, as the
// rest of the model code reports them), never a silently wrong state.
func TestErrors(t *testing.T) {
	g := rollbackGeometry
	do(t, func() {
		r := newRNG(600)
		m := mixerFor(r, g)
		c := NewCache()
		defer c.Free()
		s := newStream(r, g, 4)
		if err := c.Commit(nil); err == nil || !strings.Contains(err.Error(), "without speculate") {
			t.Errorf("commit without speculate: %v", err)
		}
		m.apply(s, c, nil)
		c.Speculate()
		m.apply(s, c, nil)
		for _, keep := range [][]int{{1, 2}, {0, 2}, {0, 1, 3}} {
			if err := c.Commit(keep); err == nil || !strings.Contains(err.Error(), "prefix") {
				t.Errorf("commit %v: %v", keep, err)
			}
		}
		if err := c.Commit(cache.Prefix(5)); err == nil {
			t.Error("kept 5 of 4 tentative rows")
		}
		if err := c.Commit(cache.Prefix(4)); err != nil {
			t.Errorf("a full commit after refusals: %v", err)
		}
		if c.Offset() != 8 {
			t.Errorf("offset %d, want 8", c.Offset())
		}
		if err := c.SetOffset(9); err == nil {
			t.Error("set offset with nothing placed")
		}
		m.apply(s, c, mlxc.FromSlice([]int32{8}, 1))
		if err := c.SetOffset(13); err == nil {
			t.Error("set offset past the placed block")
		}
		if err := c.SetOffset(7); err == nil {
			t.Error("set offset below the committed offset")
		}

		shapeErr := func(what string, fn func()) {
			err := mlxc.Catch(fn)
			var me *mlxc.Error
			if !errors.As(err, &me) || !strings.Contains(me.Msg, "must be") {
				t.Errorf("%s: want an *mlxc.Error about the shape, got %v", what, err)
			}
		}
		wrongC := &Mixer{ConvW: mlxc.Zeros([]int{g.C() + 1, g.K, 1}, mlxc.BFloat16), ALog: m.ALog, DtBias: m.DtBias,
			KeyHeads: g.Hk, ValueHeads: g.Hv, KeyDim: g.Dk, ValueDim: g.Dv, ConvKernel: g.K}
		shapeErr("conv weight of another channel count", func() { wrongC.Apply(s.qkv, s.a, s.b, NewCache(), nil) })
		shapeErr("qkv of another width", func() {
			m.Apply(mlxc.Zeros([]int{1, 4, g.C() - 2}, mlxc.BFloat16), s.a, s.b, NewCache(), nil)
		})
		shapeErr("a of another head count", func() { m.Apply(s.qkv, rows(s.qkv, 0, 4), s.b, NewCache(), nil) })
		shapeErr("conv tail of another width", func() {
			CausalConv(s.qkv, mlxc.Zeros([]int{1, 2, g.C()}, mlxc.BFloat16), m.ConvW)
		})
		shapeErr("recurrence state of another shape", func() {
			x := inputs(r, geometry{1, 2, 2, 4, 32, 32, 4})
			Recurrence(x["q"], x["k"], x["v"], x["a"], x["b"], mlxc.Zeros([]int{1, 4, 32, 16}, mlxc.Float32))
		})
		c.Speculate()
		if err := mlxc.Catch(func() { m.Apply(s.qkv, s.a, s.b, c, mlxc.FromSlice([]int32{8}, 1)) }); err == nil {
			t.Error("a placed forward while speculating")
		}
	})
}
