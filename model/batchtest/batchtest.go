// Package batchtest checks a family's batched decode step (model.BatchModel) against the
// same sequences decoded alone: rows of different prompt lengths join and leave a running
// batch, and every row's logits at every step, and its state when it leaves, must equal
// its solo run's. The families' tests run it on tiny random checkpoints.
package batchtest

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// Row is one sequence of a scenario: its prompt, the step before which it joins the
// batch, and the step after which it leaves (-1: it stays to the end).
type Row struct {
	Prompt      []int32
	Join, Leave int
}

// Scenario is a run of Steps batched steps over rows that join and leave; Hold[s] lists
// the rows (indices into Rows) that step s holds (model.BatchOptions.Live).
type Scenario struct {
	Name   string
	Rows   []Row
	Steps  int
	Hold   map[int][]int
	Padded bool // model.BatchOptions.PaddedKeys
}

// solo is one row decoded alone: its logits and state after each of its steps.
type solo struct {
	logits [][]float32     // step k's logits
	saved  [][]cache.Saved // the cache saved after step k
}

func (s *solo) free() {
	for _, sv := range s.saved {
		cache.FreeSaved(sv)
	}
}

// prefill makes a single-sequence cache holding all but the prompt's last token, as the
// engine prefills a prompt (one forward, no logits).
func prefill(m model.Model, prompt []int32) model.Cache {
	c := m.NewCache()
	if n := len(prompt) - 1; n > 0 {
		m.Forward(mlxc.FromSlice(prompt[:n], 1, n), c, model.ForwardOptions{Logits: model.LogitsNone})
		mlxc.Eval(c.Arrays()...)
	}
	return c
}

// argmax is the greedy token of logits.
func argmax(logits []float32) int32 {
	best := 0
	for i, x := range logits {
		if x > logits[best] {
			best = i
		}
	}
	return int32(best)
}

// decodeSolo decodes prompt alone for n greedy steps, keeping every step's logits and
// the cache's state after it. MLX thread only.
func decodeSolo(m model.Model, prompt []int32, n int) *solo {
	s := &solo{}
	c := prefill(m, prompt)
	defer c.Free()
	tok := prompt[len(prompt)-1]
	for range n {
		sc := mlxc.NewScope()
		o := m.Forward(mlxc.FromSlice([]int32{tok}, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
		lg := mlxc.AsType(mlxc.Reshape(o.Logits, -1), mlxc.Float32)
		mlxc.Eval(append(c.Arrays(), lg)...)
		logits := lg.Float32s()
		saved, err := c.Save(c.Offset())
		if err != nil {
			panic(err)
		}
		mlxc.Eval(cache.SavedArrays(saved)...)
		sc.Close()
		s.logits = append(s.logits, logits)
		s.saved = append(s.saved, saved)
		tok = argmax(logits)
	}
	return s
}

// active is a row in the batch: its scenario index and steps taken.
type active struct {
	id, steps int
	next      int32
}

// Run runs the scenario on m and fails t on the first row whose logits or state differ
// from its solo run's: bit for bit, or within tol of the largest magnitude (tol 0:
// exact). It returns the largest logit difference seen relative to that magnitude. A
// row's next token is its solo run's, so rows stay comparable when a near-tie flips.
func Run(t *testing.T, m model.BatchModel, sc Scenario, tol float64) float64 {
	t.Helper()
	var worst float64
	err := mlxc.Do(func() error {
		var err error
		worst, err = run(m, sc, tol)
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", sc.Name, err)
	}
	return worst
}

func run(m model.BatchModel, sc Scenario, tol float64) (float64, error) {
	solos := make([]*solo, len(sc.Rows))
	for i, r := range sc.Rows {
		end := sc.Steps
		if r.Leave >= 0 {
			end = r.Leave + 1
		}
		solos[i] = decodeSolo(m, r.Prompt, end-r.Join+2) // two more: a left row continues alone
		defer solos[i].free()
	}
	b := m.NewBatch()
	defer b.Free()
	var rows []active
	worst := 0.0
	for step := range sc.Steps {
		for i, r := range sc.Rows {
			if r.Join != step {
				continue
			}
			c := prefill(m, r.Prompt)
			at, err := b.Join(c)
			c.Free()
			if err != nil {
				return worst, fmt.Errorf("row %d joining at step %d: %w", i, step, err)
			}
			if at != len(rows) {
				return worst, fmt.Errorf("row %d joined as batch row %d, want %d", i, at, len(rows))
			}
			rows = append(rows, active{id: i, next: r.Prompt[len(r.Prompt)-1]})
		}
		if len(rows) == 0 {
			continue
		}
		d, err := batchStep(m, b, sc, step, rows, solos, tol)
		worst = max(worst, d)
		if err != nil {
			return worst, err
		}
		for j := 0; j < len(rows); j++ {
			a := rows[j]
			if sc.Rows[a.id].Leave != step {
				continue
			}
			if err := leave(m, b, j, a, solos[a.id], tol); err != nil {
				return worst, fmt.Errorf("row %d leaving after step %d: %w", a.id, step, err)
			}
			rows = slices.Delete(rows, j, j+1)
			j--
		}
	}
	for j, a := range rows {
		into := m.NewCache()
		err := b.Extract(j, into)
		if err == nil {
			err = sameState(into, solos[a.id].saved[a.steps-1], tol)
		}
		into.Free()
		if err != nil {
			return worst, fmt.Errorf("row %d extracted at the end: %w", a.id, err)
		}
	}
	return worst, nil
}

// batchStep runs one batched step and checks every live row's logits against its solo
// run's at the same step of that row.
func batchStep(m model.BatchModel, b cache.Batch, sc Scenario, step int, rows []active, solos []*solo, tol float64) (float64, error) {
	s := mlxc.NewScope()
	defer s.Close()
	B := len(rows)
	ids := make([]int32, B)
	live := make([]bool, B)
	for j, a := range rows {
		ids[j], live[j] = a.next, !slices.Contains(sc.Hold[step], a.id)
	}
	opt := model.BatchOptions{PaddedKeys: sc.Padded}
	if slices.Contains(live, false) {
		opt.Live = live
	}
	lens := slices.Clone(b.Lens())
	o := m.ForwardBatch(mlxc.FromSlice(ids, B, 1), b, opt)
	lg := mlxc.AsType(o.Logits, mlxc.Float32)
	mlxc.Eval(append(b.Arrays(), lg)...)
	if sh := lg.Shape(); len(sh) != 3 || sh[0] != B || sh[1] != 1 {
		return 0, fmt.Errorf("step %d: logits %v, want [%d, 1, V]", step, sh, B)
	}
	all := lg.Float32s()
	V := len(all) / B
	worst := 0.0
	for j := range rows {
		a := &rows[j]
		want := lens[j]
		if live[j] {
			want++
		}
		if got := b.Lens()[j]; got != want {
			return worst, fmt.Errorf("step %d: row %d has length %d, want %d", step, a.id, got, want)
		}
		if !live[j] {
			continue
		}
		got := all[j*V : (j+1)*V]
		ref := solos[a.id].logits[a.steps]
		d := relDiff(got, ref)
		worst = max(worst, d)
		if d > tol {
			return worst, fmt.Errorf("step %d: row %d (prompt of %d, its step %d) logits differ from the row alone by %.3g of the largest magnitude",
				step, a.id, len(sc.Rows[a.id].Prompt), a.steps, d)
		}
		a.next = argmax(ref)
		a.steps++
	}
	return worst, nil
}

// leave extracts batch row j into a fresh cache, removes it, checks the state against
// the solo run's after as many steps, and decodes two more steps alone from it.
func leave(m model.BatchModel, b cache.Batch, j int, a active, s *solo, tol float64) error {
	into := m.NewCache()
	defer into.Free()
	if err := b.Leave(j, into); err != nil {
		return err
	}
	if err := sameState(into, s.saved[a.steps-1], tol); err != nil {
		return err
	}
	tok := a.next
	for k := a.steps; k < a.steps+2; k++ {
		sc := mlxc.NewScope()
		o := m.Forward(mlxc.FromSlice([]int32{tok}, 1, 1), into, model.ForwardOptions{Logits: model.LogitsLast})
		lg := mlxc.AsType(mlxc.Reshape(o.Logits, -1), mlxc.Float32)
		mlxc.Eval(append(into.Arrays(), lg)...)
		got := lg.Float32s()
		sc.Close()
		if d := relDiff(got, s.logits[k]); d > tol {
			return fmt.Errorf("continued alone, its step %d differs by %.3g", k, d)
		}
		tok = argmax(s.logits[k])
	}
	return nil
}

// sameState compares every layer's saved state of c with want: bit for bit, or within
// tol of each array's largest magnitude.
func sameState(c model.Cache, want []cache.Saved, tol float64) error {
	_, err := stateDiff(c, want, tol)
	return err
}

// stateDiff is sameState that also returns the largest difference it saw, relative to
// each array's largest magnitude.
func stateDiff(c model.Cache, want []cache.Saved, tol float64) (worst float64, err error) {
	got, err := c.Save(c.Offset())
	if err != nil {
		return 0, err
	}
	defer cache.FreeSaved(got)
	if len(got) != len(want) {
		return 0, fmt.Errorf("%d layers saved, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Kind == w.Kind && g.Offset == 0 && w.Offset == 0 && (len(g.Arrays) == 0) != (len(w.Arrays) == 0) {
			// A layer of no positions has no state, or its zeros: a single cache that ran a
			// block and kept none of it holds the zeros, a batch row of length 0 none.
			if err := allZero(append(g.Arrays, w.Arrays...)); err != nil {
				return worst, fmt.Errorf("layer %d (%s) of 0 positions: %w", i, g.Kind, err)
			}
			continue
		}
		if g.Kind != w.Kind || g.Offset != w.Offset || len(g.Arrays) != len(w.Arrays) {
			return worst, fmt.Errorf("layer %d: %s state of %d positions in %d arrays, want %s of %d in %d",
				i, g.Kind, g.Offset, len(g.Arrays), w.Kind, w.Offset, len(w.Arrays))
		}
		for k := range g.Arrays {
			if !slices.Equal(g.Arrays[k].Shape(), w.Arrays[k].Shape()) || g.Arrays[k].Dtype() != w.Arrays[k].Dtype() {
				return worst, fmt.Errorf("layer %d array %d: %v %v, want %v %v", i, k, g.Arrays[k].Shape(), g.Arrays[k].Dtype(), w.Arrays[k].Shape(), w.Arrays[k].Dtype())
			}
			ga, wa := mlxc.AsType(g.Arrays[k], mlxc.Float32), mlxc.AsType(w.Arrays[k], mlxc.Float32)
			mlxc.Eval(ga, wa)
			d := relDiff(ga.Float32s(), wa.Float32s())
			worst = max(worst, d)
			if d > tol {
				return worst, fmt.Errorf("layer %d (%s) array %d differs from the row decoded alone by %.3g", i, g.Kind, k, d)
			}
		}
	}
	return worst, nil
}

// allZero reports an error unless every element of xs is zero.
func allZero(xs []*mlxc.Array) error {
	for k, x := range xs {
		f := mlxc.AsType(x, mlxc.Float32)
		mlxc.Eval(f)
		for _, v := range f.Float32s() {
			if v != 0 {
				return fmt.Errorf("array %d holds %g where an empty state holds zeros", k, v)
			}
		}
	}
	return nil
}

// relDiff is the largest |a−b| relative to b's largest magnitude; 0 only when a and b
// are equal bit for bit (a sign of zero aside), +Inf for different lengths or a NaN.
func relDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d, top float64
	exact := true
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && a[i] != b[i] {
			exact = false
		}
		if math.IsNaN(float64(a[i])) != math.IsNaN(float64(b[i])) {
			return math.Inf(1)
		}
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		top = max(top, math.Abs(float64(b[i])))
	}
	if exact {
		return 0
	}
	if top == 0 || d == 0 {
		return math.SmallestNonzeroFloat64
	}
	return d / top
}
