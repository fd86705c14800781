package model

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

func TestParseTCRule(t *testing.T) {
	// Qwen3-4B's products: merged q/k/v, o, merged gate/up, down, the vocabulary head.
	shapes := [][2]int{{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}}
	for _, tc := range []struct {
		rule string
		want []tcConfig // per shape; nil: an error
		err  string
	}{
		{rule: "", want: []tcConfig{tcConfigFor(6144, 2560), tcConfigFor(2560, 4096), tcConfigFor(19456, 2560), tcConfigFor(2560, 9728), tcConfigFor(151936, 2560)}},
		// The default for 2560 columns splits K: 4 chunks of 4096, 6 of 9728 (one wave).
		{rule: "", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}, {Tiles: 2, Warps: 4, Unroll: 8, Split: 4},
			{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}, {Tiles: 4, Warps: 4, Unroll: 4, Split: 6}, {Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}}},
		{rule: "wide=4/8/4p", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}, tcConfigFor(2560, 4096),
			{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}, tcConfigFor(2560, 9728), {Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}}},
		{rule: "down=4/4/4, narrow=1/8/s4k512", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}, {Tiles: 1, Warps: 8, Stages: 4, KT: 512},
			{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}, {Tiles: 4, Warps: 4, Unroll: 4}, {Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}}},
		// A staged shape whose tile does not divide K (2560 % 1024) keeps the default there;
		// one over the 48 KB of shared memory (3 stages) everywhere.
		{rule: "narrow=1/8/s2k1024", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}, {Tiles: 1, Warps: 8, Stages: 2, KT: 1024},
			{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}, tcConfigFor(2560, 9728), {Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}}},
		{rule: "narrow=1/8/s3k1024", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}, tcConfigFor(2560, 4096),
			{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}, tcConfigFor(2560, 9728), {Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}}},
		// mid: the merged q/k/v alone.
		{rule: "mid=1/4/8x2", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 8, Split: 2}, tcConfigFor(2560, 4096), tcConfigFor(19456, 2560),
			tcConfigFor(2560, 9728), tcConfigFor(151936, 2560)}},
		{rule: "wide", err: "want CLASS=SHAPE"},
		{rule: "tall=4/8/4", err: "unknown class"},
		{rule: "wide=4/8/4,wide=2/8/4", err: "given twice"},
		{rule: "wide=3/8/4", err: "tiles must be"},
		{rule: "wide=4/6/4", err: "warps must be"},
		{rule: "wide=4/8/0", err: "unroll must be"},
		// Split K: automatic (one group of 4 slices per warp; the head has tiles enough)
		// or a count.
		{rule: "narrow=2/4/4xa,down=2/4/4pxa,wide=4/4/4xa", want: []tcConfig{{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}, {Tiles: 2, Warps: 4, Unroll: 4, Split: 8},
			{Tiles: 4, Warps: 4, Unroll: 4, Split: 5}, {Tiles: 2, Warps: 4, Unroll: 4, Pipe: true, Split: 19}, {Tiles: 4, Warps: 4, Unroll: 4, Split: 1}}},
		{rule: "down=2/4/4x8", want: []tcConfig{tcConfigFor(6144, 2560), tcConfigFor(2560, 4096), tcConfigFor(19456, 2560),
			{Tiles: 2, Warps: 4, Unroll: 4, Split: 8}, tcConfigFor(151936, 2560)}},
		{rule: "wide=4/8/x", err: "split must be"},
		{rule: "wide=4/8/4x0", err: "split must be"},
		{rule: "wide=4/8/4xb", err: "split must be"},
		{rule: "wide=4/8", err: "want TILES/WARPS"},
		{rule: "wide=4/8/s1k128", err: "staged shapes"},
		{rule: "wide=4/8/s3k100", err: "staged shapes"},
	} {
		rule, err := parseTCRule(tc.rule)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one containing %q", tc.rule, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.rule, err)
			continue
		}
		for i, nk := range shapes {
			if got := rule(nk[0], nk[1]); got != tc.want[i] {
				t.Errorf("%q: [%d, %d] gets %+v, want %+v", tc.rule, nk[0], nk[1], got, tc.want[i])
			}
		}
	}
}

func TestTCRulesFit(t *testing.T) {
	// Every shape a rule picks for a real product must be launchable for it.
	for _, nk := range [][2]int{{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}, {6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}} {
		for name, rule := range map[string]func(int, int) tcConfig{"default": tcConfigFor} {
			if c := rule(nk[0], nk[1]); !c.fits(nk[0], nk[1]) {
				t.Errorf("%s rule: %+v does not fit [%d, %d]", name, c, nk[0], nk[1])
			}
		}
	}
}

// tcTile puts W[8nt+g][32s+8t+e] at [nt][s][4g+t][e]: checked element by element against
// the definition on a weight of two n8 tiles and three slices.
func TestTCTileLayout(t *testing.T) {
	const N, K = 16, 96
	vals := make([]float32, N*K)
	for i := range vals {
		vals[i] = float32(i) // every element distinct, exact in float32
	}
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		tl := tcTile(mlxc.FromSlice(vals, N, K))
		if got := tl.Shape(); len(got) != 4 || got[0] != N/8 || got[1] != K/32 || got[2] != 32 || got[3] != 8 {
			return fmt.Errorf("shape %v, want [%d %d 32 8]", got, N/8, K/32)
		}
		got := tl.Float32s()
		for nt := 0; nt < N/8; nt++ {
			for sl := 0; sl < K/32; sl++ {
				for g := 0; g < 8; g++ {
					for tt := 0; tt < 4; tt++ {
						for e := 0; e < 8; e++ {
							at := ((nt*(K/32)+sl)*32+4*g+tt)*8 + e
							want := vals[(8*nt+g)*K+32*sl+8*tt+e]
							if got[at] != want {
								return fmt.Errorf("tile %d slice %d lane %d element %d = %g, want %g", nt, sl, 4*g+tt, e, got[at], want)
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTCConfigForFewColumns: a product with too few column tiles for the H200's SMs gets K
// cut into smaller chunks (the drafter's k and v: 1 024 columns, 5 chunks, 320 blocks), and
// one with enough keeps one group of 8 slices per warp (o: 4 chunks, 640 blocks); a long-K
// product gets no more chunks than one wave of blocks (down: 6 chunks, 480 blocks).
func TestTCConfigForFewColumns(t *testing.T) {
	for _, tc := range []struct {
		N, K int
		want tcConfig
	}{
		{1024, 2560, tcConfig{Tiles: 2, Warps: 4, Unroll: 4, Split: 5}},
		{2560, 4096, tcConfig{Tiles: 2, Warps: 4, Unroll: 8, Split: 4}},
		{4096, 2560, tcConfig{Tiles: 2, Warps: 4, Unroll: 8, Split: 2}},
		// Long K (down, the drafter's fc): no more chunks than fill the SMs once.
		{2560, 9728, tcConfig{Tiles: 4, Warps: 4, Unroll: 4, Split: 6}},
		{2560, 12800, tcConfig{Tiles: 4, Warps: 4, Unroll: 4, Split: 6}},
		{4096, 12288, tcConfig{Tiles: 4, Warps: 4, Unroll: 4, Split: 4}},
	} {
		got := tcConfigFor(tc.N, tc.K)
		if got != tc.want {
			t.Errorf("tcConfigFor(%d, %d) = %+v, want %+v", tc.N, tc.K, got, tc.want)
		}
		if blocks := tc.N / (8 * got.Tiles) * got.Split; blocks < tcSplitMinBlocks || tc.K >= 8192 && blocks > tcOneWaveBlocks {
			t.Errorf("tcConfigFor(%d, %d): %d blocks, want at least %d (and for long K at most %d)", tc.N, tc.K, blocks, tcSplitMinBlocks, tcOneWaveBlocks)
		}
	}
}

// A NormOut launch's waiting blocks (one per column tile but the last) must leave a block
// slot free: at least 8/warps blocks fit an SM whatever the kernel's registers.
func TestNormOutFits(t *testing.T) {
	for _, c := range []struct {
		tiles, warps, sms int
		want              bool
	}{
		{160, 4, 132, true},  // the 4B shape's o projection on an H200
		{80, 4, 132, true},   // its down projection
		{264, 4, 132, true},  // 263 waiters, 264 slots
		{265, 4, 132, false}, // 264 waiters fill them
		{133, 8, 132, false}, // one slot per SM for 8-warp blocks
		{132, 8, 132, true},
		{160, 4, 40, false}, // a small GPU
		{16, 16, 20, true},  // 16-warp blocks: one per SM still
		{21, 16, 20, false},
		{1, 4, 0, false}, // SM count unknown
	} {
		if got := normOutFits(c.tiles, c.warps, c.sms); got != c.want {
			t.Errorf("normOutFits(%d tiles, %d warps, %d SMs) = %v, want %v", c.tiles, c.warps, c.sms, got, c.want)
		}
	}
}

// Tiled copies are made while they fit the budget beside MLX's live arrays, counting the
// copies already promised (a first forward promises them all before any is allocated);
// without a budget (DFLASH_TC_TILED=1) always.
func TestMayTileKeepsToTheBudget(t *testing.T) {
	if err := mlxc.Do(func() error {
		so := mlxc.NewScope()
		defer so.Close()
		w := mlxc.Zeros([]int{64, 32}, mlxc.BFloat16) // 4 096 bytes
		mlxc.Eval(w)
		n := uint64(w.NBytes())
		base := mlxc.ActiveMemory()
		for _, c := range []struct {
			name   string
			budget uint64
			want   []bool
		}{
			{"room for two", base + 2*n + n/2, []bool{true, true, false, false}},
			{"room for none", base + n - 1, []bool{false, false}},
			{"no budget", 0, []bool{true, true, true}},
		} {
			s := &SkinnyGEMM{tileBudget: c.budget}
			for i, want := range c.want {
				if got := s.mayTile(w); got != want {
					t.Errorf("%s: copy %d: mayTile = %v, want %v (counted %d bytes)", c.name, i, got, want, s.tileBytes)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
