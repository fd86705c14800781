package verify

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

func TestResolve(t *testing.T) {
	cases := []struct {
		next   []int32
		accept []bool
		a      int
		tok    int32
	}{
		{[]int32{7}, nil, 0, 7},
		{[]int32{1, 2, 3}, []bool{false, true}, 0, 1},
		{[]int32{1, 2, 3}, []bool{true, false}, 1, 2},
		{[]int32{1, 2, 3}, []bool{true, true}, 2, 3},
	}
	for _, c := range cases {
		a, tok := Resolve(c.next, c.accept)
		if a != c.a || tok != c.tok {
			t.Errorf("Resolve(%v, %v) = %d, %d; want %d, %d", c.next, c.accept, a, tok, c.a, c.tok)
		}
	}
}

// Leading computes on the device what Resolve computes on the host, for every pattern.
func TestLeadingMatchesResolve(t *testing.T) {
	cases := []struct {
		next   []int32
		accept []bool
	}{
		{[]int32{7}, nil},
		{[]int32{1, 2, 3}, []bool{false, true}},
		{[]int32{1, 2, 3}, []bool{true, false}},
		{[]int32{1, 2, 3}, []bool{true, true}},
		{[]int32{4, 5, 6, 7, 8}, []bool{true, true, false, true}},
		{[]int32{4, 5, 6, 7, 8}, []bool{false, false, false, false}},
		{[]int32{5, 6}, []bool{true}},
		{[]int32{5, 6}, []bool{false}},
		{[]int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, []bool{true, true, true, true, true, true, true, true, true, true, true, true, true, true, true}},
		{[]int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, []bool{true, true, true, true, true, true, true, true, true, true, true, true, true, false, true}},
	}
	on(t, func() {
		for _, c := range cases {
			v := Verdict{Next: mlxc.FromSlice(c.next, len(c.next))}
			if c.accept != nil {
				v.Accept = mlxc.FromSlice(c.accept, len(c.accept))
			}
			a, tok := v.Leading()
			wantA, wantTok := Resolve(c.next, c.accept)
			ga, gt := mlxc.ToSlice[int32](a), mlxc.ToSlice[int32](tok)
			if len(ga) != 1 || len(gt) != 1 || int(ga[0]) != wantA || gt[0] != wantTok {
				t.Errorf("Leading(%v, %v) = %v, %v; want [%d], [%d]", c.next, c.accept, ga, gt, wantA, wantTok)
			}
		}
	})
}

// Leading on a verdict still lazy on the device, built the way the run-ahead loop builds
// it (Greedy over logprobs whose argmax rows the drafts partly match), equals Resolve of
// the same verdict read back.
func TestLeadingOfLazyGreedyVerdict(t *testing.T) {
	on(t, func() {
		const V = 11
		for n := 1; n <= 15; n++ {
			for miss := 0; miss <= n; miss++ {
				lp := make([]float32, (n+1)*V)
				drafts := make([]int32, n)
				for i := range n + 1 {
					best := (i*7 + n) % V
					lp[i*V+best] = 1
					if i < n {
						drafts[i] = int32(best)
						if i == miss {
							drafts[i] = int32((best + 1) % V)
						}
					}
				}
				v := Greedy(mlxc.FromSlice(lp, n+1, V), mlxc.FromSlice(drafts, n))
				a, tok := v.Leading()
				ga, gt := mlxc.ToSlice[int32](a), mlxc.ToSlice[int32](tok)
				wantA, wantTok := Resolve(mlxc.ToSlice[int32](v.Next), mlxc.ToSlice[bool](v.Accept))
				if wantA != min(miss, n) {
					t.Fatalf("n %d, miss %d: Resolve accepted %d", n, miss, wantA)
				}
				if int(ga[0]) != wantA || gt[0] != wantTok {
					t.Errorf("n %d, miss %d: Leading = %v, %v; want %d, %d", n, miss, ga, gt, wantA, wantTok)
				}
			}
		}
	})
}

func on(t *testing.T, fn func()) {
	t.Helper()
	if err := mlxc.Do(func() error { s := mlxc.NewScope(); defer s.Close(); fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// peaked returns logprobs [rows, V] whose row r puts nearly all mass on tops[r].
func peaked(tops []int32, V int) *mlxc.Array {
	data := make([]float32, len(tops)*V)
	for r, top := range tops {
		for j := 0; j < V; j++ {
			data[r*V+j] = -40
		}
		data[r*V+int(top)] = 0
	}
	return mlxc.FromSlice(data, len(tops), V)
}

func TestGreedyVerdict(t *testing.T) {
	on(t, func() {
		// Target picks 3, 1, 4 at slots 0..2; drafts 3, 2 → first accepted, second rejected.
		v := Greedy(peaked([]int32{3, 1, 4}, 6), mlxc.FromSlice([]int32{3, 2}, 2))
		a, tok := Resolve(mlxc.ToSlice[int32](v.Next), mlxc.ToSlice[bool](v.Accept))
		if a != 1 || tok != 1 {
			t.Errorf("a=%d tok=%d, want 1, 1", a, tok)
		}
	})
}

// With a near-deterministic target, speculative sampling accepts drafts that match it and
// replaces the first mismatch with the target's token (the residual), whatever the seed.
func TestSpeculativeVerdictPeaked(t *testing.T) {
	sp := sample.Params{Temperature: 1}
	for seed := uint64(0); seed < 20; seed++ {
		on(t, func() {
			keys := sample.NewKeys(seed)
			v := Speculative(peaked([]int32{3, 1, 4}, 6), mlxc.FromSlice([]int32{3, 2}, 2), nil, sp, keys)
			a, tok := Resolve(mlxc.ToSlice[int32](v.Next), mlxc.ToSlice[bool](v.Accept))
			if a != 1 || tok != 1 {
				t.Errorf("seed %d: a=%d tok=%d, want 1, 1", seed, a, tok)
			}
			v = Speculative(peaked([]int32{3, 1, 4}, 6), mlxc.FromSlice([]int32{3, 1}, 2), nil, sp, keys)
			a, tok = Resolve(mlxc.ToSlice[int32](v.Next), mlxc.ToSlice[bool](v.Accept))
			if a != 2 || tok != 4 {
				t.Errorf("seed %d: a=%d tok=%d, want 2 and the bonus 4", seed, a, tok)
			}
		})
	}
}
