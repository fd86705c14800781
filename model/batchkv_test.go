package model_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// kvRef is a row's expected keys and values, [1, nKV, n, hd] float32 on the host.
type kvRef struct {
	n    int
	k, v []float32
}

// appendRef adds one position (kNew, vNew: [nKV·hd], head-major) to a reference row.
func (r *kvRef) append(kNew, vNew []float32, nKV, hd int) {
	grow := func(old, add []float32) []float32 {
		out := make([]float32, 0, len(old)+len(add))
		for h := range nKV {
			out = append(out, old[h*r.n*hd:(h+1)*r.n*hd]...)
			out = append(out, add[h*hd:(h+1)*hd]...)
		}
		return out
	}
	r.k, r.v = grow(r.k, kNew), grow(r.v, vNew)
	r.n++
}

// Random joins (rows of 0 to 600 positions, past the 256-row buffer step), decode writes
// at each row's own position, and leaves keep every row's keys and values exactly: after
// each operation every row extracts to what it was given plus what was written to it.
func TestBatchKVCacheAlgebra(t *testing.T) {
	const nKV, hd = 2, 8
	rng := rand.New(rand.NewPCG(1, 2))
	randVals := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(rng.NormFloat64())
		}
		return out
	}
	err := mlxc.Do(func() error {
		lc := &model.BatchKVCache{}
		defer lc.Free()
		var refs []kvRef
		check := func(op string) {
			t.Helper()
			if lens := lc.Lens(); len(lens) != len(refs) {
				t.Fatalf("after %s: %d rows, want %d", op, len(lens), len(refs))
			}
			for r, ref := range refs {
				s, err := lc.Extract(r)
				if err != nil {
					t.Fatalf("after %s: extract row %d: %v", op, r, err)
				}
				if s.Offset != ref.n || lc.Lens()[r] != ref.n {
					t.Fatalf("after %s: row %d holds %d positions (length %d), want %d", op, r, s.Offset, lc.Lens()[r], ref.n)
				}
				if ref.n > 0 && (!slices.Equal(s.Arrays[0].Float32s(), ref.k) || !slices.Equal(s.Arrays[1].Float32s(), ref.v)) {
					t.Fatalf("after %s: row %d's keys or values differ from what it was given", op, r)
				}
				s.Free()
			}
		}
		for step := range 60 {
			s := mlxc.NewScope()
			switch op := rng.IntN(4); {
			case op == 0 || len(refs) == 0: // join
				n := []int{0, 1, 5, 255, 256, 257, 600}[rng.IntN(7)]
				ref := kvRef{n: n, k: randVals(nKV * n * hd), v: randVals(nKV * n * hd)}
				saved := cache.Saved{Kind: "kv", Offset: n, Trimmable: true}
				if n > 0 {
					saved.Arrays = []*mlxc.Array{mlxc.FromSlice(ref.k, 1, nKV, n, hd), mlxc.FromSlice(ref.v, 1, nKV, n, hd)}
				}
				if err := lc.Join(saved); err != nil {
					t.Fatalf("step %d: join %d positions: %v", step, n, err)
				}
				refs = append(refs, ref)
				check("a join")
			case op == 1: // leave: keep a random subset
				var keep []int
				var kept []kvRef
				for r := range refs {
					if rng.IntN(3) > 0 {
						keep, kept = append(keep, r), append(kept, refs[r])
					}
				}
				if err := lc.Keep(keep); err != nil {
					t.Fatalf("step %d: keep %v: %v", step, keep, err)
				}
				refs = kept
				check("a keep")
			default: // a decode step's write, some rows held
				B := len(refs)
				kNew, vNew := randVals(B*nKV*hd), randVals(B*nKV*hd)
				live := make([]bool, B)
				for r := range live {
					live[r] = rng.IntN(4) > 0
				}
				p := model.NewBatchPass("test", lc.Lens(), 1, mlxc.Zeros([]int{B, 1}, mlxc.Int32), model.BatchOptions{Live: live})
				q := mlxc.Zeros([]int{B, nKV, 1, hd}, mlxc.Float32)
				o := p.Attend(lc, q, mlxc.FromSlice(kNew, B, nKV, 1, hd), mlxc.FromSlice(vNew, B, nKV, 1, hd), 1)
				p.Finish()
				mlxc.Eval(append(lc.Arrays(), o)...)
				for r := range refs {
					if live[r] {
						refs[r].append(kNew[r*nKV*hd:(r+1)*nKV*hd], vNew[r*nKV*hd:(r+1)*nKV*hd], nKV, hd)
					}
				}
				check("a decode write")
			}
			s.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
